"""``start_stream`` splits a held chunk only as far as holding needs, and the relay reads the rest
(``proxy.forward.streaming``): the same held/overflow decisions, relayed bytes and assembled reply
as splitting every chunk whole first (``_whole_chunk_hold``, the way it was done before), on random
streams and chunkings; what holding parsed is not parsed again.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.forward import streaming
from proxy.forward.reply_assembler import ReplyAssembler
from proxy.forward.sse import SSEEvent, SSESplitter
from proxy.forward.streaming import INCOMPLETE, error_event, start_stream
from proxy.forward.text_template import PROBE_TOKEN
from tests.test_streaming import CONTENT, DONE, LLAMACPP_ERROR, OPENAI_ERROR, ROLE, Parts, chunk, data, relay

_EVENTS = [ROLE, ROLE, CONTENT, chunk({"content": " world"}), chunk({}, "stop"), DONE, b": keep-alive\n\n",
           data({"choices": [], "usage": None}), data({"error": OPENAI_ERROR}), data({"error": LLAMACPP_ERROR}),
           b"event: error\n" + data(OPENAI_ERROR), b"data: not json\n\n",
           b'data: {"choices":[{"index":0,"delta":{"content":"half \\ud83d"}}]}\n\n']  # (a lone surrogate escape)


def _random_parts(rng: random.Random) -> list[bytes]:
    stream = b"".join(rng.choice(_EVENTS) for _ in range(rng.randint(1, 8)))
    if rng.random() < 0.2:
        stream = stream.replace(b"\n", rng.choice([b"\r\n", b"\r"]))
    if rng.random() < 0.4:
        return [stream]
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randint(1, 4))))
    return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


def _whole_chunk_hold(parts: list[bytes], hold: bool) -> tuple[list[bytes], list[SSEEvent], Any]:
    """The held chunks, the events read with them and the overflow, every held chunk split whole
    before holding looks at its events (the reference)."""
    splitter, held, held_bytes = SSESplitter(), [], 0
    state = streaming.StreamState(Parts(), Parts().aiter_raw())  # (a scratch state for ``_hold_ends``)
    for part in parts:
        held.append(part)
        held_bytes += len(part)
        if streaming._hold_ends(state, splitter.feed(part), hold, None) or held_bytes > streaming.HOLD_MAX_BYTES:
            return held, state.first, state.overflow
    streaming._hold_ends(state, splitter.flush(), hold, None)
    return held, state.first, state.overflow


def _state_of(a: ReplyAssembler) -> tuple[Any, ...]:
    return (a.message(), a.finish_reason, a.usage, a.done, a.errors, a.upstream_error, a.hidden_error,
            a.chunks, a.seen_bytes, a.malformed)


async def test_holding_splits_as_far_as_it_needs_and_decides_as_splitting_whole_chunks() -> None:
    rng = random.Random(2127)
    for _ in range(600):
        parts, hold = _random_parts(rng), rng.random() < 0.8
        held, first, overflow = _whole_chunk_hold(parts, hold)
        state = await start_stream(Parts(*parts), hold=hold)
        assert state.prebuffer == held, parts
        assert (state.overflow is None) == (overflow is None), parts
        if overflow is not None:
            assert state.overflow is not None and state.overflow.limit_tokens == overflow.limit_tokens
            continue
        assert state.first == first[:len(state.first)], parts  # the events holding looked at: a prefix
        relayed = b"".join([part async for part in relay(state)])
        ending = b"" if state.assembler.upstream_error or (state.assembler.done and not state.assembler.hidden_error) \
            else error_event(INCOMPLETE)  # (``relay_turn``'s own, at a stream's end without [DONE])
        assert relayed == b"".join(parts) + ending, parts
        whole = ReplyAssembler()
        splitter = SSESplitter()
        whole.add_events([e for part in parts for e in splitter.feed(part)] + splitter.flush())
        assert _state_of(state.assembler) == _state_of(whole), parts


async def test_a_chunk_s_events_after_the_one_that_ends_holding_are_split_once_it_is_out() -> None:
    """The fast path: one chunk with the whole reply; holding reads two events, the rest waits."""
    rest = chunk({"content": " world"}) + chunk({}, "stop") + DONE
    for close_at_first in (False, True):
        state = await start_stream(Parts(ROLE + CONTENT + rest), hold=True)
        assert [e.raw + b"\n\n" for e in state.first] == [ROLE, CONTENT] and state.rest == rest
        relay_ = relay(state)
        assert await anext(relay_) == ROLE + CONTENT + rest and state.assembler.chunks == 0  # out first
        if close_at_first:  # the client left: what it was handed is assembled all the same
            await relay_.aclose()
        else:
            assert [part async for part in relay_] == []
        a = state.assembler
        assert (a.message()["content"], a.finish_reason, a.done, state.rest) == ("Hello world", "stop", True, b"")


async def test_what_holding_parsed_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    loads = orjson.loads

    def counted(text: Any) -> Any:
        parsed.append(bytes(text))
        return loads(text)

    monkeypatch.setattr(orjson, "loads", counted)
    stream = ROLE + CONTENT + chunk({}, "stop") + DONE
    state = await start_stream(Parts(stream), hold=True)
    assert parsed == [ROLE[6:-2], CONTENT[6:-2]]
    assert b"".join([part async for part in relay(state)]) == stream
    probes = [text for text in parsed if PROBE_TOKEN in text]  # (the text template learned from CONTENT)
    assert probes == [CONTENT[6:-2].replace(b'"Hello"', PROBE_TOKEN)]
    assert [text for text in parsed if text not in probes] == [ROLE[6:-2], CONTENT[6:-2], chunk({}, "stop")[6:-2]]  # each once
    assert state.assembler.message() == {"role": "assistant", "content": "Hello"} and state.assembler.done
