"""Token counting with tiktoken, memoized per message; never downloads an encoding while serving.

Counts follow OpenAI's documented accounting for chat messages (OpenAI cookbook, "How to count
tokens with tiktoken"): 3 framing tokens per message, +1 when a ``name`` is set, the encoded text
of every field, and 3 tokens priming the reply. What the cookbook does not cover is estimated
here, each rule documented where it is defined (images and other media, tool calls, tool
schemas, Anthropic-style content blocks).

Encodings: ``o200k_base`` (GPT-4o, GPT-4.1, GPT-5, o-series; also our estimate for every non-OpenAI
model) and ``cl100k_base`` (GPT-4, GPT-3.5). ``load_counter`` loads an encoding only from tiktoken's
cache directory (file name = SHA-1 of the download URL, content checked against tiktoken's pinned
SHA-256). When the file is missing or wrong it returns a counter in *fallback mode*
(``exact=False``) that estimates ``ceil(utf8_bytes / 4)`` tokens per text: for ASCII that is
DESIGN.md's "about 4 chars per token"; for non-ASCII text (2-4 bytes per char) it counts more per
char, closer to what BPE encoders do with such text.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from proxy.cache import Memo
from proxy.tokens.encodings import default_cache_dir, load_cached_encoding
from proxy.tokens.media import (
    ANTHROPIC_IMAGE_MAX_TOKENS,
    AUDIO_BYTES_PER_SECOND,
    AUDIO_TOKENS_PER_SECOND,
    FILE_BYTES_PER_TOKEN,
    FILE_UNKNOWN_TOKENS,
    IMAGE_BASE_TOKENS,
    IMAGE_LOW_DETAIL_TOKENS,
    IMAGE_UNKNOWN_SIZE_TOKENS,
    _base64_decoded_bytes,
    anthropic_image_tokens,
    base64_image_size,
    data_url_payload,
    openai_image_tokens,
)

if TYPE_CHECKING:
    from proxy.conversation.prefix import PrefixState

log = logging.getLogger("context_proxy.tokens")

TOKENS_PER_MESSAGE = 3
"""Framing tokens per message (OpenAI cookbook, 'How to count tokens with tiktoken')."""
TOKENS_PER_NAME = 1
"""Extra token when a message has a ``name`` (same source)."""
TOKENS_PER_REPLY = 3
"""Every reply is primed with ``<|start|>assistant<|message|>``."""
TOKENS_PER_TOOL_CALL = 3
"""Framing per ``tool_calls`` entry besides its name and arguments (our estimate)."""
TOKENS_PER_TOOL = 8
"""Framing per tool schema besides its JSON (our estimate; OpenAI renders tools as a TypeScript-like
namespace, which the compact JSON of name/description/parameters over-approximates slightly)."""
TOKENS_PER_TOOLS_BLOCK = 12
"""Framing once per request that carries tools (our estimate)."""
FALLBACK_BYTES_PER_TOKEN = 4
"""Fallback estimate: one token per 4 UTF-8 bytes (DESIGN.md: about 4 chars per token)."""

def estimate_text_tokens(text: str) -> int:
    """Fallback estimate of the tokens of ``text``: ``ceil(utf8_bytes / 4)``."""
    if text.isascii():
        return -(-len(text) // FALLBACK_BYTES_PER_TOKEN)
    return -(-len(text.encode("utf-8", "surrogatepass")) // FALLBACK_BYTES_PER_TOKEN)


RECENT_TOOL_LISTS = 8
"""Tool lists ``count_tools`` compares a request's with before hashing it (sessions in flight with
different tools; a miss costs a comparison each, failing at the first difference)."""


BUFFER_TEXT_CHARS = 1 << 20
"""Texts of at least this many characters are counted through tiktoken's native token buffer
instead of a Python list of tokens (same count; the list's creation holds the GIL)."""
_NO_SPECIAL: frozenset[str] = frozenset()


class TokenCounter:
    """Counts tokens of messages, tool schemas and requests with one encoding.

    ``exact`` is ``False`` in fallback mode (encoding not loadable; ``fallback_reason`` says why):
    texts are then estimated with ``estimate_text_tokens``. ``count_message(message, key)`` is
    memoized in a bounded LRU (``memo_size`` entries; idle ones leave after
    ``proxy.cache.MEMO_IDLE_S``) by ``key`` (e.g. ``proxy.conversation.canonical.message_digest``)
    or, without a key, by a BLAKE2 hash of the message's JSON, so a request costs only the
    messages it adds (``memo_hits`` / ``memo_misses`` count lookups).

    Thread-safe: the memos are guarded by one lock (held for lookups and stores only, never while
    counting), so a big request can be counted in a worker thread (``proxy.compaction.compactor``) while the
    event loop counts others; tiktoken releases the GIL while it encodes.
    """

    def __init__(
        self,
        encoding_name: str = "o200k_base",
        memo_size: int = 200_000,
        *,
        cache_dir: str | None = None,
        encoding: Any = None,
    ) -> None:
        self.encoding_name = encoding_name
        self.fallback_reason: str | None = None
        if encoding is None:
            encoding, self.fallback_reason = load_cached_encoding(
                encoding_name, cache_dir or default_cache_dir()
            )
        self._enc = encoding
        core = getattr(encoding, "_core_bpe", None)  # tiktoken's native encoder (absent in fakes)
        self._buffer = getattr(core, "encode_to_tiktoken_buffer", None)
        self.exact = encoding is not None
        if not self.exact:
            log.warning(
                "tiktoken encoding %s unavailable (%s); token counts are estimated as ceil(utf8 bytes / 4)",
                encoding_name,
                self.fallback_reason,
            )
        self._memo = Memo(memo_size)
        self._lock = threading.Lock()
        self.memo_hits = 0
        self.memo_misses = 0
        self._recent_tools: list[tuple[list[dict[str, Any]], int]] = []  # newest last (see ``count_tools``)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` (no framing). Special-token strings count as plain text."""
        if not text:
            return 0
        if self._enc is None:
            return estimate_text_tokens(text)
        if len(text) >= BUFFER_TEXT_CHARS and self._buffer is not None:
            # the same tokens (no special tokens allowed = all plain text) into a native buffer:
            # a list of millions of ints is built holding the GIL (0.3 s at 20 MB), this is not
            return memoryview(self._buffer(text, _NO_SPECIAL)).nbytes // 4
        return len(self._enc.encode_ordinary(text))

    @property
    def memo_key(self) -> tuple[str, bool]:
        """The key this counter's per-message counts are kept under in a ``PrefixState``."""
        return self.encoding_name, self.exact

    def _count_json(self, value: Any) -> int:
        return self.count_text(orjson.dumps(value).decode())

    def count_content(self, content: Any) -> int:
        """Tokens of a message's ``content``: a string, or a list of parts (see ``_part_tokens``)."""
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, list):
            return sum(self._part_tokens(part) for part in content)
        return self._count_json(content)

    def _image_url_tokens(self, image_url: Any) -> int:
        url, detail = (image_url, "auto") if isinstance(image_url, str) else ("", "auto")
        if isinstance(image_url, dict):
            url, detail = str(image_url.get("url") or ""), image_url.get("detail") or "auto"
        if detail == "low":
            return IMAGE_LOW_DETAIL_TOKENS
        payload = data_url_payload(url)
        size = base64_image_size(payload) if payload else None
        return openai_image_tokens(*size, detail) if size else IMAGE_UNKNOWN_SIZE_TOKENS

    def count_part(self, part: Any) -> int:
        """Tokens of one content part (``_part_tokens``), no message framing."""
        return self._part_tokens(part)

    def count_tool_call(self, call: Any) -> int:
        """Tokens of one ``tool_calls`` entry: ``TOKENS_PER_TOOL_CALL`` + its name + its arguments."""
        return self._count_tool_calls([call])

    def _part_tokens(self, part: Any) -> int:
        """Tokens of one content part. Text parts: their text. ``image_url``: ``openai_image_tokens``
        from the real dimensions (never the base64 length). ``input_audio`` / ``file``: the
        estimates above. Anthropic blocks: ``tool_use`` = name + JSON input + ``TOKENS_PER_TOOL_CALL``;
        ``tool_result`` = its content + ``TOKENS_PER_TOOL_CALL``; ``image`` = ``anthropic_image_tokens``;
        ``thinking`` = its text. Anything else: its compact JSON.
        """
        if isinstance(part, str):
            return self.count_text(part)
        if not isinstance(part, dict):
            return self._count_json(part)
        kind = part.get("type")
        if isinstance(part.get("text"), str) and kind in (None, "text", "input_text", "output_text"):
            return self.count_text(part["text"])
        if kind == "image_url" or "image_url" in part:
            return self._image_url_tokens(part.get("image_url"))
        if kind == "input_audio":
            audio = part.get("input_audio") or {}
            data = audio.get("data") if isinstance(audio, dict) else None
            if not isinstance(data, str):
                return self._count_json(part)
            rate = AUDIO_BYTES_PER_SECOND.get(str(audio.get("format")), 16_000)
            return max(1, math.ceil(_base64_decoded_bytes(data) / rate * AUDIO_TOKENS_PER_SECOND))
        if kind == "file":
            file = part.get("file") or {}
            payload = data_url_payload(str(file.get("file_data") or "")) if isinstance(file, dict) else None
            if payload is None:
                return FILE_UNKNOWN_TOKENS
            return max(IMAGE_BASE_TOKENS, _base64_decoded_bytes(payload) // FILE_BYTES_PER_TOKEN)
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self.count_text(part["refusal"])
        if kind == "tool_use":
            return TOKENS_PER_TOOL_CALL + self.count_text(str(part.get("name") or "")) + self._count_json(
                part.get("input") or {}
            )
        if kind == "tool_result":
            return TOKENS_PER_TOOL_CALL + self.count_content(part.get("content"))
        if kind in ("image", "document"):
            return self._source_tokens(kind, part.get("source"))
        if kind == "thinking" and isinstance(part.get("thinking"), str):
            return self.count_text(part["thinking"])
        return self._count_json(part)

    def _source_tokens(self, kind: str, source: Any) -> int:
        if not isinstance(source, dict):
            return ANTHROPIC_IMAGE_MAX_TOKENS if kind == "image" else FILE_UNKNOWN_TOKENS
        data = source.get("data")
        if source.get("type") == "text" and isinstance(data, str):
            return self.count_text(data)
        if source.get("type") != "base64" or not isinstance(data, str):
            return ANTHROPIC_IMAGE_MAX_TOKENS if kind == "image" else FILE_UNKNOWN_TOKENS
        if kind == "image":
            size = base64_image_size(data)
            return anthropic_image_tokens(*size) if size else ANTHROPIC_IMAGE_MAX_TOKENS
        return max(IMAGE_BASE_TOKENS, _base64_decoded_bytes(data) // FILE_BYTES_PER_TOKEN)


    def _count_tool_calls(self, tool_calls: Any) -> int:
        if not isinstance(tool_calls, list):
            return self._count_json(tool_calls)
        n = 0
        for call in tool_calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                n += self._count_json(call)
                continue
            n += TOKENS_PER_TOOL_CALL + self.count_text(str(fn.get("name") or ""))
            args = fn.get("arguments")
            n += self.count_text(args) if isinstance(args, str) else self._count_json(args)
        return n

    def _message_tokens(self, message: dict[str, Any]) -> int:
        n = TOKENS_PER_MESSAGE
        for field, value in message.items():
            if value is None:
                continue
            if field == "content":
                n += self.count_content(value)
            elif field == "tool_calls":
                n += self._count_tool_calls(value)
            elif field == "function_call" and isinstance(value, dict):
                n += self._count_tool_calls([{"function": value}])
            elif isinstance(value, str):
                n += self.count_text(value)
                if field == "name":
                    n += TOKENS_PER_NAME
            else:
                n += self._count_json(value)
        return n

    def count_message(self, message: dict[str, Any], key: str | None = None) -> int:
        """Tokens of one message including framing; memoized by ``key`` (or the message's JSON hash)."""
        if key is None:
            try:
                raw = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            except TypeError:
                return self._message_tokens(message)
            key = "j:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
        with self._lock:
            hit: int | None = self._memo.get(key)
        if hit is not None:
            self.memo_hits += 1
            return hit
        self.memo_misses += 1
        n = self._message_tokens(message)
        with self._lock:
            self._memo.put(key, n)
        return n

    def count_history(self, messages: Sequence[dict[str, Any]], digests: Sequence[str], chain: Sequence[str],
                      state: PrefixState | None = None) -> list[int]:
        """``[count_message(m, d) for m, d in zip(messages, digests)]``, reusing ``state``'s.

        ``digests``/``chain``: from ``proxy.conversation.canonical.digests_and_chain(messages)``.
        ``state``: the conversation's ``proxy.conversation.prefix.PrefixState`` (taken for
        ``chain``; owned by the caller): the counts it holds for this counter (``memo_key``) are
        reused as they are and only the messages past them are counted, then kept in it (a warm
        request costs a few lookups instead of one memo lookup per message: 0.3 ms per MB,
        measured at 5,000 messages). Without a state every message is looked up in the
        per-message memo. Returns a new list. Raises ``ValueError`` when the three lengths differ.
        """
        n = len(messages)
        if len(digests) != n or len(chain) != n:
            raise ValueError(f"{n} messages but {len(digests)} digests and {len(chain)} chain hashes")
        count = self.count_message
        if state is None:
            return [count(m, d) for m, d in zip(messages, digests, strict=True)]
        counts = state.counts.get(self.memo_key)
        if counts is None or len(counts) > n:
            counts = state.counts[self.memo_key] = []
        start = len(counts)
        if start < n:  # the state is the caller's, and only copies of the list leave it
            counts += [count(m, d) for m, d in zip(messages[start:], digests[start:], strict=True)]
        return list(counts)

    def count_tools(self, tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the tool schemas sent with a request (0 without tools).

        Per tool: the compact JSON of its function's ``name``/``description``/``parameters`` (the
        whole entry for non-function tools) plus ``TOKENS_PER_TOOL``; plus ``TOKENS_PER_TOOLS_BLOCK``
        once. Memoized like a message (the same tools are sent on every request).
        """
        if not tools:
            return 0
        # The same tools arrive with every request of a session, as new objects: a list equal to
        # one of the last few is matched by ``==`` (a C-level walk) before it is serialized and
        # hashed (that was ~1% of a small request's CPU, py-spy under ``tests/benchmarks``).
        for seen, known in reversed(self._recent_tools):
            if seen == tools:
                self.memo_hits += 1
                return known
        n = self._count_tools(tools)
        self._recent_tools = [*self._recent_tools[-(RECENT_TOOL_LISTS - 1):], (tools, n)]
        return n

    def _count_tools(self, tools: list[dict[str, Any]]) -> int:
        parts = []
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict):
                parts.append({k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None})
            else:
                parts.append(tool)
        raw = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
        key = "t:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
        with self._lock:
            hit: int | None = self._memo.get(key)
        if hit is not None:
            self.memo_hits += 1
            return hit
        self.memo_misses += 1
        n = TOKENS_PER_TOOLS_BLOCK + sum(TOKENS_PER_TOOL + self._count_json(p) for p in parts)
        with self._lock:
            self._memo.put(key, n)
        return n


def reserved_output_tokens(body: Mapping[str, Any]) -> int:
    """Completion tokens a request reserves: ``max_completion_tokens``, else ``max_tokens``, else 0.

    Non-integer or negative values count as 0 (the upstream will reject them anyway).
    """
    for field in ("max_completion_tokens", "max_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def load_counter(cache_dir: str | None, encoding_name: str = "o200k_base", memo_size: int = 200_000) -> TokenCounter:
    """Build a counter for ``encoding_name`` from tiktoken's cache, never downloading.

    ``cache_dir`` (settings ``tiktoken_cache_dir``) is exported as ``TIKTOKEN_CACHE_DIR`` when given;
    otherwise tiktoken's own default lookup applies. If the encoding file is missing or corrupt the
    counter is in fallback mode (``exact=False``) and one warning is logged.
    """
    if cache_dir:
        os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir
    return TokenCounter(encoding_name, memo_size, cache_dir=cache_dir)


__all__ = [
    "TokenCounter",
    "estimate_text_tokens",
    "load_counter",
    "reserved_output_tokens",
]
