"""The Anthropic Messages codec (``POST /v1/messages``): a first version, for issue 19 to complete.

It shows that Messages fits the model without changing the defenses (``tests/conversation``
plans over a Messages conversation with the unchanged projection). Not wired to a route yet.

Pieces: the top-level ``system`` (a string or text blocks) as a leading piece
``{"role": "system", "content": system}``, then the body's ``messages`` themselves. Items:

- ``system`` piece: ``SYSTEM``;
- ``user``: ``RESULTS`` when its content holds ``tool_result`` blocks (bound to the turn before,
  answering their ``tool_use_id``s), else ``USER``;
- ``assistant``: ``ASSISTANT``, its ``calls`` the ids of its ``tool_use`` blocks; ``sealed`` when it
  holds a ``thinking`` block with a ``signature`` or a ``redacted_thinking`` block (Anthropic
  checks them, and they are bound to their turn and its ``tool_use`` blocks: kept or dropped whole);
- any other role: ``OPAQUE``, bound to the turn before.

Parts keep each block as it came (``cache_control`` included: a block a defense rewrites keeps
its other fields). ``apply`` puts the leading system piece back as the top-level ``system``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from operator import is_not
from typing import Any

from proxy.conversation.blocks import (
    block_text,
    block_with_text,
    content_with,
    inline_image,
    json_text,
    render_block,
    text_block,
    tool_use_call,
    tool_use_with_input,
)
from proxy.conversation.canonical import text_of
from proxy.conversation.codec import PartCounter, ToolCall
from proxy.conversation.model import (
    ASSISTANT,
    BINDS_NONE,
    BINDS_PREVIOUS,
    CANCELLED_TEXT,
    MEDIA,
    OPAQUE,
    OPAQUE_PART,
    OTHER,
    RESULTS,
    SYSTEM,
    TEXT,
    TOOL_CALL,
    TOOL_RESULT,
    USER,
    Conversation,
    Item,
    Part,
    Piece,
)
from proxy.conversation.pricing import price_message, price_part, tool_schemas
from proxy.json_depth import DeepBudget, DeepBudgetExceeded, deep_budget, dumps

_SIGNED = frozenset({"thinking", "redacted_thinking"})
_MEDIA = frozenset({"image", "document"})


def _blocks(piece: Piece) -> list[Any]:
    content = piece.get("content")
    return content if isinstance(content, list) else []


def _ids(blocks: list[Any], kind: str, field: str) -> tuple[str, ...]:
    return tuple(b[field] for b in blocks if isinstance(b, dict) and b.get("type") == kind
                 and isinstance(b.get(field), str))


def _signed(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") not in _SIGNED:
        return False
    return block.get("type") == "redacted_thinking" or isinstance(block.get("signature"), str)


def messages_item(piece: Piece) -> Item:
    """The ``Item`` of one Messages piece (rules in the module docstring)."""
    role = piece.get("role")
    blocks = _blocks(piece)
    if role == "system":
        return Item(SYSTEM, role)
    if role == "user":
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
            return Item(RESULTS, role, answers=_ids(blocks, "tool_result", "tool_use_id"), is_answer=True,
                        binds=BINDS_PREVIOUS)
        return Item(USER, role)
    if role == "assistant":
        return Item(ASSISTANT, role, calls=_ids(blocks, "tool_use", "id"), binds=BINDS_NONE,
                    sealed=any(map(_signed, blocks)))
    return Item(OPAQUE, role if isinstance(role, str) else None, binds=BINDS_PREVIOUS)


UNSIGNED_PLACEHOLDER = "[context-proxy] (this turn's thinking was left out)"
"""The text of a turn that held nothing but signed thinking once that is left out."""

_log = logging.getLogger("context_proxy.messages")

HASH_DROPPED = frozenset({"cache_control"})
"""Block keys the Messages hash view leaves out: a client moves its cache breakpoints from turn to
turn (Claude Code marks the newest turn), and the turn is the same turn with or without one."""


_KEPT_LEAVES = frozenset({str, int, bool})
"""Leaf types ``_hash_value`` keeps as they are (a ``None`` value is left out, a float may change)."""


def _hash_value(value: Any) -> Any:
    """``value`` without ``None`` values at any depth, whole floats as ints (``1.0`` from Python is
    ``1`` from a JavaScript client); ``value`` itself when nothing changes (no copy)."""
    if isinstance(value, dict):
        for v in value.values():  # (the usual block: only strings and ints, nothing to look into)
            if v.__class__ not in _KEPT_LEAVES:
                break
        else:
            return value
        out = {k: _hash_value(v) for k, v in value.items() if v is not None}
        return value if len(out) == len(value) and all(out[k] is value[k] for k in out) else out
    if isinstance(value, list):
        items = [_hash_value(v) for v in value]
        return items if any(map(is_not, items, value)) else value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _hash_block(block: Any) -> Any:
    if isinstance(block, dict) and not HASH_DROPPED.isdisjoint(block):
        block = {k: v for k, v in block.items() if k not in HASH_DROPPED}
    try:
        return _hash_value(block)
    except RecursionError:  # nested deeper than Python recurses (a tool's input 500 deep): the same value
        return _hash_value_deep(block, deep_budget())


def _hash_value_deep(value: Any, budget: DeepBudget | None = None) -> Any:
    """``_hash_value(value)`` without recursion, for a value nested too deep for it: the same value
    (``value`` itself when nothing changes, as there). Its containers depth first, each rebuilt once
    its children are (a container met twice, as a value the proxy built may share one, is rebuilt
    once); raises ``RecursionError``, as ``_hash_value`` would, for a cycle, and
    ``DeepBudgetExceeded`` once it meets more containers than ``budget`` has left (the request's:
    ``json_depth.DEEP_BUDGET_CONTAINERS``)."""
    done: dict[int, Any] = {}  # a container's id -> its ``_hash_value``
    open_ids: set[int] = set()
    if not isinstance(value, dict | list):
        return _hash_value(value)
    cap = budget.limit(views=True) if budget is not None else None
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        if cap is not None and len(open_ids) + len(done) > cap:
            DeepBudget.walked_total += len(open_ids) + len(done)
            raise DeepBudgetExceeded(f"more than {cap} deep containers")
        node, ready = stack.pop()
        if ready:
            done[id(node)] = _rebuilt(node, done)
            open_ids.discard(id(node))
        elif id(node) not in done:
            if id(node) in open_ids:
                raise RecursionError("a cycle in a value to hash")
            open_ids.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in (node.values() if isinstance(node, dict) else node)
                         if isinstance(child, dict | list))
    walked = len(done)
    if budget is not None:
        budget.spend(walked, views=True)
    else:
        DeepBudget.walked_total += walked
    return done[id(value)]


def _rebuilt(node: dict[str, Any] | list[Any], done: dict[int, Any]) -> Any:
    """``_hash_value(node)`` from its children's, in ``done`` (a leaf's is taken here: no depth)."""
    if isinstance(node, dict):
        out = {k: done[id(v)] if isinstance(v, dict | list) else _hash_value(v) for k, v in node.items()
               if v is not None}
        return node if len(out) == len(node) and all(out[k] is node[k] for k in out) else out
    items = [done[id(v)] if isinstance(v, dict | list) else _hash_value(v) for v in node]
    return items if any(map(is_not, items, node)) else node


def hash_view(piece: Piece) -> Piece:
    """What a Messages piece's digest is taken of (``canonical.message_digest`` then applies chat's
    rules on top): its content blocks without ``cache_control`` and without ``None`` values at any
    depth (what an SDK's echo of a reply adds: ``"citations": null``, a search result's
    ``"page_age": null``), whole floats as ints (a JavaScript client echoes ``1.0`` as ``1``), a
    string content as the one text block it means (the API reads them alike; a client that puts a
    breakpoint on it sends the block); the piece itself when nothing is left out. Only for hashing:
    the log keeps the piece as sent."""
    content = piece.get("content")
    if isinstance(content, str):  # the same turn as one text block (a client that marks it sends blocks)
        return {**piece, "content": [{"type": "text", "text": content}]}
    if not isinstance(content, list):
        return piece
    blocks = [_hash_block(b) for b in content]
    return {**piece, "content": blocks} if any(map(is_not, blocks, content)) else piece


def reply_view(piece: Piece) -> Piece | None:
    """``hash_view`` of a reply to log, or ``None`` when its deep content is past the request's
    budget (``json_depth.DEEP_BUDGET_CONTAINERS``): the reply is then logged without its content
    (a warning says so; the client has the provider's bytes whatever this answers)."""
    try:
        return hash_view(piece)
    except DeepBudgetExceeded:
        _log.warning("reply nested too deep past its budget (json_depth.DEEP_BUDGET_CONTAINERS): "
                     "logged without its content")
        return None


def round_view(piece: Piece) -> Piece:
    """``hash_view`` of a round the proxy serves (its own tool calls): a round is served and logged
    whole, so deep content past the request's budget is walked all the same (the provider's, not
    the client's: as long as the provider's answer), the request's budget then lifted."""
    try:
        return hash_view(piece)
    except DeepBudgetExceeded:
        budget = deep_budget()
        budget.unbounded = True
        return hash_view(piece)


class MessagesCodec:
    """The Messages codec (see the module docstring). Stateless."""

    name = "messages"
    binds_prefix = True

    def pieces(self, body: Mapping[str, Any]) -> list[Piece]:
        """``[{"role": "system", "content": body["system"]}]`` when a ``system`` is set, then the
        ``messages`` themselves."""
        messages = body.get("messages")
        out: list[Piece] = list(messages) if isinstance(messages, list) else []
        system = body.get("system")
        if system is not None and system != "" and system != []:
            out.insert(0, {"role": "system", "content": system})
        return out

    def item(self, piece: Piece) -> Item:
        return messages_item(piece)

    def items(self, pieces: Sequence[Piece]) -> list[Item]:
        return list(map(messages_item, pieces))

    def parse(self, body: dict[str, Any], raw: bytes, digests: list[str], chain: list[str]) -> Conversation:
        pieces = self.pieces(body)
        return Conversation(body, raw, pieces, self.items(pieces), digests, chain)

    def parts(self, piece: Piece, counter: PartCounter) -> list[Part]:
        """One part per content block (a string content is one ``TEXT`` part)."""
        content = piece.get("content")
        if isinstance(content, str):
            return [Part(TEXT, counter.count_text(content), content)]
        out: list[Part] = []
        for block in _blocks(piece):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                out.append(Part(TEXT, price_part(block, counter), block))
            elif kind in _MEDIA:
                out.append(Part(MEDIA, price_part(block, counter), block))
            elif kind == "tool_use":
                out.append(Part(TOOL_CALL, price_part(block, counter), block, _str(block.get("id"))))
            elif kind == "tool_result":
                out.append(Part(TOOL_RESULT, price_part(block, counter), block, _str(block.get("tool_use_id"))))
            elif kind in _SIGNED:
                out.append(Part(OPAQUE_PART, price_part(block, counter), block))
            else:
                out.append(Part(OTHER, price_part(block, counter), block))
        return out

    def price(self, piece: Piece, counter: PartCounter) -> int:
        """Tokens of one piece, framing included (``pricing.price_message``: a message frame, the
        ``role``'s text, the blocks' costs; the estimate chat pieces get)."""
        return price_message(piece, counter)

    def tool_schemas(self, tools: list[Any]) -> list[object]:
        """``pricing.tool_schemas`` (a Messages tool, ``name``/``description``/``input_schema``, is
        priced whole)."""
        return tool_schemas(tools)

    def part_text(self, part: Part) -> str | None:
        """A string content, a ``text`` block's text, a ``tool_result``'s string ``content``."""
        return block_text(part.native)

    def with_text(self, part: Part, text: str) -> object:
        return block_with_text(part.native, text)

    def tool_call(self, part: Part) -> ToolCall | None:
        """A ``tool_use`` block's ``name`` and ``input``."""
        found = tool_use_call(part.native)
        return ToolCall(*found) if found is not None else None

    def with_arguments(self, part: Part, arguments: object) -> object:
        return tool_use_with_input(part.native, arguments)

    def inline_media(self, part: Part) -> tuple[str, str] | None:
        """A base64 ``image`` block as a ``data:`` URL and its media type."""
        return inline_image(part.native)

    def inner_media(self, part: Part) -> list[tuple[int, str, str]]:
        """The base64 ``image`` blocks inside a ``tool_result``'s block content (a screenshot a tool
        returned): ``(index in that content, data URL, media type)``."""
        native = part.native
        inner = native.get("content") if isinstance(native, dict) and native.get("type") == "tool_result" else None
        if not isinstance(inner, list):
            return []
        return [(j, *found) for j, block in enumerate(inner) if (found := inline_image(block)) is not None]

    def with_inner(self, part: Part, new: Mapping[int, object]) -> object:
        """The ``tool_result`` block with the blocks of its content at the indices of ``new``
        replaced (its ``tool_use_id``, ``is_error``, ``cache_control`` kept). Raises ``ValueError``
        for a part with no block content."""
        native = part.native
        if not isinstance(native, dict) or native.get("type") != "tool_result" or not isinstance(
                native.get("content"), list):
            raise ValueError("this part holds no blocks")
        block: dict[str, Any] = native
        return {**block, "content": [new.get(j, inner) for j, inner in enumerate(block["content"])]}

    def text_part(self, text: str) -> object:
        """``{"type": "text", "text": text}``."""
        return text_block(text)

    def with_parts(self, piece: Piece, new: Mapping[int, object]) -> Piece:
        """``piece`` with the content blocks at the indices of ``new`` replaced (a string content is
        part 0); its other keys (``cache_control`` on the blocks included) kept."""
        content = piece.get("content")
        count = len(content) if isinstance(content, list) else 1 if isinstance(content, str) else 0
        return content_with(piece, dict(new), count)

    def render_part(self, piece: Piece, part: Part) -> str | None:
        """``blocks.render_block`` (a ``thinking`` block shows as its JSON, like any other)."""
        return render_block(part.native)

    def transcript_frame(self, piece: Piece) -> tuple[str, list[str]]:
        """Header: the role; lines: every other non-empty field as ``[field] value``."""
        role = piece.get("role", "?")
        lines = [f"[{k}] {v if isinstance(v, str) else json_text(v)}" for k, v in piece.items()
                 if k not in ("role", "content") and v is not None and v != "" and v != [] and v != {}]
        return (role if isinstance(role, str) else json_text(role)), lines

    def text_piece(self, piece: Piece, text: str) -> Piece:
        """``{"role": role, "content": text}``."""
        return {"role": piece.get("role"), "content": text}

    def insert_answers(self, pieces: list[Piece], found: list[tuple[int, list[str]]],
                       text: str = CANCELLED_TEXT) -> list[Piece]:
        """Answers go inside the next turn: ``tool_result`` blocks (``is_error``) at the start of the
        ``user`` turn at ``insert_at`` (a copy of it), or in a new ``user`` turn there."""
        out = list(pieces)
        for insert_at, ids in reversed(found):
            blocks: list[Any] = [{"type": "tool_result", "tool_use_id": cid, "content": text, "is_error": True}
                                 for cid in ids]
            nxt = out[insert_at] if insert_at < len(out) else None
            if nxt is not None and nxt.get("role") == "user":
                content = nxt.get("content")
                rest = [{"type": "text", "text": content}] if isinstance(content, str) else list(_blocks(nxt))
                out[insert_at] = {**nxt, "content": blocks + rest}
            else:
                out.insert(insert_at, {"role": "user", "content": blocks})
        return out

    def unsigned(self, piece: Piece) -> Piece | None:
        """The turn without its signed ``thinking``/``redacted_thinking`` blocks (the API binds them to
        the conversation before them: after the proxy changed that, they would be rejected or
        dropped by the API, and the docs allow leaving out an earlier turn's thinking); a turn left
        with no block gets ``UNSIGNED_PLACEHOLDER`` as its text (never an empty turn or text block).
        ``None`` when the turn holds no signed block."""
        blocks = _blocks(piece)
        if not any(map(_signed, blocks)):
            return None
        kept = [b for b in blocks if not _signed(b)]
        return {**piece, "content": kept or [text_block(UNSIGNED_PLACEHOLDER)]}

    def user_text(self, piece: Piece) -> str:
        """What the turn says: ``canonical.text_of`` its content (a string, or the ``text`` of its
        blocks joined by newlines), without the contents of its ``tool_result`` blocks (results,
        not words)."""
        content = piece.get("content")
        if isinstance(content, list):
            content = [b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result")]
        return text_of(content)

    def apply(self, body: Mapping[str, Any], raw: bytes, pieces: list[Piece],
              extra: Mapping[str, Any] | None = None) -> tuple[bytes, dict[str, Any] | None]:
        """The client's bytes when ``pieces`` are the body's own (``pieces(body)``) and no ``extra``;
        else the body with ``system`` and ``messages`` from the pieces (other fields kept, in order)."""
        if not extra and pieces == self.pieces(body):
            return raw, None
        forwarded = dict(body)
        rest = pieces
        if pieces and pieces[0].get("role") == "system":
            forwarded["system"] = pieces[0].get("content")
            rest = pieces[1:]
        forwarded["messages"] = rest
        if extra:
            forwarded.update(extra)
        return dumps(forwarded), forwarded


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


MESSAGES = MessagesCodec()
"""The Messages codec (stateless)."""
