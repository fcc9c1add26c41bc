"""Serving the proxy's own tool calls inside a request (see ``proxy.own_tools`` for the strategy).

A round: the model called only the proxy's tools; the proxy answers each call from the database,
appends the assistant message and the tool results to the forwarded messages (and to
``ctx.internal``, logged as internal messages), and asks the model again. The loop over rounds
(and over overflow retries) is one, for streams and not: ``ChatPipeline._exchanges``; this module
serves the calls and filters a round's stream. Streams stay open in the meantime (an SSE comment
line, which SDKs ignore) and stay well-formed: the finish, usage and ``[DONE]`` events of the
rounds the client does not see are held back and dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from proxy.own_tools import StreamToolFilter, split_calls
from proxy.read_tool import references_in, serve_read
from proxy.sse import SSEEvent
from proxy.streaming import in_band
from proxy.upstream import TRANSPORT_ERRORS
from storage.errors import StorageError

if TYPE_CHECKING:
    from proxy.compactor import ProjectingCompactor
    from proxy.pipeline import ChatContext
    from proxy.settings import Settings
    from proxy.streaming import StreamState
    from storage.store import Store

log = logging.getLogger("context_proxy.tools")

HELD_MAX_EVENTS = 16
"""Finish and usage events of a round held at most (an upstream sends one or two of each)."""
KEEPALIVE = b": context-proxy is serving its own tool call\n\n"
CHARS_PER_TOKEN = 4
"""Size budget of one read result: a quarter of the window at ~4 characters a token (DESIGN.md)."""
CONSERVATIVE_CHARS_PER_TOKEN = 3
"""Characters per token assumed when measuring room left (code and logs run below 4)."""
MIN_READ_CHARS = 1000


class ToolRounds:
    """Serves calls to the proxy's read and compaction tools for the pipeline."""

    def __init__(self, settings: Settings, store: Store, compactor: Any) -> None:
        self.settings = settings
        self.store = store
        self.compactor: ProjectingCompactor | Any = compactor

    def may_continue(self, ctx: ChatContext) -> bool:
        return ctx.read_rounds < self.settings.read_tool_max_rounds

    async def serve(self, ctx: ChatContext, assistant: dict[str, Any], calls: list[dict[str, Any]]) -> None:
        """Answer ``calls`` (all the proxy's own), record the round, and prepare the next body."""
        assert ctx.prepared is not None and ctx.prepared.forwarded is not None
        forwarded = ctx.prepared.forwarded
        visible = references_in([*forwarded["messages"], *ctx.internal])
        max_chars = self._read_budget_chars(ctx)
        results = []
        for call in calls:
            fn = call.get("function") or {}
            try:
                if fn.get("name") == self.settings.compact_tool_name:
                    text = await self.compactor.compact_now(ctx)
                else:
                    text = await self._read(ctx, fn.get("arguments", ""), visible, max_chars)
            except StorageError:
                log.error("serving %s failed: database error", fn.get("name"))
                text = "[context-proxy] The stored content could not be read right now (database unavailable); nothing was changed."
            results.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})
        message = {"role": "assistant", "content": assistant.get("content"), "tool_calls": calls}
        ctx.internal += [message, *results]
        ctx.read_rounds += 1
        body = forwarded | {"messages": [*forwarded["messages"], *ctx.internal]}
        if not self.may_continue(ctx):  # the last round: the model must answer
            tools = [t for t in body.get("tools") or () if (t.get("function") or {}).get("name") not in ctx.prepared.own_tools]
            body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")} | ({"tools": tools} if tools else {})
            if tools and "tool_choice" in forwarded:
                body["tool_choice"] = forwarded["tool_choice"]
        ctx.prepared = dataclasses.replace(ctx.prepared, body=orjson.dumps(body))

    async def _read(self, ctx: ChatContext, arguments: str, visible: tuple[set[str], set[str]], max_chars: int) -> str:
        """One read, cut (by re-reading fewer characters) until it fits the token budget."""
        budget = self._read_budget_tokens(ctx)
        counter = self.compactor.counter
        for _ in range(4):
            text = await serve_read(self.store, ctx.tenant, ctx.session, arguments, visible, max_chars)
            tokens = counter.count_text(text)
            if tokens <= budget or max_chars <= MIN_READ_CHARS:
                return text
            max_chars = max(MIN_READ_CHARS, int(max_chars * budget / tokens * 0.9))
        return text

    def _read_budget_tokens(self, ctx: ChatContext) -> int:
        """Tokens one read may add: half the room left in the window, at most a quarter of the window."""
        assert ctx.prepared is not None
        window = ctx.prepared.window_tokens or self.settings.fallback_trigger_tokens
        counter = self.compactor.counter
        used = (ctx.prepared.tokens_forwarded or 0) + sum(counter.count_message(m) for m in ctx.internal)
        return max(MIN_READ_CHARS // 4, min((window - used) // 2, window // 4))

    def _read_budget_chars(self, ctx: ChatContext) -> int:
        """Characters one read may return: half the room left in the window, at most a quarter of it.

        Room = window - the forwarded estimate - what earlier rounds added (counted at
        ``CONSERVATIVE_CHARS_PER_TOKEN``), so a few reads in a row never overflow the window.
        """
        assert ctx.prepared is not None
        window = ctx.prepared.window_tokens or self.settings.fallback_trigger_tokens
        used = (ctx.prepared.tokens_forwarded or 0) + len(orjson.dumps(ctx.internal)) // CONSERVATIVE_CHARS_PER_TOKEN
        room_chars = (window - used) // 2 * CONSERVATIVE_CHARS_PER_TOKEN
        return max(MIN_READ_CHARS, min(room_chars, window * CHARS_PER_TOKEN // 4))

    def strip(self, data: bytes, reply: dict[str, Any], client_calls: list[dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
        """A non-streaming response with the proxy's calls removed (the client's kept)."""
        parsed = orjson.loads(data)
        choice = parsed["choices"][0]
        message = dict(choice["message"])
        if client_calls:
            message["tool_calls"] = client_calls
            reply = reply | {"tool_calls": client_calls}
        else:  # nothing left for the client: a plain (possibly empty) answer, not an empty call list
            message.pop("tool_calls", None)
            message["content"] = message.get("content") or ""
            choice["finish_reason"] = "stop"
            reply = {k: v for k, v in reply.items() if k != "tool_calls"} | {"content": message["content"]}
        choice["message"] = message
        return orjson.dumps(parsed), reply

    async def relay_round(self, ctx: ChatContext, state: StreamState) -> AsyncIterator[bytes]:
        """Relay one upstream stream of a request that offered the proxy's tools: their call deltas
        removed, the finish, usage and ``[DONE]`` events held back to the end and sent only if this
        round is the client's last. When the model called only the proxy's tools and another round
        may follow (``serves``), nothing of the end is sent and ``state.own_calls`` holds the calls
        for the round loop (``ChatPipeline._exchanges``) to serve. ``state.assembler`` gets what
        the client is sent. Raises our translated error if the upstream fails."""
        assert ctx.prepared is not None
        assembler = state.assembler
        filt = StreamToolFilter(ctx.prepared.own_tools)
        held: list[bytes] = []
        async with contextlib.aclosing(_events(state)) as events:
            async for event in events:
                if event.data == b"[DONE]":
                    held.append(event.raw + b"\n\n")
                    assembler.add(event)
                    continue
                try:
                    chunk = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    assembler.add(event)  # an error event's text, say: recorded, relayed as it came
                    yield event.raw + b"\n\n"
                    continue
                if not isinstance(chunk, dict) or "error" in chunk or event.event == "error":
                    assembler.add(event)
                    yield event.raw + b"\n\n"
                    continue
                try:
                    out = filt.filter(chunk)
                except (AttributeError, TypeError, ValueError, KeyError, IndexError):
                    out = chunk  # a shape the filter cannot read: relayed as it came
                if out is None:
                    continue
                data = event.raw + b"\n\n" if out is chunk else b"data: " + orjson.dumps(out) + b"\n\n"
                choices = out.get("choices") or []
                if (choices and isinstance(choices[0], dict) and choices[0].get("finish_reason")) or (not choices and out.get("usage")):
                    if len(held) >= HELD_MAX_EVENTS:  # a hostile upstream repeating them: the newest kept
                        del held[0]
                    held.append(data)  # sent only if this round is the client's last
                else:
                    yield data
                assembler.add_chunk(out)
        calls = [c.as_tool_call() for c in filt.own_calls]
        if self.serves(ctx, calls, filt.client_calls):
            state.own_calls = calls
            return
        for data in held:
            yield data

    def serves(self, ctx: ChatContext, own_calls: list[dict[str, Any]], client_calls: int) -> bool:
        """Does the round loop serve these calls and ask again? Only the proxy's calls, rounds left."""
        return bool(own_calls) and not client_calls and self.may_continue(ctx)


async def _events(state: StreamState) -> AsyncIterator[SSEEvent]:
    """The stream's events: those read while holding, then the rest as it arrives."""
    for event in state.first:
        yield event
    try:
        async for chunk in state.chunks:
            for event in state.splitter.feed(chunk):
                yield event
    except TRANSPORT_ERRORS as exc:
        raise in_band(exc) from exc
    for event in state.splitter.flush():
        yield event


def own_only(reply: dict[str, Any] | None, own: frozenset[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(own_calls, client_calls)`` of a complete reply."""
    if not reply or not own:
        return [], []
    return split_calls(reply.get("tool_calls"), own)
