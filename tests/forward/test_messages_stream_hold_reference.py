"""``StreamStart.read`` splits a held chunk only up to the event that ends holding, and the relay
reads the rest (``proxy.forward.messages_start``, ``proxy.forward.messages_stream``): on random
Anthropic streams cut at random places, the same held chunks and overflow as splitting every
held chunk whole (``_old_start``, the way it was done before), the same relayed bytes in the
same chunks, and the same logged reply as splitting the whole stream and reading each event
(``_reference``); ``_round_events`` (the relay with the proxy's tools) gives the same events in
the same order. Only the error that ends holding is classified, wherever the pieces are cut.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.compaction.overflow import Overflow, classify_stream_event
from proxy.conversation.messages_codec import hash_view
from proxy.errors import ProxyError, UpstreamUnreachable
from proxy.forward import messages_start, messages_stream
from proxy.forward.messages_sse import MessagesAssembler
from proxy.forward.messages_start import StreamStart
from proxy.forward.messages_stream import MessagesStream, stream_error_event
from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.settings import Settings
from tests.fakes.anthropic.wire import message_object, sse_event, stream_events
from tests.test_streaming import Parts
from tests.test_text_template import Counted

_USAGE = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 30}
_WORDS = [f"w{i}{'é' if i % 7 == 0 else ''}{chr(10) if i % 11 == 0 else ''}" for i in range(60)]
_BLOCKS: list[list[dict[str, Any]]] = [
    [{"type": "text", "text": " ".join(_WORDS)}],
    [{"type": "thinking", "thinking": " ".join(_WORDS[:30]), "signature": "EqQBCkYIARgCKkB" * 4},
     {"type": "text", "text": " ".join(_WORDS[30:])}],
    [{"type": "text", "text": "Let me check."},
     {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris", "days": [1, 2, 3]}}],
    [{"type": "text", "text": "x" * 900}],  # (one delta over the bound when the splitter's is lowered)
]
_SENT = {"model": "m", "messages": [{"role": "user", "content": "quote: prompt is too long: 5 tokens > 9 maximum"}]}


def _error(kind: str, message: str) -> bytes:
    return sse_event("error", {"type": "error", "error": {"type": kind, "message": message}})


_OVERFLOW = _error("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")
_ECHO = _error("invalid_request_error", "quote: prompt is too long: 5 tokens > 9 maximum")  # (the client's words)
_OVERLOADED = _error("overloaded_error", "Overloaded")
_PING = sse_event("ping", {"type": "ping"})


def _stream(rng: random.Random) -> bytes:
    """A stream: one of ``_BLOCKS`` as Anthropic sends it, maybe with pings among its events, an
    error first (after message_start and a ping, or before anything) or in the middle, its end cut."""
    message = message_object("msg_01", "m", rng.choice(_BLOCKS), "end_turn", None, _USAGE)
    events = [sse_event(name, data) for name, data in stream_events(message)]
    for _ in range(rng.choice([0, 0, 1, 3])):
        events.insert(rng.randint(1, len(events)), _PING)
    error = rng.choice([None] * 6 + [_OVERFLOW, _ECHO, _OVERLOADED])
    if error is not None:
        events.insert(rng.choice([0, 1, 2, rng.randint(3, len(events))]), error)
    if rng.random() < 0.2:
        events = events[:rng.randint(1, len(events))]
    way = rng.random()
    if way < 0.1:  # every line end a CRLF, or a CR
        events = [e.replace(b"\n", rng.choice([b"\r\n", b"\r"])) for e in events]
    elif way < 0.2:  # each event's own (a raw LF LF may then end an event after a CR)
        events = [e.replace(b"\n", rng.choice([b"\n", b"\r\n", b"\r"])) for e in events]
    elif way < 0.3:  # blank lines between events
        events = [e + rng.choice([b"", b"\n", b"\n\n"]) for e in events]
    stream = b"".join(events)
    if rng.random() < 0.2:
        stream = stream[:rng.randint(1, len(stream))]  # (ends inside an event, or without its blank line)
    return stream


def _cut(rng: random.Random, stream: bytes) -> list[bytes]:
    """``stream`` in one chunk, an event a chunk, or cut at 1 to 12 random places (or after CRs)."""
    way = rng.random()
    if way < 0.3:
        return [stream]
    if way < 0.45 and b"\r" not in stream:
        return [part + b"\n\n" for part in stream.split(b"\n\n")[:-1]] + ([end] if (end := stream.rsplit(b"\n\n", 1)[-1]) else [])
    if way < 0.55 and b"\r" in stream:  # after CRs (a CR at a chunk's end, its LF maybe the next chunk's first byte)
        crs = [i + 1 for i in range(len(stream) - 1) if stream[i] == 13]
        cuts = sorted(rng.sample(crs, min(len(crs), rng.randint(1, 12))))
    else:
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(1, 12))))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


def _old_start(parts: list[bytes | BaseException]) -> tuple[int, Overflow | None, bool, bool]:
    """How many chunks the start held, its overflow, whether the stream ended or failed within:
    the rule before, each held chunk split whole before its events are looked at."""
    splitter, size, held = SSESplitter(), 0, 0
    for part in [*parts, None]:
        if size > messages_start.HOLD_MAX_BYTES:
            return held, None, False, False
        if part is None:
            return held, None, True, False
        if isinstance(part, BaseException):
            return held, None, False, True
        held, size = held + 1, size + len(part)
        decided, overflow = False, None
        for event in splitter.feed(part):
            if event.event == "error" and not decided:
                overflow = classify_stream_event(event.data, sent=_SENT)
            decided = decided or event.event not in ("message_start", "ping")
        if decided:
            return held, overflow, False, False
    raise AssertionError("not reached")


def _reference(parts: list[bytes], max_bytes: int, flush: bool) -> tuple[MessagesAssembler, SSESplitter, list[SSEEvent]]:
    """``parts`` split with one splitter, each event read by ``add`` (no template)."""
    assembler, splitter = MessagesAssembler(max_bytes), SSESplitter()
    assembler.template.learns = 0
    events = [event for part in parts for event in splitter.feed(part)] + (splitter.flush() if flush else [])
    for event in events:
        assembler.add(event)
    return assembler, splitter, events


def _outcome(a: MessagesAssembler) -> tuple[Any, ...]:
    return (a.message(), a.seen_bytes, a.truncated, a.usage, a.stop_reason, a.done, a.upstream_error, a.empty)


class _Context:
    """What the plain relay reads of a ``ChatContext``."""

    prepared = None
    finished = False

    def append_early(self, spawn: Any) -> None:
        pass


class _Writer:
    """A ``LogWriter`` that keeps what each ``finish`` was given and marks the request finished."""

    spawn = None

    def __init__(self) -> None:
        self.finished: list[dict[str, Any]] = []

    def finish(self, ctx: Any, status: int, reply: Any, usage: Any, **kwargs: Any) -> None:
        ctx.finished = True
        self.finished.append({"reply": reply, "usage": usage, **kwargs})


async def test_the_start_the_relay_and_the_log_are_those_of_splitting_each_chunk_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3141)
    failure = UpstreamUnreachable("cut")
    templated = 0
    for _ in range(500):
        monkeypatch.setattr(messages_start, "HOLD_MAX_BYTES", rng.choice([1 << 20] * 6 + [200, 700]))
        monkeypatch.setattr(SSESplitter, "MAX_EVENT_BYTES", rng.choice([8 << 20] * 6 + [600]))
        max_bytes = rng.choice([1 << 20] * 6 + [400, 3_000])
        stream = _stream(rng)
        ok = _cut(rng, stream)
        parts: list[bytes | BaseException] = [*ok]
        if rng.random() < 0.2:  # the upstream fails after some of it
            ok = ok[:rng.randint(0, len(ok))]
            parts = [*ok, failure]
        held, overflow, ended, failed = _old_start(parts)  # (``failed``: within the start)
        failing = failure in parts
        context = (stream, parts)

        start = await StreamStart.read(Parts(*parts), max_bytes, _SENT)  # type: ignore[arg-type]
        assert (start.held, start.overflow, start.ended, start.failed is not None) == (ok[:held], overflow, ended, failed), context
        start.assembler.template = counted = Counted()
        writer = _Writer()
        streamed = MessagesStream(Settings(), None, writer, None, None).relay(  # type: ignore[arg-type]
            _Context(), Parts(), {}, start, "/v1/messages")  # type: ignore[arg-type]
        whole = rng.random() < 0.7
        if whole:
            got = [part async for part in streamed.chunks]
            out = ok
        else:  # the client leaves after ``k`` chunks (0: before the first byte)
            k = rng.randint(0, len(ok))
            got = [await anext(streamed.chunks) for _ in range(k)]
            out = ok[:max(k, held)]  # (gone within the held start: all of it is read, as before)
        assert streamed.close is not None and streamed.closed is not None
        # relayed to its end, it was logged and released by the relay: ``send_stream`` skips ``close``
        assert streamed.closed() is whole, context
        if not streamed.closed():
            await streamed.close()
        assert streamed.closed(), context
        client = start.assembler
        ref, splitter, _ = _reference(out, max_bytes, flush=whole and not failing)
        if not whole:
            assert got == ok[:k], context
        elif failing:
            assert got == [*ok, stream_error_event(failure)], context
        elif ref.upstream_error or ref.done:
            assert got == ok, context
        else:
            assert got == [*ok, stream_error_event(UpstreamUnreachable("The upstream's stream ended before message_stop."))]
        assert (_outcome(client), start.splitter.dropped) == (_outcome(ref), splitter.dropped), context
        [logged] = writer.finished  # (once)
        assert (logged["reply"], logged["usage"], logged["finish_reason"]) == (
            hash_view(ref.message()) if not ref.empty else None, ref.usage, ref.stop_reason), context
        complete = not (whole and failing) and ref.done and not ref.upstream_error and not ref.truncated \
            and not splitter.dropped
        assert (logged["error"] is None) == complete, (context, logged["error"])
        templated += counted.read

        rounds = await StreamStart.read(Parts(*parts), max_bytes, _SENT)  # type: ignore[arg-type]
        events: list[SSEEvent] = []
        raised = False
        try:
            async for event in messages_stream._round_events(rounds):
                events.append(event)
        except ProxyError:
            raised = True
        assert raised == failing, context
        ref, _, ref_events = _reference(ok, max_bytes, flush=not failing)
        assert [(e.event, e.data, e.raw) for e in events] == [(e.event, e.data, e.raw) for e in ref_events], context
        assert _outcome(rounds.assembler) == _outcome(ref), context
    assert templated > 300  # (the fast path was compared: deltas read by the template)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
async def test_only_an_error_that_ends_holding_is_classified(line_end: bytes) -> None:
    """An overflow after the first content block (in the same piece when the line ends are CRs:
    no LF LF to cut at) is the stream's, not the start's; of two errors first, the first is."""
    message = message_object("msg_01", "m", _BLOCKS[0], "end_turn", None, _USAGE)
    events = [sse_event(name, data) for name, data in stream_events(message)]
    cases = [(events[:4] + [_OVERFLOW] + events[4:], False),
             (events[:2] + [_OVERFLOW, _ECHO] + events[2:], True),
             (events[:1] + [_ECHO, _OVERFLOW] + events[1:], False)]
    for stream, overflows in cases:
        whole = b"".join(stream).replace(b"\n", line_end)
        for parts in ([whole], [whole[:200], whole[200:]]):
            start = await StreamStart.read(Parts(*parts), 1 << 20, _SENT)  # type: ignore[arg-type]
            assert (start.overflow is not None) == overflows and _old_start([*parts])[1] == start.overflow


@pytest.mark.parametrize("hold_max_bytes", [1 << 20, 100])
async def test_a_held_chunk_that_ends_in_a_cr_keeps_the_next_chunk_s_lf_for_it(
        monkeypatch: pytest.MonkeyPatch, hold_max_bytes: int) -> None:
    """CRLF line ends, the last held chunk cut between a CR and its LF, nothing held after holding
    ended (content_block_start, or ``HOLD_MAX_BYTES``) but the start of the next event: the
    round's events are those of splitting the stream whole. (``_round_events`` splits the empty
    ``tail``; when that dropped the splitter's CR, the LF that opens the next chunk ended the
    event's name line twice: a ``content_block_delta`` without data, then its data as an unnamed
    event, both relayed so.)"""
    monkeypatch.setattr(messages_start, "HOLD_MAX_BYTES", hold_max_bytes)
    message = message_object("msg_01", "m", _BLOCKS[0], "end_turn", None, _USAGE)
    stream = b"".join(sse_event(name, data) for name, data in stream_events(message)).replace(b"\n", b"\r\n")
    at = stream.index(b"event: content_block_delta") + len(b"event: content_block_delta\r")
    parts = [stream[:at], stream[at:]]
    state = await StreamStart.read(Parts(*parts), 1 << 20, _SENT)  # type: ignore[arg-type]
    assert state.held == parts[:1] and not state.splitter.idle
    events = [event async for event in messages_stream._round_events(state)]
    _, _, ref_events = _reference(parts, 1 << 20, flush=True)
    assert [(e.event, e.data, e.raw) for e in events] == [(e.event, e.data, e.raw) for e in ref_events]
