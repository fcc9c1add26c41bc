"""Serving the proxy's own tool calls inside a request (see ``proxy.tools.own_tools`` for the strategy).

A round: the model called only the proxy's tools; the proxy answers each call from the database,
appends the assistant message and the tool results to the forwarded messages (and to
``ctx.internal``, logged as internal messages), and asks the model again. The loop over rounds
(and over overflow retries) is one, for streams and not: ``proxy.forward.rounds.RoundLoop``; this
module serves the calls and filters a round's stream. Streams stay open in the meantime (an SSE comment
line, which SDKs ignore) and stay well-formed: the finish, usage and ``[DONE]`` events of the
rounds the client does not see are held back and dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import orjson

from proxy.compaction.apis import CHAT_API, ProviderApi
from proxy.errors import UpstreamError
from proxy.forward.sse import SSEEvent
from proxy.json_depth import dumps
from proxy.json_text import parse_json
from proxy.tools.own_tools import StreamToolFilter, split_calls
from proxy.tools.read_tool import Visible, serve_read, visible_in
from storage.errors import StorageError

if TYPE_CHECKING:
    from proxy.compaction.base import Compactor
    from proxy.forward.context import ChatContext
    from proxy.forward.streaming import StreamState
    from proxy.settings import Settings
    from proxy.tokens.protocol import Tokenizer
    from storage.store import Store

log = logging.getLogger("context_proxy.tools")

HELD_MAX_EVENTS = 16
"""Finish and usage events of a round held at most (an upstream sends one or two of each)."""
KEEPALIVE = b": context-proxy is serving its own tool call\n\n"
CHARS_PER_TOKEN = 3
"""Characters per token a read result is first sized at (then counted, and cut until it fits)."""
MIN_READ_TOKENS = 250
"""A round after which less than this many tokens of budget are left is the last (the next request
goes without the proxy's tools); a read with less than half of it is answered ``BUDGET_SPENT``."""
MIN_READ_CHARS = 1000
MESSAGE_FRAME_TOKENS = 32
"""Tokens counted per round message on top of the estimate (its frame: role, ids; providers count
more than tiktoken's estimate of the content), so the budget is not overrun."""
MAX_CALLS_PER_ROUND = 8
"""Calls of one round served at most; the rest are dropped from the round (the last result says
so), as each call and its result add to the prompt whatever the budget."""
ROUND_SEARCH_S = 3.0
"""Wall time the searches of one round may take in all (seconds); a search past it stops and says so."""
UNSERVED_IN_ROUND = (f"[context-proxy] Not served: at most {MAX_CALLS_PER_ROUND} calls are served per round; "
                     "call again for this one if you still need it.")
BUDGET_SPENT = "[context-proxy] Not served: the read budget of this request is spent; answer with what you have read."


class ToolRounds:
    """Serves calls to the proxy's read and compaction tools for the pipeline.

    Budget: the read rounds of one request may add at most ``read_tool_budget_fraction`` of the
    window (tokens: the rounds' assistant calls and results, counted as forwarded) and never more
    than half the room the window has left; ``read_tool_max_rounds`` is the backstop. A round
    after which less than ``MIN_READ_TOKENS`` of budget is left is the last: the next request goes
    without the proxy's tools (``ctx.tools_withdrawn``), so the model answers.

    A call to a tool the request offered is always served while rounds are left, even with no
    budget left (the tools a request offers never depend on the budget: a tool list that changes
    between a session's requests invalidates the provider's prompt cache): its reads are answered
    ``BUDGET_SPENT`` and that round is the last, so at most one such round. A call no round can
    serve (rounds spent, or a call to a tool withdrawn) is removed; when nothing is left for the
    client (no text, no call of its own) the request fails with our 502 (``unserved``), never
    an empty answer an agent would stop on.
    """

    def __init__(self, settings: Settings, store: Store, compactor: Compactor, counter: Tokenizer,
                 api: ProviderApi = CHAT_API) -> None:
        self.settings = settings
        self.store = store
        self.compactor = compactor
        """Serves the compaction tool."""
        self.shape = api.name
        """``chat``: a round is an assistant message with ``tool_calls`` and one ``tool`` message per
        call; ``messages``: the assistant turn as the provider sent it (its ``tool_use`` blocks,
        thinking included) and one user turn of ``tool_result`` blocks."""
        self.counter = counter.bind(api.codec)
        """Sizes the rounds' calls and results in the API's shape (tokens; the app's one counter,
        the defenses' too, bound to the API's codec)."""

    def may_continue(self, ctx: ChatContext) -> bool:
        if ctx.read_rounds >= self.settings.read_tool_max_rounds:
            return False
        return ctx.prepared is None or self._budget_left(ctx) >= MIN_READ_TOKENS

    async def serve(self, ctx: ChatContext, assistant: dict[str, Any], calls: list[dict[str, Any]]) -> None:
        """Answer ``calls`` (all the proxy's own, chat-shaped: ``{id, function: {name, arguments}}``),
        record the round, and prepare the next body. ``assistant``: the reply that made them (chat:
        its ``content``; Messages: the whole assistant turn, forwarded again as it came)."""
        assert ctx.prepared is not None and ctx.prepared.forwarded is not None
        forwarded = ctx.prepared.forwarded
        visible = visible_in([*forwarded["messages"], *ctx.internal], ctx.messages, self.settings.read_tool_scope,
                             ctx.session.session_id)
        if self.shape == "messages":  # every tool_use needs its result: calls over the bound are answered so
            served, unserved = calls[:MAX_CALLS_PER_ROUND], calls[MAX_CALLS_PER_ROUND:]
            dropped = 0
            message = assistant
        else:
            served, unserved = calls[:MAX_CALLS_PER_ROUND], []
            dropped = max(0, len(calls) - MAX_CALLS_PER_ROUND)
            message = {"role": "assistant", "content": assistant.get("content"), "tool_calls": served}
        calls = served
        counter = self.counter
        spent = counter.count_message(message) + MESSAGE_FRAME_TOKENS  # the round's call, added to the prompt too
        left = self._budget_left(ctx)
        deadline = time.monotonic() + ROUND_SEARCH_S
        results = []
        for i, call in enumerate(calls):
            fn = call.get("function") or {}
            available = left - spent - MESSAGE_FRAME_TOKENS
            budget = min(available, max(MIN_READ_TOKENS // 2, available // (len(calls) - i)))
            try:
                if fn.get("name") == self.settings.compact_tool_name:
                    text = await self.compactor.compact_now(ctx)
                elif available < MIN_READ_TOKENS // 2:
                    text = BUDGET_SPENT
                else:
                    text = await self._read(ctx, fn.get("arguments", ""), visible, budget, deadline)
            except StorageError:
                log.error("serving %s failed: database error", fn.get("name"))
                text = ("[context-proxy] The stored content could not be read right now (database unavailable); "
                        "nothing was changed.")
            except MemoryError:
                log.error("serving %s failed: out of memory", fn.get("name"))
                text = "[context-proxy] This read needed too much memory; narrow it (a simpler query, or a reference)."
            if dropped and i == len(calls) - 1:
                text += (f"\n[context-proxy] {dropped} more calls of this round were not served (at most "
                         f"{MAX_CALLS_PER_ROUND} per round); call again for those you still need.")
            result = self._result(call.get("id"), text)
            spent += counter.count_message(result) + MESSAGE_FRAME_TOKENS
            results.append(result)
        results += [self._result(call.get("id"), UNSERVED_IN_ROUND) for call in unserved]
        if self.shape == "messages":  # the results as one user turn (tool results first, nothing else)
            results = [{"role": "user", "content": [r["content"][0] for r in results]}]
        ctx.internal += [message, *results]
        ctx.read_rounds += 1
        body = forwarded | {"messages": [*forwarded["messages"], *ctx.internal]}
        last = not self.may_continue(ctx)
        if last and self.shape == "messages":  # the last round: the model must answer
            ctx.tools_withdrawn = True  # (the tool list kept: in the cache's prefix, and history names the tool)
            body["tool_choice"] = {"type": "none"}
        elif last:
            ctx.tools_withdrawn = True
            own = ctx.prepared.own_tools
            tools = [t for t in body.get("tools") or () if (t.get("function") or {}).get("name") not in own]
            body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
            if tools:
                body["tools"] = tools
            if tools and "tool_choice" in forwarded:
                body["tool_choice"] = forwarded["tool_choice"]
        ctx.prepared = dataclasses.replace(ctx.prepared, body=dumps(body))

    def _result(self, call_id: Any, text: str) -> dict[str, Any]:
        """One call's result: a ``tool`` message (chat), or a user turn of its ``tool_result`` block."""
        if self.shape == "messages":
            return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    async def _read(self, ctx: ChatContext, arguments: str, visible: Visible, budget: int, deadline: float) -> str:
        """One read, at most ``budget`` tokens: served at ``budget * CHARS_PER_TOKEN`` characters,
        counted, re-read once at fewer characters if over (while the round's search time lasts),
        then cut to the budget (its last line, how to continue, kept)."""
        counter = self.counter
        max_chars = max(MIN_READ_CHARS, budget * CHARS_PER_TOKEN)
        text = await serve_read(self.store, ctx.tenant, ctx.session, arguments, visible, max_chars, deadline)
        tokens = counter.count_text(text)
        if tokens > budget and deadline - time.monotonic() > ROUND_SEARCH_S / 4:
            max_chars = max(MIN_READ_CHARS // 4, int(max_chars * budget / tokens * 0.9))
            text = await serve_read(self.store, ctx.tenant, ctx.session, arguments, visible, max_chars, deadline)
            tokens = counter.count_text(text)
        return text if tokens <= budget else fit_tokens(text, tokens, budget, counter.count_text)

    def _window(self, ctx: ChatContext) -> int:
        assert ctx.prepared is not None
        return ctx.prepared.window_tokens or self.settings.fallback_trigger_tokens

    def spent_tokens(self, ctx: ChatContext) -> int:
        """Tokens this request's read rounds added to the prompt so far (calls and results)."""
        counter = self.counter
        return sum(counter.count_message(m) + MESSAGE_FRAME_TOKENS for m in ctx.internal)

    def _budget_left(self, ctx: ChatContext) -> int:
        """Tokens further reads may add: the budget's rest, at most half the room left in the window."""
        assert ctx.prepared is not None
        window = self._window(ctx)
        spent = self.spent_tokens(ctx)
        total = int(window * self.settings.read_tool_budget_fraction)
        room = window - (ctx.prepared.tokens_forwarded or 0) - spent
        return max(0, min(total - spent, room // 2))

    def strip(self, data: bytes, reply: dict[str, Any],
              client_calls: list[dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
        """A non-streaming response with the proxy's calls removed (the client's kept)."""
        parsed = parse_json(data)  # as ``_reply_of`` read it (``proxy.json_text``)
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
        return dumps(parsed), reply

    async def relay_round(self, ctx: ChatContext, state: StreamState) -> AsyncGenerator[bytes, None]:
        """Relay one upstream stream of a request that offered the proxy's tools: their call deltas
        removed, the finish, usage and ``[DONE]`` events held back to the end and sent only if this
        round is the client's last. When the model called only the proxy's tools and another round
        may follow (``serves``), nothing of the end is sent and ``state.own_calls`` holds the calls
        for the round loop (``ChatPipeline._exchanges``) to serve. ``state.assembler`` gets what
        the client is sent. Raises ``UpstreamError`` if the upstream fails."""
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
                    chunk = parse_json(event.data)  # as the assembler reads it (``proxy.json_text``)
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
                data = event.raw + b"\n\n" if out is chunk else b"data: " + dumps(out) + b"\n\n"
                choices = out.get("choices") or []
                finish = bool(choices) and isinstance(choices[0], dict) and bool(choices[0].get("finish_reason"))
                if finish or (not choices and out.get("usage")):
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
        if calls and not filt.client_calls:  # removed unserved: the text relayed is the answer
            self.unserved(ctx, calls, has_text=assembler.truncated or bool(assembler.message().get("content")))
            held = [_finish_stop(data) for data in held]
        for data in held:
            yield data

    def serves(self, ctx: ChatContext, own_calls: list[dict[str, Any]], client_calls: int) -> bool:
        """Does the round loop serve these calls and ask again? Only the proxy's calls, of a request
        that offered them (not ``ctx.tools_withdrawn``), while ``read_tool_max_rounds`` allows:
        whatever the budget (``serve`` then answers ``BUDGET_SPENT`` and makes it the last round)."""
        return (bool(own_calls) and not client_calls and not ctx.tools_withdrawn
                and ctx.read_rounds < self.settings.read_tool_max_rounds)

    def unserved(self, ctx: ChatContext, own_calls: list[dict[str, Any]], *, has_text: bool) -> None:
        """The model called only the proxy's tools and no round can serve them (``serves`` is
        False): logged (a warning: names and counts only). With ``has_text`` the text is the
        answer (returned with the calls removed, ``finish_reason: "stop"``); without, raises our
        ``UpstreamError`` (502, code ``unserved_tool_call``): an empty success would make an agent
        stop as if the task were done, an error is seen (and retried by SDKs)."""
        names = sorted({str((c.get("function") or {}).get("name")) for c in own_calls})
        log.warning("own tool calls not served (%d: %s; rounds %d, tools withdrawn %s); answer %s",
                    len(own_calls), ",".join(names), ctx.read_rounds, ctx.tools_withdrawn,
                    "kept" if has_text else "empty: 502")
        if not has_text:
            raise UpstreamError("The model answered only with calls to context-proxy's own tools, which could not "
                                "be served in this request (its read rounds are spent); retry the request.",
                                code="unserved_tool_call")


def fit_tokens(text: str, tokens: int, budget: int, count: Callable[[str], int]) -> str:
    """``text`` (``tokens`` long) cut to at most ``budget`` tokens by ``count``: its start and, when
    it fits, its last line (a result's way to continue); nothing but a marker when even that is over."""
    last = text.rsplit("\n", 1)[-1] if "\n" in text else ""
    tail = "…\n" + last if last and count(last) * 2 < budget else "…"
    room = budget - count(tail)
    for _ in range(6):
        if room <= 0:
            break
        chars = int(len(text) * room / max(tokens, 1) * 0.9)
        cut = text[: max(0, chars)]
        tokens = count(cut)
        if tokens <= room:
            return cut + tail
        text = cut
    return "[context-proxy] Cut: the result did not fit the read budget."


def _finish_stop(data: bytes) -> bytes:
    """A held event, its choice's ``finish_reason: "tool_calls"`` made ``"stop"`` (the calls it
    ended were removed); any other event as it is."""
    if not data.startswith(b"data: ") or b'"tool_calls"' not in data:
        return data
    try:
        chunk = parse_json(data[6:].strip())
    except orjson.JSONDecodeError:
        return data
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return data
    if choices[0].get("finish_reason") != "tool_calls":
        return data
    fixed = chunk | {"choices": [choices[0] | {"finish_reason": "stop"}, *choices[1:]]}
    return b"data: " + dumps(fixed) + b"\n\n"


async def _events(state: StreamState) -> AsyncGenerator[SSEEvent, None]:
    """The stream's events: those read while holding, then the rest as it arrives."""
    for event in state.first:
        yield event
    if state.rest:  # the rest of the chunk that ended holding
        for event in state.splitter.feed(state.rest):
            yield event
    async for chunk in state.chunks:
        for event in state.splitter.feed(chunk):
            yield event
    for event in state.splitter.flush():
        yield event


def own_only(reply: dict[str, Any] | None, own: frozenset[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(own_calls, client_calls)`` of a complete reply."""
    if not reply or not own:
        return [], []
    return split_calls(reply.get("tool_calls"), own)
