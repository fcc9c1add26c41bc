"""``BodyMemo``: a big request body parsed by reusing the parse of its conversation's previous body.

A client resends its whole history every turn, and an SDK writes the messages it wrote before with
the same bytes: the new body is the previous one up to the end of its last message, then ``,``, the
new messages, ``]`` and the members after ``messages``. Parsing it whole cost 2.4 ms per MB (orjson,
11 ms of the pipeline benchmark's 24 ms warm request at 5.3 MB). So the previous body's bytes up to
the end of its last message (``prefix``) and its parsed messages are kept; a body that starts with
those bytes gets those very message objects (they are never mutated: ``proxy.conversation.digest_memo``
keeps them too, and comparing them there is now an identity check) and only its tail is parsed.

Exactness: JSON parsing is deterministic in the bytes read, so a body whose first bytes are a
prefix whose parse ended inside the top-level ``messages`` array, just after an element, parses to
those elements and then goes on from there. Every position this module relies on is verified by
a parse at the same nesting depth as in the whole body (orjson's error position is only a
candidate), the members after the array are parsed with the head in front of them and a random
token in the array's place (so a second ``messages`` member, which would win, is noticed), and any
failure falls back to parsing the whole body (the same value or the same error as before). Only
text orjson parses as is takes part (a body whose lone surrogate escapes needed the lenient parser
of ``proxy.json_text`` is not kept, and a tail that needs it fails here: the whole body is parsed).

A body's own end of messages is learnt when the next body of its conversation arrives (where the
two first differ: there the old body closes its array and the new one continues it with ``,``),
so a client whose bodies never repeat the previous one pays no extra parse.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson

from proxy.cache import MEMO_IDLE_S
from proxy.conversation.json_spans import array_close, common_prefix, messages_start, skip_ws, trim_ws

MIN_BODY_BYTES = 64 * 1024
"""Bodies smaller than this are parsed whole and not kept (parsing them costs well under 0.2 ms)."""
BODY_MEMO_MAX_BYTES = 32 * 1024 * 1024
"""Bound of ``BodyMemo``: accounted bytes of the kept bodies (each body's bytes, and its parsed
messages by ``parsed_weight``; the messages are mostly shared with ``DigestMemo``); least
recently used first out, and an entry unused for ``MEMO_IDLE_S`` leaves. What the kept bodies hold
is within it, or up to 2.4 times it when their text is outside ASCII (``QUOTE_COST``). A body past
``BODY_MEMO_MAX_BYTES / PARSED_COST`` (12.8 MB) is never kept: parsed whole each turn."""
PARSED_COST = 2.5
"""Memory a kept body costs per byte: its bytes (1) and its parsed messages (1.55: 8.2 MB of Python
objects for the benchmark's 5.27 MB history, measured with ``tracemalloc``), plus what
``parsed_weight`` adds for the objects the bytes make."""
DICT_COST = 192
"""Bytes added per ``{`` of the kept messages: a dict with one to five keys is 184 bytes of Python
(an empty one 64) for as few as 5 bytes of JSON (``{"":`` and ``}`` nested)."""
LIST_COST = 64
"""Bytes added per ``[``: an empty list is 56 bytes of Python, one of one element 64, for 2 bytes of JSON."""
ITEM_COST = 40
"""Bytes added per ``,``: a list slot and a number outside CPython's small-int cache (``-6,``: 32
bytes of int and 8 of slot for 3 bytes of JSON)."""
QUOTE_COST = 24
"""Bytes added per ``"``: a short string object (``"ab",``: 56 bytes of str and 8 of slot for 5
bytes of JSON). (Text with characters outside ASCII is stored at 1, 2 or 4 bytes a character and
gets a cached UTF-8 copy once serialized: up to 2.4 times its accounted weight, not counted here.)"""


def parsed_weight(data: bytes, start: int, stop: int) -> int:
    """What the parsed ``data[start:stop]`` (JSON text) is accounted at, in bytes: ``PARSED_COST - 1``
    a byte (the bytes themselves are accounted apart) and the per-object costs above, counted in C."""
    return (int((stop - start) * (PARSED_COST - 1)) + DICT_COST * data.count(b"{", start, stop)
            + LIST_COST * data.count(b"[", start, stop) + ITEM_COST * data.count(b",", start, stop)
            + QUOTE_COST * data.count(b'"', start, stop))


CANDIDATES = 16
"""Kept bodies per (tenant, first ``KEY_BYTES`` bytes): conversations of one tenant that start alike
(the same system prompt and tools); the newest kept."""
KEY_BYTES = 1024
"""How many first bytes of a body index it (with the tenant)."""

class _Entry:
    """A kept body: ``head`` its bytes before the messages array's ``[``; ``prefix`` its bytes up to
    the end of its last message (a view of the body: no copy, and ``bytes.startswith`` compares it
    without one) and ``messages`` their parse (a tuple: never handed out, lists are) once known;
    until then ``raw``, the whole body."""

    __slots__ = ("head", "key", "messages", "parsed", "prefix", "raw", "used", "weight")

    def __init__(self, key: tuple[str, bytes], head: bytes, messages: tuple[Any, ...], *,
                 prefix: memoryview | None = None, raw: bytes | None = None, parsed: int = 0) -> None:
        self.key = key
        self.head = head
        self.messages = messages
        self.prefix = prefix
        self.raw = raw
        self.used = time.monotonic()
        self.parsed = parsed
        """``parsed_weight`` of ``messages``' bytes."""
        self.weight = (len(prefix.obj) + len(head) + parsed  # type: ignore[arg-type]
                       if prefix is not None else len(raw or b"") + len(head))
        """Counted against ``BodyMemo.max_bytes`` while stored: the whole body a prefix views, ``head``
        (a copy) and the parsed messages (kept whole: the body and ``head``)."""


class Reused:
    """A body parsed by reusing a kept one: ``body`` (the whole body's value, ``messages`` a new
    list), ``fresh`` how many of its last messages were parsed here (the rest were checked before)."""

    __slots__ = ("body", "entry", "fresh", "old")

    def __init__(self, body: dict[str, Any], fresh: int, entry: _Entry, old: _Entry) -> None:
        self.body, self.fresh, self.entry, self.old = body, fresh, entry, old


class BodyMemo:
    """Parsed bodies of big requests, per tenant, reused by the next body of their conversation
    (module docstring). Bounded by ``max_bytes`` (the kept bytes and ``parsed_weight`` of their
    messages, least recently used first out) and by idleness (``idle_s``); keyed by tenant, so one tenant's bodies
    are never matched against another's (one tenant can still push another's out of the shared bound,
    as in ``DigestMemo``). Thread-safe (one lock, held for lookups and stores only; an entry learning
    where its messages end sets its messages before its prefix, which readers test first). Built by
    its owner (the chat pipeline) and passed to ``chat_request.parse_chat_request``."""

    def __init__(self, max_bytes: int = BODY_MEMO_MAX_BYTES, idle_s: float = MEMO_IDLE_S,
                 min_bytes: int = MIN_BODY_BYTES) -> None:
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self.min_bytes = min_bytes
        self._index: dict[tuple[str, bytes], list[_Entry]] = {}
        self._lru: OrderedDict[int, _Entry] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()
        self._token_text = secrets.token_hex(16)
        self._token = orjson.dumps(self._token_text)
        """Put in the messages array's place to parse the members after it (a client cannot guess it)."""
        self.reused = 0
        """Bodies parsed by reusing a kept one (since creation; for tests and metrics)."""

    def __len__(self) -> int:
        return len(self._lru)

    def reuse(self, raw: bytes, tenant: str) -> Reused | None:
        """``raw`` parsed by reusing a kept body of ``tenant`` it extends, or ``None`` (parse it whole).
        Nothing is stored until ``keep``."""
        if len(raw) < self.min_bytes:
            return None
        key = (tenant, raw[:KEY_BYTES])
        with self._lock:
            cands = list(self._index.get(key, ()))
        for entry in cands:
            end = self._end(entry, raw)
            if end is None:
                continue
            if end < 0:
                return None  # one kept body verified a body: its parse failed, parse this one whole
            if len(raw) - end > end:
                return None  # more new bytes than reused ones: a whole parse is cheaper
            return self._extend(entry, raw, end)  # the tail fails alike after any other: parse whole
        return None

    def _end(self, entry: _Entry, raw: bytes) -> int | None:
        """Where ``entry``'s last message ends, when ``raw`` starts with ``entry``'s bytes up to there
        and continues the array after it (for an entry kept whole: found where the two bodies first
        differ, and verified by parsing the old array alone, its messages taken from that parse);
        ``-1`` when that verification failed (``entry`` dropped)."""
        old = entry.raw  # read before ``prefix``: another thread sets ``prefix`` before clearing ``raw``
        prefix = entry.prefix
        if prefix is not None:
            return len(prefix) if len(raw) > len(prefix) and raw.startswith(prefix) else None
        assert old is not None
        p = common_prefix(old, raw)
        # (the old body's run is read no further than the new body's length: its bytes bound the work)
        close, more = skip_ws(old, p, p + len(raw)), skip_ws(raw, p)
        start = len(entry.head)
        if close <= start or close >= len(old) or old[close] != 0x5D or raw[more:more + 1] != b",":
            return None  # the new body does not continue the old one's messages there (or differs before them)
        if len(old) - close > len(raw) - more:
            return None  # checking the old members after the array would parse more than the new body has
        try:  # inside ``[...]`` (the elements at their depth in the body), an array closed before
            # ``close`` would leave ``,"key": ...`` after it, which no array holds
            messages = orjson.loads(b"[" + old[start:close + 1] + b"]")[0]
            after = orjson.loads(entry.head + self._token + old[close + 1:])
        except ValueError:  # (a lone surrogate escape the lenient whole parse took): never reusable
            with self._lock:
                self._drop(entry)
            return -1
        if after.__class__ is not dict or after.get("messages") != self._token_text:
            with self._lock:  # a later "messages" member won in the old body: these were never checked
                self._drop(entry)
            return -1
        end = trim_ws(old, start, p)
        entry.messages = tuple(messages)  # before ``prefix``: a reader that sees the prefix sees them
        entry.prefix, entry.raw = memoryview(old)[:end], None
        parsed = parsed_weight(old, start, close)
        with self._lock:
            entry.parsed = parsed
            weight = len(old) + len(entry.head) + parsed
            if id(entry) in self._lru:
                self._total += weight - entry.weight
            entry.weight = weight
            if weight > self.max_bytes:  # too heavy to keep: it leaves alone, the others stay
                self._drop(entry)
            self._evict(time.monotonic())  # (the body may be refused: no store would evict for it)
        return end

    def _extend(self, entry: _Entry, raw: bytes, end: int) -> Reused | None:
        """Parse what ``raw`` has after ``entry``'s messages (``end``): its new messages and the
        members after the array; ``None`` when a check fails (the caller parses it whole)."""
        head = entry.head
        pos = skip_ws(raw, end)
        if pos >= len(raw) or raw[pos] != 0x2C:  # ","
            return None
        tail = raw[pos + 1:]
        close = array_close(tail)
        if close is None:
            return None
        try:  # the new elements at their depth in the body, inside ``[...]``: ``close`` is the array's end
            fresh = orjson.loads(b"[[" + tail[:close + 1] + b"]")[0]
            body = orjson.loads(head + self._token + tail[close + 1:])
        except ValueError:
            return None
        if not fresh:
            return None  # "[..., ]": a trailing comma, which a whole parse refuses
        if body.__class__ is not dict or body.get("messages") != self._token_text:
            return None  # another "messages" member after this one wins: parse the whole body
        messages = [*entry.messages, *fresh]
        body["messages"] = messages
        stop = trim_ws(raw, pos + 1, pos + 1 + close)
        new = _Entry(entry.key, head, tuple(messages), prefix=memoryview(raw)[:stop],
                     parsed=entry.parsed + parsed_weight(tail, 0, close))
        return Reused(body, len(fresh), new, entry)

    def keep(self, found: Reused) -> None:
        """Store the body ``found`` (checked by the caller) in place of the one it extended."""
        self.reused += 1
        with self._lock:
            self._drop(found.old)
            self._store(found.entry)

    def remember(self, raw: bytes, tenant: str) -> None:
        """Keep ``raw`` (a body parsed whole and checked) for the next body of its conversation;
        small bodies and bodies without a top-level ``messages`` array are not kept. Nothing of its
        parse is kept: the next body that extends it has the old array parsed again, alone."""
        if len(raw) < self.min_bytes or len(raw) > self.max_bytes / PARSED_COST:
            return
        start = messages_start(raw)
        if start is None:
            return
        entry = _Entry((tenant, raw[:KEY_BYTES]), raw[:start], (), raw=raw)
        with self._lock:
            self._store(entry)

    def _store(self, entry: _Entry) -> None:
        """Keep ``entry`` (newest first), evicting for it; one heavier than ``max_bytes`` is not kept
        (it would push out every other kept body, then itself)."""
        if entry.weight > self.max_bytes:
            return
        cands = self._index.setdefault(entry.key, [])
        cands.insert(0, entry)
        for old in cands[CANDIDATES:]:
            self._drop(old)
        self._lru[id(entry)] = entry
        self._total += entry.weight
        self._evict(entry.used)

    def _evict(self, now: float) -> None:
        """Drop least recently used entries while past ``max_bytes``, and idle ones (``now - idle_s``)."""
        while self._lru:
            first = next(iter(self._lru.values()))
            if self._total <= self.max_bytes and first.used >= now - self.idle_s:
                break
            self._drop(first)

    def _drop(self, entry: _Entry) -> None:
        if self._lru.pop(id(entry), None) is None:
            return
        self._total -= entry.weight
        cands = self._index.get(entry.key)
        if cands is not None and entry in cands:
            cands.remove(entry)
            if not cands:
                del self._index[entry.key]
