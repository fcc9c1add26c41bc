"""proxy/forward/streaming.py: what a stream's start holds (``start_stream``) and what the relay sends.

The upstream is a tiny fake response (``Parts``): the body parts as they would arrive, so each
chunking (an event split between a CR and its LF, an unterminated last event) is exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest

from proxy.errors import UpstreamUnreachable
from proxy.forward import streaming
from proxy.forward.answers import Turn
from proxy.forward.streaming import relay_turn, start_stream

LLAMACPP_ERROR = {"code": 500, "type": "exceed_context_size_error", "n_prompt_tokens": 2649, "n_ctx": 2048,
                  "message": "the request exceeds the available context size. try increasing the context size or enable context shift"}
OPENAI_ERROR = {"message": "This model's maximum context length is 2048 tokens. However, your messages resulted in 2649 tokens.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}


class Parts:
    """An upstream response whose body arrives as ``parts`` (an exception part is raised there)."""

    status_code = 200

    def __init__(self, *parts: bytes | BaseException | float) -> None:
        self.parts = parts
        self.closed = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            if isinstance(part, BaseException):
                raise part
            if isinstance(part, float):  # the upstream is quiet this many seconds
                await asyncio.sleep(part)
                continue
            yield part

    async def aclose(self) -> None:
        self.closed = True


def data(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    return data({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra})


ROLE = chunk({"role": "assistant", "content": "", "refusal": None})
CONTENT = chunk({"content": "Hello"})
DONE = b"data: [DONE]\n\n"


def relay(state: streaming.StreamState, *, started: Callable[[], None] = lambda: None,
          ended: Callable[[], Awaitable[None]] | None = None) -> AsyncGenerator[bytes, None]:
    """``relay_turn`` of the one stream ``state`` (a round loop's ``StreamState`` segment, relayed
    as it came), the turn's assembler ``state``'s."""
    turn = Turn()
    turn.built = state.assembler

    async def no_more() -> AsyncIterator[streaming.Segment]:
        return
        yield b""  # an async generator (never reached)

    async def nothing() -> None:
        pass

    return relay_turn(turn, state, no_more(), started=started, ended=ended or nothing)


async def relayed(state: streaming.StreamState) -> bytes:
    return b"".join([part async for part in relay(state)])


# --- what carries nothing is held; an overflow among it is reported --------------------------


async def test_a_role_only_chunk_is_held_until_content() -> None:
    resp = Parts(ROLE, CONTENT, DONE)
    state = await start_stream(resp, hold=True)
    assert state.overflow is None and [e.data for e in state.first] == [ROLE[6:-2], CONTENT[6:-2]]
    assert await relayed(state) == ROLE + CONTENT + DONE  # the upstream's bytes, unchanged
    assert state.assembler.message()["content"] == "Hello" and state.assembler.done


@pytest.mark.parametrize("parts", [
    (ROLE, data({"error": OPENAI_ERROR})),  # OpenAI-style, after the role chunk (issue 15)
    (data({"error": LLAMACPP_ERROR}), DONE),  # llama.cpp 2025, case 014
    (b": keep-alive\n\n", ROLE, b"event: error\n" + data({"error": OPENAI_ERROR})),
    (ROLE, b"event: error\n" + data(OPENAI_ERROR)),  # a named error event: its data is the error itself
    (b"error: " + orjson.dumps(LLAMACPP_ERROR) + b"\n\n", DONE),  # llama.cpp's older ``error:`` field
    (ROLE, b"data: " + orjson.dumps({"error": LLAMACPP_ERROR}) + b"\n"),  # ends without its blank line
    (ROLE.replace(b"\n", b"\r\n"), (b"data: " + orjson.dumps({"error": LLAMACPP_ERROR}) + b"\r\n\r"), b"\n", b"data: [DONE]\r\n\r\n"),
    ((ROLE + data({"error": LLAMACPP_ERROR}) + DONE).replace(b"\n", b"\r"),),  # lone CR line ends
    (data({"choices": [], "prompt_filter_results": []}), ROLE, data({"error": OPENAI_ERROR})),  # Azure's first chunk
    (data({"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}}], "usage": None}), data({"error": OPENAI_ERROR})),
], ids=["openai-after-role", "llamacpp-2025", "comment-role-event-error", "bare-named-error", "error-field",
        "unterminated", "crlf-split-between-cr-and-lf", "lone-cr", "azure-filter-chunk", "usage-null"])
async def test_an_overflow_before_anything_carried_is_reported_not_relayed(parts: tuple[bytes, ...]) -> None:
    state = await start_stream(Parts(*parts), hold=True)
    assert state.overflow is not None and state.overflow.limit_tokens == 2048
    assert state.assembler.chunks == 0  # nothing was relayed: the pipeline retries, or relays it as it came


@pytest.mark.parametrize("parts", [
    (ROLE, CONTENT + data({"error": OPENAI_ERROR})),  # content first: the error is the client's to see
    (ROLE, chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}), data({"error": OPENAI_ERROR})),
    (ROLE, chunk({}, "stop"), data({"error": OPENAI_ERROR})),
    (data({"choices": [], "usage": {"prompt_tokens": 3}}), data({"error": OPENAI_ERROR})),
    (ROLE, DONE, data({"error": OPENAI_ERROR})),
    (ROLE, b"data: not json\n\n", data({"error": OPENAI_ERROR})),
])
async def test_holding_ends_at_the_first_event_that_carries_something(parts: tuple[bytes, ...]) -> None:
    resp = Parts(*parts)
    state = await start_stream(resp, hold=True)
    assert state.overflow is None
    assert await relayed(state) == b"".join(parts)
    assert state.assembler.upstream_error


async def test_an_error_that_is_not_an_overflow_ends_holding_and_is_relayed() -> None:
    overloaded = data({"error": {"message": "Overloaded", "type": "overloaded_error"}})
    state = await start_stream(Parts(ROLE, overloaded), hold=True)
    assert state.overflow is None
    assert await relayed(state) == ROLE + overloaded


async def test_without_hold_the_first_event_is_enough() -> None:
    """Compaction off: nothing could be retried, so the stream starts as before (an error first is
    still classified: the compactor may learn from it)."""
    state = await start_stream(Parts(ROLE, data({"error": OPENAI_ERROR})), hold=False)
    assert state.overflow is None and len(state.first) == 1
    first = await start_stream(Parts(data({"error": OPENAI_ERROR}), DONE), hold=False)
    assert first.overflow is not None


# --- bounds: a hostile upstream cannot make the proxy buffer without end -----------------------


async def test_holding_is_bounded_in_events() -> None:
    parts = [ROLE] * (streaming.HOLD_MAX_EVENTS + 10) + [data({"error": OPENAI_ERROR})]
    state = await start_stream(Parts(*parts), hold=True)
    assert state.overflow is None and len(state.first) == streaming.HOLD_MAX_EVENTS


async def test_holding_is_bounded_in_bytes() -> None:
    comment = b": " + b"x" * 4000 + b"\n\n"  # comments are no events: only the byte bound stops them
    parts = [comment] * (streaming.HOLD_MAX_BYTES // len(comment) + 2) + [data({"error": OPENAI_ERROR})]
    state = await start_stream(Parts(*parts), hold=True)
    assert state.overflow is None and sum(map(len, state.prebuffer)) <= streaming.HOLD_MAX_BYTES + len(comment)
    unterminated = b"data: " + b"y" * (streaming.HOLD_MAX_BYTES + 1)  # one event that never ends
    state = await start_stream(Parts(unterminated, b"more"), hold=True)
    assert state.prebuffer == [unterminated]


async def test_holding_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A role chunk, then a quiet upstream (a model thinking): what was held goes out when the hold
    ends, without waiting for the next chunk, and the relay reads on from the read under way."""
    monkeypatch.setattr(streaming, "HOLD_MAX_S", 0.05)
    content = chunk({"content": "late"})
    loop = asyncio.get_running_loop()
    started = loop.time()
    state = await start_stream(Parts(ROLE, 0.5, content, b"data: [DONE]\n\n"), hold=True)
    assert loop.time() - started < 0.4  # did not wait for the quiet upstream
    assert state.overflow is None and state.prebuffer == [ROLE]
    assert await relayed(state) == ROLE + content + b"data: [DONE]\n\n"


