"""The message each artifact was offloaded from, where the projection did not name it: found by
its content among a request's messages.

The projection names the message each artifact was offloaded from (``ArtifactToStore.source``);
clipping a request that overflowed does not (``proxy.defenses.overflow_clip``). For those, the
compactor looks for each artifact's content among the strings of the request's messages (a tool
result's text, a long user message's text, an inline image's ``data:`` URL, or an Anthropic image
block's base64 ``data``), newest first (new content is offloaded when its message is first seen, so
it is nearly always among the last few: the walk stops there, whatever the conversation's length),
and records that message's chain hash with the artifact (``storage.records.ArtifactRecord.message_hash``).
A content that a newer message holds as sent (under its own threshold) is attributed to that one:
only the projection can tell them apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from proxy.defenses.offload import ArtifactToStore

MAX_DEPTH = 64
"""Nesting walked into a message (JSON the proxy parsed is at most 254 deep; content sits near the top)."""
_END = object()


def _strings(value: Any) -> Iterator[str]:
    """The strings in ``value`` (a JSON value: dicts' values, lists' items), containers entered down
    to ``MAX_DEPTH`` (``value`` is depth 0; a string at depth ``MAX_DEPTH`` is still yielded). One
    generator with a stack of iterators: each value costs the same however deep it sits (a recursive
    generator passed every string up through one frame per level), and memory is the depth."""
    stack: list[Iterator[Any]] = [iter((value,))]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, str):
            yield item
        elif len(stack) <= MAX_DEPTH and isinstance(item, dict):
            stack.append(iter(item.values()))
        elif len(stack) <= MAX_DEPTH and isinstance(item, list):
            stack.append(iter(item))


def source_messages(
    messages: Sequence[dict[str, Any]], chain: Sequence[str], artifacts: Sequence[ArtifactToStore]
) -> dict[str, str]:
    """``{artifact id: chain hash}`` of the newest of ``messages`` (``chain[i]`` is ``messages[i]``'s
    hash) holding each artifact's content as one of its strings; an artifact not found (its text
    was joined from several parts) is left out. A ``data:`` URL also matches its base64 payload
    alone (how Anthropic's image blocks carry it). Strings are compared only when their length is
    one of the contents', and the walk (newest message first) stops once all are found."""
    wanted: dict[str, str] = {}
    for a in artifacts:
        wanted.setdefault(a.content, a.id)
        if a.content.startswith("data:") and ";base64," in a.content:
            wanted.setdefault(a.content.partition(";base64,")[2], a.id)
    lengths, ids = {len(s) for s in wanted}, set(wanted.values())
    found: dict[str, str] = {}
    for message, chain_hash in zip(reversed(messages), reversed(chain), strict=False):
        for s in _strings(message):
            if len(s) in lengths and (art_id := wanted.get(s)) is not None and art_id not in found:
                found[art_id] = chain_hash
        if len(found) == len(ids):
            break
    return found
