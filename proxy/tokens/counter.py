"""Token counting with tiktoken, memoized; never downloads an encoding while serving.

The counter knows no API shape: it prices texts, JSON values, media (``proxy.tokens.media``) and
the framing numbers of OpenAI's documented accounting for chat messages (OpenAI cookbook, "How to
count tokens with tiktoken"): 3 framing tokens per message, +1 when a ``name`` is set, and 3
tokens priming the reply; what the cookbook does not cover is estimated here, each rule documented
where it is defined (media, tool calls, tool schemas). What a piece is made of (its parts, its
frames) the API's codec says (``Codec.price``); ``TokenCounter.bind(codec)`` gives the counter of
one codec's pieces (``proxy.tokens.priced.CodecCounter``).

Encodings: ``o200k_base`` (GPT-4o, GPT-4.1, GPT-5, o-series; also our estimate for every non-OpenAI
model) and ``cl100k_base`` (GPT-4, GPT-3.5). ``load_counter`` loads an encoding only from tiktoken's
cache directory (file name = SHA-1 of the download URL, content checked against tiktoken's pinned
SHA-256). When the file is missing or wrong it returns a counter in *fallback mode*
(``exact=False``) that estimates ``ceil(utf8_bytes / 4)`` tokens per text: for ASCII that is
DESIGN.md's "about 4 chars per token"; for non-ASCII text (2-4 bytes per char) it counts more per
char, closer to what BPE encoders do with such text.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from proxy.cache import Memo
from proxy.json_depth import write_deep
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
from proxy.tokens.priced import CodecCounter

if TYPE_CHECKING:
    from proxy.conversation.codec import Codec

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


BUFFER_TEXT_CHARS = 1 << 20
"""Texts of at least this many characters are counted through tiktoken's native token buffer
instead of a Python list of tokens (same count; the list's creation holds the GIL)."""
_NO_SPECIAL: frozenset[str] = frozenset()


class TokenCounter:
    """Counts tokens of texts, JSON values, media and framing with one encoding (a ``PartCounter``).

    ``exact`` is ``False`` in fallback mode (encoding not loadable; ``fallback_reason`` says why):
    texts are then estimated with ``estimate_text_tokens``. ``memoized(key, price)`` keeps counts
    in a bounded LRU (``memo_size`` entries; idle ones leave after ``proxy.cache.MEMO_IDLE_S``),
    which the codec-bound counters (``bind``) use per piece and per tool list, so a request costs
    only the messages it adds (``memo_hits`` / ``memo_misses`` count lookups).

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
        self._bound: dict[str, CodecCounter] = {}  # one per codec name (see ``bind``)

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

    def count_json(self, value: object) -> int:
        """Tokens of ``value``'s compact JSON text (``orjson``'s, at any depth: ``proxy.json_depth``)."""
        try:
            return self.count_text(orjson.dumps(value).decode())
        except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes
            return self.count_text(write_deep(exc, value).decode())

    def count_frame(self, *, messages: int = 0, names: int = 0, tool_calls: int = 0) -> int:
        """Framing tokens: ``TOKENS_PER_MESSAGE`` per message, ``TOKENS_PER_NAME`` per name,
        ``TOKENS_PER_TOOL_CALL`` per tool call."""
        return messages * TOKENS_PER_MESSAGE + names * TOKENS_PER_NAME + tool_calls * TOKENS_PER_TOOL_CALL

    def count_image_url(self, url: str, detail: object) -> int:
        """An image by URL, OpenAI's pricing: ``detail == "low"`` costs ``IMAGE_LOW_DETAIL_TOKENS``; a
        ``data:`` URL whose image is readable ``openai_image_tokens`` of its real size (never the
        base64 length); anything else ``IMAGE_UNKNOWN_SIZE_TOKENS``."""
        if detail == "low":
            return IMAGE_LOW_DETAIL_TOKENS
        payload = data_url_payload(url)
        size = base64_image_size(payload) if payload else None
        return openai_image_tokens(*size, detail) if size else IMAGE_UNKNOWN_SIZE_TOKENS  # type: ignore[arg-type]

    def count_image_data(self, data: str | None) -> int:
        """An inline base64 image, Anthropic's pricing (``anthropic_image_tokens``);
        ``ANTHROPIC_IMAGE_MAX_TOKENS`` when ``data`` is ``None`` or its size unreadable."""
        size = base64_image_size(data) if data is not None else None
        return anthropic_image_tokens(*size) if size else ANTHROPIC_IMAGE_MAX_TOKENS

    def count_audio(self, data: str, audio_format: str) -> int:
        """Base64 audio: its decoded bytes at ``AUDIO_BYTES_PER_SECOND[audio_format]`` (else 16,000
        bytes/s) times ``AUDIO_TOKENS_PER_SECOND``, at least 1."""
        rate = AUDIO_BYTES_PER_SECOND.get(audio_format, 16_000)
        return max(1, math.ceil(_base64_decoded_bytes(data) / rate * AUDIO_TOKENS_PER_SECOND))

    def count_file_data(self, data: str | None, *, data_url: bool = False) -> int:
        """A base64 file (a ``data:`` URL when ``data_url``): one token per ``FILE_BYTES_PER_TOKEN``
        decoded bytes, at least ``IMAGE_BASE_TOKENS``; ``FILE_UNKNOWN_TOKENS`` without a payload."""
        payload = data_url_payload(data) if data_url and data is not None else data
        if payload is None:
            return FILE_UNKNOWN_TOKENS
        return max(IMAGE_BASE_TOKENS, _base64_decoded_bytes(payload) // FILE_BYTES_PER_TOKEN)

    def memoized(self, key: Hashable, price: Callable[[], int]) -> int:
        """``price()``, kept in the memo under ``key`` (a hit returns the kept count: the caller
        makes ``key`` name what was priced and how, e.g. ``proxy.tokens.priced``'s codec name and a
        digest); counts ``memo_hits``/``memo_misses``. The lock is not held while pricing."""
        with self._lock:
            hit: int | None = self._memo.get(key)
        if hit is not None:
            self.memo_hits += 1
            return hit
        self.memo_misses += 1
        n = price()
        with self._lock:
            self._memo.put(key, n)
        return n

    def count_tool_schemas(self, key: Hashable, schemas: Sequence[object]) -> int:
        """Tokens of a request's tool schemas (what a codec's ``tool_schemas`` says each is made
        of): ``TOKENS_PER_TOOLS_BLOCK`` once plus ``TOKENS_PER_TOOL`` + the compact JSON of each;
        memoized under ``key``."""
        return self.memoized(key, lambda: TOKENS_PER_TOOLS_BLOCK + sum(TOKENS_PER_TOOL + self.count_json(p)
                                                                       for p in schemas))

    def bind(self, codec: Codec) -> CodecCounter:
        """This counter bound to ``codec`` (``proxy.tokens.priced.CodecCounter``: counts the codec's
        pieces, histories and tool schemas). One per codec name, kept (bound: the codecs, a few)."""
        bound = self._bound.get(codec.name)
        if bound is None or bound.codec is not codec:
            bound = self._bound[codec.name] = CodecCounter(self, codec)
        return bound


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
