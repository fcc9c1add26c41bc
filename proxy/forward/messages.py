"""The Messages use case: log each ``POST /v1/messages`` in its session, project it through the
defenses, forward it, recover from the provider's overflow, relay the answer, log the reply (issue 19).

Flow: parse the body (a JSON object with a ``messages`` list; anything else is forwarded
unlogged, as it came: the provider judges it) -> hash the pieces (``MessagesCodec.pieces``: the
``system`` as a leading piece, then the turns; digests of ``messages_codec.hash_view``) -> name the
session (``X-Claude-Code-Session-Id``, then ``X-Session-Id``, then derived from the tenant and the
first user turn, as chat does) -> prepare (the Messages compactor: ``ProjectingCompactor`` with
``MESSAGES_API``; the client's bytes when nothing applies) -> forward -> on the provider's overflow
(an error status in either wording, or an ``error`` event before a stream's first content block:
a stream's start is held until then) learn, compact even below the trigger and retry, bounded by
``max_overflow_retries``, before any byte reaches the client -> relay the answer (a stream byte
for byte, reassembled on the side by ``messages_sse.MessagesAssembler``) -> log the client's new
turns, the reply (``{"role": "assistant", "content": blocks}``, as ``hash_view`` reads it: no
``null`` values, whole floats as ints, so its echo continues the branch) and a request record
through the chat path's ``LogWriter`` (one backpressure bound, one drain at shutdown). A
provider's 401/403 to the client's own key logs the record only, as chat does. The database down:
503, or with ``database_failure_mode=open`` forwarded unlogged. A stream the upstream cuts short
(the connection, or an end without ``message_stop``) ends with an Anthropic ``error`` event, as
the API ends a failed stream, so the client's SDK raises instead of taking half a message as whole.

``counted_body``: a ``count_tokens`` request counted as the proxy would forward it now.

The read tool, in Anthropic's tool shape, goes after the client's tools once stored content is
named (``proxy.compaction.offer``). A reply that calls only it is served and asked again
(``ToolRounds``, bounded by the read budget and ``read_tool_max_rounds``; a stream kept alive with
``ping`` events meanwhile, its own ``tool_use`` events removed and later blocks renumbered:
``messages_tools.RoundFilter``); mixed with the client's calls, the client's are returned and the
proxy's dropped. The client sees one message: every round's blocks but the proxy's calls
(``proxy.conversation.messages_rounds``); the rounds are logged as internal turns and put back on
later requests, so each block is forwarded after the prefix it was made over.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.compaction.base import Compactor
from proxy.compaction.overflow import Overflow, classify_error, classify_stream_event
from proxy.conversation.canonical import digests_off_loop
from proxy.conversation.digest_memo import DigestMemo
from proxy.conversation.messages_codec import MESSAGES, hash_view
from proxy.conversation.messages_rounds import after_rounds, as_calls, merged, split_uses, without
from proxy.errors import ProxyError, UpstreamUnreachable
from proxy.forward.answers import Buffered, Streamed
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.log_writer import LogWriter
from proxy.forward.messages_sse import MessagesAssembler
from proxy.forward.messages_tools import PING, RoundFilter, ended_by_the_client, has_text, provider_error_event
from proxy.forward.pipeline import DEGRADED_WARNING, context_headers
from proxy.forward.rounds import Recovery, sent_with_rounds
from proxy.forward.session_ids import client_session_id
from proxy.forward.session_log import SessionLog, new_id
from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.forward.tool_rounds import ToolRounds
from proxy.json_text import parse_json
from proxy.settings import Settings
from proxy.telemetry.logs import bind
from proxy.telemetry.metrics import Metrics
from proxy.upstream.client import HeldResponse, Upstream
from proxy.upstream.headers import forward_request_headers, response_headers
from storage.errors import StorageError, StorageUnavailable
from storage.records import SessionRecord
from storage.refused import track_writes, untrack_writes

log = logging.getLogger("context_proxy.messages")

CLAUDE_CODE_SESSION_HEADER = "x-claude-code-session-id"
"""Claude Code names its session in every request; the first choice for the proxy's session id."""
DISCONNECTED = "client disconnected"


