"""The end-of-request log write: the reply and the request record, started as the answer goes back.

``LogWriter`` (one per pipeline, ``ChatPipeline.writer``) owns what the pipeline's requests leave
running: the pending writes (the end of a request; a stream's early append of the client's
messages, ``spawn``; a learned limit to store), the backpressure on them
(``Settings.max_pending_log_writes``) and the drain at shutdown.

One call ends a request: ``finish``. It starts the write (``SessionLog.finish``: the store's
``append_and_record``, on SQLite a write queued in the deferred batch, no task; elsewhere a task
of the store's) with what to do once it ended (``_ended``: the usage the request's compactor
learns from, ``ChatContext.compactor``; a failure logged and counted, never raised to the
client), called in the one loop step that settles the write, and tracks it until then. A request
whose messages were written early (``ChatContext.append_task``), or whose key the provider refused
(only its record is kept; it waits for the writes pending when it finished too, so that its
cleanup sees their records), first waits for that: its write is a task of its own. ``_ended`` runs
in the request's context (its ids on their log lines): it is called from a done callback added
in the request, and a future's callback runs in the context it was added in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

from proxy.errors import ProxyError
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.session_log import LoggedRequest, SessionLog, Then, settle, tell
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from storage.errors import StorageUnavailable
from storage.records import RequestRecord

log = logging.getLogger("context_proxy.pipeline")


class LogWriter:
    """Starts and tracks the pipeline's log writes; never raises a write's failure to the client.

    Bound: at most ``Settings.max_pending_log_writes`` writes pending when a request is admitted
    (``full``, ``wait_for_room``); a write's future is held from its start until it ended."""

    def __init__(self, settings: Settings, session_log: SessionLog, metrics: Metrics, health: DatabaseHealth) -> None:
        self.settings = settings
        self.log = session_log
        self.metrics = metrics
        self.health = health
        self._pending: set[asyncio.Future[Any]] = set()
        """What has not ended: ``finish``'s futures (each resolved, never failed, once its write
        ended and was accounted for) and ``spawn``'s tasks."""
        self._room = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        """``finish``'s writes that run in a task (after an early append; refused): held until
        they end (the loop holds tasks weakly). Counted as pending through their ``finish`` future."""

    @property
    def full(self) -> bool:
        """``max_pending_log_writes`` writes are pending: a new request waits (``wait_for_room``)."""
        return len(self._pending) >= self.settings.max_pending_log_writes

    async def wait_for_room(self) -> None:
        """Backpressure: wait while ``max_pending_log_writes`` log writes are pending (the
        database is slower than the traffic), so the backlog, and memory, stay bounded."""
        while self.full:
            self._room.clear()
            self.metrics.database_error("backpressure")
            await self._room.wait()

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait for the pending writes (graceful shutdown), for at most ``timeout_s`` in all
        (writes a callback starts meanwhile, a learned limit to store, are waited for too)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._pending and (left := deadline - loop.time()) > 0:
            await asyncio.wait(list(self._pending), timeout=left)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a tracked task (counted as pending, awaited by ``drain``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._track(task)
        return task

    def finish(self, ctx: ChatContext, status: int, reply: dict[str, Any] | None, usage: dict[str, Any] | None, *,
               error: str | None = None, partial: bool = False, finish_reason: str | None = None,
               after_answer: bool = False) -> asyncio.Future[None]:
        """Log the reply (``partial``: as far as it came, marked with ``error``) and the request
        record, once per request (``ctx.finished``). Started now; never raises. The returned
        future is resolved (never failed) once the write ended and its outcome was handled:
        committed, or its failure logged (``logging the reply failed``) and counted. A caller
        that must know the write is stored before it answers (the proxy's own rounds: the
        client's next request must find them) awaits it.

        ``after_answer``: the caller is about to hand a complete answer to the server in this
        loop step; the record and the reply's message rows are then built and the write queued in
        the next step (``call_soon``), once the answer is out, instead of before it (a SQLite log
        converts them to the driver's rows later still, at its batch's commit:
        ``storage.sqlite.end_write``). The latency recorded is measured now, the
        request is finished now (pending, counted), and the write is queued before anything the
        answer leads to can run (a client's next request, a read of the log: the loop runs the
        callbacks queued in one step before the next step's I/O)."""
        ctx.finished = True
        latency_ms = (time.perf_counter() - ctx.started) * 1000
        self._count_finished(ctx, status)
        loop = asyncio.get_running_loop()  # (once: on Python 3.11 each lookup is a ``getpid`` system call)
        ended: asyncio.Future[None] = loop.create_future()
        self._pending.add(ended)
        then = functools.partial(self._ended, ctx, usage, ended)
        if ctx.append_task is not None or ctx.refused:
            # a refused request's cleanup runs after the writes already started: a request that
            # found its rows stored and was answered first is recorded before the cleanup looks
            earlier = [f for f in self._pending if f is not ended] if ctx.refused else []
            task = loop.create_task(
                self._after_append(ctx, latency_ms, status, reply, usage, error, partial, finish_reason, earlier))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(functools.partial(tell, then))
        elif after_answer:
            loop.call_soon(self._write, ctx, latency_ms, status, reply, usage, error, partial,
                                                 finish_reason, then)
        else:
            self._write(ctx, latency_ms, status, reply, usage, error, partial, finish_reason, then)
        return ended

    def _write(self, ctx: ChatContext, latency_ms: float, status: int, reply: dict[str, Any] | None,
               usage: dict[str, Any] | None, error: str | None, partial: bool, finish_reason: str | None,
               then: Then) -> None:
        """``finish``'s write when nothing was written early: the record and the rows, queued."""
        try:
            record = _record(ctx, latency_ms, status, usage, None, error, finish_reason)
            keep = _kept_reply(reply, status, partial, error)
        except Exception as exc:  # noqa: BLE001  (an odd value in what the upstream sent: answered all the same)
            asyncio.get_running_loop().call_soon(then, exc)
        else:
            self.log.finish(ctx.session, ctx.messages, ctx.chain, ctx.internal, keep, record,
                            with_request=True, then=then)

    def finish_failed(self, ctx: ChatContext, exc: BaseException) -> None:
        """``finish`` for a request that ended in ``exc`` (unless already finished): the record with
        ``exc``'s status (500 for one not the proxy's) and its text (500 characters at most)."""
        if not ctx.finished:
            status = exc.status if isinstance(exc, ProxyError) else 500
            self.finish(ctx, status, None, None, error=str(exc)[:500] or type(exc).__name__)

    async def _after_append(self, ctx: ChatContext, latency_ms: float, status: int, reply: dict[str, Any] | None,
                            usage: dict[str, Any] | None, error: str | None, partial: bool,
                            finish_reason: str | None, earlier: list[asyncio.Future[Any]]) -> None:
        """``finish`` after the early append of the client's messages (``ctx.append_task``): the
        record counts what it added; a refused request keeps only its record (what it stored
        itself is deleted in the same transaction), written once the writes pending when it
        finished (``earlier``) ended: the cleanup keeps what a request recorded by then relies on
        (``storage.refused``), and an answered request's record could still be in flight. Raises
        what the write raises."""
        logged: LoggedRequest | None = None  # None: the client's messages go in the final transaction
        if ctx.append_task is not None:
            try:
                logged = await asyncio.shield(ctx.append_task)
                ctx.use_session(logged)
            except asyncio.CancelledError:
                if not ctx.append_task.cancelled():
                    raise  # this task itself is cancelled (shutdown)
                logged = None  # the write never ran: it goes in the final transaction
            except Exception as exc:  # (retried with the reply: the final transaction writes them)
                log.exception("appending the request's messages failed; retried with the reply",
                              extra={"session_id": ctx.session.session_id})
                self.metrics.database_error("log")
                self._storage_failed(exc)
        record = _record(ctx, latency_ms, status, usage, None if ctx.refused else logged, error, finish_reason)
        if ctx.refused:  # only the record is kept: what the request stored itself goes, at once
            if earlier:  # (each resolves, never fails, once its write ended)
                await asyncio.wait(earlier)
            gone = await self.log.finish_refused(ctx.session, record, logged, ctx.writes)
            ctx.compactor.forget_refused(ctx.session.pk, ctx.tenant, gone, bool(ctx.writes.event_ids))
            return
        keep = _kept_reply(reply, status, partial, error)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.log.finish(ctx.session, ctx.messages, ctx.chain, ctx.internal, keep, record,
                        with_request=logged is None, then=functools.partial(settle, done))
        await done

    def _ended(self, ctx: ChatContext, usage: dict[str, Any] | None, ended: asyncio.Future[None],
               error: BaseException | None) -> None:
        """A write ended (``proxy.forward.session_log.Then``): its failure logged, or the reply's usage observed (a
        learned limit to store is a tracked task); then ``ended`` is no longer pending and is
        resolved. Runs in the request's context."""
        try:
            if isinstance(error, asyncio.CancelledError):
                return  # (shutdown: the loop is stopping)
            if error is None:
                try:
                    if ctx.compactor.usage_observed(ctx, usage):
                        self.spawn(self._persist_observed(ctx))
                except Exception as exc:  # noqa: BLE001  (an odd ``usage``, say)
                    error = exc
            if error is not None:
                self._log_failed(ctx, error)
        finally:
            self._pending.discard(ended)
            if not self.full:
                self._room.set()
            ended.set_result(None)

    async def _persist_observed(self, ctx: ChatContext) -> None:
        try:
            await ctx.compactor.persist_observed(ctx)
        except Exception as exc:  # noqa: BLE001  (as a write's failure: logged)
            self._log_failed(ctx, exc)

    def _track(self, future: asyncio.Future[Any]) -> None:
        self._pending.add(future)
        future.add_done_callback(self._untrack)

    def _untrack(self, future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        if not self.full:
            self._room.set()

    def _count_finished(self, ctx: ChatContext, status: int) -> None:
        if ctx.prepared is not None:
            p = ctx.prepared
            self.metrics.chat_forwarded(ctx.model, p.tokens_client, p.tokens_forwarded, p.applied)
        if ctx.retries and status < 400 and ctx.unrecovered is None:
            self.metrics.overflow("recovered")

    def _storage_failed(self, exc: BaseException) -> None:
        if isinstance(exc, StorageUnavailable):
            self.health.failed()

    def _log_failed(self, ctx: ChatContext, exc: BaseException) -> None:
        log.error("logging the reply failed", exc_info=exc,
                  extra={"session_id": ctx.session.session_id, "request_id": ctx.request_id})
        self.metrics.database_error("log")
        self._storage_failed(exc)


def _record(ctx: ChatContext, latency_ms: float, status: int, usage: dict[str, Any] | None,
            logged: LoggedRequest | None, error: str | None, finish_reason: str | None) -> RequestRecord:
    """The request's record (``logged``: its messages' earlier write, if any). Every field by
    position, in ``RequestRecord``'s order (``created_at`` ``None``: the write's time): a class
    called with keywords builds a dict of them for its ``__init__`` (sixteen: about 560 ns of
    the record's 880, timeit; ``test_the_record_is_built_by_position_in_the_fields_order``)."""
    p = ctx.prepared
    return RequestRecord(
        ctx.request_id,  # id
        ctx.session.pk,  # session_pk
        ctx.model,  # model
        status,
        latency_ms,
        ctx.stream,  # stream
        usage,
        logged.added if logged else 0,  # added_messages
        logged.first_added_seq if logged else None,  # first_added_seq
        p.tokens_client if p else None,  # tokens_client
        p.tokens_forwarded if p else None,  # tokens_forwarded
        list(p.applied) if p else [],  # defenses
        list(p.event_ids) if p else [],  # event_ids
        error.replace("\x00", "") if error else error,  # error
        None,  # created_at
        finish_reason,
        ctx.retries,  # overflow_retries
    )


def _kept_reply(reply: dict[str, Any] | None, status: int, partial: bool, error: str | None) -> dict[str, Any] | None:
    """The reply as logged: none for an error status; a partial one marked with why it stopped."""
    if reply is None or status >= 400:
        return None
    if not partial:
        return reply
    return reply | {"x_context_proxy": reply.get("x_context_proxy", {}) | {"partial": True, "reason": error}}