async def test_chunks_that_are_there_already_are_held_whatever_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "HOLD_MAX_S", 0.0)
    state = await start_stream(Parts(b": processing\n\n", b": processing\n\n", data({"error": OPENAI_ERROR})), hold=True)
    assert state.overflow is not None  # the bound is on waiting, not on reading what arrived


async def test_a_failure_before_the_first_event_is_our_502_and_closes_the_response() -> None:
    resp = Parts(ROLE[:20], UpstreamUnreachable("cut"))  # (a transport's reads raise ours only)
    with pytest.raises(UpstreamUnreachable):
        await start_stream(resp, hold=True)
    assert resp.closed


async def test_a_failure_after_a_held_event_is_reported_by_the_relay_after_it() -> None:
    """As before holding: once the stream has sent an event, a failure goes in-band."""
    state = await start_stream(Parts(ROLE, UpstreamUnreachable("cut")), hold=True)
    sent = [part async for part in relay(state)]
    assert sent == [ROLE, streaming.error_event(UpstreamUnreachable("cut"))]


async def test_a_chunk_goes_out_before_its_events_are_assembled_and_a_closed_relay_still_has_them() -> None:
    """The first byte waits for no parsing; the client leaving at a chunk does not lose its events
    (assembled before the turn's ``ended()`` logs them); ``started()`` runs once, after the first."""
    for close_after in (1, 2, None):
        state = await start_stream(Parts(ROLE + CONTENT, chunk({"content": " world"}), chunk({}, "stop") + DONE),
                                   hold=True)
        calls: list[str] = []

        async def ended(state: streaming.StreamState = state, calls: list[str] = calls) -> None:
            calls.append("ended: " + state.assembler.message()["content"])

        relay_ = relay(state, started=lambda calls=calls: calls.append("started"), ended=ended)
        sent = [await anext(relay_)]
        assert sent == [ROLE + CONTENT] and state.assembler.chunks == 0 and calls == []  # out first
        if close_after == 1:
            await relay_.aclose()
            assert (state.assembler.message()["content"], state.assembler.done) == ("Hello", False)
            assert calls == ["ended: Hello"]
            continue
        sent.append(await anext(relay_))
        assert state.assembler.message()["content"] == "Hello"  # the first chunk's, once it was out
        assert calls == ["started"]
        if close_after == 2:
            await relay_.aclose()
            assert state.assembler.message()["content"] == "Hello world"
            assert calls == ["started", "ended: Hello world"]
            continue
        sent += [part async for part in relay_]
        assert (state.assembler.message()["content"], state.assembler.finish_reason, state.assembler.done) == (
            "Hello world", "stop", True)
        assert b"".join(sent) == ROLE + CONTENT + chunk({"content": " world"}) + chunk({}, "stop") + DONE
        assert calls == ["started", "ended: Hello world"]


