"""The chat use case: log, project, forward, recover from overflow, relay, log the reply.

Flow of one ``POST /v1/chat/completions`` (DESIGN.md section 5): parse -> name the session ->
project (stored events + defenses; a new compaction first writes the client's messages, then is
planned, executed and stored) -> forward -> on an overflow (an error status, or an error event
before anything a stream carried): compact even below the trigger and retry (bounded; when no
retry is left the provider's answer goes back as it came) -> serve the proxy's own tool calls and
ask again (the same loop, streamed or not: ``_exchanges``) -> relay the reply while reassembling
it (a stream writes the client's messages once its first byte is out) -> log the reply and a request record (with the client's messages
not yet written) in one transaction: queued for the store's next batched commit where it defers
small writes (SQLite), else in a task of its own; either way started before the response is
handed back, so a client that disconnects cannot skip it.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.compaction.base import Compactor, Prepared
from proxy.compaction.overflow import Overflow, classify_error
from proxy.conversation.canonical import digests_off_loop
from proxy.conversation.chat_request import is_too_deep, parse_chat_request, too_deep
from proxy.errors import ProxyError, UpstreamUnreachable
from proxy.forward.answers import DISCONNECTED, Buffered, Streamed, Turn
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.session_ids import client_session_id, header_value
from proxy.forward.session_log import (
    LoggedRequest,
    SessionLog,
    derive_session_id,
    new_id,
)
from proxy.forward.sse import ReplyAssembler
from proxy.forward.streaming import (
    Segment,
    provider_error_event,
    relay_plain,
    relay_turn,
    relay_unlogged,
    start_stream,
)
from proxy.forward.tool_rounds import KEEPALIVE, ToolRounds, own_only
from proxy.json_text import parse_json
from proxy.settings import Settings
from proxy.telemetry.logs import bind
from proxy.telemetry.metrics import Metrics
from proxy.upstream.client import (
    Upstream,
    forward_request_headers,
    response_headers,
    translate,
)
from storage.errors import StorageError, StorageUnavailable
from storage.records import RequestRecord, SessionRecord
from storage.refused import RequestWrites, track_writes, untrack_writes

log = logging.getLogger("context_proxy.pipeline")

CHAT_PATH = "/chat/completions"
DRAIN_POLL_S = 0.005
"""How often ``drain`` looks again at writes queued without a task."""
DEGRADED_WARNING = "database unavailable: this request was forwarded without logging or compaction"
COMPACTING = b": context-proxy is compacting after an overflow\n\n"
"""Keep-alive comment of a stream whose later round overflowed (summary calls take a while)."""


@dataclass(slots=True)
class ChatContext:
    """Everything one chat request carries through the pipeline."""

    request_id: str
    tenant: str
    session: SessionRecord
    body: dict[str, Any]
    raw: bytes
    messages: list[dict[str, Any]]
    digests: list[str]
    chain: list[str]
    upstream_headers: list[tuple[str, str]]
    stream: bool
    started: float
    session_log: SessionLog
    append_task: asyncio.Task[LoggedRequest] | None = None
    """Set when the client's messages are written before the reply (streams; compactions)."""
    finished: bool = False
    prepared: Prepared | None = None
    retries: int = 0
    unrecovered: Overflow | None = None
    """The provider's overflow this request ended with, no retry left (its answer returned as sent)."""
    compact_tool: bool = False
    """The client asked for the manual compaction tool (header ``X-Context-Proxy-Compact-Tool``)."""
    count_tools: list[dict[str, Any]] | None = None
    """Tool schemas counted against the window: the client's plus the proxy's own."""
    internal: list[dict[str, Any]] = field(default_factory=list)
    """Messages of the proxy's own tool rounds in this request (logged as internal)."""
    read_rounds: int = 0
    expanded: bool = False
    """``messages`` include internal rounds the client's history does not (forward them, not ``raw``)."""
    degraded: bool = False
    """The database failed and ``database_failure_mode`` is open: forwarded without compaction."""
    refused: bool = False
    """The provider refused the client's own key (401/403, keys passed through): only the request
    record is logged, none of the content (anyone can send a body under a made-up key)."""
    writes: RequestWrites = field(default_factory=RequestWrites)
    """The artifact and event rows this request's own inserts created (tracked while it is
    handled: ``storage.refused.track_writes``), deleted if it is ``refused``."""

    @property
    def model(self) -> str:
        return str(self.body.get("model"))

    async def ensure_logged(self) -> LoggedRequest:
        """Write the client's messages now (before a compaction event anchors on them). Shielded:
        a request cancelled meanwhile (its client left) does not cancel the write."""
        if self.append_task is None:
            self.append_task = asyncio.ensure_future(self.session_log.append_request(self.session, self.messages, self.chain))
        logged = await asyncio.shield(self.append_task)
        self.use_session(logged)
        return logged

    def use_session(self, logged: LoggedRequest) -> None:
        """Go on in the session the messages went to (opened again if the request's was gone)."""
        if logged.session is not None:
            self.session = logged.session


