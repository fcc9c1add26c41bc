"""What the chat pipeline answers (``Buffered``, ``Streamed``) and the state of one request's
upstream exchanges (``Turn``: the round loop's, ``proxy.forward.rounds.RoundLoop.exchanges``; ``Reply``:
the complete upstream answer it ended with)."""

from __future__ import annotations

import types
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.forward.reply_assembler import ReplyAssembler
from proxy.upstream.transport import UpstreamResponse

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
    request and releases the upstream response. ``closed()``, when given, is ``True`` when ``close()``
    has nothing left to do (the relay ended, the request is logged, the upstream response released:
    a stream relayed to its end); the HTTP layer then does not run it (a task of its own, shielded,
    for nothing: about 42,000 instructions a stream, callgrind). It only looks: it changes nothing."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]] | None = None
    closed: Callable[[], bool] | None = None


def generator_over(gen: AsyncGenerator[Any, None]) -> bool:
    """``gen`` (a Python async generator) ran its ``finally``: ended, or closed after it started
    (no frame left). A generator never started keeps its frame until closed (``Streamed.closed``'s)."""
    return isinstance(gen, types.AsyncGeneratorType) and gen.ag_frame is None


@dataclass(slots=True)
class Reply:
    """A complete upstream answer the round loop ended with, for the pipeline to log and return.

    ``status``/``headers``: the upstream's; ``data``: the body bytes as the client gets them (the
    proxy's own tool calls removed); ``message``/``usage``/``finish_reason``: its choice 0 as logged
    (``None`` for an error status or a body that is not a chat completion)."""

    status: int
    headers: Mapping[str, str]
    data: bytes
    message: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class Turn:
    """The upstream exchanges of one chat request: its rounds and overflow retries."""

    max_bytes: int | None = None
    """The assembler's bound (``ReplyAssembler.max_bytes``: ``Settings.stream_log_max_bytes``)."""
    built: ReplyAssembler | None = None
    """The assembler once ``assembler`` built it (``None``: nothing read it yet: a request that is
    not a stream never does, but for an overflow retry's ``reset_round``, which has nothing to reset)."""
    resp: UpstreamResponse | None = None
    """The upstream response being read (closed when the next is sent and when the turn ends)."""
    reply: Reply | None = None
    """A complete answer: not a stream, or answered before a stream's first byte."""
    committed: bool = False
    """A stream's client has been sent bytes: whatever follows goes in-band."""
    status: int = 200
    """The status the stream's client got."""
    error: str | None = DISCONNECTED
    """How the stream ended (``None``: complete), for the log."""

    @property
    def assembler(self) -> ReplyAssembler:
        """The reply as a stream's client saw it, across rounds and retries (built when first read)."""
        built = self.built
        if built is None:
            built = self.built = ReplyAssembler(self.max_bytes)
        return built

    def reset_round(self) -> None:
        """``ReplyAssembler.reset_round`` of the assembler, when one was built (a new one has
        nothing to forget)."""
        if self.built is not None:
            self.built.reset_round()
