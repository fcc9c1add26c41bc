"""Second review of BodyMemo: each test is a body (or a sequence of bodies of one tenant) whose
parse with the memo differed from its whole parse, or that the memo's bounds did not hold."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.conversation.body_memo import BodyMemo
from tests.conversation.test_body_memo import history, same


def tools(n: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 100}} for i in range(n)]


def test_a_body_that_differs_from_the_kept_one_before_its_messages_parses_as_a_whole_parse() -> None:
    """Members written before ``messages`` (here ``tools``, 2.6 kB: past the first ``KEY_BYTES``
    that index a kept body) where the new body adds an element to an array: the two bodies first
    differ where the old one has ``]`` and the new one ``,``, before either's messages array; the
    kept array was then taken to end there (an ``IndexError``: a 500 for a valid body)."""
    memo = BodyMemo(min_bytes=1024)
    same(orjson.dumps({"model": "m", "tools": tools(20), "messages": history()}), memo)
    added = orjson.dumps({"model": "m", "tools": [*tools(20), {"type": "function", "function": {"name": "new"}}],
                          "messages": history()})
    assert same(added, memo)["tools"][-1]["function"]["name"] == "new"