class ChatPipeline:
    """Orchestrates one chat request. Owns no connections: the store and upstream are injected."""

    def __init__(self, settings: Settings, session_log: SessionLog, upstream: Upstream, compactor: Compactor,
                 *, metrics: Metrics | None = None) -> None:
        self.metrics = metrics or Metrics()
        self.settings = settings
        self.log = session_log
        self.upstream = upstream
        self.compactor = compactor
        self.rounds = ToolRounds(settings, session_log.store, compactor)
        self.health = DatabaseHealth(session_log.store)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending_writes = 0
        """Log writes queued by ``_finish_nowait`` and not yet ended."""
        self._room = asyncio.Event()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` as a tracked task (awaited at shutdown by ``drain``)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._write_ended()

    def _write_ended(self) -> None:
        if self._pending() < self.settings.max_pending_log_writes:
            self._room.set()

    def _pending(self) -> int:
        """Log writes not ended: tasks, and writes queued without one (``_finish_nowait``)."""
        return len(self._tasks) + self._pending_writes

    async def _wait_for_room(self) -> None:
        """Backpressure: wait while ``max_pending_log_writes`` log writes are pending (the
        database is slower than the traffic), so the backlog, and memory, stay bounded."""
        while self._pending() >= self.settings.max_pending_log_writes:
            self._room.clear()
            self.metrics.database_error("backpressure")
            await self._room.wait()

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait for pending log writes (graceful shutdown): tasks, and writes queued without one
        (committed within ``storage.sqlite.file.DEFER_WRITE_S``, or retried one by one), for at
        most ``timeout_s`` in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._pending() and loop.time() < deadline:
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=deadline - loop.time())
            else:
                await asyncio.sleep(DRAIN_POLL_S)

    async def handle(self, raw: bytes, headers: Mapping[str, str], header_items: list[tuple[str, str]], tenant: str) -> Buffered | Streamed:
        if self._pending() >= self.settings.max_pending_log_writes:
            await self._wait_for_room()
        body = parse_chat_request(raw)
        messages: list[dict[str, Any]] = body["messages"]
        try:
            digests, chain = await digests_off_loop(messages, len(raw))
        except orjson.JSONEncodeError as exc:  # ``TypeError`` itself: only the depth limit is the client's
            if not is_too_deep(exc):
                raise
            raise too_deep() from None
        session_id = client_session_id(headers.get("x-session-id")) or derive_session_id(tenant, messages, chain)
        try:
            if not await self.health.usable():
                raise StorageUnavailable("the database did not answer the last probe")
            session = await self.log.open_session(tenant, session_id)
            expanded = await self.log.expand_internal(session, messages, digests, chain)
        except StorageError as exc:
            self._storage_failed(exc)
            if self.settings.database_failure_mode != "open":
                raise
            return await self._forward_unlogged(raw, bool(body.get("stream")), header_items, tenant)
        if expanded is not None:  # the proxy's earlier tool rounds, put back where they happened
            messages, digests, chain = expanded
        ctx = ChatContext(
            request_id=new_id("req"),
            tenant=tenant,
            session=session,
            body=body,
            raw=raw,
            messages=messages,
            digests=digests,
            chain=chain,
            upstream_headers=forward_request_headers(
                header_items, upstream_api_key=self.settings.upstream_api_key, identity=True
            ),
            stream=bool(body.get("stream")),
            started=time.perf_counter(),
            session_log=self.log,
            compact_tool=(headers.get("x-context-proxy-compact-tool") or "").lower() in ("1", "on", "true", "yes"),
            expanded=expanded is not None,
        )
        bind(request_id=ctx.request_id, session_id=session.session_id, model=ctx.model)
        tracking = track_writes(ctx.writes)
        try:
            return await self._run(ctx)
        except BaseException as exc:  # every path logs the client's messages, errors included
            if not ctx.finished:
                status = exc.status if isinstance(exc, ProxyError) else 500
                self._spawn_finish(ctx, status, None, None, error=str(exc)[:500] or type(exc).__name__)
            raise
        finally:
            untrack_writes(tracking)

    async def _run(self, ctx: ChatContext) -> Buffered | Streamed:
        """Prepare, then run the round loop (``_exchanges``): a complete answer, or a stream once
        its first bytes are ready (errors before them are answered with an HTTP status)."""
        await self._prepare(ctx, None)
        turn = Turn(assembler=ReplyAssembler(self.settings.stream_log_max_bytes))
        steps = self._exchanges(ctx, turn)
        try:
            first = await anext(steps)
        except StopAsyncIteration:
            assert turn.answer is not None
            return turn.answer
        headers = self._client_headers(ctx, turn.resp.headers)

        def started() -> None:
            if ctx.append_task is None:
                # a stream may last minutes: commit the client's messages while it runs, once
                # its first byte is out (not before: the write would delay that byte)
                ctx.append_task = self.spawn(self.log.append_request(ctx.session, ctx.messages, ctx.chain))

        relay = relay_turn(turn, first, steps, started=started, ended=lambda: self._stream_ended(ctx, turn, steps))

        async def close() -> None:
            try:
                await relay.aclose()  # a started relay, stopped at a yield, runs its finally now
                if not ctx.finished:  # never started: the client left before the first byte
                    await self._stream_ended(ctx, turn, steps)
            finally:
                await steps.aclose()  # idempotent: the upstream response released even if cut short
                await turn.resp.aclose()

        return Streamed(turn.status, headers, relay, close)

    async def _prepare(self, ctx: ChatContext, overflow: Overflow | None) -> None:
        """``ctx.prepared``: what to forward (the defenses; forced after an ``overflow``)."""
        try:
            ctx.prepared = await self.compactor.prepare(ctx, overflow=overflow)
        except orjson.JSONEncodeError as exc:  # ``TypeError`` itself: only the depth limit is the client's
            if not is_too_deep(exc):
                raise
            raise too_deep() from None
        except StorageError as exc:
            self._storage_failed(exc)
            if self.settings.database_failure_mode != "open":
                raise
            self.metrics.database_error("fail_open")
            ctx.degraded = True
            ctx.prepared = Prepared(orjson.dumps(ctx.body | {"messages": ctx.messages}) if ctx.expanded else ctx.raw)

    async def _retry(self, ctx: ChatContext, turn: Turn, overflow: Overflow) -> bool:
        """After an overflow: learn from it; when a retry is left (``max_overflow_retries``, and
        the compactor can), compact and prepare it and return True. The proxy's rounds start over
        on the compacted request, unless a stream's client has seen text from them: then they are
        kept after it (asked again from scratch, the model would say that text again). False when no
        retry is left, or when compacting changed nothing (the same body would overflow again):
        the provider's answer is returned as it came, with headers saying what was tried (the
        proxy never words an overflow of its own)."""
        await self.compactor.learn(ctx, overflow)
        if not (turn.committed and not turn.assembler.empty):
            ctx.internal, ctx.read_rounds = [], 0  # rounds that led to an overflow are not kept
        if ctx.retries >= self.settings.max_overflow_retries or not self.compactor.can_retry(ctx, overflow):
            return self._unrecovered(ctx, overflow)
        assert ctx.prepared is not None
        before = ctx.prepared.body
        await self._prepare(ctx, overflow)
        if ctx.internal:
            base = ctx.prepared.forwarded or ctx.body
            body = orjson.dumps(base | {"messages": [*base["messages"], *ctx.internal]})
            ctx.prepared = dataclasses.replace(ctx.prepared, body=body)
        if ctx.prepared.body == before:
            return self._unrecovered(ctx, overflow)
        ctx.retries += 1
        self.metrics.overflow("retried")
        turn.assembler.reset_round()
        return True

    def _unrecovered(self, ctx: ChatContext, overflow: Overflow) -> bool:
        ctx.unrecovered = overflow
        self.metrics.overflow("unrecoverable")
        return False

    def _client_headers(self, ctx: ChatContext, upstream: Any) -> dict[str, str]:
        shared_key = self.settings.upstream_api_key is not None  # the operator's account headers stay here
        out = response_headers(upstream, keep_encoding=False, shared_key=shared_key) if upstream is not None else {}
        out.pop("content-length", None)
        p = ctx.prepared
        out["x-context-proxy-session-id"] = header_value(ctx.session.session_id)
        out["x-context-proxy-request-id"] = ctx.request_id
        if p is not None:
            if p.tokens_client is not None:
                out["x-context-proxy-tokens-client"] = str(p.tokens_client)
            if p.tokens_forwarded is not None:
                out["x-context-proxy-tokens-forwarded"] = str(p.tokens_forwarded)
            out["x-context-proxy-defenses"] = ",".join(p.applied) or "none"
            if p.event_ids:
                out["x-context-proxy-events"] = ",".join(p.event_ids)
        if ctx.retries or ctx.unrecovered is not None:
            out["x-context-proxy-overflow-retries"] = str(ctx.retries)
        if ctx.unrecovered is not None:  # the provider's overflow, returned as it sent it
            out["x-context-proxy-overflow"] = ctx.unrecovered.provider_style
        if ctx.degraded:
            out["x-context-proxy-warning"] = DEGRADED_WARNING
        return out

    async def _forward_unlogged(self, raw: bytes, stream: bool, header_items: list[tuple[str, str]], tenant: str) -> Buffered | Streamed:
        """Fail open: relay the request as sent, without logging or compaction (database down)."""
        self.metrics.database_error("fail_open")
        log.warning("database unavailable: forwarding without logging or compaction (database_failure_mode=open)")
        headers = forward_request_headers(header_items, upstream_api_key=self.settings.upstream_api_key, identity=True)
        resp = await self.upstream.send("POST", CHAT_PATH, headers=headers, content=raw, tenant=tenant)
        out = response_headers(resp.headers, keep_encoding=False, shared_key=self.settings.upstream_api_key is not None)
        out["x-context-proxy-warning"] = DEGRADED_WARNING
        out.pop("content-length", None)
        if stream and resp.status_code < 400:
            return Streamed(resp.status_code, out, relay_unlogged(resp), resp.aclose)
        try:
            data = await _read(resp)
        finally:
            await resp.aclose()
        return Buffered(resp.status_code, out, data)

    async def _exchanges(self, ctx: ChatContext, turn: Turn) -> AsyncIterator[Segment]:
        """The round loop, one for streams and not: forward; when the model called only the
        proxy's tools, serve them and ask again (``ToolRounds``); after an overflow (an error
        status, or an error event before anything a stream carried), learn, compact and retry
        (``_retry``). Yields what a stream's client is sent, as ``Segment``s for ``relay_turn`` (a
        stream keeps relaying across rounds and retries); a complete answer (not a stream, or
        answered before a stream's first byte) is left in ``turn.answer``. The upstream response
        is closed however this ends."""
        hold = self.compactor.retries_overflows  # an overflow in a stream's start can be retried
        try:
            while True:
                assert ctx.prepared is not None
                if turn.resp is not None:
                    await turn.resp.aclose()
                sent = ctx.prepared.forwarded or ctx.body  # what overflow errors may quote back
                if ctx.internal:
                    sent = sent | {"messages": [*sent["messages"], *ctx.internal]}
                started = time.perf_counter()
                resp = turn.resp = await self.upstream.send("POST", CHAT_PATH, headers=ctx.upstream_headers, content=ctx.prepared.body,
                                                            tenant=ctx.tenant)
                self.metrics.upstream_answered(ctx.model, time.perf_counter() - started)
                if resp.status_code >= 400:
                    data = await _read(resp)
                    await resp.aclose()  # read whole: its pool slot is free for a summary call
                    overflow = classify_error(resp.status_code, data, resp.headers, sent=sent)
                    if overflow is not None:
                        if turn.committed:
                            yield COMPACTING
                        if await self._retry(ctx, turn, overflow):
                            continue
                    if turn.committed:
                        turn.error = f"the upstream answered {resp.status_code} in a later round"
                        turn.assembler.upstream_error = True
                        yield provider_error_event(data)
                    else:
                        turn.answer = self._error_answer(ctx, resp.status_code, resp.headers, data)
                    return
                if ctx.stream and "text/event-stream" in resp.headers.get("content-type", ""):
                    state = await start_stream(resp, hold=hold, assembler=turn.assembler, sent=sent)
                    if state.overflow is not None:
                        if turn.committed:
                            yield COMPACTING
                        if await self._retry(ctx, turn, state.overflow):
                            continue
                    if not turn.committed:
                        turn.committed, turn.status = True, resp.status_code
                    yield self.rounds.relay_round(ctx, state) if ctx.prepared.own_tools else relay_plain(state)
                    if not state.own_calls or turn.assembler.upstream_error:  # (resumed once that relay was read to its end)
                        return  # an error event relayed ends the stream's rounds too
                    yield KEEPALIVE
                    await self.rounds.serve(ctx, {"content": None}, state.own_calls)
                    turn.assembler.reset_round()
                    continue
                data = await _read(resp)
                reply, usage, finish_reason = _reply_of(data)
                mine, theirs = own_only(reply, ctx.prepared.own_tools)
                if self.rounds.serves(ctx, mine, len(theirs)):
                    await self.rounds.serve(ctx, reply or {}, mine)
                    continue
                if turn.committed:
                    raise UpstreamUnreachable("The upstream answered a streamed round without an event stream.")
                turn.answer = await self._answer(ctx, resp, data, reply, usage, finish_reason, theirs if mine else None)
                return
        finally:
            if turn.resp is not None:
                await turn.resp.aclose()

    async def _answer(self, ctx: ChatContext, resp: Any, data: bytes, reply: dict[str, Any] | None, usage: dict[str, Any] | None,
                      finish_reason: str | None, client_calls: list[dict[str, Any]] | None) -> Buffered:
        """A complete reply, logged (``client_calls``: what is left of it when the model called the
        proxy's tools too: those are removed)."""
        if client_calls is not None and reply is not None:
            data, reply = self.rounds.strip(data, reply, client_calls)
            finish_reason = "stop" if not client_calls else finish_reason
        if ctx.internal:  # log the proxy's rounds before answering: the next turn must find them
            ctx.finished = True
            await self._finish(ctx, resp.status_code, reply, usage, finish_reason=finish_reason)
        else:
            self._spawn_finish(ctx, resp.status_code, reply, usage, finish_reason=finish_reason)
        return Buffered(resp.status_code, self._client_headers(ctx, resp.headers), data)

    def _error_answer(self, ctx: ChatContext, status: int, headers: Any, data: bytes) -> Buffered:
        """The provider's error response as it sent it (status, body, content type), logged (a
        401/403 to a client's own key: the record only, ``ChatContext.refused``)."""
        ctx.refused = status in (401, 403) and self.settings.upstream_api_key is None and not ctx.internal
        # (the provider's 401 text may quote the key: not kept for a refused one)
        error = f"the upstream refused the client's key ({status})" if ctx.refused else data[:500].decode("utf-8", "replace")
        self._spawn_finish(ctx, status, None, None, error=error)
        return Buffered(status, self._client_headers(ctx, headers), data)

    async def _stream_ended(self, ctx: ChatContext, turn: Turn, steps: AsyncIterator[Segment]) -> None:
        """Log the reply as far as it came and release the upstream response (once per stream)."""
        if ctx.finished:
            return
        a = turn.assembler
        # a client that closes right after reading [DONE] leaves the relay at its last yield: the
        # reply is complete all the same (else it would be logged as partial, and its hash would
        # differ from the client's echo of it)
        error = None if (a.done and not a.upstream_error and not a.hidden_error and turn.error == DISCONNECTED) else turn.error
        reply = a.message() if not a.empty else None
        self._spawn_finish(ctx, turn.status, reply, a.usage, error=error,
                           partial=error is not None, finish_reason=a.finish_reason)
        await steps.aclose()  # type: ignore[attr-defined]

    def _storage_failed(self, exc: BaseException) -> None:
        if isinstance(exc, StorageUnavailable):
            self.health.failed()

    def _spawn_finish(self, ctx: ChatContext, status: int, reply: dict[str, Any] | None, usage: dict[str, Any] | None,
                      **kwargs: Any) -> None:
        """Log the reply and the request record (``_finish``): queued at once when that needs no
        wait (``SessionLog.finish_nowait``: the usual case on SQLite), else in a task of its own."""
        ctx.finished = True
        if ctx.append_task is None and not ctx.internal and not ctx.refused and self._finish_nowait(ctx, status, reply, usage, **kwargs):
            return
        self.spawn(self._finish(ctx, status, reply, usage, **kwargs))

    def _finish_nowait(self, ctx: ChatContext, status: int, reply: dict[str, Any] | None, usage: dict[str, Any] | None,
                       *, error: str | None = None, partial: bool = False, finish_reason: str | None = None) -> bool:
        """``_finish`` without a task when the write can be queued (``SessionLog.finish_nowait``);
        ``False``, having done nothing, when it cannot. Never raises (as ``_finish``): a reply
        that cannot be logged is logged as such. Its pending writes count towards
        ``max_pending_log_writes`` until they end; what ``done`` logs or starts runs in this
        request's context (its ids), not in that of the flush that calls it."""
        if not self.log.defers_writes:
            return False
        try:
            record = self._record(ctx, self._latency_ms(ctx), status, usage, None, error, finish_reason)
            keep = _kept_reply(reply, status, partial, error)
            context = contextvars.copy_context()

            def done(exc: BaseException | None) -> None:
                self._pending_writes -= 1
                self._write_ended()
                context.run(self._write_done, ctx, usage, exc)

            if not self.log.finish_nowait(ctx.session, ctx.messages, ctx.chain, keep, record, done):
                return False
        except Exception as exc:  # noqa: BLE001  (e.g. a reply orjson cannot hash: answered all the same)
            self._count_finished(ctx, status)
            self._log_failed(ctx, exc)
            return True
        self._pending_writes += 1
        self._count_finished(ctx, status)
        return True

    def _write_done(self, ctx: ChatContext, usage: dict[str, Any] | None, exc: BaseException | None) -> None:
        """After a queued write: its failure logged, or the reply observed (``_finish`` does both)."""
        try:
            if exc is None and self.compactor.usage_observed(ctx, usage):
                self.spawn(self._persist_observed(ctx))
        except Exception as error:  # noqa: BLE001  (an odd ``usage``, say)
            exc = error
        if exc is not None:
            self._log_failed(ctx, exc)

    async def _persist_observed(self, ctx: ChatContext) -> None:
        try:
            await self.compactor.persist_observed(ctx)
        except Exception as exc:  # noqa: BLE001  (as in ``_finish``)
            self._log_failed(ctx, exc)

    async def _finish(
        self,
        ctx: ChatContext,
        status: int,
        reply: dict[str, Any] | None,
        usage: dict[str, Any] | None,
        *,
        error: str | None = None,
        partial: bool = False,
        finish_reason: str | None = None,
    ) -> None:
        """Log the reply and the request record, in a task of its own (when ``_finish_nowait``
        cannot queue it); never raises."""
        latency_ms = self._latency_ms(ctx)
        self._count_finished(ctx, status)
        logged: LoggedRequest | None = None  # None: the client's messages go in the final transaction
        if ctx.append_task is not None:
            try:
                logged = await asyncio.shield(ctx.append_task)
                ctx.use_session(logged)
            except asyncio.CancelledError:
                if not ctx.append_task.cancelled():
                    raise  # this task itself is cancelled (shutdown)
                logged = None  # the write never ran: it goes in the final transaction
            except Exception as exc:
                log.exception("appending the request's messages failed; retried with the reply", extra={"session_id": ctx.session.session_id})
                self.metrics.database_error("log")
                self._storage_failed(exc)
        try:
            record = self._record(ctx, latency_ms, status, usage, None if ctx.refused else logged, error, finish_reason)
            keep = _kept_reply(reply, status, partial, error)
            if ctx.refused:  # only the record is kept: what the request stored itself goes, at once
                gone = await self.log.finish_refused(ctx.session, record, logged, ctx.writes)
                self.compactor.forget_refused(ctx.session.pk, ctx.tenant, gone, bool(ctx.writes.event_ids))
            else:
                await self.log.finish(ctx.session, ctx.messages, ctx.chain, ctx.internal, keep, record, with_request=logged is None)
            if self.compactor.usage_observed(ctx, usage):
                await self.compactor.persist_observed(ctx)
        except Exception as exc:
            self._log_failed(ctx, exc)

    def _count_finished(self, ctx: ChatContext, status: int) -> None:
        if ctx.prepared is not None:
            self.metrics.chat_forwarded(ctx.model, ctx.prepared.tokens_client, ctx.prepared.tokens_forwarded, ctx.prepared.applied)
        if ctx.retries and status < 400 and ctx.unrecovered is None:
            self.metrics.overflow("recovered")

    @staticmethod
    def _latency_ms(ctx: ChatContext) -> float:
        return (time.perf_counter() - ctx.started) * 1000

    @staticmethod
    def _record(ctx: ChatContext, latency_ms: float, status: int, usage: dict[str, Any] | None,
                logged: LoggedRequest | None, error: str | None, finish_reason: str | None) -> RequestRecord:
        """The request's record (``logged``: its messages' earlier write, if any)."""
        p = ctx.prepared
        return RequestRecord(
            id=ctx.request_id,
            session_pk=ctx.session.pk,
            model=ctx.model,
            status=status,
            latency_ms=latency_ms,
            stream=ctx.stream,
            usage=usage,
            added_messages=logged.added if logged else 0,
            first_added_seq=logged.first_added_seq if logged else None,
            tokens_client=p.tokens_client if p else None,
            tokens_forwarded=p.tokens_forwarded if p else None,
            defenses=list(p.applied) if p else [],
            event_ids=list(p.event_ids) if p else [],
            error=error.replace("\x00", "") if error else error,
            finish_reason=finish_reason,
        )

    def _log_failed(self, ctx: ChatContext, exc: BaseException) -> None:
        log.error("logging the reply failed", exc_info=exc,
                  extra={"session_id": ctx.session.session_id, "request_id": ctx.request_id})
        self.metrics.database_error("log")
        self._storage_failed(exc)


def _kept_reply(reply: dict[str, Any] | None, status: int, partial: bool, error: str | None) -> dict[str, Any] | None:
    """The reply as logged: none for an error status; a partial one marked with why it stopped."""
    if reply is None or status >= 400:
        return None
    if not partial:
        return reply
    return reply | {"x_context_proxy": reply.get("x_context_proxy", {}) | {"partial": True, "reason": error}}


async def _read(resp: Any) -> bytes:
    try:
        return await resp.aread()
    except BaseException as exc:
        raise translate(exc) from exc


def _reply_of(data: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]:
    """``(message, usage, finish_reason)`` of a chat.completion body (choice 0); Nones if unusable.
    A lone surrogate escape in it is usable, replaced by U+FFFD (``proxy.json_text``)."""
    try:
        parsed = parse_json(data)
        choice = parsed["choices"][0]
        message = dict(choice["message"])
        return message, parsed.get("usage"), choice.get("finish_reason")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None, None, None