def stream_error_event(exc: ProxyError) -> bytes:
    """An Anthropic ``error`` event ending a stream the upstream failed mid-way (the SDKs raise it as
    an ``APIError``): ``event: error`` with the error envelope (``ProxyError.anthropic_body``)."""
    return b"event: error\ndata: " + exc.anthropic_body() + b"\n\n"


def parse_messages_body(raw: bytes) -> dict[str, Any] | None:
    """``raw`` as a Messages request the proxy can log: a JSON object whose ``messages`` is a list
    of objects; ``None`` for anything else (forwarded unlogged: the provider answers it)."""
    try:
        body = parse_json(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    return body


def session_id_of(headers: Mapping[str, str]) -> str | None:
    """``X-Claude-Code-Session-Id`` when it is an id the read API can address (else passed over:
    the header is addressed to Anthropic, not a reason to refuse), then ``X-Session-Id`` (checked by
    ``client_session_id``: a 400 for one it refuses), else ``None``."""
    try:
        named = client_session_id(headers.get(CLAUDE_CODE_SESSION_HEADER))
    except ProxyError:
        named = None
    return named or client_session_id(headers.get("x-session-id"))


HOLD_MAX_BYTES = 1 << 20
"""A stream's start is held (for an overflow ``error`` event to be retried unseen) until its first
content block, an error, its end, or this many bytes."""
_BEFORE_CONTENT = frozenset({"message_start", "ping"})
"""Events that come before a stream's content: held while they come."""


@dataclass(slots=True)
class _StreamStart:
    """A stream's start, read and held until its first content block (``read``): ``held`` the
    bytes as they came, ``rest`` the stream after them, ``splitter``/``assembler`` what read them;
    ``overflow`` when it began with the provider's overflow ``error`` event; ``ended``: the stream
    ended within; ``failed``: the upstream failed within (raised where the relay reaches it)."""

    held: list[bytes]
    rest: AsyncIterator[bytes]
    splitter: SSESplitter
    assembler: MessagesAssembler
    events: list[SSEEvent] = dataclasses.field(default_factory=list)
    """The events of ``held`` (``assembler`` has read them)."""
    overflow: Overflow | None = None
    ended: bool = False
    failed: ProxyError | None = None

    @classmethod
    async def read(cls, resp: HeldResponse, max_bytes: int, sent: Mapping[str, Any]) -> _StreamStart:
        """Read ``resp``'s start (``max_bytes``: the assembler's bound; ``sent``: the body that was
        forwarded, which an error may quote). Raises nothing of the upstream's: a failure is kept."""
        start = cls([], aiter(resp.aiter_raw()), SSESplitter(), MessagesAssembler(max_bytes))
        size = 0
        try:
            while size <= HOLD_MAX_BYTES:
                try:
                    chunk = await anext(start.rest)
                except StopAsyncIteration:
                    start.ended = True
                    return start
                start.held.append(chunk)
                size += len(chunk)
                decided = False
                for event in start.splitter.feed(chunk):
                    start.assembler.add(event)
                    start.events.append(event)
                    if event.event == "error" and not decided:
                        start.overflow = classify_stream_event(event.data, sent=sent)
                    decided = decided or event.event not in _BEFORE_CONTENT
                if decided:
                    return start
        except ProxyError as exc:
            start.failed = exc
        return start


class MessagesPipeline:
    """``handle`` serves one ``POST /v1/messages`` (module docstring). One per app; shares the chat
    pipeline's session log, log writer, database health and digest memo. ``upstream``: the Anthropic
    one; ``compactor``: the defenses over Messages (``ProjectingCompactor`` with ``MESSAGES_API``)."""

    def __init__(self, settings: Settings, session_log: SessionLog, upstream: Upstream, writer: LogWriter,
                 health: DatabaseHealth, metrics: Metrics, digest_memo: DigestMemo | None = None,
                 compactor: Compactor | None = None, tools: ToolRounds | None = None) -> None:
        self.digest_memo = digest_memo
        """Digests of the histories seen (the chat pipeline's: one bound; the same values, computed once)."""
        self.settings = settings
        self.log = session_log
        self.upstream = upstream
        self.writer = writer
        self.health = health
        self.metrics = metrics
        self.compactor = compactor if compactor is not None else Compactor()
        self.recovery = Recovery(settings, self.compactor, metrics, health)
        """Prepares each request and its retries after an overflow (with escalation: signed cycles)."""
        self.tools = tools
        """Serves the proxy's read tool (``None``: a reply's calls to it are never served: removed)."""

    async def handle(self, raw: bytes, target: str, headers: Mapping[str, str], header_items: list[tuple[str, str]],
                     tenant: str) -> Buffered | Streamed:
        """Serve one request: ``raw`` its body, ``target`` the upstream path (with its query),
        ``headers`` by lower-case name, ``header_items`` as sent. Raises ``BadRequest`` (a refused
        ``X-Session-Id``), ``StorageError`` (database down, ``database_failure_mode`` closed),
        ``CannotFit`` (under an operator's window, a request no compaction makes fit),
        ``ProxyBusy``/``UpstreamError`` (before any answer)."""
        key = self.settings.anthropic_upstream_api_key
        forward_headers = forward_request_headers(header_items, upstream_api_key=key, identity=True,
                                                  key_header="x-api-key")
        if self.writer.full:
            await self.writer.wait_for_room()
        body = parse_messages_body(raw)
        if body is None:
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=False)
        pieces = MESSAGES.pieces(body)
        if not pieces:  # no turn to log (``"messages": []``, no system): the provider answers it
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=False)
        try:
            digests, chain = await digests_off_loop([hash_view(p) for p in pieces], len(raw), self.digest_memo)
        except (orjson.JSONEncodeError, RecursionError):  # nested deeper than it hashes: the provider judges it
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=False)
        self.log.follow(chain)  # a regenerate's write is then known stored, not read again
        session_id = session_id_of(headers) or self.log.derive_session_id(tenant, pieces, chain)
        try:
            if not await self.health.usable():
                raise StorageUnavailable("the database did not answer the last probe")
            session = await self.log.open_session(tenant, session_id, "messages")
            expanded = await self.log.expand_internal(session, pieces, digests, chain, after=after_rounds)
        except StorageError as exc:
            self.health.saw(exc)
            if self.settings.database_failure_mode != "open":
                raise
            self.metrics.database_error("fail_open")
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=True)
        if expanded is not None:  # the proxy's earlier tool rounds, put back where they ran
            pieces, digests, chain = expanded
        ctx = ChatContext(request_id=new_id("req"), tenant=tenant, session=session, body=body, raw=raw,
                          messages=pieces, digests=digests, chain=chain, upstream_headers=forward_headers,
                          stream=body.get("stream") is True, started=time.perf_counter(), session_log=self.log,
                          compactor=self.compactor, expanded=expanded is not None)
        bind(request_id=ctx.request_id, session_id=session.session_id, model=ctx.model)
        tracking = track_writes(ctx.writes)
        try:
            return await self._run(ctx, target)
        except BaseException as exc:  # every path logs the client's turns, errors included
            self.writer.finish_failed(ctx, exc)
            raise
        finally:
            untrack_writes(tracking)

    async def counted_body(self, raw: bytes, headers: Mapping[str, str], tenant: str) -> bytes:
        """The body to count for a ``count_tokens`` request (``raw``): what the proxy would forward
        for it now, in its session (named as ``handle`` names it; ``Compactor.counted``), or ``raw``
        itself for a body it cannot read, a database that does not answer, compaction disabled.
        Logs nothing, stores nothing. Raises ``BadRequest`` (a refused ``X-Session-Id``)."""
        body = parse_messages_body(raw)
        pieces = MESSAGES.pieces(body) if body is not None else []
        if body is None or not pieces:
            return raw
        try:
            digests, chain = await digests_off_loop([hash_view(p) for p in pieces], len(raw), self.digest_memo)
        except (orjson.JSONEncodeError, RecursionError):
            return raw
        session_id = session_id_of(headers) or self.log.derive_session_id(tenant, pieces, chain)
        try:
            session = await self.log.store.find_session(session_id, tenant)
            now = datetime.now(UTC)  # (pk 0: a session not stored yet, no event applies)
            ctx = ChatContext(request_id=new_id("req"), tenant=tenant,
                              session=session or SessionRecord(0, session_id, tenant, now, now, "messages"),
                              body=body, raw=raw, messages=pieces, digests=digests, chain=chain,
                              upstream_headers=[], stream=False, started=time.perf_counter(), session_log=self.log)
            return await self.compactor.counted(ctx)
        except StorageError as exc:
            self.health.saw(exc)
            return raw
        except orjson.JSONEncodeError:  # (nested deeper than it serializes: counted as sent)
            return raw

    async def _run(self, ctx: ChatContext, target: str) -> Buffered | Streamed:
        """Prepare (the defenses), forward, and on the provider's overflow (an error status, or an
        ``error`` event before a stream's first content block) compact and retry, bounded by
        ``max_overflow_retries``: the client sees only the attempt that answered."""
        await self.recovery.prepare(ctx, None)
        while True:
            assert ctx.prepared is not None
            sent = sent_with_rounds(ctx)  # what an overflow error may quote back
            resp = await self.upstream.send("POST", target, headers=ctx.upstream_headers, content=ctx.prepared.body,
                                            tenant=ctx.tenant)
            if ctx.stream and resp.status_code < 400 and "text/event-stream" in resp.headers.get("content-type", ""):
                try:
                    start = await _StreamStart.read(resp, self.settings.stream_log_max_bytes, sent)
                    retry = start.overflow is not None and await self.recovery.retry(
                        ctx, start.overflow, keep_rounds=False, escalate=True)
                except BaseException:
                    await resp.aclose()
                    raise
                if retry:
                    await resp.aclose()
                    continue
                # (an overflow with no retry left: the provider's stream goes back as it came)
                return self._stream(ctx, resp, self._client_headers(ctx, resp.headers), start, target)
            try:
                data = await resp.aread()
            finally:
                await resp.aclose()  # read whole: its pool slot is free for a summary call
            if resp.status_code >= 400:
                overflow = classify_error(resp.status_code, data, resp.headers, sent=sent)
                if overflow is not None and await self.recovery.retry(ctx, overflow, keep_rounds=False, escalate=True):
                    continue
            elif ctx.prepared.own_tools and self.tools is not None:
                answer = await self._own_calls(ctx, data)
                if answer is None:  # served: ask again
                    continue
                data = answer
            self._finish_whole(ctx, resp.status_code, data)
            return Buffered(resp.status_code, self._client_headers(ctx, resp.headers), data)

    async def _own_calls(self, ctx: ChatContext, data: bytes) -> bytes | None:
        """A whole answer of a request that offered the proxy's tool: ``None`` when it called only
        that tool and a round served it (ask again); else the answer to return, the proxy's calls
        removed and earlier rounds' blocks first (``data`` itself when nothing changes). Raises
        ``UpstreamError`` (502 ``unserved_tool_call``) for an answer of nothing but unservable calls."""
        assert ctx.prepared is not None and self.tools is not None
        try:
            message = parse_json(data)
        except ValueError:
            return data
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            return data
        mine, theirs = split_uses(message["content"], ctx.prepared.own_tools)
        if self.tools.serves(ctx, mine, theirs):
            await self.tools.serve(ctx, hash_view({"role": "assistant", "content": message["content"]}),
                                   as_calls(mine))
            return None
        if not mine and not ctx.internal:
            return data
        content = without(message["content"], mine)
        if mine and not theirs:
            self.tools.unserved(ctx, as_calls(mine), has_text=has_text(content))
            if message.get("stop_reason") == "tool_use":
                message["stop_reason"] = "end_turn"
        message["content"] = merged(ctx.internal, content)
        return orjson.dumps(message)

    async def _next_round(self, ctx: ChatContext, target: str) -> tuple[HeldResponse | None, _StreamStart | bytes]:
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
                try:
                    start = await _StreamStart.read(resp, self.settings.stream_log_max_bytes, sent)
                    retry = start.overflow is not None and await self.recovery.retry(
                        ctx, start.overflow, keep_rounds=True, escalate=True)
                except BaseException:
                    await resp.aclose()
                    raise
                if not retry:
                    return resp, start
                await resp.aclose()
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

    def _finish_whole(self, ctx: ChatContext, status: int, data: bytes) -> None:
        """Log a complete answer: the Message's ``content`` as the reply, its ``usage`` and
        ``stop_reason``; an error status with the provider's text (a refused key: the record only)."""
        if status >= 400:
            ctx.refused = status in (401, 403) and self.settings.anthropic_upstream_api_key is None
            error = (f"the upstream refused the client's key ({status})" if ctx.refused
                     else data[:500].decode("utf-8", "replace"))
            self.writer.finish(ctx, status, None, None, error=error)
            return
        try:
            message = parse_json(data)
        except ValueError:
            message = None
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            self.writer.finish(ctx, status, None, None, error="the upstream's answer is not a Message")
            return
        usage = message.get("usage") if isinstance(message.get("usage"), dict) else None
        stop = message.get("stop_reason") if isinstance(message.get("stop_reason"), str) else None
        reply = hash_view({"role": "assistant", "content": message["content"]})
        self.writer.finish(ctx, status, reply, usage, finish_reason=stop)

    def _stream(self, ctx: ChatContext, resp: HeldResponse, headers: dict[str, str], start: _StreamStart,
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

        async def plain() -> AsyncGenerator[bytes, None]:
            for chunk in start.held:
                yield chunk
            if start.failed is not None:
                raise start.failed
            if not start.ended:
                async for chunk in start.rest:
                    for event in splitter.feed(chunk):
                        client.add(event)
                    yield chunk
            for event in splitter.flush():
                client.add(event)

        async def chunks() -> AsyncGenerator[bytes, None]:
            nonlocal ended
            try:
                async for chunk in (self._rounds(ctx, target, start, client, current) if rounds else plain()):
                    yield chunk
                    if ctx.append_task is None:  # once the first byte is out (the write would delay it)
                        ctx.start_append(self.writer.spawn)  # a long stream: the turns committed meanwhile
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

        relay = chunks()

        async def close() -> None:
            try:
                await relay.aclose()
            finally:
                await current[0].aclose()
                if not ctx.finished:
                    error = ended
                    if error == DISCONNECTED and client.done and not client.upstream_error:
                        error = None  # gone after message_stop, before the end of the body: complete all the same
                    reply = hash_view(client.message()) if not client.empty else None
                    if client.truncated or splitter.dropped:  # (an event over SSESplitter's bound is not read)
                        error = error or "the reply is longer than stream_log_max_bytes: logged as far as it fits"
                    self.writer.finish(ctx, resp.status_code, reply, client.usage, error=error,
                                       partial=error is not None, finish_reason=client.stop_reason)

        return Streamed(resp.status_code, headers, relay, close)

    async def _rounds(self, ctx: ChatContext, target: str, start: _StreamStart, client: MessagesAssembler,
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
        state: _StreamStart = start
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
                await self.tools.serve(ctx, hash_view(round_asm.message()), as_calls(uses))
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

    def _headers(self, upstream: Mapping[str, str]) -> dict[str, str]:
        """The upstream's response headers to pass back (the operator's not under a held key; the
        length is the proxy's to set)."""
        out = response_headers(upstream, keep_encoding=False,
                               shared_key=self.settings.anthropic_upstream_api_key is not None)
        out.pop("content-length", None)
        return out

    def _client_headers(self, ctx: ChatContext, upstream: Mapping[str, str]) -> dict[str, str]:
        return context_headers(ctx, upstream, shared_key=self.settings.anthropic_upstream_api_key is not None)

    async def _forward_unlogged(self, raw: bytes, target: str, headers: list[tuple[str, str]], tenant: str, *,
                                warn: bool) -> Buffered | Streamed:
        """Relay as sent, without logging (a body the proxy cannot log; the database down, fail open:
        ``warn`` says so in ``x-context-proxy-warning``)."""
        if warn:
            log.warning("database unavailable: forwarding without logging (database_failure_mode=open)")
        resp = await self.upstream.send("POST", target, headers=headers, content=raw, tenant=tenant)
        out = self._headers(resp.headers)
        if warn:
            out["x-context-proxy-warning"] = DEGRADED_WARNING

        sse = "text/event-stream" in resp.headers.get("content-type", "")

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            except ProxyError as exc:  # a stream under way is ended in-band; another body is cut
                if not sse:
                    raise
                yield stream_error_event(exc)

        return Streamed(resp.status_code, out, chunks(), resp.aclose)


async def _round_events(state: _StreamStart) -> AsyncGenerator[SSEEvent, None]:
    """A round's events: those its start held, then the rest as it arrives (each read into
    ``state.assembler``: the round's whole assistant turn). Raises the upstream's failure."""
    for event in state.events:
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
