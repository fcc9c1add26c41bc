"""The session log as the pipeline uses it: name the session, append what a request adds, log the reply.

A session is named by the ``X-Session-Id`` header, else derived from the tenant and the chain hash
of the conversation's first user message (which covers the system prompt before it), so every
request of one conversation lands in one session without any client change. Conversations that
start the same way share a session and become branches of its message tree.

Hot-path caches (per process, bounded, short-lived): the session record, how much of a
conversation this process knows is stored in a session (kept in the conversation's
``proxy.conversation.prefix.PrefixState``, per session pk, trusted ``CACHE_TTL_S``), and the
session's internal rounds. A steady-state turn then costs one
write transaction for the new messages and one at the end (reply + request record), instead of
five round trips (measured by ``tests/benchmarks``: ~1.3 ms of CPU each on SQLite). The cache only
skips work that is known to be done: every insert is still idempotent (``ON CONFLICT DO NOTHING``).
A cached session may be gone (retention deleted it, here or on another replica): a write that
finds it gone (``MissingRow``) drops what is cached of it, opens the session again (a new row of
the same id) and writes the request's whole conversation there, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from proxy.cache import BoundedCache
from proxy.conversation.canonical import chain_hash, message_digest
from proxy.conversation.prefix import PrefixStates
from proxy.forward.entropy import EntropyPool
from storage.errors import MissingRow
from storage.records import MessageRecord, NewMessage, RequestRecord, SessionRecord
from storage.refused import RequestWrites
from storage.store import Store

MAX_SESSION_ID_CHARS = 200
CACHE_TTL_S = 30.0
"""How long a cached session row or internal-round list is trusted (other replicas may add rounds)."""
PENDING_INTERNAL = 64
"""Internal messages of one session remembered while their write is under way (the newest)."""
CACHED_SESSIONS = 10_000

Then = Callable[[BaseException | None], None]
"""Told once how a write ended (``SessionLog.finish``): ``None`` stored, else its error."""


def _new_rows(
    messages: list[dict[str, Any]], chain: list[str], internal: list[dict[str, Any]], reply: dict[str, Any] | None,
    stored: int | None,
) -> tuple[list[NewMessage], int | None]:
    """The rows ``finish`` writes and how many of the first are the client's (``client_rows`` of
    ``Store.append_and_record``: the record counts those the write inserts): the client's
    messages after the first ``stored`` (``None``: none of theirs, and the record's own counts),
    then ``internal`` and ``reply``, chained on."""
    new: list[NewMessage] = []
    client_rows = None
    n = len(messages)
    if stored is not None:
        if stored < n:  # (a turn whose history is stored: none)
            new = [NewMessage(chain[i], chain[i - 1] if i else None, i, str(messages[i].get("role")), messages[i])
                   for i in range(stored, n)]
        client_rows = len(new)
    parent, seq = chain[-1], n
    for message in internal:
        h = chain_hash(parent, message_digest(message))
        new.append(NewMessage(h, parent, seq, str(message.get("role", "assistant")), message, message is not reply))
        parent, seq = h, seq + 1
    if reply is not None:
        new.append(NewMessage(chain_hash(parent, message_digest(reply)), parent, seq,
                              str(reply.get("role", "assistant")), reply))
    return new, client_rows


DERIVED_IDS_KEPT = 10_000
"""Session ids ``SessionLog.derive_session_id`` remembers (by tenant and anchor: a conversation's
every request names the same one; SHA-256 through OpenSSL was about 1% of a small request's
instructions, callgrind). Emptied whole when full: the ids of active conversations come back at once."""


def new_id(prefix: str, entropy: EntropyPool | None = None) -> str:
    """A time-ordered id for records outside the projection (requests); never used inside it:
    ``prefix_`` + 12 hex of the Unix time in milliseconds + 12 hex (48 bits) from system entropy
    (time first, as in a UUIDv7, RFC 9562, without its version bits). Time first, so a new row
    lands at the end of the id's index instead of on a random page of it (a batch of 8 request
    rows: 16 us of SQLite's CPU a row with random ids, 12 us time-ordered, 10,000 rows stored;
    thread CPU time of the same INSERTs through ``sqlite3``, 2,000 rows each way).
    Only ids of one millisecond can collide: for n of them, with probability about n^2 / 2^49.
    The id shows its request's time to the millisecond (to the client that sent it). From
    ``secrets``, not ``random``: whatever seeds ``random`` (a test framework, a library) would
    make ids repeat, and a repeated request id fails the request's log write. ``entropy``: the
    caller's pool of the same system entropy, read in blocks (``proxy.forward.entropy``; the
    pipelines'), else it is read for this id alone."""
    random = entropy.hex(12) if entropy is not None else secrets.token_hex(6)
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{random}"


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class LoggedRequest:
    """What a request added to the log: ``added`` new messages starting at ``first_added_seq``,
    the ids of the rows it inserted (``message_ids``: not those found stored) and the session they
    went to (``session``: another row than the caller's if that one was gone and the session was
    opened again; ``None``: the caller's)."""

    added: int
    first_added_seq: int | None
    message_ids: tuple[int, ...] = ()
    session: SessionRecord | None = None