# --- a held read: ``_read_until`` against ``asyncio.wait`` -------------------------------------


async def _steps_until(waited: Awaitable[Any], gate: asyncio.Future[bytes], value: bytes) -> tuple[Any, int]:
    """``waited``'s result, and the event loop's steps from ``gate`` getting ``value`` to it."""
    steps = 0

    async def tick() -> None:
        nonlocal steps
        while True:
            await asyncio.sleep(0)
            steps += 1

    holder = asyncio.ensure_future(waited)
    for _ in range(3):  # the read started and waiting
        await asyncio.sleep(0)
    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)
    steps = 0
    gate.set_result(value)
    result = await holder
    ticker.cancel()
    return result, steps


async def test_a_held_read_gives_what_asyncio_wait_gives_one_loop_step_sooner() -> None:
    """The read that holding waits for (``_read_until``): done with the chunk as with ``asyncio.wait``
    on the read's task, the holder woken one loop step sooner; past the deadline, a read under way
    is not cancelled (the relay goes on from it), as with ``wait``'s timeout."""
    loop = asyncio.get_running_loop()

    def reader() -> tuple[AsyncIterator[bytes], asyncio.Future[bytes]]:
        gate: asyncio.Future[bytes] = loop.create_future()

        async def chunks() -> AsyncIterator[bytes]:
            yield await gate

        return aiter(chunks()), gate

    chunks, gate = reader()
    task, fast = await _steps_until(streaming._read_until(chunks, time.monotonic() + 10), gate, CONTENT)
    assert task.done() and task.result() == CONTENT

    chunks, gate = reader()

    async def with_wait() -> asyncio.Future[bytes]:  # what holding did before
        pending = asyncio.ensure_future(anext(chunks))
        await asyncio.wait({pending}, timeout=10)
        return pending

    task, slow = await _steps_until(with_wait(), gate, CONTENT)
    assert task.done() and task.result() == CONTENT
    assert fast == slow - 1

    chunks, gate = reader()
    task = await streaming._read_until(chunks, time.monotonic() + 0.01)  # the upstream is quiet
    assert not task.done()
    gate.set_result(CONTENT)
    assert await task == CONTENT  # read on, not cancelled
    ended: AsyncIterator[bytes] = aiter(Parts().aiter_raw())
    task = await streaming._read_until(ended, time.monotonic() + 10)
    with pytest.raises(StopAsyncIteration):
        task.result()


async def test_a_held_read_costs_start_stream_one_loop_step_more_than_a_first_read() -> None:
    """Where the step is saved: ``start_stream`` returns one loop step later when the chunk that ends
    holding comes in a held read (its task's hop) than when it comes in the first read, not two
    (``asyncio.wait`` heard of the read from its done callback, a step more)."""
    loop = asyncio.get_running_loop()

    async def steps(parts: list[bytes]) -> int:
        gates = [loop.create_future() for _ in parts]

        class Gated(Parts):
            async def aiter_raw(self) -> AsyncIterator[bytes]:
                for gate in gates:
                    yield await gate

        for gate, part in zip(gates[:-1], parts[:-1], strict=True):
            gate.set_result(part)  # there already
        state, count = await _steps_until(start_stream(Gated(), hold=True), gates[-1], parts[-1])
        assert state.prebuffer == parts
        return count

    first = await steps([CONTENT])
    held = await steps([ROLE, CONTENT])
    assert held == first + 1
