"""``proxy.compaction.references.ReferenceMemo``: ``any(references_in(messages))``, reading only messages new since a
remembered prefix (the per-request cost of deciding whether to offer the read tool)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.compaction.references import (
    REFERENCE_CHECKPOINT,
    REFERENCE_LOOKBACK,
    ReferenceMemo,
)
from proxy.conversation.canonical import digests_and_chain
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


@pytest.mark.parametrize("branch_at", [REFERENCE_CHECKPOINT - 1, 3 * REFERENCE_CHECKPOINT + 5])
def test_a_branch_older_than_the_lookback_reuses_a_checkpoint(branch_at: int) -> None:
    n = branch_at + 2 * REFERENCE_LOOKBACK + 10
    messages = [{"role": "user", "content": f"m{i}"} for i in range(n)]
    memo = ReferenceMemo()
    assert memo.names(messages, chain_of(messages)) is False
    branch = [*messages[: branch_at + 1], {"role": "user", "content": "edited"}]
    chain = chain_of(branch)
    # a reference put into the prefix without changing its chain hashes is not read: the answer
    # up to the deepest checkpoint at or before the branch point is the remembered one
    injected = [{"role": "user", "content": f"/artifacts/{ART}"} if i == 2 else m for i, m in enumerate(branch)]
    assert memo.names(injected, chain) is False
    assert ReferenceMemo().names(injected, chain) is True


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError):
        ReferenceMemo().names([{"role": "user", "content": "x"}], [])


def test_empty_history_names_nothing() -> None:
    assert ReferenceMemo().names([], []) is False
