"""A streamed Messages response's start, held until its first content block (``StreamStart``), so
that an overflow ``error`` event before it can be retried unseen; relayed and logged by
``proxy.forward.messages_stream``."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.compaction.overflow import Overflow, classify_stream_event
from proxy.errors import ProxyError
from proxy.forward.messages_sse import MessagesAssembler
from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.upstream.client import HeldResponse

HOLD_MAX_BYTES = 1 << 20
"""A stream's start is held (for an overflow ``error`` event to be retried unseen) until its first
content block, an error, its end, or this many bytes."""
_BEFORE_CONTENT = frozenset({"message_start", "ping"})
"""Events that come before a stream's content: held while they come."""


@dataclass(slots=True)
class StreamStart:
    """A stream's start, read and held until its first content block (``read``): ``held`` the
    bytes as they came, ``rest`` the stream after them, ``splitter``/``assembler`` what read them;
    ``overflow`` when it began with the provider's overflow ``error`` event; ``ended``: the stream
    ended within; ``failed``: the upstream failed within (raised where the relay reaches it)."""

    held: list[bytes]
    rest: AsyncIterator[bytes]
    splitter: SSESplitter
    assembler: MessagesAssembler
    events: list[SSEEvent] = dataclasses.field(default_factory=list)
    """The events of ``held`` to the end of the piece (``_split``) with the one that ended holding,
    not read by ``assembler`` yet: the relay reads them once they are out (``add_held``, ``_round_events``)."""
    tail: bytes = b""
    """The last held chunk's bytes after that piece, not split (most often the first block's
    deltas: ``MessagesAssembler.add_data`` reads a run of text deltas by its template, unsplit)."""
    overflow: Overflow | None = None
    ended: bool = False
    failed: ProxyError | None = None

    @classmethod
    async def read(cls, resp: HeldResponse, max_bytes: int, sent: Mapping[str, Any]) -> StreamStart:
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
                if start._split(chunk, sent):
                    return start
        except ProxyError as exc:
            start.failed = exc
        return start

    def _split(self, chunk: bytes, sent: Mapping[str, Any]) -> bool:
        """Split ``chunk`` (held) into ``events`` a piece at a time, each cut after a ``\\n\\n`` (an
        event's end whatever line ends come before: the splitter's events are the same however a
        stream is cut there), up to the piece with the event that ends holding (not
        ``message_start``/``ping``; an overflow ``error`` sets ``overflow``): True, ``tail`` the rest."""
        feed, pos, decided = self.splitter.feed, 0, False
        while pos < len(chunk) and not decided:
            end = chunk.find(b"\n\n", pos) + 2
            end = end if end > 1 else len(chunk)
            for event in feed(chunk[pos:end]):
                self.events.append(event)
                if not decided and event.event not in _BEFORE_CONTENT:
                    decided = True
                    if event.event == "error":
                        self.overflow = classify_stream_event(event.data, sent=sent)
            pos = end
        self.tail = chunk[pos:]
        return decided

    def add_held(self, assembler: MessagesAssembler) -> None:
        """Read what holding kept into ``assembler`` (``events``, then ``tail`` by ``add_data``), once."""
        events, tail, self.events, self.tail = self.events, self.tail, [], b""
        assembler.add_events(events)
        if tail:
            assembler.add_data(self.splitter, tail)
