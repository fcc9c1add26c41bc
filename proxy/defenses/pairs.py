"""Tool-pair safety: where a history may be cut, and synthetic answers for dangling tool calls.

Read from the neutral model (``proxy.conversation.model``): a strict provider (OpenAI, DeepSeek,
Anthropic) rejects a request where a tool answer does not answer a call of the nearest preceding
calling item, or where a call is not answered before the next turn. So an item making calls and
the items bound to it form a pairing group, kept or dropped together (cases 001, 002, 004, 022).

An ``OPAQUE`` item (chat: a role the proxy does not know, Llama's ``ipython``, which answers a
tool call; a vendor's own role) may be an answer, a note bound to the item before it, anything
(issue 15). So it is never separated from the item before it (a kept tail never starts at it), and
the calls of a group it belongs to are never patched (a synthetic "cancelled" answer could
contradict the answer it carries; the provider judges them).
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.conversation.codec import Codec
from proxy.conversation.model import CALL, CANCELLED_TEXT, OPAQUE, RESULTS, TOOL, Item, Piece

__all__ = ["dangling_calls", "patch_dangling"]

_BLOCK_KINDS = frozenset({TOOL, OPAQUE})


def dangling_calls(items: Sequence[Item]) -> list[tuple[int, list[str]]]:
    """Unanswered calls: ``(insert_at, [call id, ...])`` pairs, in order.

    After an item with ``calls`` (and the ``CALL`` items right after it: Responses' parallel
    calls), the block of ``TOOL`` answers and ``OPAQUE`` items that follows answers them;
    ``insert_at`` is the index of the first item after that block (where synthetic answers go).
    A ``RESULTS`` turn there answers the ids it names (Messages: ``tool_result`` blocks answer
    the ``tool_use`` blocks of the turn before; the codec puts the missing ones inside it), and so
    do the ``RESULTS`` turns right after it (the API merges consecutive user turns: parallel
    results may come one turn each). Chat
    ``tool_use`` blocks are not ``calls`` of a chat item, and chat ``RESULTS`` items name no
    ids, so chat patches only ``tool_calls``. Nor are the calls of a block that holds
    an ``OPAQUE`` item (Llama's ``ipython`` answers calls without a ``tool_call_id``): whether they
    are answered is the provider's to judge, and the block is forwarded as sent.
    """
    out: list[tuple[int, list[str]]] = []
    i, n = 0, len(items)
    while i < n:
        ids = items[i].calls
        i += 1
        if not ids:
            continue
        pending = list(ids)
        while i < n and items[i].kind == CALL:
            pending.extend(items[i].calls)
            i += 1
        opaque = False
        while i < n and items[i].kind in _BLOCK_KINDS:
            if items[i].kind == TOOL:
                for answered in items[i].answers:
                    if answered in pending:
                        pending.remove(answered)
            else:
                opaque = True
            i += 1
        j = i  # answers inside the next turn (Messages), or the turns right after it (the API merges
        while pending and j < n and items[j].kind == RESULTS:  # consecutive user turns into one)
            pending = [cid for cid in pending if cid not in items[j].answers]
            j += 1
        if pending and not opaque:
            out.append((i, pending))
    return out


def patch_dangling(pieces: list[Piece], items: Sequence[Item], codec: Codec) -> list[Piece] | None:
    """``pieces`` with a synthetic answer after each dangling call (``codec.insert_answers``), or
    ``None`` if none dangle. ``items``: the model's items of ``pieces`` (``codec.items(pieces)``).
    The input list is not mutated; unchanged pieces are shared."""
    found = dangling_calls(items)
    if not found:
        return None
    return codec.insert_answers(pieces, found, CANCELLED_TEXT)
