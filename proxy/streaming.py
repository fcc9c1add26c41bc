"""Relaying a streamed chat reply: hold the first event (an overflow there is retried, not relayed),
then pass the upstream's bytes through as they arrive while the reply is reassembled for the log.

A stream that breaks (connection cut, read timeout) or ends without ``[DONE]`` gets an error event
in OpenAI's envelope at its end, so no client mistakes it for a complete reply. ``state.error`` says
how it ended (``None``: complete; set before the first byte to "client disconnected", so a
generator closed by a disconnect is recorded as partial).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.overflow import Overflow, classify_stream_event
from proxy.sse import ReplyAssembler, SSEEvent, SSESplitter
from proxy.upstream import TRANSPORT_ERRORS, translate

INCOMPLETE = UpstreamUnreachable("The upstream stream ended before it was complete.")


@dataclass
class StreamState:
    """One upstream stream being relayed, and what was learned from it."""

    resp: Any
    """The upstream response (``proxy.upstream.AiohttpResponse`` or ``httpx.Response``)."""
    chunks: AsyncIterator[bytes]
    prebuffer: list[bytes] = field(default_factory=list)
    first: list[SSEEvent] = field(default_factory=list)
    splitter: SSESplitter = field(default_factory=SSESplitter)
    assembler: ReplyAssembler = field(default_factory=ReplyAssembler)
    error: str | None = "client disconnected"


def error_event(exc: ProxyError) -> bytes:
    """An SSE event carrying OpenAI's error envelope (the SDKs raise on it)."""
    return b"data: " + exc.body() + b"\n\n"


async def start_stream(resp: Any) -> StreamState | Overflow:
    """Read until the first complete event; an overflow error there is returned, not relayed.

    Cases 014 (llama.cpp's error event inside a 200 stream) and SSE ``error`` events before any
    content. Raises our 502/504 errors if the upstream fails before the first event.
    """
    state = StreamState(resp, resp.aiter_raw())
    try:
        async for chunk in state.chunks:
            state.prebuffer.append(chunk)
            events = state.splitter.feed(chunk)
            if events:
                overflow = classify_stream_event(events[0].data)
                if overflow is not None:
                    await resp.aclose()
                    return overflow
                state.first = events
                break
    except BaseException as exc:
        await resp.aclose()
        raise translate(exc) from exc
    return state


async def relay_plain(state: StreamState) -> AsyncIterator[bytes]:
    """The upstream's bytes, unchanged, chunk by chunk; the reply reassembled on the side."""
    for event in state.first:
        state.assembler.add(event)
    for chunk in state.prebuffer:
        yield chunk
    try:
        async for chunk in state.chunks:
            for event in state.splitter.feed(chunk):
                state.assembler.add(event)
            yield chunk
        for event in state.splitter.flush():
            state.assembler.add(event)
        state.error = None if state.assembler.done else "upstream stream ended without [DONE]"
    except TRANSPORT_ERRORS as exc:
        translated = translate(exc)
        state.error = str(translated)
        if isinstance(translated, (UpstreamUnreachable, UpstreamTimeout)):
            yield error_event(translated)
            return
    if state.error is not None:
        yield error_event(INCOMPLETE)


async def relay_rounds(state: StreamState, rounds: Any, ctx: Any) -> AsyncIterator[bytes]:
    """Like ``relay_plain`` for a request that offered the proxy's tools (``ToolRounds.relay``)."""
    try:
        async for data in rounds.relay(ctx, state):
            yield data
        state.error = None if state.assembler.done else "upstream stream ended without [DONE]"
    except ProxyError as exc:
        state.error = exc.message
        yield error_event(exc)
        return
    except Exception as exc:  # a storage or transport failure inside a tool round: end the stream cleanly
        translated = translate(exc)
        err = translated if isinstance(translated, ProxyError) else UpstreamUnreachable(
            f"context-proxy could not complete its tool round ({type(exc).__name__})."
        )
        state.error = err.message
        yield error_event(err)
        return
    if state.error is not None:
        yield error_event(INCOMPLETE)


async def relay_unlogged(resp: Any) -> AsyncIterator[bytes]:
    """Fail-open relay: bytes through, nothing observed."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except TRANSPORT_ERRORS as exc:
        translated = translate(exc)
        yield error_event(translated if isinstance(translated, ProxyError) else INCOMPLETE)
    finally:
        await resp.aclose()
