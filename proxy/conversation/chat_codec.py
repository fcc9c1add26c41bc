"""The chat-completions codec: ``messages`` <-> the neutral model (``proxy.conversation.codec``).

Pieces are the body's ``messages`` themselves. Items (``item``), by the message's ``role``:

- a role the proxy does not know (``canonical.is_known_role``: Llama's ``ipython``, a vendor's,
  none, not a string): ``OPAQUE``, bound to the message before it;
- ``tool``/``function``: ``TOOL``, bound to the message before it, answering its
  ``tool_call_id``;
- ``system``/``developer``: ``SYSTEM``;
- ``user``: ``USER``, or ``RESULTS`` when its content list carries Anthropic-style
  ``tool_result`` blocks (bound to the message before it);
- ``assistant``: ``ASSISTANT``, its ``calls`` the string ids of its ``tool_calls``.

Any message carrying ``tool_result`` blocks is a tool answer (``Item.is_answer``) and bound to the
message before it. ``tool_use`` blocks in chat content are not ``calls`` (their answers live inside
the next message: never patched). Nothing in chat is sealed: no chat field is signed.

``apply`` forwards the client's bytes when the messages are the body's own; otherwise the body with
``messages`` replaced (``orjson``; key order and every other field kept, so the bytes are those
the proxy forwarded before the model existed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from proxy.conversation.blocks import (
    block_text,
    block_with_text,
    content_count,
    content_with,
    inline_image,
    json_text,
    render_block,
    text_block,
    tool_use_call,
    tool_use_with_input,
)
from proxy.conversation.canonical import ROLES, is_known_role, text_of
from proxy.conversation.codec import PartCounter, ToolCall
from proxy.conversation.model import (
    ASSISTANT,
    BINDS_NONE,
    BINDS_PREVIOUS,
    CANCELLED_TEXT,
    MEDIA,
    OPAQUE,
    OTHER,
    RESULTS,
    SYSTEM,
    TEXT,
    TOOL,
    TOOL_CALL,
    TOOL_RESULT,
    USER,
    Conversation,
    Item,
    Part,
    Piece,
)
from proxy.conversation.pricing import price_message, price_part, price_tool_call, tool_schemas
from proxy.json_depth import dumps

_ANSWER_ROLES = frozenset({"tool", "function"})
_SYSTEM_ROLES = frozenset({"system", "developer"})
_MEDIA_TYPES = frozenset({"image_url", "input_audio", "file", "image", "document"})
_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})

def _build_common() -> dict[tuple[str, str | None, bool], Item]:
    table: dict[tuple[str, str | None, bool], Item] = {}
    for role in ROLES:
        kind = (TOOL if role in _ANSWER_ROLES else SYSTEM if role in _SYSTEM_ROLES else USER if role == "user"
                else ASSISTANT)
        for answer in (False, True):
            binds = BINDS_PREVIOUS if answer or kind == TOOL else BINDS_NONE
            table[(kind, role, answer)] = Item(kind, role, is_answer=answer or kind == TOOL, binds=binds)
        if role == "user":
            table[(RESULTS, role, True)] = Item(RESULTS, role, is_answer=True, binds=BINDS_PREVIOUS)
    return table


_COMMON = MappingProxyType(_build_common())
"""Items without call ids for every known role (most messages): one shared object each (a constant)."""


def has_tool_result_blocks(message: Piece) -> bool:
    """True if ``message`` carries Anthropic ``tool_result`` blocks in a content list."""
    content = message.get("content")
    if content.__class__ is not list:
        return False
    return any(p.__class__ is dict and p.get("type") == "tool_result" for p in content)


def call_ids(message: Piece) -> tuple[str, ...]:
    """String ids of an assistant message's ``tool_calls`` (none for any other role)."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or calls.__class__ is not list:
        return ()
    return tuple(c["id"] for c in calls if c.__class__ is dict and c.get("id").__class__ is str)


def chat_item(message: Piece) -> Item:
    """The ``Item`` of one chat message (rules in the module docstring)."""
    role = message.get("role")
    blocks = has_tool_result_blocks(message)
    if not is_known_role(message):
        return Item(OPAQUE, role if role.__class__ is str else None, is_answer=blocks, binds=BINDS_PREVIOUS)
    if role in _ANSWER_ROLES:
        answered = message.get("tool_call_id")
        if answered.__class__ is str:
            return Item(TOOL, role, answers=(answered,), is_answer=True, binds=BINDS_PREVIOUS)
        return _COMMON[(TOOL, role, True)]
    assert role.__class__ is str  # a known role
    if role in _SYSTEM_ROLES:
        return _COMMON[(SYSTEM, role, blocks)]
    if role == "user":
        return _COMMON[(RESULTS if blocks else USER, role, blocks)]
    calls = call_ids(message)
    if calls:
        return Item(ASSISTANT, role, calls=calls, is_answer=blocks, binds=BINDS_PREVIOUS if blocks else BINDS_NONE)
    return _COMMON[(ASSISTANT, role, blocks)]


