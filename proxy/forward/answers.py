"""What the chat pipeline answers (``Buffered``, ``Streamed``) and the state of one request's
upstream exchanges (``Turn``: the round loop's, ``proxy.forward.pipeline.ChatPipeline._exchanges``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.forward.sse import ReplyAssembler

DISCONNECTED = "client disconnected"
"""``Turn.error`` until the stream ends otherwise: a relay closed by a disconnect is partial."""


@dataclass(slots=True)
class Buffered:
    """A complete response: status, headers and body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Streamed:
    """A streaming response: status, headers and the byte iterator to relay.

    The HTTP layer awaits ``close()`` once the response is over, however it ended: a client gone
    before the relay's first step leaves ``chunks`` never started, and only ``close`` then logs the
    request and releases the upstream response."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]] | None = None


@dataclass(slots=True)
class Turn:
    """The upstream exchanges of one chat request: its rounds and overflow retries."""

    assembler: ReplyAssembler = field(default_factory=ReplyAssembler)
    """The reply as a stream's client saw it, across rounds and retries."""
    resp: Any = None
    """The upstream response being read (closed when the next is sent and when the turn ends)."""
    answer: Buffered | None = None
    """A complete answer: not a stream, or answered before a stream's first byte."""
    committed: bool = False
    """A stream's client has been sent bytes: whatever follows goes in-band."""
    status: int = 200
    """The status the stream's client got."""
    error: str | None = DISCONNECTED
    """How the stream ended (``None``: complete), for the log."""
