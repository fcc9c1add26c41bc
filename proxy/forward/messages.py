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

Here: the request parsed, its session named and opened, the attempts run (``_run``; overflow
retries through ``proxy.forward.rounds.Recovery``, as chat's) and a body forwarded unlogged. The
streamed path is ``proxy.forward.messages_stream``, the whole-answer path
``proxy.forward.messages_whole``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from itertools import repeat
from typing import Any

import orjson

from proxy.compaction.base import Compactor
from proxy.compaction.overflow import classify_error
from proxy.conversation.canonical import digests_now, digests_off_loop
from proxy.conversation.digest_memo import DigestMemo
from proxy.conversation.messages_codec import MESSAGES, hash_view
from proxy.conversation.messages_rounds import after_rounds
from proxy.errors import ProxyError
from proxy.forward.answers import Buffered, Streamed
from proxy.forward.context import ChatContext
from proxy.forward.db_health import DatabaseHealth
from proxy.forward.entropy import EntropyPool
from proxy.forward.log_writer import LogWriter
from proxy.forward.messages_stream import MessagesStream, stream_error_event
from proxy.forward.messages_whole import finish_whole, own_calls
from proxy.forward.pipeline import DEGRADED_WARNING, context_headers
from proxy.forward.rounds import Recovery, sent_with_rounds
from proxy.forward.session_ids import client_session_id
from proxy.forward.session_log import SessionLog, new_id
from proxy.forward.tool_rounds import ToolRounds
from proxy.json_depth import DeepBudgetExceeded, budget_fields
from proxy.json_text import parse_json
from proxy.settings import Settings
from proxy.telemetry.logs import bind_request
from proxy.telemetry.metrics import Metrics
from proxy.upstream.client import Upstream
from proxy.upstream.headers import forward_request_headers, response_headers
from storage.errors import StorageError, StorageUnavailable
from storage.records import SessionRecord
from storage.refused import track_writes, untrack_writes

log = logging.getLogger("context_proxy.messages")

CLAUDE_CODE_SESSION_HEADER = "x-claude-code-session-id"
"""Claude Code names its session in every request; the first choice for the proxy's session id."""


TURNS = ("messages", "system")
"""The body's fields ``MESSAGES.pieces`` makes its turns of (hashed: ``hash_view``)."""


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
    if not isinstance(messages, list) or not all(map(isinstance, messages, repeat(dict))):
        return None
    return body


def session_id_of(headers: Mapping[str, str]) -> str | None:
    """``X-Claude-Code-Session-Id`` when it is an id the read API can address (else passed over:
    the header is addressed to Anthropic, not a reason to refuse), then ``X-Session-Id`` (checked by
    ``client_session_id``: a 400 for one it refuses), else ``None``."""
    named = headers.get(CLAUDE_CODE_SESSION_HEADER)
    if named is not None:
        try:
            named = client_session_id(named)
        except ProxyError:
            named = None
        if named:
            return named
    return client_session_id(headers.get("x-session-id"))


class MessagesPipeline:
    """``handle`` serves one ``POST /v1/messages`` (module docstring). One per app; shares the chat
    pipeline's session log, log writer, database health and digest memo. ``upstream``: the Anthropic
    one; ``compactor``: the defenses over Messages (``ProjectingCompactor`` with ``MESSAGES_API``)."""

    def __init__(self, settings: Settings, session_log: SessionLog, upstream: Upstream, writer: LogWriter,
                 health: DatabaseHealth, metrics: Metrics, digest_memo: DigestMemo | None = None,
                 compactor: Compactor | None = None, tools: ToolRounds | None = None,
                 entropy: EntropyPool | None = None) -> None:
        self.digest_memo = digest_memo
        """Digests of the histories seen (the chat pipeline's: one bound; the same values, computed once)."""
        self.settings = settings
        self.log = session_log
        self.upstream = upstream
        self.writer = writer
        self.health = health
        self.metrics = metrics
        self.compactor = compactor if compactor is not None else Compactor()
        self.entropy = entropy if entropy is not None else EntropyPool()
        """System entropy for the request ids (the chat pipeline's: one bound, ``ENTROPY_POOL_BYTES``)."""
        self.recovery = Recovery(settings, self.compactor, metrics, health)
        """Prepares each request and its retries after an overflow (with escalation: signed cycles)."""
        self.tools = tools
        """Serves the proxy's read tool (``None``: a reply's calls to it are never served: removed)."""
        self.streams = MessagesStream(settings, upstream, writer, self.recovery, tools)
        """Relays a stream (the read tool's rounds in it)."""

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
            views = [hash_view(p) for p in pieces]
            digests, chain = (digests_now(views, len(raw), self.digest_memo)  # (a small body: no coroutine)
                              or await digests_off_loop(views, len(raw), self.digest_memo))
            budget_fields(body, TURNS)  # (its tool schemas, nested deeper than orjson writes)
        except orjson.JSONEncodeError:  # a value orjson refuses, not for its depth (none ``parse_json`` makes)
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=False)
        except DeepBudgetExceeded:  # more deep content than a request may cost the loop: as sent, unlogged
            self.metrics.deep_over_budget("request")
            log.warning("request nested too deep past its budget (json_depth.DEEP_BUDGET_CONTAINERS): "
                        "forwarded unlogged")
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=False)
        self.log.follow(chain)  # a regenerate's write is then known stored, not read again
        session_id = session_id_of(headers) or self.log.derive_session_id(tenant, pieces, chain)
        try:
            if self.health.down and not await self.health.usable():  # (up: no coroutine to await)
                raise StorageUnavailable("the database did not answer the last probe")
            # (the session row and its internal rounds as cached, without a coroutine each: most
            # requests read neither)
            session = (self.log.session_now(tenant, session_id)
                       or await self.log.open_session(tenant, session_id, "messages"))
            internal = self.log.internal_now(session.pk)
            expanded = (self.log.expand(internal, pieces, digests, chain, after_rounds) if internal is not None
                        else await self.log.expand_internal(session, pieces, digests, chain, after=after_rounds))
        except StorageError as exc:
            self.health.saw(exc)
            if self.settings.database_failure_mode != "open":
                raise
            self.metrics.database_error("fail_open")
            return await self._forward_unlogged(raw, target, forward_headers, tenant, warn=True)
        if expanded is not None:  # the proxy's earlier tool rounds, put back where they ran
            pieces, digests, chain = expanded
        # (by position, in the fields' order, as the chat pipeline builds it)
        ctx = ChatContext(new_id("req", self.entropy), tenant, session, body, raw, pieces, digests, chain,
                          forward_headers, body.get("stream") is True, time.perf_counter(), self.log, self.compactor,
                          False, expanded is not None)
        bind_request(ctx.request_id, session.session_id, ctx.model)
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
            budget_fields(body, TURNS)
        except (orjson.JSONEncodeError, DeepBudgetExceeded):  # (as ``handle``)
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
        except orjson.JSONEncodeError:  # (a value orjson refuses: counted as sent)
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
                start = await self.streams.read_start(ctx, resp, sent, keep_rounds=False)
                if start is None:
                    continue
                # (an overflow with no retry left: the provider's stream goes back as it came)
                return self.streams.relay(ctx, resp, self._client_headers(ctx, resp.headers), start, target)
            try:
                data = await resp.aread()
            finally:
                await resp.aclose()  # read whole: its pool slot is free for a summary call
            message = None  # (the answer's Message, once read: read once)
            if resp.status_code >= 400:
                overflow = classify_error(resp.status_code, data, resp.headers, sent=sent)
                if overflow is not None and await self.recovery.retry(ctx, overflow, keep_rounds=False, escalate=True):
                    continue
            elif ctx.prepared.own_tools and self.tools is not None:
                answer = await own_calls(ctx, data, self.tools)
                if answer is None:  # served: ask again
                    continue
                data, message = answer
            finish_whole(ctx, resp.status_code, data, self.writer,
                         shared_key=self.settings.anthropic_upstream_api_key is not None, message=message)
            return Buffered(resp.status_code, self._client_headers(ctx, resp.headers), data)

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
