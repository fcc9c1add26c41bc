"""``DigestMemo``: digests and chain hashes of message lists, reusing those of lists seen before.

The values are exactly ``proxy.conversation.canonical.digests_and_chain``'s; the memo only saves
serializing and hashing messages a client resends every turn. Built by the chat pipeline (one per
app) and passed to ``canonical.digests_and_chain``/``canonical.digests_off_loop``.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson

from proxy.cache import MEMO_IDLE_S
from proxy.conversation.canonical import canonical, chain_hash
from proxy.json_depth import DeepBudget, deep_budget, write_deep

MEMO_MAX_BYTES = 16 * 1024 * 1024
"""Accounted bytes of the message lists ``DigestMemo`` keeps (canonical bytes plus
``MEMO_MESSAGE_OVERHEAD_BYTES`` a message), least recently used dropped first: enough for a few
5,000-message histories or dozens of agent-sized ones. A history past the bound is hashed anew
each turn (correct, only slower). Measured in the 200-stream load run (150 s, PostgreSQL): with
the digest memo, the counter's memos and the compactor's reference memo at 2-2.5x these sizes the
proxy's RSS grew 0.35 MB/s; with them almost off, 0.1 MB/s."""
MEMO_MESSAGE_OVERHEAD_BYTES = 600
"""Python memory a kept message costs beyond its canonical bytes (its dict, strings, list slots,
index key; an estimate), counted against ``MEMO_MAX_BYTES`` so that the bound follows memory for
histories of many short messages too."""
MEMO_CANDIDATES = 8
"""Lists kept per (parent chain hash, message key): branches of one conversation at one place."""


def _plain(value: Any) -> bool:
    """True when every leaf of ``value`` is a ``str`` or ``None`` (containers: dicts and lists)."""
    t = value.__class__
    if t is str or value is None:
        return True
    if t is dict:
        return all(map(_plain, value.values()))
    if t is list:
        return all(map(_plain, value))
    return False


def _key(parent: str | None, message: dict[str, Any]) -> tuple[Any, ...]:
    """A cheap, hashable index key: the parent's chain hash, the role and the text content."""
    role = message.get("role")
    content = message.get("content")
    return (parent, role if role.__class__ is str else None,
            content if content.__class__ is str else len(message))


class _Run:
    """One message list seen before, with its digests, chain hashes and canonical sizes (bytes).

    ``unsafe``: sorted positions whose canonical form has a non-string leaf (a number or a
    boolean): Python's ``==`` says ``1 == 1.0 == True`` while their JSON differs, so those are
    never reused, always hashed."""

    __slots__ = ("chain", "dead", "digests", "keys", "messages", "nbytes", "sizes", "unsafe", "used")

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.digests: list[str] = []
        self.chain: list[str] = []
        self.sizes: list[int] = []
        self.unsafe: list[int] = []
        self.nbytes = 0
        self.keys: list[tuple[Any, ...]] = []
        self.dead = False
        self.used = 0.0
        """``time.monotonic()`` of the last request that reused or extended this list."""


