"""Relaying a streamed chat reply: hold what carries nothing (an overflow among it is retried, not
relayed), then pass the upstream's bytes through as they arrive while the reply is reassembled.

Holding (``start_stream``): before the first event that carries something (content, a tool call, a
refusal, a finish reason, usage, ``[DONE]``, or anything not understood), the events that carry
nothing (role-only deltas such as ``{"role": "assistant", "content": "", "refusal": null}``, chunks
with empty ``choices`` and no usage, SSE comments) are held. An error event among them is
classified like an error body (every overflow style, ``proxy.compaction.overflow``) and reported in
``StreamState.overflow``: the pipeline retries, and the client sees only the retry's stream, or
relays what was held as it came. Once something has been relayed, an error event is relayed as it
came. Holding is bounded (``HOLD_MAX_EVENTS``, ``HOLD_MAX_BYTES``, ``HOLD_MAX_S``): past a bound,
what is held is relayed. On a normal stream the first content delta follows the role chunk at
once, so holding adds nothing measurable to the time to the first content byte.

A stream that breaks (connection cut, read timeout) or ends without ``[DONE]`` gets an error event
in OpenAI's envelope at its end, so no client mistakes it for a complete reply, unless the upstream
sent an error event itself (that one says why; the proxy adds none). The pipeline does that, and
logs how the stream ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from proxy.compaction.overflow import Overflow, classify_error, classify_stream_event
from proxy.errors import ProxyError, UpstreamError, UpstreamUnreachable
from proxy.forward.answers import DISCONNECTED, Turn
from proxy.forward.reply_assembler import ReplyAssembler
from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.json_text import parse_json
from proxy.upstream.transport import UpstreamResponse

INCOMPLETE = UpstreamUnreachable("The upstream stream ended before it was complete.")
HOLD_MAX_EVENTS = 64
"""Content-free events held at most before relaying them (a role chunk and a few keep-alives)."""
HOLD_MAX_BYTES = 65_536
"""Bytes held at most (a hostile upstream cannot make the proxy buffer without end)."""
HOLD_MAX_S = 3.0
"""Holding ends this long after the first chunk arrived, whether more came or not (a model that
sends its role chunk and then thinks for a minute: the client gets the headers and what was held
then, within a load balancer's usual time-to-first-byte limit). An overflow's error event comes
at once, with or right after the role chunk."""
_EMPTY: tuple[object, ...] = (None, "", [], {})


@dataclass
class StreamState:
    """One upstream stream: what was read of it, and what was learned from its start."""

    resp: UpstreamResponse
    """The upstream response (its reads raise ``UpstreamError`` only)."""
    chunks: AsyncIterator[bytes]
    assembler: ReplyAssembler = field(default_factory=ReplyAssembler)
    """The reply as the client sees it (shared by the streams of one request's rounds)."""
    prebuffer: list[bytes] = field(default_factory=list)
    """Bytes read while holding, relayed first."""
    first: list[SSEEvent] = field(default_factory=list)
    """Events read while holding (the relay adds them to ``assembler`` as it sends them)."""
    parsed: list[Any] = field(default_factory=list)
    """What ``parse_json`` read of the data of ``first``'s events that holding classified (a prefix
    of them: ``None`` for one not JSON, or a named error); the assembler takes them instead of
    parsing the data again (``ReplyAssembler.add_read``)."""
    rest: bytes = b""
    """The end of the last chunk held, after the event that ended holding: relayed with it, split
    by the relay once it is out (the first byte waits for no more splitting than holding needs)."""
    splitter: SSESplitter = field(default_factory=SSESplitter)
    overflow: Overflow | None = None
    """An error event before anything was carried that reads as an overflow (held, not relayed)."""
    own_calls: list[dict[str, Any]] = field(default_factory=list)
    """The proxy's own calls this stream ended with, to serve (``ToolRounds.relay_round``)."""


def error_event(exc: ProxyError) -> bytes:
    """An SSE event carrying OpenAI's error envelope (the SDKs raise on it)."""
    return b"data: " + exc.body() + b"\n\n"


async def start_stream(resp: UpstreamResponse, *, hold: bool, assembler: ReplyAssembler | None = None,
                       sent: dict[str, Any] | None = None) -> StreamState:
    """Read the start of a stream: its first complete event, or with ``hold`` every event up to the
    first that carries something (module docstring). An error event read there that is an overflow
    sets ``overflow`` (``sent``: the forwarded body, for ``proxy.compaction.overflow``). Raises our 502/504
    errors if the upstream fails before its first event (the response is then closed); a failure
    after it is the relay's to report, after what was held (as when nothing was held)."""
    chunks = aiter(resp.aiter_raw())
    state = StreamState(resp, chunks, assembler or ReplyAssembler())
    held_bytes = 0
    deadline: float | None = None  # from the first chunk on: a slow first byte is the upstream's own
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            try:
                if deadline is None:
                    chunk = await anext(chunks)
                else:  # a read that may outlast the hold: waited for, not cancelled, on timeout
                    pending = await _read_until(chunks, deadline)
                    if not pending.done():  # held long enough: relay it, and read on from here
                        state.chunks, pending = _resumed(pending, chunks), None
                        return state
                    chunk, pending = pending.result(), None
            except StopAsyncIteration:
                break
            if deadline is None:
                deadline = time.monotonic() + HOLD_MAX_S
            state.prebuffer.append(chunk)
            held_bytes += len(chunk)
            if _held(state, chunk, hold, sent) or held_bytes > HOLD_MAX_BYTES:
                return state
        _hold_ends(state, state.splitter.flush(), hold, sent)  # ended while held (no final blank line)
        state.chunks = _ended()
    except UpstreamError as exc:
        if state.first:
            state.chunks = _failing(exc)
            return state
        await resp.aclose()
        raise
    except BaseException:
        if pending is not None:
            pending.cancel()
        await resp.aclose()
        raise
    return state


async def _read_until(chunks: AsyncIterator[bytes], deadline: float) -> asyncio.Task[bytes]:
    """The next read of ``chunks``, as a task, once it is done or ``deadline`` (``time.monotonic()``
    seconds) has passed, whichever comes first: on time, the task is not cancelled (check
    ``done()``). What ``asyncio.wait({task}, timeout=...)`` gives, without its sets and callbacks,
    and one loop step sooner: the read wakes this coroutine itself as it ends, where ``wait``
    hears of it from the task's done callback, one step later (a stream whose first content
    event came in a read of its own waited a loop step more for its first byte)."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()
    pending = loop.create_task(_next_waking(chunks, woken))
    pending.add_done_callback(_retrieved)
    timer = loop.call_later(max(0.0, deadline - time.monotonic()), _wake, woken)
    try:
        await woken
    except BaseException:
        pending.cancel()
        raise
    finally:
        timer.cancel()
    return pending


async def _next_waking(chunks: AsyncIterator[bytes], woken: asyncio.Future[None]) -> bytes:
    """``anext(chunks)``, waking ``woken`` as it ends, however it ends."""
    try:
        return await anext(chunks)
    finally:
        _wake(woken)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


def _retrieved(future: asyncio.Future[bytes]) -> None:
    """Mark a read's outcome seen (a read abandoned with its stream must not be reported as lost)."""
    if not future.cancelled():
        future.exception()


async def _resumed(pending: asyncio.Future[bytes], chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The rest of a stream whose holding timed out: the read under way, then the others."""
    try:
        first = await pending
    except StopAsyncIteration:
        return
    finally:
        if not pending.done():
            pending.cancel()
    yield first
    async for chunk in chunks:
        yield chunk


async def _ended() -> AsyncIterator[bytes]:
    """The rest of a stream that ended while held: nothing."""
    return
    yield b""  # an async generator (never reached)


async def _failing(exc: BaseException) -> AsyncIterator[bytes]:
    """The rest of a stream that failed while held: the failure, raised where the relay reads."""
    raise exc
    yield b""  # an async generator (never reached)


def _held(state: StreamState, chunk: bytes, hold: bool, sent: dict[str, Any] | None) -> bool:
    """Split ``chunk`` (held) as far as holding needs: an event at a time, cut at each blank line
    (the splitter gives the same events however a stream is cut); once holding ends the chunk's
    rest is left in ``state.rest``. True when the start has been read (holding ends)."""
    feed = state.splitter.feed
    pos = 0
    while (end := chunk.find(b"\n\n", pos)) >= 0:
        end += 2
        if _hold_ends(state, feed(chunk[pos:end]), hold, sent):
            state.rest = chunk[end:]
            return True
        pos = end
    if pos:
        if pos == len(chunk):
            return False
        chunk = chunk[pos:]
    return _hold_ends(state, feed(chunk), hold, sent)


def _hold_ends(state: StreamState, events: list[SSEEvent], hold: bool, sent: dict[str, Any] | None) -> bool:
    """Keep ``events`` in ``state.first``; True when the start has been read (holding ends)."""
    ends = False
    for event in events:
        state.first.append(event)
        if ends:
            continue
        carried = _carried(event, state.parsed)
        if carried == "error":
            state.overflow = _overflow(event, sent)
            ends = True
        elif carried == "something" or not hold or len(state.first) >= HOLD_MAX_EVENTS:
            ends = True
    return ends


def _carried(event: SSEEvent, parsed: list[Any]) -> Literal["error", "nothing", "something"]:
    """What an event carries: an error, nothing (a role-only delta; empty ``choices`` and no usage;
    an object without ``choices``), or something (anything else, ``[DONE]`` and non-JSON too).
    What its data reads as is appended to ``parsed`` (``None``: not JSON, or a named error event,
    whose data is not read here)."""
    if event.event == "error":
        parsed.append(None)
        return "error"
    try:
        chunk = parse_json(event.data)  # a lone surrogate escape is read (``proxy.json_text``)
    except orjson.JSONDecodeError:
        parsed.append(None)
        return "something"
    parsed.append(chunk)
    if not isinstance(chunk, dict):
        return "something"
    if "error" in chunk or chunk.get("type") == "error":
        return "error"
    if chunk.get("usage"):
        return "something"
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        return "something"
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("finish_reason") or choice.get("logprobs"):
            return "something"
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            return "something"
        for key, value in delta.items():
            if key != "role" and value not in _EMPTY:
                return "something"
    return "nothing"


def _overflow(event: SSEEvent, sent: dict[str, Any] | None) -> Overflow | None:
    """An error event read as an error body: a named ``error`` event's data is the error itself
    (``event: error``; llama.cpp's older ``error:`` field), else ``{"error": ...}``."""
    if event.event == "error":
        return classify_error(400, event.data, sent=sent)
    return classify_stream_event(event.data, sent=sent)


def _add_held(state: StreamState) -> None:
    """Add what holding read to the assembler: ``state.first`` (what it parsed not parsed again),
    then the events of ``state.rest`` (split now; ``rest`` emptied)."""
    state.assembler.add_read(state.first, state.parsed)
    if state.rest:
        rest, state.rest = state.rest, b""
        state.assembler.add_data(state.splitter, rest)


Segment = bytes | StreamState | AsyncGenerator[bytes, None]
"""What the round loop yields for a stream's client: bytes (a keep-alive comment, an error event),
an upstream stream to relay as it came (``StreamState``), or another relay of one upstream stream
(``ToolRounds.relay_round``); a stream is read to its end before the loop goes on."""


async def relay_turn(turn: Turn, first: Segment, steps: AsyncIterator[Segment], *,
                     started: Callable[[], None], ended: Callable[[], Awaitable[None]]) -> AsyncGenerator[bytes, None]:
    """Relay a stream to its end: ``first``, then the rest of the round loop's segments. A failure
    is reported in an error event; a stream that ends without ``[DONE]`` gets one too, unless the
    upstream sent an error event itself; ``turn.error`` says how it ended (``None``: complete).
    ``started()`` runs once the first bytes are out, ``ended()`` in the ``finally`` (disconnects and
    errors too). Segments are relayed here, not re-yielded by the loop, and a stream relayed as it
    came (a ``StreamState``) by this generator itself: each layer of generators costs every chunk of
    every stream a step.

    Such a stream: the upstream's bytes, unchanged, chunk by chunk; the reply reassembled on the
    side, each chunk split and its events assembled once the chunk is out (``ReplyAssembler.add_data``:
    its bytes wait for no parsing, and a stream's first byte goes before the events read with it
    are assembled). A relay closed at a chunk (the client
    left) still assembles that chunk's events, before ``ended()``: it was handed to the client."""
    try:
        segment: Segment | None = first
        notify: Callable[[], None] | None = started
        try:
            while segment is not None:
                if isinstance(segment, bytes):
                    yield segment
                elif isinstance(segment, StreamState):
                    state, held, out = segment, True, b""  # (``out``: the chunk out, not assembled yet)
                    read, splitter = state.assembler.add_data, state.splitter
                    try:
                        for data in state.prebuffer:
                            yield data
                            if notify is not None:
                                notify()
                                notify = None
                        held = False
                        _add_held(state)
                        async for data in state.chunks:
                            out = data
                            yield data
                            if notify is not None:
                                notify()
                                notify = None
                            out = b""
                            read(splitter, data)
                    finally:
                        if held:  # (closed at what holding read)
                            _add_held(state)
                        if out:
                            read(splitter, out)
                    state.assembler.add_events(splitter.flush())
                else:
                    try:  # (``contextlib.aclosing``'s work, without its object and coroutines)
                        async for data in segment:
                            yield data
                            if notify is not None:
                                notify()
                                notify = None
                    finally:
                        await segment.aclose()
                segment = await anext(steps, None)
        except ProxyError as exc:
            turn.error = exc.message
            yield error_event(exc)
            return
        except Exception as exc:  # noqa: BLE001  (a storage or transport failure inside a round: end the stream cleanly)
            err = in_band(exc)
            turn.error = err.message
            yield error_event(err)
            return
        if turn.assembler.upstream_error:
            turn.error = "the upstream sent an error event" if turn.error == DISCONNECTED else turn.error
        elif turn.assembler.done and not turn.assembler.hidden_error:
            turn.error = None
        else:
            turn.error = "upstream stream ended without [DONE]"
            yield error_event(INCOMPLETE)
    finally:
        await ended()


def provider_error_event(body: bytes) -> bytes:
    """A provider's error response, for a stream under way: its JSON body as it came, in one event
    (a ``data:`` line per line); our 502 envelope when the body is not a JSON object."""
    try:
        parsed = parse_json(body)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        text = body[:200].decode("utf-8", "replace")
        return error_event(UpstreamUnreachable(f"The upstream failed during the stream: {text}"))
    return b"".join(b"data: " + line + b"\n" for line in body.splitlines() if line.strip()) + b"\n"


def in_band(exc: BaseException) -> ProxyError:
    """Our error for a failure after a stream started (reported in an error event): ours as it is,
    any other (a storage failure in a round, say) a 502 naming only its type."""
    if isinstance(exc, ProxyError):
        return exc
    return UpstreamUnreachable(f"context-proxy could not complete the stream ({type(exc).__name__}).")


async def relay_unlogged(resp: UpstreamResponse) -> AsyncIterator[bytes]:
    """Fail-open relay: bytes through, nothing observed (a failure: an error event at the end)."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except UpstreamError as exc:
        yield error_event(exc)
    finally:
        await resp.aclose()
