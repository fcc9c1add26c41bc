"""The round loop of one chat request, one for streams and not: forward, recover, serve, ask again.

A request's exchanges with the provider: forward what the compactor prepared; on an overflow (an
error status, or an error event before anything a stream carried) learn from it, compact even below
the trigger and retry (bounded by ``Settings.max_overflow_retries``; when no retry is left the
provider's answer goes back as it came); when the model called only the proxy's own tools, serve
them (``proxy.forward.tool_rounds``) and ask again (with no read budget left, one last round
answered ``BUDGET_SPENT``; a call no round can serve never ends in an empty answer:
``ToolRounds.unserved``). Overflow recovery and tool rounds are the same loop whether the client
streams or not, so a later round that overflows is compacted and retried in both. The loop does no
logging and builds no client response: it yields what a stream's client is sent (``Segment``s,
relayed by ``proxy.forward.streaming.relay_turn``) and leaves a complete answer (not a stream, or
answered before a stream's first byte) in ``Turn.reply`` for the pipeline.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from proxy.compaction.base import Compactor, Prepared
from proxy.compaction.overflow import Overflow, classify_error
from proxy.errors import UpstreamUnreachable
from proxy.forward.answers import Reply, Turn
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.streaming import (
    Segment,
    provider_error_event,
    start_stream,
)
from proxy.forward.tool_rounds import KEEPALIVE, ToolRounds, own_only
from proxy.json_depth import dumps
from proxy.json_text import parse_json
from proxy.settings import Settings
from proxy.telemetry.metrics import Metrics
from proxy.upstream.client import Upstream
from proxy.upstream.transport import UpstreamResponse
from proxy.upstream.urls import UPSTREAM_CHAT_PATH
from storage.errors import StorageError

COMPACTING = b": context-proxy is compacting after an overflow\n\n"
"""Keep-alive comment of a stream whose later round overflowed (summary calls take a while)."""


def sent_with_rounds(ctx: ChatContext) -> dict[str, Any]:
    """The body forwarded last, as a mapping: the prepared one (``Prepared.forwarded``, else the
    client's ``ctx.body``) with this request's tool rounds (``ctx.internal``) after its messages.
    What an overflow error may quote back, and what a retry forwards."""
    assert ctx.prepared is not None
    sent = ctx.prepared.forwarded or ctx.body
    return sent | {"messages": [*sent["messages"], *ctx.internal]} if ctx.internal else sent


class Recovery:
    """A request's preparation and its retries after an overflow, the one way for either API
    (chat's ``RoundLoop``, the Messages pipeline); no per-request state."""

    def __init__(self, settings: Settings, compactor: Compactor, metrics: Metrics, health: DatabaseHealth) -> None:
        self.settings = settings
        self.compactor = compactor
        self.metrics = metrics
        self.health = health

    async def prepare(self, ctx: ChatContext, overflow: Overflow | None) -> None:
        """Set ``ctx.prepared``: what to forward (this compactor's defenses; forced after an
        ``overflow``). A database failure with ``database_failure_mode`` open marks ``ctx.degraded``
        and forwards the request as it came; closed, it raises (``storage.errors.StorageError``).
        Raises ``proxy.errors.CannotFit``. The one way a request of either API is prepared (chat's
        round loop, the Messages pipeline)."""
        try:
            ctx.prepared = await self.compactor.prepare(ctx, overflow=overflow)
        except StorageError as exc:
            self.health.saw(exc)
            if self.settings.database_failure_mode != "open":
                raise
            self.metrics.database_error("fail_open")
            ctx.degraded = True
            ctx.prepared = Prepared(dumps(ctx.body | {"messages": ctx.messages}) if ctx.expanded else ctx.raw)

    async def retry(self, ctx: ChatContext, overflow: Overflow, *, keep_rounds: bool, escalate: bool) -> bool:
        """After an overflow: learn from it; when a retry is left (``max_overflow_retries``, and
        the compactor can), compact and prepare it (this request's tool rounds, ``ctx.internal``,
        forwarded after it; the proxy's tools offered again) and return True. The rounds start over
        on the compacted request unless ``keep_rounds`` (the caller's client has seen what they
        said). ``escalate``: when compacting changed nothing, compact once more with
        ``ctx.escalated`` (a signed tool cycle summarized whole: Messages). False (``ctx.unrecovered``)
        when no retry is left, or when the body is still the one refused (it would overflow again):
        the provider's answer goes back as it came (the proxy never words an overflow of its own)."""
        await self.compactor.learn(ctx, overflow)
        if not keep_rounds:
            ctx.internal, ctx.read_rounds = [], 0  # rounds that led to an overflow are not kept
        if ctx.retries >= self.settings.max_overflow_retries or not self.compactor.can_retry(ctx, overflow):
            return self._unrecovered(ctx, overflow)
        assert ctx.prepared is not None
        before = ctx.prepared.body
        await self._prepare_with_rounds(ctx, overflow)
        if escalate and ctx.prepared.body == before and not ctx.escalated:  # refused again as it is:
            ctx.escalated = True  # compact further (a signed cycle summarized whole), once
            await self._prepare_with_rounds(ctx, overflow)
        ctx.tools_withdrawn = False  # the body is made anew: the proxy's tools are offered again
        if ctx.prepared.body == before:
            return self._unrecovered(ctx, overflow)
        ctx.retries += 1
        self.metrics.overflow("retried")
        return True

    async def _prepare_with_rounds(self, ctx: ChatContext, overflow: Overflow) -> None:
        """``prepare``, this request's tool rounds (``ctx.internal``) forwarded after it."""
        await self.prepare(ctx, overflow)
        assert ctx.prepared is not None
        if ctx.internal:
            ctx.prepared = dataclasses.replace(ctx.prepared, body=dumps(sent_with_rounds(ctx)))

    def _unrecovered(self, ctx: ChatContext, overflow: Overflow) -> bool:
        ctx.unrecovered = overflow
        self.metrics.overflow("unrecoverable")
        return False


class RoundLoop:
    """Runs the exchanges of the pipeline's requests (one per pipeline; no per-request state)."""

    def __init__(self, settings: Settings, upstream: Upstream, compactor: Compactor, tools: ToolRounds,
                 metrics: Metrics, health: DatabaseHealth) -> None:
        self.upstream = upstream
        self.compactor = compactor
        self.tools = tools
        self.metrics = metrics
        self.recovery = Recovery(settings, compactor, metrics, health)

    async def exchanges(self, ctx: ChatContext, turn: Turn) -> AsyncGenerator[Segment, None]:
        """The loop (module docstring), after ``Recovery.prepare``. Yields what a stream's client is sent, as
        ``Segment``s for ``relay_turn`` (a stream keeps relaying across rounds and retries); a
        complete answer is left in ``turn.reply``. The upstream response is closed however this
        ends. Raises our 502/504 errors when the upstream fails (in a stream, after its start: in
        what the relay reads). A request that is not a stream runs ``complete`` instead."""
        hold = self.compactor.retries_overflows  # an overflow in a stream's start can be retried
        try:
            while True:
                resp = await self._send(ctx, turn)
                if resp.status_code >= 400:
                    data, overflow = await self._refused(ctx, resp)
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
                        turn.reply = Reply(resp.status_code, resp.headers, data)
                    return
                assert ctx.prepared is not None
                if ctx.stream and "text/event-stream" in resp.headers.get("content-type", ""):
                    state = await start_stream(resp, hold=hold, assembler=turn.assembler, sent=sent_with_rounds(ctx))
                    if state.overflow is not None:
                        if turn.committed:
                            yield COMPACTING
                        if await self._retry(ctx, turn, state.overflow):
                            continue
                    if not turn.committed:
                        turn.committed, turn.status = True, resp.status_code
                    yield self.tools.relay_round(ctx, state) if ctx.prepared.own_tools else state
                    # (resumed once that relay was read to its end)
                    if not state.own_calls or turn.assembler.upstream_error:
                        return  # an error event relayed ends the stream's rounds too
                    yield KEEPALIVE
                    await self.tools.serve(ctx, {"content": None}, state.own_calls)
                    turn.assembler.reset_round()
                    continue
                if not await self._whole(ctx, turn, resp):
                    return
        finally:
            if turn.resp is not None:
                await turn.resp.aclose()

    async def complete(self, ctx: ChatContext, turn: Turn) -> None:
        """``exchanges`` for a request that is not a stream (``ctx.stream`` false), as a coroutine:
        such a request commits nothing and reads no event stream, so there the loop never yields,
        and an async generator ended by ``StopAsyncIteration`` cost about four times this
        coroutine's await (timed in isolation). The same steps (what ``_send`` does, ``_refused``,
        ``_retry``, ``_whole``); the answer is left in ``turn.reply``, the upstream response is
        closed however this ends. Raises what ``exchanges`` raises."""
        assert not ctx.stream
        try:
            while True:  # (``_send`` inlined: every frame between the task and the upstream is resumed
                # at each of its suspensions; a round's response is closed before the next is sent)
                assert ctx.prepared is not None
                started = time.perf_counter()
                resp = turn.resp = await self.upstream.send("POST", UPSTREAM_CHAT_PATH, headers=ctx.upstream_headers,
                                                            content=ctx.prepared.body, tenant=ctx.tenant)
                self.metrics.upstream_answered(ctx.model, time.perf_counter() - started)
                if resp.status_code < 400:
                    if await self._whole(ctx, turn, resp):
                        continue
                    return
                data, overflow = await self._refused(ctx, resp)
                if overflow is None or not await self._retry(ctx, turn, overflow):
                    turn.reply = Reply(resp.status_code, resp.headers, data)
                    return
        finally:
            if turn.resp is not None:
                await turn.resp.aclose()

    async def _send(self, ctx: ChatContext, turn: Turn) -> UpstreamResponse:
        """Forward what is prepared (``ctx.prepared``), the last round's response closed first."""
        assert ctx.prepared is not None
        if turn.resp is not None:
            await turn.resp.aclose()
        started = time.perf_counter()
        resp = turn.resp = await self.upstream.send("POST", UPSTREAM_CHAT_PATH, headers=ctx.upstream_headers,
                                                    content=ctx.prepared.body, tenant=ctx.tenant)
        self.metrics.upstream_answered(ctx.model, time.perf_counter() - started)
        return resp

    async def _refused(self, ctx: ChatContext, resp: UpstreamResponse) -> tuple[bytes, Overflow | None]:
        """An error status: its body, read whole and released (its pool slot is free for a summary
        call), and the overflow it reports (``None``: another error)."""
        data = await resp.aread()
        await resp.aclose()
        # (``sent_with_rounds``: what overflow errors may quote back; ``ctx`` is as sent)
        return data, classify_error(resp.status_code, data, resp.headers, sent=sent_with_rounds(ctx))

    async def _whole(self, ctx: ChatContext, turn: Turn, resp: UpstreamResponse) -> bool:
        """A round answered whole (not an event stream): True when the model called only the
        proxy's tools and they were served (ask again), else the answer is left in ``turn.reply``
        (the proxy's own calls removed from it). Raises our 502 for such a round after a stream's
        first byte."""
        assert ctx.prepared is not None
        data = await resp.aread()
        message, usage, finish_reason = reply_of(data)
        mine, theirs = own_only(message, ctx.prepared.own_tools)
        if self.tools.serves(ctx, mine, len(theirs)):
            await resp.aclose()  # read whole: released before the tools are served
            await self.tools.serve(ctx, message or {}, mine)
            return True
        if turn.committed:
            raise UpstreamUnreachable("The upstream answered a streamed round without an event stream.")
        if mine and message is not None:  # the model called the proxy's tools too: those are removed
            if not theirs:  # nothing but the proxy's calls, none servable: the text, or our 502
                self.tools.unserved(ctx, mine, has_text=bool(message.get("content")))
            data, message = self.tools.strip(data, message, theirs)
            finish_reason = "stop" if not theirs else finish_reason
        turn.reply = Reply(resp.status_code, resp.headers, data, message, usage, finish_reason)
        return False

    async def _retry(self, ctx: ChatContext, turn: Turn, overflow: Overflow) -> bool:
        """After an overflow: ``Recovery.retry`` (True: the compacted request is prepared; False:
        the provider's answer is returned as it came, with headers saying what was tried). The
        proxy's rounds start over on the compacted request, unless a stream's client has seen text
        from them: then they are kept after it (asked again from scratch, the model would say that
        text again). No escalation: that is the Messages pipeline's (signed tool cycles)."""
        kept = turn.committed and not turn.assembler.empty
        if not await self.recovery.retry(ctx, overflow, keep_rounds=kept, escalate=False):
            return False
        turn.reset_round()
        return True


def reply_of(data: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]:
    """``(message, usage, finish_reason)`` of a chat.completion body (choice 0); Nones if unusable.
    A lone surrogate escape in it is usable, replaced by U+FFFD (``proxy.json_text``)."""
    try:
        parsed = parse_json(data)
        choice = parsed["choices"][0]
        message = dict(choice["message"])
        return message, parsed.get("usage"), choice.get("finish_reason")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None, None, None
