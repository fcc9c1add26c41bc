"""What the defenses' shell needs to know of each provider API: its codec, how a summary call is
made and read, how its ``usage`` states the prompt's size.

One ``ProviderApi`` per API the proxy compacts (``CHAT_API``: ``POST /chat/completions``;
``MESSAGES_API``: Anthropic's ``POST /v1/messages``); a ``ProjectingCompactor`` is built for one
(``proxy.app``: one per upstream). Pure: no I/O (``proxy.compaction.summarizer`` makes the call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson

from proxy.conversation.chat_codec import CHAT
from proxy.conversation.codec import Codec
from proxy.conversation.messages_codec import MESSAGES
from proxy.defenses.summarize import build_summary_request_messages
from proxy.json_text import parse_json
from proxy.upstream.urls import UPSTREAM_CHAT_PATH

MESSAGES_PATH = "/v1/messages"
"""Where an Anthropic summary call goes (the upstream URL has no ``/v1``: Anthropic's clients add it)."""


class UnusableReply(ValueError):
    """A summary call's reply holds no text the proxy can use (``args[0]`` says why)."""


def summary_request_body(model: str, client_body: Mapping[str, Any], previous: str | None, transcript: str,
                         reply_tokens: int) -> dict[str, Any]:
    """The body of one chat summary call: ``model``, the summary prompt, and ``reply_tokens`` under
    the token-limit field the client used (``max_completion_tokens`` or ``max_tokens``; neither when
    the client set neither, case 028). Never ``stream``/``stream_options`` (case 029)."""
    body: dict[str, Any] = {"model": model, "messages": build_summary_request_messages(previous, transcript)}
    if "max_completion_tokens" in client_body:
        body["max_completion_tokens"] = reply_tokens
    elif "max_tokens" in client_body:
        body["max_tokens"] = reply_tokens
    return body


def messages_summary_body(model: str, client_body: Mapping[str, Any], previous: str | None, transcript: str,
                          reply_tokens: int) -> dict[str, Any]:
    """The body of one Messages summary call: ``model``, ``max_tokens`` (the API requires it:
    ``reply_tokens``) and the summary prompt as the one ``user`` turn. Nothing else of the
    client's: no ``system`` (its instructions are not the summarizer's), no ``thinking`` (a summary
    needs none, and its signed blocks would only cost), no ``tools``, never ``stream``."""
    return {"model": model, "max_tokens": reply_tokens,
            "messages": [{"role": m["role"], "content": m["content"]}
                         for m in build_summary_request_messages(previous, transcript)]}


def chat_reply_text(data: bytes) -> str:
    """The text of a ``chat.completion`` (choice 0's ``message.content``). Raises ``UnusableReply``."""
    try:
        text = parse_json(data)["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise UnusableReply("unusable summary reply") from exc
    if not isinstance(text, str):
        raise UnusableReply("unusable summary reply")
    return text


def messages_reply_text(data: bytes) -> str:
    """The text of a Message: its ``text`` blocks joined by newlines (a ``thinking`` block, if a
    model adds one, is not the summary). Raises ``UnusableReply``."""
    try:
        content = parse_json(data)["content"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise UnusableReply("unusable summary reply") from exc
    if not isinstance(content, list):
        raise UnusableReply("unusable summary reply")
    return "\n".join(b["text"] for b in content
                     if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


def chat_prompt_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A chat ``usage`` as it is (``prompt_tokens``: the whole prompt)."""
    return usage


def messages_prompt_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """A Messages ``usage`` as ``{"prompt_tokens": N}``: the whole prompt is ``input_tokens`` plus
    ``cache_creation_input_tokens`` plus ``cache_read_input_tokens`` (Anthropic counts the cached
    parts apart); ``None`` without an integer ``input_tokens``."""
    if not isinstance(usage, dict):
        return None
    total = 0
    for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total += value
        elif name == "input_tokens":
            return None
    return {"prompt_tokens": total}


CLIENT_COMPACTION_ASKS = ("detailed summary of the conversation",)
"""What the last user turn of Claude Code's own compaction request asks (its wording, as sent:
"Your task is to create a detailed summary of the conversation so far, ...")."""
CLIENT_COMPACTION_SYSTEMS = ("tasked with summarizing conversations",)
"""What the system prompt of Claude Code's compaction request says ("You are a helpful AI assistant
tasked with summarizing conversations.")."""
MAX_MATCHED_CHARS = 20_000
"""Only this much of the last user text and of the system prompt is searched (bounded work per request)."""


def never_client_compaction(body: Mapping[str, Any]) -> bool:
    """Chat: no client compaction is recognized (every request is the proxy's to compact)."""
    return False


def messages_client_compaction(body: Mapping[str, Any]) -> bool:
    """The request is the client's own compaction (Claude Code's: an ordinary ``/v1/messages``
    request whose last user text asks for a detailed summary of the conversation, or whose system
    prompt is a summarizer's): forwarded as it came, never summarized again, not counted toward
    the proxy's trigger. Reads at most ``MAX_MATCHED_CHARS`` of each text."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else {}
    asked = last.get("role") == "user" and _found(_texts(last.get("content")), CLIENT_COMPACTION_ASKS)
    return asked or _found(_texts(body.get("system")), CLIENT_COMPACTION_SYSTEMS)


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content[:MAX_MATCHED_CHARS]
    if not isinstance(content, list):
        return ""
    out: list[str] = []
    size = 0
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            out.append(block["text"][:MAX_MATCHED_CHARS - size])
            size += len(out[-1])
            if size >= MAX_MATCHED_CHARS:
                break
    return "\n".join(out)


def _found(text: str, phrases: tuple[str, ...]) -> bool:
    lowered = text.lower()
    return any(map(lowered.__contains__, phrases))  # (no generator: ``p in lowered`` for each)


TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal"})
"""Chat content parts that are text (any other part: an image, audio, a file)."""
MEDIA_BLOCK_TYPES = frozenset({"image", "document"})
"""Messages blocks whose tokens the proxy only estimates (any other block is text or JSON it counts)."""


def chat_text_only(messages: Sequence[dict[str, Any]]) -> bool:
    """No image, audio or file in chat ``messages``: no content is a list of parts (one C-level
    pass), or every part of those that are is text (their parts read; the body is not searched)."""
    contents: list[Any] = list(map(dict.get, messages, repeat("content")))
    if list not in map(type, contents):
        return True
    return all(not isinstance(part, dict) or part.get("type") in TEXT_PART_TYPES
               for content in contents if type(content) is list for part in content)


def messages_text_only(pieces: Sequence[dict[str, Any]]) -> bool:
    """No ``image`` or ``document`` block in Messages ``pieces``, at the top of a turn or inside a
    ``tool_result``: text, tool calls and results, thinking are all counted, not estimated."""
    for piece in pieces:
        content = piece.get("content")
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            if block.get("type") in MEDIA_BLOCK_TYPES:
                return False
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list) and any(isinstance(b, dict) and b.get("type") in MEDIA_BLOCK_TYPES
                                               for b in inner):
                return False
    return True


@dataclass(frozen=True, slots=True)
class ProviderApi:
    """One provider API as the defenses' shell sees it.

    ``name``: ``chat`` or ``messages``; ``codec``: its pieces; ``summary_path``: the upstream path
    of a summary call, ``summary_body(model, client_body, previous, transcript, reply_tokens)`` its
    body and ``reply_text(data)`` the text of its answer (raises ``UnusableReply``);
    ``prompt_usage(usage)``: a reply's ``usage`` as ``{"prompt_tokens": N, ...}`` (what the
    learned limits read); ``client_compaction(body)``: the request is the client's own compaction
    (no event is planned for it); ``text_only(pieces)``: no media whose tokens are estimated (a
    reply's usage then calibrates the estimates)."""

    name: str
    codec: Codec
    summary_path: str
    summary_body: Callable[[str, Mapping[str, Any], str | None, str, int], dict[str, Any]]
    reply_text: Callable[[bytes], str]
    prompt_usage: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    client_compaction: Callable[[Mapping[str, Any]], bool]
    text_only: Callable[[Sequence[dict[str, Any]]], bool]


CHAT_API = ProviderApi("chat", CHAT, UPSTREAM_CHAT_PATH, summary_request_body, chat_reply_text, chat_prompt_usage,
                       never_client_compaction, chat_text_only)
MESSAGES_API = ProviderApi("messages", MESSAGES, MESSAGES_PATH, messages_summary_body, messages_reply_text,
                           messages_prompt_usage, messages_client_compaction, messages_text_only)
