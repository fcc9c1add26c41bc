"""Native content parts that chat and Messages share: their reading and rewriting for the codecs.

Chat content lists and Messages content carry the same part objects: ``{"type": "text", "text"}``,
Anthropic ``tool_use`` (``id``, ``name``, ``input``: a JSON value), ``tool_result``
(``tool_use_id``, ``content``: a string or blocks), ``image`` (``source``: ``{"type": "base64",
"media_type", "data"}``), and chat's ``image_url`` (``{"url"}`` or a bare URL string). A bare string
is a part too (chat and Messages string ``content``).

The transcript renderings (``render_block``, ``render_content``) are those of the summary requests
since before the codecs: the bytes of a chat summary request depend on them.

Every function is pure: a rewrite returns a new object (the other keys keep their values and
places), never mutates its input, and raises nothing for a part of any other shape (it reads as
``None``: no text, no call, no media).
"""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.conversation.model import Piece
from proxy.json_depth import dumps


def block_text(native: object) -> str | None:
    """The text of a part a defense may read and rewrite: a bare string; a ``text`` part's ``text``;
    a ``tool_result`` block's ``content`` when it is a string. ``None`` for anything else (a
    ``tool_result`` with block content, ``input_text``, an untyped part: kept as sent)."""
    if isinstance(native, str):
        return native
    if not isinstance(native, dict):
        return None
    kind = native.get("type")
    value = native.get("text") if kind == "text" else native.get("content") if kind == "tool_result" else None
    return value if isinstance(value, str) else None


def block_with_text(native: object, text: str) -> object:
    """``native`` with the text ``block_text`` reads replaced by ``text`` (a bare string becomes
    ``text``). Raises ``ValueError`` for a part ``block_text`` gives no text for."""
    if block_text(native) is None:
        raise ValueError("this part has no text to replace")
    if isinstance(native, str):
        return text
    assert isinstance(native, dict)
    return {**native, "text" if native.get("type") == "text" else "content": text}


def tool_use_call(native: object) -> tuple[object, object] | None:
    """``(name, input)`` of an Anthropic ``tool_use`` block (either may be any JSON value), else ``None``."""
    if not isinstance(native, dict) or native.get("type") != "tool_use":
        return None
    return native.get("name"), native.get("input")


def tool_use_with_input(native: object, arguments: object) -> object:
    """A ``tool_use`` block with ``input`` replaced (``ValueError`` for any other part)."""
    if tool_use_call(native) is None:
        raise ValueError("not a tool_use block")
    assert isinstance(native, dict)
    return {**native, "input": arguments}


MAX_MEDIA_TYPE_CHARS = 127
"""RFC 6838 §4.2's bound on a type or subtype name; a longer media type is not one."""
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*")
UNKNOWN_MEDIA_TYPE = "application/octet-stream"


def media_type_of(value: object) -> str:
    """``value`` when it is a ``type/subtype`` media type of at most ``MAX_MEDIA_TYPE_CHARS``
    characters (RFC 6838's name characters), else ``application/octet-stream``: the client names
    it, and it becomes a stub's text and an indexed column (PostgreSQL refuses index rows past
    2,704 bytes)."""
    if isinstance(value, str) and len(value) <= MAX_MEDIA_TYPE_CHARS and _MEDIA_TYPE.fullmatch(value):
        return value
    return UNKNOWN_MEDIA_TYPE


def inline_image(native: object) -> tuple[str, str] | None:
    """``(data_url, media_type)`` of an inline image part: chat ``image_url`` with a ``data:`` URL,
    Anthropic ``image`` with a ``base64`` source (as a ``data:`` URL). ``None`` otherwise (remote
    ``http(s)`` URLs are small and left alone). ``media_type`` is bounded (``media_type_of``); the
    chat URL is kept as sent."""
    if not isinstance(native, dict):
        return None
    part: dict[str, Any] = native
    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if isinstance(url, str) and url.startswith("data:"):
            return url, media_type_of(url[5:].split(";", 1)[0].split(",", 1)[0])
    if part.get("type") == "image":
        source = part.get("source")
        if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
            media_type = media_type_of(source.get("media_type"))
            return f"data:{media_type};base64,{source['data']}", media_type
    return None


def text_block(text: str) -> dict[str, Any]:
    """A ``{"type": "text", "text": text}`` part."""
    return {"type": "text", "text": text}


def content_with(piece: Piece, new: dict[int, object], count: int) -> Piece:
    """``piece`` with the parts of its ``content`` at the indices of ``new`` (below ``count``, the
    number of content parts) replaced: a string content (one part) becomes ``new[0]``, a list is
    copied with those elements replaced. Returns ``piece`` itself when no index is below ``count``."""
    mine = {i: v for i, v in new.items() if i < count}
    if not mine:
        return piece
    content = piece.get("content")
    if isinstance(content, list):
        replaced = list(content)
        for i, value in mine.items():
            replaced[i] = value
        return {**piece, "content": replaced}
    return {**piece, "content": mine[0]}


def content_count(piece: Piece) -> int:
    """How many parts a piece's ``content`` gives in chat (a list: one per element; ``None``: none;
    anything else: one)."""
    content = piece.get("content")
    if isinstance(content, list):
        return len(content)
    return 0 if content is None else 1


def json_text(value: object) -> str:
    """``value`` as deterministic JSON text for a transcript (keys sorted, non-ASCII kept); one
    nested deeper than the stdlib's writer recurses, as orjson's compact text (``proxy.json_depth``)."""
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except RecursionError:
        return dumps(value, sort_keys=True).decode()


def render_block(native: object) -> str:
    """How a content part reads in a summary transcript: a ``text`` part's text; an ``image_url``
    as ``[image: URL]`` (``[image: inline data, N chars]`` for a ``data:`` URL); a ``tool_use``
    as ``-> tool call NAME (id ID): INPUT-JSON``; a ``tool_result`` as ``<- tool result (id ID):``
    and its content below; any other object as its JSON; anything not an object as ``str()``."""
    if not isinstance(native, dict):
        return str(native)
    kind = native.get("type")
    if kind == "text":
        return str(native.get("text", ""))
    if kind == "image_url":
        image = native.get("image_url")
        url = str(image.get("url") if isinstance(image, dict) else image)
        return f"[image: inline data, {len(url)} chars]" if url.startswith("data:") else f"[image: {url}]"
    if kind == "tool_use":
        return f"-> tool call {native.get('name')} (id {native.get('id')}): {json_text(native.get('input'))}"
    if kind == "tool_result":
        return f"<- tool result (id {native.get('tool_use_id')}):\n{render_content(native.get('content'))}"
    return json_text(native)


def render_content(content: object) -> str:
    """A whole ``content`` value as transcript text: ``None`` is empty, a string itself, a list its
    parts' ``render_block`` one per line, anything else its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(render_block(p) for p in content)
    return json_text(content)