class SessionLog:
    """Appends to the append-only log through ``Store``; every call is one short transaction."""

    def __init__(self, store: Store, prefixes: PrefixStates | None = None) -> None:
        self.store = store
        self.prefixes = prefixes if prefixes is not None else PrefixStates()
        """Where the stored length of a conversation in a session is kept (per session pk; the
        app's per-conversation prefix states, bounded there)."""
        self._sessions = BoundedCache(CACHED_SESSIONS, CACHE_TTL_S)
        self._stamp = 0
        """The last stamp given (``time.monotonic_ns``, strictly increasing)."""
        self._trusted = BoundedCache(CACHED_SESSIONS, CACHE_TTL_S)
        """Session pk -> the stamp from which its stored lengths in ``prefixes`` are trusted (the
        first noted since it was last forgotten; gone after ``CACHE_TTL_S``, then they are read
        again)."""
        self._internal = BoundedCache(CACHED_SESSIONS, CACHE_TTL_S)
        self._pending_internal = BoundedCache(CACHED_SESSIONS, CACHE_TTL_S)
        """Internal messages being written, per session (at most ``PENDING_INTERNAL`` each): an
        agent's next request often arrives before its last reply's write lands, and its rounds
        must be put back all the same."""
        self._derived: dict[tuple[str, str], str] = {}
        """``derive_session_id``'s memo: at most ``DERIVED_IDS_KEPT`` ids."""
        self._tasks: set[asyncio.Task[None]] = set()
        """``finish`` writes that read first, or are redone on a reopened session (kept: the
        loop holds tasks weakly)."""

    def derive_session_id(self, tenant: str, messages: list[dict[str, Any]], chain_hashes: list[str]) -> str:
        """``sess_`` + 24 hex of SHA-256(tenant, chain hash of the first user message).

        Without a user message, the first message anchors the session.
        """
        first_user = 0
        for i, m in enumerate(messages):
            if m.get("role") == "user":
                first_user = i
                break
        anchor = chain_hashes[first_user] if chain_hashes else ""
        key = (tenant, anchor)
        session_id = self._derived.get(key)
        if session_id is None:
            if len(self._derived) >= DERIVED_IDS_KEPT:
                self._derived.clear()
            session_id = self._derived[key] = "sess_" + hashlib.sha256(f"{tenant}:{anchor}".encode()).hexdigest()[:24]
        return session_id

    async def open_session(self, tenant: str, session_id: str, api: str = "chat") -> SessionRecord:
        """The session row, created on first use speaking ``api`` (``chat`` or ``messages``; cached
        for ``CACHE_TTL_S``)."""
        key = (tenant, session_id)
        session = self._sessions.fresh(key)
        if session is None:
            session = await self.store.get_or_create_session(tenant, session_id, now(), api)
            self._sessions.put(key, session)
        return session

    def session_now(self, tenant: str, session_id: str) -> SessionRecord | None:
        """``open_session`` without I/O (nor a coroutine): the cached row, ``None`` when it is to be
        opened (not cached, or cached more than ``CACHE_TTL_S`` ago)."""
        return self._sessions.fresh((tenant, session_id))

    async def _reopen(self, session: SessionRecord) -> SessionRecord:
        """``session`` was found gone (``MissingRow``): forget what is cached of it and open it again."""
        self._sessions.pop((session.tenant, session.session_id), None)
        self._forget(session.pk)
        self._internal.pop(session.pk, None)
        return await self.open_session(session.tenant, session.session_id, session.api)

    def _next_stamp(self) -> int:
        stamp, now_ns = self._stamp + 1, time.monotonic_ns()
        self._stamp = now_ns if now_ns > stamp else stamp  # (``max``, inline)
        return self._stamp

    def follow(self, chain: list[str]) -> None:
        """Move the conversation's prefix state to the end of ``chain`` (what the chat path's
        projection does), so the stored length this request's write notes is found again when the
        same history comes back (a retry, a regenerate) as well as by the next turn. For a path
        that runs no projection (Messages, before its defenses)."""
        if chain:
            self.prefixes.keep(chain, self.prefixes.take(chain))

    def _forget(self, session_pk: int) -> None:
        """Trust no stored length of ``session_pk`` noted before now."""
        self._trusted.pop(session_pk, None)

    def _remember(self, session_pk: int, chain: list[str]) -> None:
        """All of ``chain`` is stored in ``session_pk``'s log."""
        if self._trusted.fresh(session_pk) is None:
            self._trusted.put(session_pk, self._next_stamp())
        self.prefixes.note_stored(chain, session_pk, self._next_stamp())

    def known_stored(self, session: SessionRecord, chain: list[str]) -> bool:
        """Whether this process knows every message of ``chain`` is stored in ``session``'s log
        (``append_request`` would write nothing)."""
        stored = self._known_prefix(session.pk, chain)
        return stored is not None and stored >= len(chain)

    def _known_prefix(self, session_pk: int, chain: list[str]) -> int | None:
        """How many of ``chain``'s first messages this process knows are stored in the session (the
        log is prefix-closed: everything up to a stored message is stored); ``None``: unknown."""
        since = self._trusted.fresh(session_pk)
        if since is None:
            return None
        return self.prefixes.stored_len(chain, session_pk, since)

    async def append_request(
        self, session: SessionRecord, messages: list[dict[str, Any]], chain: list[str]
    ) -> LoggedRequest:
        """Store the messages of ``messages`` not yet in the session's log (by chain hash). If
        the session is gone, it is opened again and they go there: the result's ``session`` is
        the row used (the caller's is stale then; the rest of the request uses this one)."""
        try:
            return await self._append_request(session, messages, chain)
        except MissingRow:
            return await self._append_request(await self._reopen(session), messages, chain)

    async def _append_request(
        self, session: SessionRecord, messages: list[dict[str, Any]], chain: list[str]
    ) -> LoggedRequest:
        stored = self._known_prefix(session.pk, chain)
        if stored is None:
            stored = await self.store.stored_prefix_len(session.pk, chain)
        if stored >= len(messages):
            self._remember(session.pk, chain)
            return LoggedRequest(0, None, (), session)
        new = [
            NewMessage(
                chain_hash=chain[i],
                parent_hash=chain[i - 1] if i else None,
                seq=i,
                role=str(messages[i].get("role")),
                message=messages[i],
            )
            for i in range(stored, len(messages))
        ]
        ids = await self.store.append_new_messages(session.pk, new, now())
        self._remember(session.pk, chain)
        # ``stored`` is a lower bound: some of ``new`` may have been stored meanwhile (the last
        # reply's queued write, another replica's); those inserted are the last (prefix-closed)
        return LoggedRequest(len(ids), len(messages) - len(ids) if ids else None, tuple(ids), session)

    def finish(
        self,
        session: SessionRecord,
        messages: list[dict[str, Any]],
        chain: list[str],
        internal: list[dict[str, Any]],
        reply: dict[str, Any] | None,
        record: RequestRecord,
        *,
        with_request: bool,
        then: Then,
    ) -> None:
        """Store (``with_request``: the client's new messages,) the proxy's internal rounds, the reply
        after them, and the request record, in one transaction (``Store.append_and_record``): a
        plain request costs one write. Internal messages are marked ``internal``; the chain runs
        through them. If the session is gone, it is opened again and all of it is written there
        (``_refinish``).

        Started now; never raises. ``then(error)`` is called once when the write ended, in a later
        loop step and in the caller's context: ``error`` ``None`` once stored, else a
        ``StorageError``, what building the rows raised (say a reply orjson cannot serialize), or
        a ``CancelledError`` (the loop stopping). When this process knows how much of the
        client's history is stored (or ``with_request`` is false) it is the store's write with
        this log's bookkeeping and ``then`` after it in one callback: no task and no future of its
        own (on SQLite a queued write, ``storage.sqlite.end_write``); else a task that reads how
        much is stored first."""
        stored = None
        if with_request:
            stored = self._known_prefix(session.pk, chain)
            if stored is None:
                task = self._spawn(self._finish_after_read(session, messages, chain, internal, reply, record))
                task.add_done_callback(functools.partial(tell, then))
                return
        self._write(session, messages, chain, internal, reply, record, stored, then, reopen=True)

    async def _finish_after_read(self, session: SessionRecord, messages: list[dict[str, Any]], chain: list[str],
                                 internal: list[dict[str, Any]], reply: dict[str, Any] | None,
                                 record: RequestRecord) -> None:
        stored = await self.store.stored_prefix_len(session.pk, chain)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write(session, messages, chain, internal, reply, record, stored, functools.partial(settle, done),
                    reopen=True)
        await done

    async def _refinish(self, session: SessionRecord, messages: list[dict[str, Any]], chain: list[str],
                        internal: list[dict[str, Any]], reply: dict[str, Any] | None, record: RequestRecord) -> None:
        """``finish`` on ``session`` opened again (it was gone): the client's messages too, whatever
        was written before, and the record moved to the new row."""
        reopened = await self._reopen(session)
        record = dataclasses.replace(record, session_pk=reopened.pk)
        stored = await self.store.stored_prefix_len(reopened.pk, chain)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write(reopened, messages, chain, internal, reply, record, stored, functools.partial(settle, done),
                    reopen=False)
        await done

    def _write(self, session: SessionRecord, messages: list[dict[str, Any]], chain: list[str],
               internal: list[dict[str, Any]], reply: dict[str, Any] | None, record: RequestRecord, stored: int | None,
               then: Then, *, reopen: bool) -> None:
        """The store's write of ``finish`` (``stored``: the client's messages already stored,
        ``None``: none of theirs to write), then what this process remembers of it, then
        ``then``; a session found gone (``MissingRow``) is opened again and written there once
        (``reopen``)."""
        try:
            new, client_rows = _new_rows(messages, chain, internal, reply, stored)
            written = self.store.append_and_record(session.pk, new, record, now(), client_rows=client_rows)
            if internal:
                rows = [MessageRecord(0, session.pk, m.chain_hash, m.parent_hash, m.seq, m.role, m.message, True,
                                      now()) for m in new if m.internal]
                pending = self._pending_internal.fresh(session.pk) or []
                self._pending_internal.put(session.pk, [*pending, *rows][-PENDING_INTERNAL:])
        except Exception as exc:  # noqa: BLE001  (``then``'s: see ``finish``)
            asyncio.get_running_loop().call_soon(then, exc)
            return

        def ended(future: asyncio.Future[int]) -> None:
            if future.cancelled():
                then(asyncio.CancelledError())
                return
            error = future.exception()
            if isinstance(error, MissingRow) and reopen:
                retry = self._spawn(self._refinish(session, messages, chain, internal, reply, record))
                retry.add_done_callback(functools.partial(tell, then))
            elif error is not None:
                then(error)
            else:
                n = len(chain)
                self._remember(session.pk, chain + [m.chain_hash for m in new if m.seq >= n])
                if internal:
                    self._internal.pop(session.pk, None)
                then(None)

        written.add_done_callback(ended)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def finish_refused(self, session: SessionRecord, record: RequestRecord, logged: LoggedRequest | None,
                             writes: RequestWrites) -> list[str]:
        """The record of a request whose key the provider refused, written in the transaction that
        deletes what the request created itself (``Store.record_refused``: the messages its early
        append inserted, ``logged``; its new artifacts and events, ``writes``); this process's
        caches forget them. A session found gone took all of it with it: the record alone goes
        to the session opened again. Returns the deleted artifacts' ids."""
        ids = logged.message_ids if logged is not None else ()
        try:
            gone = await self.store.record_refused(record, now(), session.tenant, ids, writes.artifact_ids,
                                                   writes.event_ids)
        except MissingRow:
            reopened = await self._reopen(session)
            gone = await self.store.record_refused(dataclasses.replace(record, session_pk=reopened.pk), now(),
                                                   session.tenant, (), (), ())
        if ids:
            self._forget(session.pk)
        return gone

    async def _internal_messages(self, session_pk: int) -> list[MessageRecord]:
        """The session's internal messages: stored, and those being written (``_pending_internal``)."""
        records = self._internal.fresh(session_pk)
        if records is None:
            records = await self.store.list_internal_messages(session_pk)
            self._internal.put(session_pk, records)
        return self._with_pending(session_pk, records)

    def internal_now(self, session_pk: int) -> list[MessageRecord] | None:
        """``_internal_messages`` without I/O (nor a coroutine): ``None`` when the stored ones are
        to be read first (not cached, or cached more than ``CACHE_TTL_S`` ago)."""
        records = self._internal.fresh(session_pk)
        return self._with_pending(session_pk, records) if records is not None else None

    def _with_pending(self, session_pk: int, records: list[MessageRecord]) -> list[MessageRecord]:
        """``records`` (the stored internal messages) and those being written not among them."""
        pending = self._pending_internal.fresh(session_pk)
        if pending:
            known = {r.chain_hash for r in records}
            records = [*records, *(r for r in pending if r.chain_hash not in known)]
        return records

    async def expand_internal(
        self, session: SessionRecord, messages: list[dict[str, Any]], digests: list[str], chain: list[str],
        after: Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[list[dict[str, Any]], list[str], list[str]] | None:
        """The client's messages with the proxy's earlier internal rounds put back where they happened.

        An internal round is stored as internal messages whose parent is the message after which it
        ran; the chain continues through them, so the reply that followed (and the client's echo
        of it) hash identically. ``after(run, message)``: the client's message that follows the
        internal messages ``run`` as it is forwarded after them (its digest and chain hash stay
        those of the message as logged; Messages: ``messages_rounds.after_rounds``). Returns ``None``
        when the session has no internal rounds.
        """
        internal = self.internal_now(session.pk)
        if internal is None:
            internal = await self._internal_messages(session.pk)
        return self.expand(internal, messages, digests, chain, after)

    @staticmethod
    def expand(
        internal: list[MessageRecord], messages: list[dict[str, Any]], digests: list[str], chain: list[str],
        after: Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[list[dict[str, Any]], list[str], list[str]] | None:
        """``expand_internal`` given the session's ``internal`` messages (``internal_now``, else
        read): without I/O, for a caller that has them without a coroutine."""
        if not internal:
            return None
        children: dict[str | None, MessageRecord] = {}
        for record in internal:
            children.setdefault(record.parent_hash, record)
        out_m: list[dict[str, Any]] = []
        out_d: list[str] = []
        out_c: list[str] = []
        parent: str | None = None
        shifted = False
        run: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            h = chain_hash(parent, digests[i]) if shifted else chain[i]
            out_m.append(after(run, message) if run and after is not None else message)
            out_d.append(digests[i])
            out_c.append(h)
            run = []
            while h in children:
                record = children[h]
                run.append(record.message)
                out_m.append(record.message)
                out_d.append(message_digest(record.message))
                out_c.append(record.chain_hash)
                h = record.chain_hash
                shifted = True
            parent = h
        return (out_m, out_d, out_c) if shifted else None


def tell(then: Then, task: asyncio.Task[Any]) -> None:
    """``then`` told how ``task`` ended (a done callback: ``functools.partial(tell, then)``)."""
    then(asyncio.CancelledError() if task.cancelled() else task.exception())


def settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    """``functools.partial(settle, done)``: a ``Then`` that ends ``done`` as the write ended (its
    error raised by ``await done``); nothing if ``done`` was cancelled meanwhile."""
    if done.done():
        return
    if error is None:
        done.set_result(None)
    elif isinstance(error, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(error)
