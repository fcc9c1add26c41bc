"""What chat and Anthropic-style pieces are made of, for a token counter to price (no tiktoken here).

A codec prices a piece as the sum of what it is made of: its framing (``PartCounter.count_frame``:
per-message overhead, a ``name``, per-tool-call overhead), its texts (``count_text``), its JSON
values (``count_json``) and its media (``count_image_url`` and friends). The counter knows no API
shape; these functions know the shapes of chat-completions messages and of the Anthropic-style
blocks that may appear in their content (and in Messages pieces). Pure; counts are tokens; nothing
raises for any JSON value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.conversation.codec import PartCounter

_TEXT_KINDS = (None, "text", "input_text", "output_text")


def price_part(part: object, counter: PartCounter) -> int:
    """Tokens of one content part (no message framing). Text parts: their text. ``image_url``:
    ``counter.count_image_url`` (a string URL, or ``url``/``detail``). ``input_audio`` with string
    ``data``: ``count_audio``. ``file``: ``count_file_data`` of its ``file_data`` data-URL payload.
    ``refusal``: its text. Anthropic blocks: ``tool_use`` = one tool-call frame + name + JSON
    ``input``; ``tool_result`` = one tool-call frame + its content (``price_content``); ``image``/
    ``document`` = their ``source`` (``price_source``); ``thinking``: its text, or with none its
    ``signature`` (``signature_tokens``). Anything else (a
    non-dict included): its compact JSON."""
    if isinstance(part, str):
        return counter.count_text(part)
    if not isinstance(part, dict):
        return counter.count_json(part)
    kind = part.get("type")
    if isinstance(part.get("text"), str) and kind in _TEXT_KINDS:
        return counter.count_text(part["text"])
    if kind == "image_url" or "image_url" in part:
        image_url = part.get("image_url")
        url, detail = (image_url, "auto") if isinstance(image_url, str) else ("", "auto")
        if isinstance(image_url, dict):
            url, detail = str(image_url.get("url") or ""), image_url.get("detail") or "auto"
        return counter.count_image_url(url, detail)
    if kind == "input_audio":
        audio = part.get("input_audio") or {}
        data = audio.get("data") if isinstance(audio, dict) else None
        if not isinstance(data, str):
            return counter.count_json(part)
        return counter.count_audio(data, str(audio.get("format")))
    if kind == "file":
        file = part.get("file") or {}
        return counter.count_file_data(str(file.get("file_data") or "") if isinstance(file, dict) else None,
                                       data_url=True)
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return counter.count_text(part["refusal"])
    if kind == "tool_use":
        return (counter.count_frame(tool_calls=1) + counter.count_text(str(part.get("name") or ""))
                + counter.count_json(part.get("input") or {}))
    if kind == "tool_result":
        return counter.count_frame(tool_calls=1) + price_content(part.get("content"), counter)
    if kind in ("image", "document"):
        return price_source(kind, part.get("source"), counter)
    if kind == "thinking" and isinstance(part.get("thinking"), str) and part["thinking"]:
        return counter.count_text(part["thinking"])
    if kind == "thinking" and isinstance(part.get("signature"), str):
        return signature_tokens(part["signature"])
    return counter.count_json(part)


SIGNATURE_BYTES_PER_TOKEN = 4
"""An omitted thinking's tokens, estimated from its signature: the base64 carries the thinking
encrypted, about its size in bytes, at about 4 bytes a token."""


def signature_tokens(signature: str) -> int:
    """Tokens of a ``thinking`` block sent with empty text and only a ``signature`` (adaptive
    thinking with the text omitted, as Claude Code sends it): the signature's decoded bytes at
    ``SIGNATURE_BYTES_PER_TOKEN`` (what the provider counts is the thinking it carries, not the
    empty text)."""
    return -(-len(signature) * 3 // 4 // SIGNATURE_BYTES_PER_TOKEN)


def price_source(kind: str, source: object, counter: PartCounter) -> int:
    """Tokens of an Anthropic ``image``/``document`` block's ``source``: ``{"type": "text", "data"}``
    its text; ``{"type": "base64", "data"}`` ``count_image_data``/``count_file_data``; anything else
    the unknown price of its kind (``count_image_data(None)`` / ``count_file_data(None)``)."""
    data = source.get("data") if isinstance(source, dict) else None
    if isinstance(source, dict) and source.get("type") == "text" and isinstance(data, str):
        return counter.count_text(data)
    if not isinstance(source, dict) or source.get("type") != "base64" or not isinstance(data, str):
        data = None
    if kind == "image":
        return counter.count_image_data(data)
    return counter.count_file_data(data)


def price_content(content: object, counter: PartCounter) -> int:
    """Tokens of a ``content`` value: a string's text, a list's parts (``price_part``), ``None`` 0,
    anything else its compact JSON."""
    if content is None:
        return 0
    if isinstance(content, str):
        return counter.count_text(content)
    if isinstance(content, list):
        return sum(price_part(part, counter) for part in content)
    return counter.count_json(content)


def price_tool_call(call: object, counter: PartCounter) -> int:
    """Tokens of one ``tool_calls`` entry: a tool-call frame + its ``function``'s name + arguments (a
    string as text, anything else as JSON); an entry without a ``function`` object: its JSON."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return counter.count_json(call)
    args = fn.get("arguments")
    return (counter.count_frame(tool_calls=1) + counter.count_text(str(fn.get("name") or ""))
            + (counter.count_text(args) if isinstance(args, str) else counter.count_json(args)))


def price_message(message: dict[str, Any], counter: PartCounter) -> int:
    """Tokens of one message-shaped piece including its framing: one message frame; ``content``
    (``price_content``); ``tool_calls`` (a list: each ``price_tool_call``; else its JSON); a
    ``function_call`` object as one tool call; every other string field its text (``name`` plus a
    name frame); every other non-``None`` field its compact JSON. Unknown fields count too: the
    provider sees them."""
    n = counter.count_frame(messages=1)
    for field, value in message.items():
        if value is None:
            continue
        if field == "content":
            n += price_content(value, counter)
        elif field == "tool_calls":
            n += (sum(price_tool_call(c, counter) for c in value) if isinstance(value, list)
                  else counter.count_json(value))
        elif field == "function_call" and isinstance(value, dict):
            n += price_tool_call({"function": value}, counter)
        elif isinstance(value, str):
            n += counter.count_text(value)
            if field == "name":
                n += counter.count_frame(names=1)
        else:
            n += counter.count_json(value)
    return n


def tool_schemas(tools: list[Any]) -> list[object]:
    """What each tool schema of a request is made of, for ``count_json``: a ``function`` tool's
    ``name``/``description``/``parameters`` (those not ``None``), any other entry whole."""
    out: list[object] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict):
            out.append({k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None})
        else:
            out.append(tool)
    return out
