"""A token counter bound to one codec: counts that codec's pieces, histories and tool schemas.

``CodecCounter(counter, codec)`` (built by ``TokenCounter.bind(codec)``) is the
``proxy.tokens.protocol.MessageCounter`` the projection, the planner, the compactor and the tool
rounds count with: a piece costs ``codec.price(piece, counter)`` (what the codec says it is made
of, priced by the counter, which knows no API shape), memoized in the counter's memo under
``(codec name, key)``; a request's tools cost what ``codec.tool_schemas`` says they are made of.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy.conversation.codec import Codec, PartCounter
from proxy.conversation.model import Piece
from proxy.json_depth import dumps

if TYPE_CHECKING:
    from proxy.conversation.prefix import PrefixState

RECENT_TOOL_LISTS = 8
"""Tool lists ``count_tools`` compares a request's with before hashing it (sessions in flight with
different tools; a miss costs a comparison each, failing at the first difference)."""


class MemoCounter(PartCounter, Protocol):
    """What a ``CodecCounter`` is built on (``proxy.tokens.counter.TokenCounter``): a
    ``PartCounter`` with a memo (``memoized``, ``memo_hits``) and the tool-schema framing."""

    encoding_name: str
    exact: bool
    memo_hits: int

    def memoized(self, key: Hashable, price: Callable[[], int]) -> int: ...

    def count_tool_schemas(self, key: Hashable, schemas: Sequence[object]) -> int: ...


class CodecCounter:
    """``counter`` bound to ``codec`` (a ``MessageCounter``). State: the last ``RECENT_TOOL_LISTS``
    tool lists and their counts (``count_tools``); the counts themselves live in ``counter``'s
    memo (thread-safe there). ``memo_key``: the encoding, its exactness and the codec's name (the
    key of this counter's counts in a ``PrefixState``)."""

    def __init__(self, counter: MemoCounter, codec: Codec) -> None:
        self.counter = counter
        self.codec = codec
        self.encoding_name = counter.encoding_name
        self.exact = counter.exact
        self.memo_key = (counter.encoding_name, counter.exact, codec.name)
        self.count_text = counter.count_text
        self._name = codec.name
        self._recent_tools: list[tuple[list[dict[str, Any]], int]] = []  # newest last (see ``count_tools``)

    def price(self, piece: Piece) -> int:
        """``codec.price(piece, counter)``, not memoized (tokens, framing included)."""
        return self.codec.price(piece, self.counter)

    def count_message(self, message: Piece, key: str | None = None) -> int:
        """Tokens of one piece including framing; memoized by ``key`` (a digest, e.g.
        ``proxy.conversation.canonical.message_digest``) or the piece's JSON hash (BLAKE2)."""
        if key is None:
            try:
                raw = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            except TypeError:
                return self.codec.price(message, self.counter)
            key = "j:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
        return self.counter.memoized((self._name, key), lambda: self.codec.price(message, self.counter))

    def count_history(self, messages: Sequence[Piece], digests: Sequence[str], chain: Sequence[str],
                      state: PrefixState | None = None) -> list[int]:
        """``[count_message(m, d) for m, d in zip(messages, digests)]``, reusing ``state``'s.

        ``digests``/``chain``: from ``proxy.conversation.canonical.digests_and_chain(messages)``.
        ``state``: the conversation's ``proxy.conversation.prefix.PrefixState`` (taken for
        ``chain``; owned by the caller): the counts it holds for this counter (``memo_key``) are
        reused as they are and only the messages past them are counted, then kept in it (a warm
        request costs a few lookups instead of one memo lookup per message: 0.3 ms per MB,
        measured at 5,000 messages). Without a state every message is looked up in the
        per-message memo. Returns a new list without ``state``; with it, the state's own list
        (read it, never change it, and only until ``state`` is used again: ``proxy.projection``
        copies what it changes). Raises ``ValueError`` when the three lengths differ.
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
        if start < n:
            counts += [count(m, d) for m, d in zip(messages[start:], digests[start:], strict=True)]
        return counts

    def count_tools(self, tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the tool schemas sent with a request (0 without tools): what
        ``codec.tool_schemas`` says they are made of, priced by ``TokenCounter.count_tool_schemas``
        (memoized like a piece: the same tools are sent on every request)."""
        if not tools:
            return 0
        # The same tools arrive with every request of a session, as new objects: a list equal to
        # one of the last few is matched by ``==`` (a C-level walk) before it is serialized and
        # hashed (that was ~1% of a small request's CPU, py-spy under ``tests/benchmarks``).
        try:
            for seen, known in reversed(self._recent_tools):
                if seen == tools:
                    self.counter.memo_hits += 1
                    return known
        except RecursionError:  # equal down to as deep as ``==`` recurses (about 950 levels): counted anew
            pass
        schemas = self.codec.tool_schemas(tools)
        raw = dumps(schemas, sort_keys=True)
        n = self.counter.count_tool_schemas((self._name, "t:" + hashlib.blake2b(raw, digest_size=16).hexdigest()),
                                            schemas)
        self._recent_tools = [*self._recent_tools[-(RECENT_TOOL_LISTS - 1):], (tools, n)]
        return n


__all__ = ["RECENT_TOOL_LISTS", "CodecCounter", "MemoCounter"]
