"""``proxy.compaction.references.ReferenceMemo``: ``any(references_in(messages))``, reading only messages new since a
remembered prefix (the per-request cost of deciding whether to offer the read tool)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.compaction.references import ARCHIVE_URL, ReferenceMemo, url_in_body
from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.prefix import LOOKBACK, PrefixStates
from proxy.tools.read_tool import references_in

ART = "art_" + "0123456789abcdef" * 2


def chain_of(messages: list[dict[str, Any]]) -> list[str]:
    return digests_and_chain(messages)[1]


def test_agrees_with_references_in_on_growing_and_branching_histories() -> None:
    rng = random.Random(7)
    texts = ["plain text", f"see {ART}", "the /sessions/s1/archive has it", "art_short", "/archive alone",
             [{"type": "text", "text": f"part {ART}"}], None]
    weights = [40, 1, 1, 2, 2, 1, 3]
    memo = ReferenceMemo()
    histories: list[list[dict[str, Any]]] = [[]]
    for turn in range(300):
        base = rng.choice(histories) if rng.random() < 0.2 else histories[-1]
        cut = rng.randrange(len(base) + 1) if rng.random() < 0.1 else len(base)
        new = [{"role": rng.choice(["user", "assistant", "tool"]), "content": rng.choices(texts, weights)[0], "n": f"{turn}.{k}"}
               for k in range(rng.randrange(1, 30))]
        messages = base[:cut] + new
        histories.append(messages)
        assert memo.names(messages, chain_of(messages)) is any(references_in(messages)), turn


def test_the_answer_for_a_known_prefix_comes_from_its_chain_hash() -> None:
    named = [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"at /artifacts/{ART}"}]
    memo = ReferenceMemo()
    assert memo.names(named, chain_of(named)) is True
    grown = [*named, {"role": "user", "content": "next"}]
    chain = chain_of(grown)
    # the same chain hashes with the reference gone from the text: only the new message is read,
    # the prefix's answer is the remembered one (a chain hash identifies the content before it)
    scrubbed = [named[0], {"role": "assistant", "content": "nothing"}, grown[2]]
    assert memo.names(scrubbed, chain) is True
    assert ReferenceMemo().names(scrubbed, chain) is False


def test_a_request_extending_the_last_one_reuses_its_answer_and_a_branch_reads_all() -> None:
    """The answer lives in the conversation's prefix state, kept under the last request's newest
    chain hash and found among the next request's newest ``LOOKBACK``: a request that extends it
    reads only what it adds; a branch (an edit, a regenerated turn) reads its history once (the
    former own cache also kept checkpoints every 256 positions; gone with it)."""
    n = 3 * LOOKBACK
    messages = [{"role": "user", "content": f"m{i}"} for i in range(n)]
    memo = ReferenceMemo()
    assert memo.names(messages, chain_of(messages)) is False
    grown = [*messages, *({"role": "user", "content": f"new {i}"} for i in range(LOOKBACK - 1))]
    injected = [{"role": "user", "content": f"/artifacts/{ART}"} if i == 2 else m for i, m in enumerate(grown)]
    assert memo.names(injected, chain_of(grown)) is False  # the prefix's remembered answer: not read
    branch = [*messages[: n - 1], {"role": "user", "content": "edited"}]
    injected = [{"role": "user", "content": f"/artifacts/{ART}"} if i == 2 else m for i, m in enumerate(branch)]
    assert memo.names(injected, chain_of(branch)) is True  # no state within the lookback: all read
    too_far = [*grown, *({"role": "user", "content": f"later {i}"} for i in range(LOOKBACK))]
    injected = [{"role": "user", "content": f"/artifacts/{ART}"} if i == 2 else m for i, m in enumerate(too_far)]
    assert memo.names(injected, chain_of(too_far)) is True


def test_the_answer_is_kept_in_the_shared_prefix_state() -> None:
    prefixes = PrefixStates()
    memo = ReferenceMemo(prefixes)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"at /artifacts/{ART}"},
                {"role": "user", "content": "more"}]
    chain = chain_of(messages)
    assert memo.names(messages, chain) is True and len(prefixes) == 1
    state = prefixes.take(chain)
    assert (state.refs_at, state.refs_checked, state.length) == (1, 2, 3)


def test_many_conversations_stay_within_the_prefix_states_bound() -> None:
    prefixes = PrefixStates(max_positions=1_000)
    memo = ReferenceMemo(prefixes)
    for k in range(2_000):
        messages = [{"role": "user", "content": f"conversation {k}"}, {"role": "assistant", "content": "a"}]
        assert memo.names(messages, chain_of(messages)) is False
    assert len(prefixes) <= 1_000


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError):
        ReferenceMemo().names([{"role": "user", "content": "x"}], [])


def test_empty_history_names_nothing() -> None:
    assert ReferenceMemo().names([], []) is False


_PIECES = [b"/", b"\\/", b"/artifacts/art_", b"/artifacts/", b"art_01", b"/archive", b"/sessions/s1/archive",
           b"/sessions/ s/archive", b"/sessions//archive", b"/ar", b"{\"role\":\"user\"}", b"x" * 40, b""]


@given(st.lists(st.sampled_from(_PIECES), max_size=12), st.binary(max_size=64), st.booleans())
def test_url_in_body_answers_as_the_two_searches_do(pieces: list[bytes], noise: bytes, expanded: bool) -> None:
    """``url_in_body`` looks for a ``/`` before its two substring searches: the same answer as
    the searches alone on any body (URL pieces, escaped slashes, near misses, arbitrary bytes)."""
    raw = b"".join(pieces) + noise
    searched = (b"/artifacts/art_" in raw or (b"/archive" in raw and ARCHIVE_URL.search(raw) is not None)
                or expanded)
    assert url_in_body(raw, expanded) is searched