class ChatCodec:
    """The codec of ``POST /chat/completions`` (see the module docstring). Stateless."""

    name = "chat"
    binds_prefix = False

    def pieces(self, body: Mapping[str, Any]) -> list[Piece]:
        """The body's ``messages`` (the list itself)."""
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []

    def item(self, piece: Piece) -> Item:
        return chat_item(piece)

    def items(self, pieces: Sequence[Piece]) -> list[Item]:
        return list(map(chat_item, pieces))

    def parse(self, body: dict[str, Any], raw: bytes, digests: list[str], chain: list[str]) -> Conversation:
        """The conversation of a chat body the route accepted (``chat_request.parse_chat_request``)."""
        pieces = self.pieces(body)
        return Conversation(body, raw, pieces, self.items(pieces), digests, chain)

    def parts(self, piece: Piece, counter: PartCounter) -> list[Part]:
        """The parts of one message, in order: its ``content`` (a string is one ``TEXT`` part; a list
        gives one part per element), then one ``TOOL_CALL`` part per ``tool_calls`` entry. A
        ``tool``/``function`` message's text is its ``TOOL_RESULT``. Costs (no message framing):
        ``proxy.conversation.pricing.price_part`` / ``price_tool_call`` through ``counter``."""
        out: list[Part] = []
        answered = piece.get("tool_call_id")
        call_id = answered if answered.__class__ is str else None
        role = piece.get("role")
        is_answer = role.__class__ is str and role in _ANSWER_ROLES
        content = piece.get("content")
        if content.__class__ is str:
            out.append(Part(TOOL_RESULT if is_answer else TEXT, counter.count_text(content), content,
                            call_id if is_answer else None))
        elif content.__class__ is list:
            for part in content:
                out.append(Part(_part_kind(part, is_answer), price_part(part, counter), part, _part_call_id(part)))
        elif content is not None:
            out.append(Part(OTHER, price_part(content, counter), content))
        calls = piece.get("tool_calls")
        if calls.__class__ is list:
            for call in calls:
                cid = call.get("id") if call.__class__ is dict else None
                out.append(Part(TOOL_CALL, price_tool_call(call, counter), call,
                                cid if cid.__class__ is str else None, "tool_calls"))
        return out

    def price(self, piece: Piece, counter: PartCounter) -> int:
        """Tokens of one message, framing included (``pricing.price_message``: OpenAI's documented
        accounting, 3 per message and 1 per ``name``, plus every field's text or JSON)."""
        return price_message(piece, counter)

    def tool_schemas(self, tools: list[Any]) -> list[object]:
        """``pricing.tool_schemas``: a function tool's name/description/parameters, else the entry."""
        return tool_schemas(tools)

    def part_text(self, part: Part) -> str | None:
        """A content part's text (``blocks.block_text``: a string content, a ``text`` part, a
        ``tool_result`` block with string content); ``None`` for a tool call and anything else."""
        return block_text(part.native) if part.field == "content" else None

    def with_text(self, part: Part, text: str) -> object:
        if part.field != "content":
            raise ValueError("a tool call has no text to replace")
        return block_with_text(part.native, text)

    def tool_call(self, part: Part) -> ToolCall | None:
        """A ``tool_calls`` entry with a ``function`` object whose ``arguments`` is a string
        (name and arguments as sent), or a ``tool_use`` content block (name and ``input``)."""
        native = part.native
        if part.field == "tool_calls":
            fn = native.get("function") if isinstance(native, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            return ToolCall(fn.get("name"), args) if isinstance(fn, dict) and isinstance(args, str) else None
        found = tool_use_call(native)
        return ToolCall(*found) if found is not None else None

    def with_arguments(self, part: Part, arguments: object) -> object:
        if part.field != "tool_calls":
            return tool_use_with_input(part.native, arguments)
        if self.tool_call(part) is None:
            raise ValueError("not a tool call with string arguments")
        call: dict[str, Any] = part.native  # type: ignore[assignment]  # checked by tool_call
        return {**call, "function": {**call["function"], "arguments": arguments}}

    def inline_media(self, part: Part) -> tuple[str, str] | None:
        """``blocks.inline_image`` of a content part (``image_url`` with a ``data:`` URL, a base64
        ``image`` block)."""
        return inline_image(part.native) if part.field == "content" else None

    def inner_media(self, part: Part) -> list[tuple[int, str, str]]:
        """``[]``: a chat part holds no parts of its own."""
        return []

    def with_inner(self, part: Part, new: Mapping[int, object]) -> object:
        raise ValueError("a chat part holds no parts of its own")

    def text_part(self, text: str) -> object:
        """``{"type": "text", "text": text}``."""
        return text_block(text)

    def with_parts(self, piece: Piece, new: Mapping[int, object]) -> Piece:
        """``piece`` with its content parts and ``tool_calls`` entries at the indices of ``new``
        replaced (indices as ``parts`` gives them: content first, then ``tool_calls``)."""
        if not new:
            return piece
        n = content_count(piece)
        out = content_with(piece, dict(new), n)
        calls = piece.get("tool_calls")
        mine = {i - n: v for i, v in new.items() if i >= n}
        if mine and isinstance(calls, list):
            replaced = list(calls)
            for i, value in mine.items():
                replaced[i] = value
            out = {**out, "tool_calls": replaced}
        return out

    def render_part(self, piece: Piece, part: Part) -> str | None:
        """A content part by ``blocks.render_block`` (a content that is neither a string nor a list:
        its JSON); a ``tool_calls`` entry as ``-> tool call NAME (id ID): ARGUMENTS`` (``None``
        for an entry that is not an object)."""
        native = part.native
        if part.field == "tool_calls":
            if not isinstance(native, dict):
                return None
            fn: dict[str, Any] = native["function"] if isinstance(native.get("function"), dict) else {}
            return f"-> tool call {fn.get('name')} (id {native.get('id')}): {fn.get('arguments')}"
        if native is piece.get("content") and not isinstance(native, str):
            return json_text(native)
        return render_block(native)

    def transcript_frame(self, piece: Piece) -> tuple[str, list[str]]:
        """Header: the role (``?`` when absent, JSON when not a string), `` (NAME)``, `` [answer to
        call ID]``. Lines: a legacy ``function_call`` as ``-> function call NAME: ARGUMENTS``, then
        every other non-empty field as ``[field] value`` (a vendor's, DeepSeek's
        ``reasoning_content``)."""
        header = _field_text(piece.get("role", "?"))
        if piece.get("name"):
            header += f" ({piece['name']})"
        if piece.get("tool_call_id"):
            header += f" [answer to call {piece['tool_call_id']}]"
        lines: list[str] = []
        legacy = piece.get("function_call")
        if isinstance(legacy, dict):
            lines.append(f"-> function call {legacy.get('name')}: {legacy.get('arguments')}")
        for key, value in piece.items():
            if key not in _RENDERED_FIELDS and value is not None and value != "" and value != [] and value != {}:
                lines.append(f"[{key}] {_field_text(value)}")
        return header, lines

    def text_piece(self, piece: Piece, text: str) -> Piece:
        """``{role, name, tool_call_id}`` of ``piece`` (those it has) and ``content: text``."""
        kept: Piece = {k: piece[k] for k in ("role", "name", "tool_call_id") if k in piece}
        return {**kept, "content": text}

    def answer(self, call_id: str, text: str = CANCELLED_TEXT) -> Piece:
        """The synthetic ``tool`` message answering ``call_id``."""
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def insert_answers(self, pieces: list[Piece], found: list[tuple[int, list[str]]],
                       text: str = CANCELLED_TEXT) -> list[Piece]:
        """``pieces`` with a synthetic answer for each ``(insert_at, ids)`` of ``found`` inserted at
        ``insert_at`` (a new list; the pieces themselves are shared)."""
        out: list[Piece] = []
        prev = 0
        for insert_at, ids in found:
            out.extend(pieces[prev:insert_at])
            out.extend(self.answer(cid, text) for cid in ids)
            prev = insert_at
        out.extend(pieces[prev:])
        return out

    def user_text(self, piece: Piece) -> str:
        """``canonical.text_of`` the message's ``content`` (as before the codec)."""
        return text_of(piece.get("content"))

    def unsigned(self, piece: Piece) -> Piece | None:
        """``None``: a chat message holds nothing signed."""
        return None

    def apply(self, body: Mapping[str, Any], raw: bytes, messages: list[Piece],
              extra: Mapping[str, Any] | None = None) -> tuple[bytes, dict[str, Any] | None]:
        """``(bytes to forward, the body they encode or None)``: ``raw`` itself when ``messages`` is (or
        equals) the body's own list and no ``extra`` field is set; else ``body`` with ``messages``
        replaced and ``extra`` set, serialized by orjson (at any depth: ``proxy.json_depth``)."""
        native = body.get("messages")
        if not extra and (messages is native or messages == native):
            return raw, None
        forwarded = {**body, "messages": messages}  # ``messages`` keeps its place in the key order
        if extra:
            forwarded.update(extra)
        return dumps(forwarded), forwarded


_RENDERED_FIELDS = frozenset({"role", "name", "tool_call_id", "content", "tool_calls", "function_call"})
"""Fields a chat transcript shows in its header or parts (every other one as ``[field] value``)."""


def _field_text(value: Any) -> str:
    return value if isinstance(value, str) else json_text(value)


def _part_kind(part: Any, is_answer: bool) -> str:
    if part.__class__ is not dict:
        return OTHER  # a bare string inside a list is no content part of the API: kept as sent
    kind = part.get("type")
    if kind == "tool_result":
        return TOOL_RESULT
    if kind == "tool_use":
        return TOOL_CALL
    if kind in _TEXT_TYPES or (kind is None and part.get("text").__class__ is str):
        return TOOL_RESULT if is_answer else TEXT
    if kind in _MEDIA_TYPES or "image_url" in part:
        return MEDIA
    return OTHER


def _part_call_id(part: Any) -> str | None:
    if part.__class__ is not dict:
        return None
    cid = part.get("tool_use_id") if part.get("type") == "tool_result" else part.get("id")
    return cid if cid.__class__ is str and part.get("type") in ("tool_result", "tool_use") else None


CHAT = ChatCodec()
"""The chat codec (stateless: one instance serves every request)."""
