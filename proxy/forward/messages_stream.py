"""The streamed path of the Messages use case (``proxy.forward.messages``): a stream's start held
until its first content block (``messages_start.StreamStart``: an overflow ``error`` event before
it is retried unseen), then relayed byte for byte, reassembled on the side (``messages_sse.MessagesAssembler``)
and logged when it ends, however it ends (``MessagesStream.relay``). A stream that offered the
proxy's read tool is relayed round after round (``MessagesStream._rounds``): each round's own
``tool_use`` events removed and later blocks renumbered (``messages_tools.RoundFilter``), a round
that called only the read tool served (a ``ping`` sent meanwhile) and the model asked again, a
later round's overflow compacted and retried with this request's rounds kept. A stream the
upstream cuts short ends with an Anthropic ``error`` event (``stream_error_event``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from proxy.compaction.overflow import classify_error
from proxy.conversation.messages_codec import reply_view, round_view
from proxy.conversation.messages_rounds import as_calls
from proxy.errors import ProxyError, UpstreamUnreachable
from proxy.forward.answers import DISCONNECTED, Streamed, generator_over
from proxy.forward.context import ChatContext
from proxy.forward.log_writer import LogWriter
from proxy.forward.messages_sse import MessagesAssembler
from proxy.forward.messages_start import StreamStart
from proxy.forward.messages_tools import PING, RoundFilter, ended_by_the_client, has_text, provider_error_event
from proxy.forward.rounds import Recovery, sent_with_rounds
from proxy.forward.sse import SSEEvent
from proxy.forward.tool_rounds import ToolRounds
from proxy.json_depth import DEEP_REPLY_ERROR
from proxy.settings import Settings
from proxy.upstream.client import HeldResponse, Upstream


def stream_error_event(exc: ProxyError) -> bytes:
    """An Anthropic ``error`` event ending a stream the upstream failed mid-way (the SDKs raise it as
    an ``APIError``): ``event: error`` with the error envelope (``ProxyError.anthropic_body``)."""
    return b"event: error\ndata: " + exc.anthropic_body() + b"\n\n"


class MessagesStream:
    """Relays the Messages pipeline's streams (``relay``; module docstring). One per pipeline, no
    per-request state: ``recovery`` the pipeline's (prepares an overflow's retry), ``tools`` serves
    the proxy's read tool (``None``: a stream is relayed as it came)."""

    def __init__(self, settings: Settings, upstream: Upstream, writer: LogWriter, recovery: Recovery,
                 tools: ToolRounds | None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.writer = writer
        self.recovery = recovery
        self.tools = tools

    async def read_start(self, ctx: ChatContext, resp: HeldResponse, sent: Mapping[str, Any], *,
                         keep_rounds: bool) -> StreamStart | None:
        """``resp``'s start (``StreamStart.read``; ``sent``: the body forwarded), or ``None`` when it
        began with the provider's overflow and a retry is prepared (``Recovery.retry``, with
        ``keep_rounds``): ``resp`` is closed then, and when this raises."""
        try:
            start = await StreamStart.read(resp, self.settings.stream_log_max_bytes, sent)
            retry = start.overflow is not None and await self.recovery.retry(
                ctx, start.overflow, keep_rounds=keep_rounds, escalate=True)
        except BaseException:
            await resp.aclose()
            raise
        if retry:
            await resp.aclose()
            return None
        return start

    async def _next_round(self, ctx: ChatContext, target: str) -> tuple[HeldResponse | None, StreamStart | bytes]:
        """A stream's next round, after a served one: the upstream's response and its start, or
        (``None``, the ``error`` event that ends the client's stream) when it answered an error
        (an overflow is compacted and retried first, this request's rounds kept: the client has
        seen their blocks) or no event stream."""
        while True:
            assert ctx.prepared is not None
            sent = sent_with_rounds(ctx)
            resp = await self.upstream.send("POST", target, headers=ctx.upstream_headers, content=ctx.prepared.body,
                                            tenant=ctx.tenant)
            if resp.status_code < 400 and "text/event-stream" in resp.headers.get("content-type", ""):
                start = await self.read_start(ctx, resp, sent, keep_rounds=True)
                if start is not None:
                    return resp, start
                continue
            try:
                data = await resp.aread()
            finally:
                await resp.aclose()
            if resp.status_code >= 400:
                overflow = classify_error(resp.status_code, data, resp.headers, sent=sent)
                if overflow is not None and await self.recovery.retry(ctx, overflow, keep_rounds=True, escalate=True):
                    continue
                return None, provider_error_event(data)
            return None, stream_error_event(UpstreamUnreachable("The upstream answered a streamed round without "
                                                                "an event stream."))

    def relay(self, ctx: ChatContext, resp: HeldResponse, headers: dict[str, str], start: StreamStart,
              target: str) -> Streamed:
        """Relay ``resp`` byte for byte (``start``'s held bytes first), or, when the request offered
        the proxy's tool, its rounds (``_rounds``); the reply is reassembled beside it and logged
        when the stream ends, however it ends (complete, cut by the upstream, or the client gone)."""
        rounds = bool(ctx.prepared is not None and ctx.prepared.own_tools) and self.tools is not None
        client = MessagesAssembler(self.settings.stream_log_max_bytes) if rounds else start.assembler
        """What the client is sent, reassembled (the logged reply)."""
        splitter = start.splitter
        current: list[HeldResponse] = [resp]  # the upstream response open now
        ended: str | None = DISCONNECTED  # how the stream ended, for the log (``None``: complete)

        began = False  # ``plain`` ran (else, the client gone before the first byte, ``close`` reads the start)

        async def plain() -> AsyncGenerator[bytes, None]:
            # each chunk's events read once the chunk is out (a relay closed at a chunk reads them too)
            nonlocal began
            began = True
            read, rest = client.add_data, b""  # (``rest``: a chunk out, not read yet)
            try:
                for chunk in start.held:
                    yield chunk
                start.add_held(client)
                if start.failed is not None:
                    raise start.failed
                if not start.ended:
                    async for chunk in start.rest:
                        rest = chunk
                        yield chunk
                        rest = b""
                        read(splitter, chunk)
            finally:
                if start.events:  # (closed at a held chunk)
                    start.add_held(client)
                if rest:
                    read(splitter, rest)
            for event in splitter.flush():
                client.add(event)

        logged = False  # ``finished`` ran to its end: the reply logged, the upstream response released

        async def finished(after_answer: bool) -> None:
            # the start as held, when the client left before the first byte; the reply logged (once:
            # ``ctx.finished``), then the upstream response released (a cancel landing in the
            # release leaves ``logged`` false: ``close`` runs it again, idempotent)
            nonlocal logged
            try:
                if not rounds and not began:  # gone before the first byte: the start as held is logged
                    start.add_held(client)
                if not ctx.finished:
                    error = ended
                    if error == DISCONNECTED and client.done and not client.upstream_error:
                        error = None  # gone after message_stop, before the end of the body: complete all the same
                    reply = reply_view(client.message()) if not client.empty else None
                    if reply is None and not client.empty:  # deep content past the request's budget
                        error = error or DEEP_REPLY_ERROR
                    if client.truncated or splitter.dropped:  # (an event over SSESplitter's bound is not read)
                        error = error or "the reply is longer than stream_log_max_bytes: logged as far as it fits"
                    self.writer.finish(ctx, resp.status_code, reply, client.usage, error=error,
                                       partial=error is not None, finish_reason=client.stop_reason,
                                       after_answer=after_answer and error is None)
            finally:  # released even when logging raised
                await current[0].aclose()
            logged = True

        async def chunks() -> AsyncGenerator[bytes, None]:
            nonlocal ended
            out = False
            source = self._rounds(ctx, target, start, client, current) if rounds else plain()
            try:
                try:
                    async with contextlib.aclosing(source):  # closed with the relay: its last chunk's events read
                        async for chunk in source:
                            yield chunk
                            if not out:  # once the first byte is out (the write would delay it)
                                out = True
                                ctx.append_early(self.writer.spawn)  # a long stream: the turns committed meanwhile
                except ProxyError as exc:  # the client has the stream's start: told in-band, as the API would
                    ended = f"the upstream failed mid-stream: {exc.message}"
                    yield stream_error_event(exc)
                    return
                if client.upstream_error:
                    ended = "the upstream's stream carried an error event"
                elif not client.done:
                    ended = "the upstream's stream ended before message_stop"
                    yield stream_error_event(UpstreamUnreachable("The upstream's stream ended before message_stop."))
                else:
                    ended = None
            finally:
                # logged here, as the chat relay logs its reply: a stream relayed to its end leaves
                # ``close`` nothing to do (``closed``); one complete is logged once its end is out
                # (``LogWriter.finish``'s ``after_answer``: the server gets the end in this loop step)
                try:
                    await finished(ended is None)
                except Exception:  # noqa: BLE001  (``logged`` false: ``close`` raises it again, after
                    pass  # ``send_stream`` sent the body's end, as before: the client's stream is whole)

        relay = chunks()

        async def close() -> None:
            try:
                await relay.aclose()
            finally:
                if not logged:  # (a relay never started, or stopped before its ``finally`` ended)
                    await finished(False)

        def closed() -> bool:
            return logged and generator_over(relay)

        return Streamed(resp.status_code, headers, relay, close, closed)

    async def _rounds(self, ctx: ChatContext, target: str, start: StreamStart, client: MessagesAssembler,
                      current: list[HeldResponse]) -> AsyncGenerator[bytes, None]:
        """The events of a stream that offered the proxy's tool, round after round: each filtered
        (``RoundFilter``: the proxy's calls removed, blocks renumbered, one ``message_start``) and
        read into ``client``; a round that called only the proxy's tool, complete, is served (a
        ``ping`` sent meanwhile) and the model asked again (``current[0]`` becomes its response).
        The last round's held end is sent (``stop_reason`` ``end_turn`` when only the proxy's
        unservable calls ended it); the logged usage is the last round's, as a whole answer's.
        Raises ``ProxyError`` (the upstream failed; or 502 ``unserved_tool_call`` for a round of
        nothing but unservable calls)."""
        assert ctx.prepared is not None and self.tools is not None
        own = ctx.prepared.own_tools
        state: StreamStart = start
        index, first = 0, True
        while True:
            filt = RoundFilter(own, index, first)
            async for event in _round_events(state):
                out = filt.filter(event)
                if out is not None:
                    client.add(out)
                    yield out.raw + b"\n\n"
            index, first = filt.next_index, False
            uses = filt.own_uses
            if client.upstream_error:
                return
            round_asm = state.assembler
            if (not filt.client_uses and round_asm.done and not round_asm.truncated
                    and self.tools.serves(ctx, uses, 0)):
                yield PING
                await self.tools.serve(ctx, round_view(round_asm.message()), as_calls(uses))
                await current[0].aclose()
                resp, nxt = await self._next_round(ctx, target)
                if isinstance(nxt, bytes):  # the round's error ends the stream
                    client.upstream_error = True
                    yield nxt
                    return
                assert resp is not None
                current[0], state = resp, nxt
                continue
            held = filt.held
            if uses and not filt.client_uses:
                self.tools.unserved(ctx, as_calls(uses), has_text=has_text(client.message()["content"]))
                held = [ended_by_the_client(e) for e in held]
            if state is not start and round_asm.usage is not None:  # the prompt the estimate sized, rounds
                client.usage = dict(round_asm.usage)  # included (the learned ratio compares the two)
            for event in held:
                client.add(event)
                yield event.raw + b"\n\n"
            return


async def _round_events(state: StreamStart) -> AsyncGenerator[SSEEvent, None]:
    """A round's events: those its start held, then the rest as it arrives (each read into
    ``state.assembler``: the round's whole assistant turn). Raises the upstream's failure."""
    for event in [*state.events, *state.splitter.feed(state.tail)]:
        state.assembler.add(event)
        yield event
    if state.failed is not None:
        raise state.failed
    if not state.ended:
        async for chunk in state.rest:
            for event in state.splitter.feed(chunk):
                state.assembler.add(event)
                yield event
    for event in state.splitter.flush():
        state.assembler.add(event)
        yield event
