"""The neutral model of a conversation that the defenses, the projection and the token counter read.

One model for every API (chat completions, Anthropic Messages, OpenAI Responses); a codec per API
(``proxy.conversation.codec.Codec``) parses a native request into it and applies a projection back.

- A **conversation** is a list of native *pieces* (for chat: the ``messages``; for Messages: the
  top-level ``system`` as a leading piece, then the ``messages``; for Responses: ``instructions``,
  then the ``input`` items) and, position by position, one ``Item`` describing each piece. Item
  ``i`` stands for ``pieces[i]``: that position is its reference to its native piece (items are
  kept across requests by ``proxy.conversation.prefix.PrefixStates``, and must not hold a past
  request's body alive). Digests and chain hashes are per piece too (``canonical.py``).
- An **item** has a ``kind`` (``SYSTEM``, ``USER``, ``ASSISTANT``, ``CALL``, ``TOOL``, ``RESULTS``,
  ``OPAQUE``), the native ``role`` (or item type), the tool-call ids it makes (``calls``) and
  answers (``answers``), what it is bound to (``binds``) and whether it is ``sealed``.
- **Pairing groups**: an item making calls and the items bound to it after it (its answers,
  parallel ones included, and opaque items) form one group, kept or dropped together: a cut (the
  start of a kept tail, ``group_start``) never falls inside one.
- **Parts** (``Part``): the content of an item, each with a kind (``TEXT``, ``MEDIA``,
  ``TOOL_CALL`` for a call's arguments, ``TOOL_RESULT``, ``OPAQUE``, ``OTHER``), its token cost
  and a reference to its native part (``native``). Computed on demand by the codec
  (``Codec.parts``), never cached. A defense that rewrites parts (truncate arguments, offload,
  media, the summary transcript) decides over ``Part`` (kind, text, call) through the codec's
  accessors and rewrites through ``Codec.with_parts``: it never reads a native key.
- **Opaque** items and parts are forwarded byte-exact: a defense may keep or drop them whole,
  never rewrite them. Each has a binding rule: ``BINDS_PREVIOUS`` (chat: a message with a role the
  proxy does not know, Llama's ``ipython``; tool answers too), ``BINDS_NEXT`` (Responses: a
  ``reasoning`` item with ``encrypted_content`` is bound to the item after it), or, for a part,
  its item (Messages: ``thinking``/``redacted_thinking`` blocks with a ``signature`` are bound to
  their assistant turn and its ``tool_use`` blocks: that item is ``sealed``, so no defense
  rewrites any part of it, and it goes with its group).

Everything here is immutable and pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

Piece = dict[str, Any]
"""A native piece: a JSON object as parsed (``Any`` values: JSON of any shape, relayed as is)."""

SYSTEM = "system"
"""Instructions that stay first in every projection (chat ``system``/``developer``, Messages'
top-level ``system``, Responses' ``instructions``)."""
USER = "user"
"""A turn written by the user (never a carrier of tool results)."""
ASSISTANT = "assistant"
"""A model turn; its tool calls, if any, are in ``calls``."""
CALL = "call"
"""A tool call that is an item of its own (Responses ``function_call``)."""
TOOL = "tool"
"""A tool answer that is an item of its own (chat ``tool``/``function``, Responses ``function_call_output``)."""
RESULTS = "results"
"""A turn carrying tool results as parts (Messages: a ``user`` message with ``tool_result`` blocks)."""
OPAQUE = "opaque"
"""An item the proxy does not understand (a role it does not know, an item type it does not know):
forwarded as it came, kept or dropped whole with the item it is bound to."""

KINDS = frozenset({SYSTEM, USER, ASSISTANT, CALL, TOOL, RESULTS, OPAQUE})

BINDS_NONE = 0
"""A kept tail may start at this item, and the item after it may start one."""
BINDS_PREVIOUS = 1
"""Never separated from the item before it (a tool answer, an opaque item, a parallel call)."""
BINDS_NEXT = 2
"""Never separated from the item after it (Responses ``reasoning`` with ``encrypted_content``)."""

TEXT = "text"
MEDIA = "media"
TOOL_CALL = "tool_call"
TOOL_RESULT = "tool_result"
OPAQUE_PART = "opaque"
OTHER = "other"
PART_KINDS = frozenset({TEXT, MEDIA, TOOL_CALL, TOOL_RESULT, OPAQUE_PART, OTHER})


CANCELLED_TEXT = "[context-proxy] This tool call was cancelled or its result is unavailable."
"""Content of the synthetic answer to a dangling call (DESIGN.md section 2): chat ``tool`` messages,
Messages ``tool_result`` blocks."""


class Item(NamedTuple):
    """What the defenses know of one piece (a message, a Messages turn, a Responses item).

    ``kind``: one of ``KINDS``. ``role``: the native role (chat, Messages) or item type
    (Responses); ``None`` when absent or not a string. ``calls``: ids of the tool calls it makes
    (string ids only). ``answers``: ids of the calls it answers. ``is_answer``: it answers the calls
    of the item before it (a ``TOOL`` item, a ``RESULTS`` turn, or any item carrying result
    parts; its ``answers`` may be empty when the codec does not pair by id). ``binds``: ``BINDS_NONE``,
    ``BINDS_PREVIOUS`` or ``BINDS_NEXT``. ``sealed``: it holds an opaque part (a signed thinking
    block): keep or drop it whole, never rewrite any of its parts.
    """

    kind: str
    role: str | None
    calls: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    is_answer: bool = False
    binds: int = BINDS_NONE
    sealed: bool = False


class Part(NamedTuple):
    """One content part of an item: ``kind`` (one of ``PART_KINDS``), ``tokens`` (its cost by the
    counter that built it, no message framing), ``native`` (the native part itself: a string, a
    content part, a tool call, a block), ``call_id`` (for ``TOOL_CALL``/``TOOL_RESULT`` parts, the
    id they carry, else ``None``), ``field`` (where it lives in its piece: ``content``,
    ``tool_calls``...)."""

    kind: str
    tokens: int
    native: object
    call_id: str | None = None
    field: str = "content"


@dataclass(frozen=True, slots=True)
class Conversation:
    """A parsed request: ``pieces[i]`` (native, as the client sent it) is described by ``items[i]``,
    and has digest ``digests[i]`` and chain hash ``chain[i]`` (``proxy.conversation.canonical``).
    ``body``: the native request body (a JSON object); ``raw``: its bytes as received (forwarded
    as they are when nothing is changed). Never mutated: a projection builds new pieces."""

    body: dict[str, Any]
    raw: bytes
    pieces: list[Piece]
    items: Sequence[Item]
    digests: list[str]
    chain: list[str]

    def __post_init__(self) -> None:
        n = len(self.pieces)
        if len(self.items) != n or len(self.digests) != n or len(self.chain) != n:
            raise ValueError(f"{n} pieces but {len(self.items)} items, {len(self.digests)} digests "
                             f"and {len(self.chain)} chain hashes")


def is_user_turn(item: Item) -> bool:
    """True for a turn the user wrote (``USER``: never a carrier of tool results)."""
    return item.kind == USER


def bound_to_previous(items: Sequence[Item], i: int) -> bool:
    """True when a kept tail may not start at ``items[i]``: it is bound to the item before it, or
    that item is bound to it (``BINDS_NEXT``). ``i == 0`` is never bound (nothing before it)."""
    return i > 0 and (items[i].binds == BINDS_PREVIOUS or items[i - 1].binds == BINDS_NEXT)


def group_start(items: Sequence[Item], i: int) -> int:
    """The largest index ``<= i`` where a kept tail may begin without splitting a pairing group
    (``bound_to_previous``); 0 when none before ``i``."""
    while i > 0 and bound_to_previous(items, i):
        i -= 1
    return i

