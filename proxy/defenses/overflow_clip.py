"""Defense 4's last resort: clip the oversized tool results a request ends with.

DESIGN.md section 2: after an overflow, summarize now; if the kept tail still ends in a batch of
oversized tool results (nothing before them left to summarize), offload each of them behind a
stub. A tool message is never deleted (case 022: deleting a result orphans its call); it keeps its
role and ``tool_call_id``, only its content becomes the stub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from proxy.conversation.codec import Codec
from proxy.conversation.model import Item, Piece
from proxy.defenses.config import DefenseConfig
from proxy.defenses.offload import ArtifactToStore, offload_message
from proxy.tokens.protocol import CountText

CLIP_MIN_TOKENS = 500
"""Results at or under this are left alone: a stub with its 10-line preview costs 150-400 tokens."""


def trailing_batch(items: Sequence[Item]) -> range:
    """Indices of the tool answers the items end with (empty when they end with anything else)."""
    start = len(items)
    while start > 0 and items[start - 1].is_answer:
        start -= 1
    return range(start, len(items))


def clip_trailing_results(
    messages: list[Piece],
    items: Sequence[Item],
    counts: Sequence[int],
    config: DefenseConfig,
    count_text: CountText,
    unavailable: frozenset[str],
    codec: Codec,
) -> tuple[list[Piece] | None, list[int], list[ArtifactToStore]]:
    """Offload each tool result of the trailing batch over ``CLIP_MIN_TOKENS``.

    ``items[i]``/``counts[i]``: the model's item and the token count of ``messages[i]`` (pieces of
    ``codec``). Returns
    ``(new list or None if nothing was clipped, the indices clipped, artifacts to store)``. The
    input is not mutated.
    """
    clip_config = dataclasses.replace(config, offload_tool_tokens=CLIP_MIN_TOKENS)
    out: list[Piece] | None = None
    clipped: list[int] = []
    artifacts: list[ArtifactToStore] = []
    for i in trailing_batch(items):
        if counts[i] <= CLIP_MIN_TOKENS:
            continue
        new, arts = offload_message(messages[i], counts[i], count_text, clip_config, unavailable, item=items[i],
                                    codec=codec)
        if new is None:
            continue
        if out is None:
            out = list(messages)
        out[i] = new
        clipped.append(i)
        artifacts.extend(arts)
    return out, clipped, artifacts
