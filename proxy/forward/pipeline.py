"""The chat use case: log, project, forward, recover from overflow, relay, log the reply.

Flow of one ``POST /v1/chat/completions`` (DESIGN.md section 5): parse -> name the session ->
project (stored events + defenses; a new compaction first writes the client's messages, then is
planned, executed and stored) -> forward -> on an overflow (an error status, or an error event
before anything a stream carried): compact even below the trigger and retry (bounded; when no
retry is left the provider's answer goes back as it came) -> serve the proxy's own tool calls and
ask again (the same loop, streamed or not: ``proxy.forward.rounds.RoundLoop``) -> relay the reply
while reassembling it (``proxy.forward.streaming``; a stream writes the client's messages once its
first byte is out) -> log the reply and a request record (``proxy.forward.log_writer``), started
before the response is handed back, so a client that disconnects cannot skip it.

This module is the use case only: it builds the request's context (``proxy.forward.context``),
runs the round loop, and turns what it ended with into the client's response.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from proxy.compaction.base import Compactor
from proxy.conversation.body_memo import BodyMemo
from proxy.conversation.canonical import digests_now, digests_off_loop
from proxy.conversation.chat_request import parse_chat_request
from proxy.conversation.digest_memo import DigestMemo
from proxy.forward.answers import DISCONNECTED, Buffered, Reply, Streamed, Turn, generator_over
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.entropy import EntropyPool
from proxy.forward.log_writer import LogWriter
from proxy.forward.rounds import RoundLoop
from proxy.forward.session_ids import client_session_id, header_value
from proxy.forward.session_log import SessionLog, new_id
from proxy.forward.streaming import Segment, relay_turn, relay_unlogged
from proxy.forward.tool_rounds import ToolRounds
from proxy.json_depth import DeepBudgetExceeded, budget_fields
from proxy.settings import Settings
from proxy.telemetry.logs import bind_request
from proxy.telemetry.metrics import Metrics
from proxy.tokens.protocol import Tokenizer
from proxy.upstream.client import Upstream
from proxy.upstream.headers import forward_request_headers, response_headers
from proxy.upstream.urls import UPSTREAM_CHAT_PATH
from storage.errors import StorageError, StorageUnavailable
from storage.refused import track_writes, untrack_writes

log = logging.getLogger("context_proxy.pipeline")

DEGRADED_WARNING = "database unavailable: this request was forwarded without logging or compaction"



def context_headers(ctx: ChatContext, upstream: Mapping[str, str] | None, *, shared_key: bool) -> dict[str, str]:
    """The headers of a logged request's answer: the upstream's a client uses
    (``proxy.upstream.headers.response_headers``; the operator's account headers not under a
    ``shared_key``; the length is the proxy's to set), then the proxy's own: the session and request
    ids, the tokens the client's request needs (prompt + reserved output: ``max_tokens``) and those
    forwarded (estimates), the defenses applied and the
    events, the overflow retries and an overflow returned as the provider sent it, a degraded warning."""
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


class ChatPipeline:
    """The chat use case, one per app; safe for concurrent requests. Owns no connections: the
    store and upstream are injected. Its parts: ``loop`` (the round loop), ``writer`` (the log
    writes and their backpressure), ``health`` (whether the database is usable), ``digest_memo``."""

    def __init__(self, settings: Settings, session_log: SessionLog, upstream: Upstream, compactor: Compactor,
                 counter: Tokenizer, *, metrics: Metrics) -> None:
        self.metrics = metrics
        self.settings = settings
        self.log = session_log
        self.upstream = upstream
        self.compactor = compactor
        self.health = DatabaseHealth(session_log.store)
        self.digest_memo = DigestMemo()
        """Digests of the histories seen (bounded: ``digest_memo.MEMO_MAX_BYTES``)."""
        self.body_memo = BodyMemo()
        """Big bodies seen, parsed (bounded: ``body_memo.BODY_MEMO_MAX_BYTES``)."""
        self.entropy = EntropyPool()
        """System entropy for the request ids (bounded: ``entropy.ENTROPY_POOL_BYTES``)."""
        tools = ToolRounds(settings, session_log.store, compactor, counter)
        self.loop = RoundLoop(settings, upstream, compactor, tools, self.metrics, self.health)
        self.writer = LogWriter(settings, session_log, self.metrics, self.health)

    async def handle(self, raw: bytes, headers: Mapping[str, str], header_items: list[tuple[str, str]],
                     tenant: str) -> Buffered | Streamed:
        """Serve one chat request: ``raw`` its body bytes, ``headers`` its headers by lower-case name,
        ``header_items`` all of them as sent, ``tenant`` the caller's. A ``Buffered`` answer, or a
        ``Streamed`` one once its first bytes are ready. Raises ``ProxyError``s (a 400 for a body
        that is not a chat request, our 502/504 when the upstream fails before answering, 503 when
        the database is down and ``database_failure_mode`` is closed: ``StorageError``)."""
        if self.writer.full:
            await self.writer.wait_for_room()
        body = parse_chat_request(raw, self.body_memo, tenant)
        messages: list[dict[str, Any]] = body["messages"]
        try:
            digests, chain = (digests_now(messages, len(raw), self.digest_memo)  # (a small body: no coroutine)
                              or await digests_off_loop(messages, len(raw), self.digest_memo))
            budget_fields(body, ("messages",))  # (its tool schemas, nested deeper than orjson writes)
        except DeepBudgetExceeded:  # more deep content than a request may cost the loop: as sent, unlogged
            self.metrics.deep_over_budget("request")
            log.warning("request nested too deep past its budget (json_depth.DEEP_BUDGET_CONTAINERS): "
                        "forwarded unlogged")
            return await self._forward_unlogged(raw, bool(body.get("stream")), header_items, tenant, degraded=False)
        session_id = (client_session_id(headers.get("x-session-id"))
                      or self.log.derive_session_id(tenant, messages, chain))
        try:
            if self.health.down and not await self.health.usable():  # (up: no coroutine to await)
                raise StorageUnavailable("the database did not answer the last probe")
            # (the session row and its internal rounds as cached, without a coroutine each: most
            # requests read neither)
            session = self.log.session_now(tenant, session_id) or await self.log.open_session(tenant, session_id)
            internal = self.log.internal_now(session.pk)
            expanded = (self.log.expand(internal, messages, digests, chain) if internal is not None
                        else await self.log.expand_internal(session, messages, digests, chain))
        except StorageError as exc:
            self.health.saw(exc)
            if self.settings.database_failure_mode != "open":
                raise
            return await self._forward_unlogged(raw, bool(body.get("stream")), header_items, tenant)
        if expanded is not None:  # the proxy's earlier tool rounds, put back where they happened
            messages, digests, chain = expanded
        compact_tool = (headers.get("x-context-proxy-compact-tool") or "").lower() in ("1", "on", "true", "yes")
        # (by position, in the fields' order: naming them cost about half of building the context)
        ctx = ChatContext(
            new_id("req", self.entropy), tenant, session, body, raw, messages, digests, chain,
            forward_request_headers(header_items, upstream_api_key=self.settings.upstream_api_key, identity=True),
            bool(body.get("stream")), time.perf_counter(), self.log, self.compactor, compact_tool, expanded is not None,
        )
        bind_request(ctx.request_id, session.session_id, ctx.model)
        tracking = track_writes(ctx.writes)
        try:
            return await self._run(ctx)
        except BaseException as exc:  # every path logs the client's messages, errors included
            self.writer.finish_failed(ctx, exc)
            raise
        finally:
            untrack_writes(tracking)

    async def _run(self, ctx: ChatContext) -> Buffered | Streamed:
        """Prepare (``Recovery.prepare``), then run the round loop (``RoundLoop.exchanges``): a
        complete answer, or a stream once its first bytes are ready (errors before them are
        answered with an HTTP status)."""
        await self.loop.recovery.prepare(ctx, None)
        turn = Turn(self.settings.stream_log_max_bytes)
        if not ctx.stream:  # the same loop, never yielding: a coroutine (``RoundLoop.complete``)
            await self.loop.complete(ctx, turn)
            return await self._answer(ctx, turn)
        steps = self.loop.exchanges(ctx, turn)
        try:
            first = await anext(steps)
        except StopAsyncIteration:
            return await self._answer(ctx, turn)
        resp = turn.resp  # the stream's (a later round's response is closed by ``exchanges``)
        assert resp is not None
        headers = self._client_headers(ctx, resp.headers)

        def started() -> None:
            # a stream may last minutes: commit the client's messages while it runs, once its
            # first byte is out (not before: the write would delay that byte); once per request
            ctx.append_early(self.writer.spawn)

        relay = relay_turn(turn, first, steps, started=started, ended=lambda: self._stream_ended(ctx, turn, steps))

        async def close() -> None:
            try:
                await relay.aclose()  # a started relay, stopped at a yield, runs its finally now
                if not ctx.finished:  # never started: the client left before the first byte
                    await self._stream_ended(ctx, turn, steps)
            finally:
                await steps.aclose()  # idempotent: the upstream response released even if cut short
                if turn.resp is not None:
                    await turn.resp.aclose()

        def closed() -> bool:
            # ``close`` would only await what already ended: the relay and the loop ran their
            # ``finally`` (the loop's released ``turn.resp``; the relay's logged the request); a
            # relay never started keeps its frame, and ``close`` logs the request then
            return generator_over(relay) and generator_over(steps) and ctx.finished

        return Streamed(turn.status, headers, relay, close, closed)

    def _client_headers(self, ctx: ChatContext, upstream: Mapping[str, str] | None) -> dict[str, str]:
        shared_key = self.settings.upstream_api_key is not None  # the operator's account headers stay here
        return context_headers(ctx, upstream, shared_key=shared_key)

    async def _forward_unlogged(self, raw: bytes, stream: bool, header_items: list[tuple[str, str]],
                                tenant: str, *, degraded: bool = True) -> Buffered | Streamed:
        """Relay the request as sent, without logging or compaction: fail open (the database down:
        ``degraded``, said in ``x-context-proxy-warning``), or a body the proxy does not log (deep
        content past its budget: ``json_depth.DEEP_BUDGET_CONTAINERS``)."""
        if degraded:
            self.metrics.database_error("fail_open")
            log.warning("database unavailable: forwarding without logging or compaction (database_failure_mode=open)")
        headers = forward_request_headers(header_items, upstream_api_key=self.settings.upstream_api_key, identity=True)
        resp = await self.upstream.send("POST", UPSTREAM_CHAT_PATH, headers=headers, content=raw, tenant=tenant)
        out = response_headers(resp.headers, keep_encoding=False, shared_key=self.settings.upstream_api_key is not None)
        if degraded:
            out["x-context-proxy-warning"] = DEGRADED_WARNING
        out.pop("content-length", None)
        if stream and resp.status_code < 400:
            return Streamed(resp.status_code, out, relay_unlogged(resp), resp.aclose)
        try:
            data = await resp.aread()
        finally:
            await resp.aclose()
        return Buffered(resp.status_code, out, data)

    async def _answer(self, ctx: ChatContext, turn: Turn) -> Buffered:
        """The complete reply the loop left in ``turn``, logged: an error status as the provider
        sent it (``_error_answer``); else its log write waited for when the proxy served tool
        rounds (the next turn must find them), else started in the background."""
        reply = turn.reply
        assert reply is not None
        if reply.status >= 400:
            return self._error_answer(ctx, reply)
        if ctx.internal:
            await self.writer.finish(ctx, reply.status, reply.message, reply.usage, finish_reason=reply.finish_reason)
        else:  # (queued once the answer is out)
            self.writer.finish(ctx, reply.status, reply.message, reply.usage, finish_reason=reply.finish_reason,
                               after_answer=True)
        return Buffered(reply.status, self._client_headers(ctx, reply.headers), reply.data)

    def _error_answer(self, ctx: ChatContext, reply: Reply) -> Buffered:
        """The provider's error response as it sent it (status, body, content type), logged (a
        401/403 to a client's own key: the record only, ``ChatContext.refused``)."""
        status, data = reply.status, reply.data
        ctx.refused = status in (401, 403) and self.settings.upstream_api_key is None and not ctx.internal
        # (the provider's 401 text may quote the key: not kept for a refused one)
        error = (f"the upstream refused the client's key ({status})" if ctx.refused
                 else data[:500].decode("utf-8", "replace"))
        self.writer.finish(ctx, status, None, None, error=error, after_answer=True)
        return Buffered(status, self._client_headers(ctx, reply.headers), data)

    async def _stream_ended(self, ctx: ChatContext, turn: Turn, steps: AsyncGenerator[Segment, None]) -> None:
        """Log the reply as far as it came and release the upstream response (once per stream)."""
        if ctx.finished:
            return
        a = turn.assembler
        # a client that closes right after reading [DONE] leaves the relay at its last yield: the
        # reply is complete all the same (else it would be logged as partial, and its hash would
        # differ from the client's echo of it)
        complete = a.done and not a.upstream_error and not a.hidden_error and turn.error == DISCONNECTED
        error = None if complete else turn.error
        reply = a.message() if not a.empty else None
        # relayed to its end (``turn.error`` None): the server gets the stream's end in this loop
        # step, right after this; the record and message rows are built in the next, once it is
        # out (``LogWriter.finish``'s ``after_answer``)
        self.writer.finish(ctx, turn.status, reply, a.usage, error=error,
                           partial=error is not None, finish_reason=a.finish_reason, after_answer=turn.error is None)
        await steps.aclose()