class DigestMemo:
    """Digests and chain hashes of message lists, reusing those of lists seen before (exactly).

    A message is reused only when it ``==`` the message at the same position of a list seen
    before, after the same chain hash (so the same prefix), and that earlier message's canonical
    form has only string/``None`` leaves: then both have the same canonical bytes (``==`` on
    dicts, lists and strings is exact; only numbers and booleans compare equal across types).
    Comparing is one C-level list comparison per matching run (about 0.2 ms per MB), against
    serializing and hashing every message (3 ms per MB). Everything else is hashed as before.

    Bounded by ``max_bytes`` of canonical bytes over the kept lists (least recently used dropped);
    a list no request reused or extended for ``idle_s`` seconds is dropped too.
    Thread-safe (one lock); the lists given are never mutated, and copies are kept. Built by its
    owner (the chat pipeline) and passed to ``digests_and_chain``/``digests_off_loop``.
    """

    def __init__(self, max_bytes: int = MEMO_MAX_BYTES, idle_s: float = MEMO_IDLE_S) -> None:
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self._index: dict[tuple[Any, ...], list[_Run]] = {}
        self._runs: OrderedDict[int, _Run] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0
        """Messages whose digest came from the memo (since creation; for tests and metrics)."""
        self.hashed = 0
        """Messages hashed (since creation)."""

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._index.clear()
            self._runs.clear()
            self._bytes = 0

    def digests_and_chain(self, messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        """``(digests, chain_hashes)`` of ``messages`` (see ``proxy.conversation.canonical.digests_and_chain``)."""
        msgs = messages if messages.__class__ is list else list(messages)
        with self._lock:
            return self._compute(msgs)

    def _match(self, msgs: list[dict[str, Any]], i: int, parent: str | None) -> tuple[_Run | None, int]:
        """A kept run whose messages ``[i, j)`` equal ``msgs[i:j]`` (``j > i``), or ``(None, i)``."""
        cands = self._index.get(_key(parent, msgs[i]))
        if not cands:
            return None, i
        m = msgs[i]
        for run in cands:
            kept = run.messages
            if run.dead or i >= len(kept) or not (kept[i] is m or kept[i] == m):
                continue
            k = bisect.bisect_right(run.unsafe, i)
            if k and run.unsafe[k - 1] == i:
                continue
            limit = min(len(msgs), len(kept), run.unsafe[k] if k < len(run.unsafe) else len(kept))
            j = i + 1
            if msgs[j:limit] == kept[j:limit]:  # the common case: one C-level comparison
                return run, limit
            while j < limit and (msgs[j] is kept[j] or msgs[j] == kept[j]):
                j += 1
            return run, j
        return None, i

    def _compute(self, msgs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
        n = len(msgs)
        digests: list[str] = []
        chain: list[str] = []
        sizes: list[int] = []
        fresh: list[int] = []  # positions hashed here whose canonical form is plain (to index)
        unsafe: list[int] = []
        last: _Run | None = None  # the run of the last reused stretch
        parent: str | None = None
        budget: DeepBudget | None = None  # the request's, once a message is too deep for orjson
        i = 0
        while i < n:
            run, j = self._match(msgs, i, parent)
            if run is not None:
                digests += run.digests[i:j]
                chain += run.chain[i:j]
                sizes += run.sizes[i:j]
                self.reused += j - i
                last, parent, i = run, chain[-1], j
                continue
            c = canonical(msgs[i])
            try:
                raw = orjson.dumps(c, option=orjson.OPT_SORT_KEYS)
                plain = _plain(c)
            except orjson.JSONEncodeError as exc:  # nested deeper than orjson writes (``canonical_bytes``'s
                budget = budget or deep_budget()  # bytes, within the request's budget: raises past it)
                raw = write_deep(exc, c, sort_keys=True, budget=budget)  # never compared: as deep as ``==`` recurses
                plain = False
            d = hashlib.sha256(raw).hexdigest()
            parent = chain_hash(parent, d)
            digests.append(d)
            chain.append(parent)
            sizes.append(len(raw))
            (fresh if plain else unsafe).append(i)
            self.hashed += 1
            i += 1
        if budget is not None:  # hashed whole under the budget: the request's later walks are not capped
            budget.decided = True
        now = time.monotonic()
        if fresh or unsafe:
            self._keep(msgs, digests, chain, sizes, fresh, unsafe, last, now)
        elif last is not None:
            last.used = now
            self._runs.move_to_end(id(last))
        self._expire(now)
        return digests, chain

    def _expire(self, now: float) -> None:
        """Drop the lists unused for ``idle_s`` (the least recently used come first)."""
        runs, cutoff = self._runs, now - self.idle_s
        while len(runs) > 1:
            if next(iter(runs.values())).used >= cutoff:
                break
            self._drop(runs.popitem(last=False)[1])

    def _keep(self, msgs: list[dict[str, Any]], digests: list[str], chain: list[str], sizes: list[int],
              fresh: list[int], unsafe: list[int], last: _Run | None, now: float) -> None:
        """Index the hashed positions: on the run they extend, else on a new run."""
        if last is not None and len(last.chain) <= len(chain) and chain[len(last.chain) - 1] == last.chain[-1]:
            run = last  # the same conversation, grown: keep only the newest list
            run.unsafe = sorted(set(run.unsafe).union(unsafe))
        elif fresh:
            run = _Run()
            run.unsafe = unsafe
        else:  # only numbers or booleans were new: nothing to index
            return
        self._bytes -= run.nbytes
        run.messages, run.digests, run.chain, run.sizes = list(msgs), list(digests), list(chain), list(sizes)
        run.nbytes = sum(sizes) + MEMO_MESSAGE_OVERHEAD_BYTES * len(sizes)
        self._bytes += run.nbytes
        for i in fresh:
            key = _key(chain[i - 1] if i else None, msgs[i])
            cands = self._index.setdefault(key, [])
            if run not in cands:
                cands.insert(0, run)
                del cands[MEMO_CANDIDATES:]
                run.keys.append(key)
        run.used = now
        self._runs[id(run)] = run
        self._runs.move_to_end(id(run))
        while self._bytes > self.max_bytes and len(self._runs) > 1:
            self._drop(self._runs.popitem(last=False)[1])
        if self._bytes > self.max_bytes:  # one list alone over the bound: keep nothing
            self._drop(self._runs.popitem(last=False)[1])

    def _drop(self, run: _Run) -> None:
        run.dead = True
        self._bytes -= run.nbytes
        for key in run.keys:
            cands = self._index.get(key)
            if cands is not None and run in cands:
                cands.remove(run)
                if not cands:
                    del self._index[key]
        run.messages, run.keys = [], []
