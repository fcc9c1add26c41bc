"""Issue 17, item 6, at a small scale: facts that only stored content keeps are recalled through
the read tool, streamed and not, with no request over the window and none invalid.

The full measurement (>= 20 facts per configuration) is ``python -m tests.recall --out
docs/recall.md``; this runs the same code (``tests/recall.py``) with fewer facts, on SQLite.
"""

from __future__ import annotations

import pytest

from tests.recall import TRACES, Config, run
from tests.support.shared import needs_exact_encodings


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("kind", "window", "facts"), [
    ("huge", 16384, 3), ("huge", 32768, 3), ("offload", 131072, 4), ("huge-trace", 32768, 3),
    pytest.param("summary", 32768, 4, marks=needs_exact_encodings),  # where the summary cuts decides what a read finds
])
def test_facts_kept_only_in_stored_content_are_recalled(kind: str, window: int, facts: int, stream: bool) -> None:
    if kind == "huge-trace" and not TRACES.is_dir():
        pytest.skip(f"{TRACES} is absent (real traces are a plus; the synthetic configurations run)")
    result = run(Config(kind, window, stream, facts))
    assert len(result.outcomes) == facts
    assert not any(o.in_prompt for o in result.outcomes)  # each fact needed a read: the test measures what it says
    assert result.recalled / facts >= 0.99, [(o.recalled, o.rounds) for o in result.outcomes]
    assert result.over_window == 0 and result.invalid == 0 and result.tool_seen == 0
    assert all(1 <= o.rounds <= 8 and o.tokens_added <= window // 4 for o in result.outcomes)


def test_a_model_that_only_pages_misses_facts_in_huge_outputs() -> None:
    """The comparison that makes the test above able to fail: without ``query`` (the fake model
    pages), the read budget is spent on pages before the fact is reached."""
    result = run(Config("huge", 32768, False, 3), pages=True)
    assert result.recalled < 3
    assert result.over_window == 0 and result.invalid == 0
