"""Wire shapes of OpenAI chat completions, the canonical form of a message, and chain hashes.

Wire shapes are ``TypedDict``s over plain dicts, so unknown fields survive untouched: the proxy
never parses a client's body into a model that drops fields.

The canonical form (used only for hashing, never forwarded) ignores what SDKs add or drop when
they echo an assistant reply back: ``None`` versus absent, ``refusal: null``, empty
``annotations``/``tool_calls`` lists, the streaming-only ``index`` of a tool call, and an
assistant's ``content`` of ``None`` versus ``""`` (both mean "no text"). So the reply the proxy
logs and the client's echo of it hash the same.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from proxy.cache import MEMO_IDLE_S


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict, total=False):
    role: str
    content: Any  # str | list[content part] | None
    name: str
    tool_calls: list[ToolCall]
    tool_call_id: str


class ChatRequest(TypedDict, total=False):
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    tool_choice: Any
    stream: bool
    stream_options: dict[str, Any]
    max_tokens: int
    max_completion_tokens: int
    n: NotRequired[int]


ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""Roles the proxy understands (OpenAI's API reference). They are not a whitelist: a message with
any other role (Llama's ``ipython``, a vendor's own) is forwarded, logged and counted as it came,
and which roles are valid is the provider's decision (issue 15). The defenses treat such a message
as opaque: never rewritten, never separated from the message before it (``is_known_role``)."""


def is_known_role(message: dict[str, Any]) -> bool:
    """True when ``message``'s ``role`` is one of ``ROLES`` (a non-string role is unknown)."""
    role = message.get("role")
    return role.__class__ is str and role in ROLES


_EMPTY_DROPPED = frozenset({"tool_calls", "annotations", "audio", "refusal", "function_call", "reasoning_content"})


def _canonical_tool_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if "index" not in call and None not in call.values() and (not isinstance(fn, dict) or None not in fn.values()):
        return call  # already canonical (the common case: no copy)
    out = {k: v for k, v in call.items() if v is not None and k != "index"}
    fn = out.get("function")
    if isinstance(fn, dict):
        out["function"] = {k: v for k, v in fn.items() if v is not None}
    return out


def _already_canonical(message: dict[str, Any], role: Any) -> bool:
    """True when ``canonical`` would change nothing (checked without copying)."""
    for key, value in message.items():
        if value is None or (key in _EMPTY_DROPPED and not value):
            return False
        if key == "tool_calls" and not (isinstance(value, list) and all(_canonical_tool_call(c) is c for c in value)):
            return False
        if key == "content" and role == "assistant" and value == "":
            return False
    return True


def canonical(message: dict[str, Any]) -> dict[str, Any]:
    """Return the canonical form of ``message`` (the input itself when already canonical; never mutated).

    Rules: drop keys whose value is ``None``; drop empty ``tool_calls``/``annotations``/``audio``/
    ``refusal``/``function_call``; for assistant messages treat ``content`` ``""`` as absent;
    drop ``index`` inside tool calls.
    """
    role = message.get("role")
    if _already_canonical(message, role):
        return message
    out: dict[str, Any] = {}
    for key, value in message.items():
        if value is None:
            continue
        if key in _EMPTY_DROPPED and not value:
            continue
        if key == "content" and role == "assistant" and value == "":
            continue
        if key == "tool_calls" and isinstance(value, list):
            value = [_canonical_tool_call(c) for c in value]
        out[key] = value
    return out


def canonical_bytes(message: dict[str, Any]) -> bytes:
    """Canonical JSON bytes of ``message``: sorted keys, compact, UTF-8."""
    return orjson.dumps(canonical(message), option=orjson.OPT_SORT_KEYS)


def message_digest(message: dict[str, Any]) -> str:
    """Hex SHA-256 of the canonical bytes: identifies a message's content regardless of position."""
    return hashlib.sha256(canonical_bytes(message)).hexdigest()


def chain_hash(parent_hash: str | None, digest: str) -> str:
    """Hex SHA-256 over the parent's chain hash and this message's digest.

    Identifies a message together with everything before it, so an event anchored on a chain
    hash applies exactly to requests whose history contains that prefix.
    """
    return hashlib.sha256(f"{parent_hash or ''}:{digest}".encode()).hexdigest()


def digests_and_chain(messages: list[dict[str, Any]], memo: DigestMemo | None = None) -> tuple[list[str], list[str]]:
    """Return ``(digests, chain_hashes)`` for ``messages``, one of each per message.

    The same values as ``message_digest``/``chain_hash`` applied in order; with ``memo`` (the
    caller's ``DigestMemo``, e.g. the pipeline's) reusing what it hashed before: a client resends
    its whole history every turn, and hashing it again cost 3 ms per MB (measured by
    ``tests/benchmarks``, pipeline section). Raises ``orjson.JSONEncodeError`` for a message
    orjson cannot serialize (nested deeper than 254).
    """
    if memo is None:
        return _hash_all(messages)
    return memo.digests_and_chain(messages)


OFF_LOOP_DIGEST_BYTES = 8 << 20
"""Request bodies of at least this many bytes are hashed in a worker thread (``digests_off_loop``)."""
OFF_LOOP_DIGEST_MESSAGES = 20_000
"""Message lists of at least this many messages are hashed in a worker thread too (0.4 s of hashing
on the event loop when cold; such a list is past ``MEMO_MAX_BYTES``, so the memo keeps it briefly)."""


async def digests_off_loop(messages: list[dict[str, Any]], body_bytes: int,
                           memo: DigestMemo | None = None) -> tuple[list[str], list[str]]:
    """``digests_and_chain(messages, memo)``, the same values; for a big request (``body_bytes``, the
    request body's size, at least ``OFF_LOOP_DIGEST_BYTES``, or ``OFF_LOOP_DIGEST_MESSAGES``
    messages) hashed in a worker thread without the memo (whose lock would stall the event loop's
    other requests meanwhile; such a list is past the memo's bound anyway), so the loop keeps serving
    other clients (hashlib releases the GIL on large buffers, and the Python loop yields it every
    switch interval). Raises what ``digests_and_chain`` raises."""
    if body_bytes < OFF_LOOP_DIGEST_BYTES and len(messages) < OFF_LOOP_DIGEST_MESSAGES:
        return digests_and_chain(messages, memo)
    return await asyncio.to_thread(_hash_all, list(messages))


def _hash_all(messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    digests: list[str] = []
    chain: list[str] = []
    parent: str | None = None
    for message in messages:
        d = message_digest(message)
        parent = chain_hash(parent, d)
        digests.append(d)
        chain.append(parent)
    return digests, chain


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
            raw = orjson.dumps(c, option=orjson.OPT_SORT_KEYS)
            d = hashlib.sha256(raw).hexdigest()
            parent = chain_hash(parent, d)
            digests.append(d)
            chain.append(parent)
            sizes.append(len(raw))
            (fresh if _plain(c) else unsafe).append(i)
            self.hashed += 1
            i += 1
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



def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string as is; text parts of a list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif isinstance(part.get("content"), str):
                    parts.append(part["content"])
        return "\n".join(parts)
    return str(content)
