"""``MessagesAssembler.add_data``: a Messages stream's text and thinking deltas read by the template
learned from one of them (``proxy.forward.text_template``) give the reply that ``add`` of each
split event gives (the fast path against the slow one, on the same bytes however they are cut);
the fast path is taken on a usual stream; bytes that only look like the template go the slow way."""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.forward.messages_sse import MessagesAssembler
from proxy.forward.sse import SSESplitter
from tests.fakes.anthropic.wire import sse_event
from tests.test_text_template import PIECES, Counted, read_however_cut


def start(index: int, block: dict[str, Any]) -> bytes:
    return sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def delta(index: int, piece: str, kind: str = "text") -> bytes:
    return sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": f"{kind}_delta", kind: piece}})


OPEN = sse_event("message_start", {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 5}}})
END = (sse_event("content_block_stop", {"type": "content_block_stop", "index": 1})
       + sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                     "usage": {"output_tokens": 9}})
       + sse_event("message_stop", {"type": "message_stop"}))
THINK = start(0, {"type": "thinking", "thinking": ""}) + delta(0, "Hmm", "thinking") + delta(0, " so", "thinking")
TEXT = start(1, {"type": "text", "text": ""})


def outcome(a: MessagesAssembler) -> tuple[Any, ...]:
    return (a.message(), a.seen_bytes, a.truncated, a.usage, a.stop_reason, a.done, a.upstream_error, a.empty)


def both(chunks: list[bytes], max_bytes: int = 1 << 20) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """The reply of ``chunks`` read by ``add_data`` and by ``add`` of each split event (no
    template), and how many events the template read."""
    fast, slow = MessagesAssembler(max_bytes), MessagesAssembler(max_bytes)
    slow.template.learns = 0
    fast.template = counted = Counted()
    fast_split, slow_split = SSESplitter(), SSESplitter()
    for chunk in chunks:
        fast.add_data(fast_split, chunk)
        for event in slow_split.feed(chunk):
            slow.add(event)
    for event in fast_split.flush():
        fast.add(event)
    for event in slow_split.flush():
        slow.add(event)
    return outcome(fast), outcome(slow), counted.read


def test_a_usual_stream_is_read_by_the_template_and_gives_the_same_reply() -> None:
    fast, slow, read = both([OPEN + TEXT + delta(1, "Hi"), b"".join(delta(1, p) for p in PIECES) + END])
    assert fast == slow and read == len(PIECES)
    assert fast[0]["content"] == [{"type": "text", "text": "Hi" + "".join(PIECES)}]
    fast, slow, read = both([OPEN, TEXT, *(delta(1, p) for p in PIECES), END])  # one event a chunk
    assert fast == slow and read == len(PIECES) - 1
    fast, slow, read = both([OPEN + THINK, b"".join(delta(0, p, "thinking") for p in PIECES) + TEXT + END])
    assert fast == slow and read == len(PIECES)  # (learned from thinking: text at 1 does not fit it)


def test_the_same_reply_however_the_stream_is_cut() -> None:
    rng = random.Random(11)
    stream = (OPEN + THINK + b"".join(delta(0, rng.choice(PIECES), "thinking") for _ in range(20)) + TEXT
              + b"".join(delta(1, rng.choice(PIECES)) for _ in range(40)) + start(1, {"type": "text", "text": "x"})
              + b"".join(delta(1, rng.choice(PIECES)) for _ in range(20)) + END)
    assert read_however_cut(both, stream, rng) > 0


@pytest.mark.parametrize("odd", [b'"a","b"', b'"a"\n', b'"a"\r', b'\r"a"', b'\n"a"', b'"a"\n\n', b'  "spaced"\t', b'12', b'"\\ud800"',
                                 b'"unterminated', b'"a"}},"x":{"y":"b"', b'null'])
def test_bytes_in_the_pieces_place_that_are_not_one_string_give_the_slow_paths_reply(odd: bytes) -> None:
    before, after = delta(1, "zz").split(b'"zz"')
    forged = before + odd + after
    for chunks in ([OPEN + TEXT + delta(1, "Hi"), delta(1, "a") + forged + delta(1, "b") + END],
                   [OPEN + TEXT + delta(1, "Hi"), forged + delta(1, "b") + END]):
        fast, slow, _ = both(chunks)
        assert fast == slow


def test_the_bound_and_a_block_replaced_are_the_same() -> None:
    stream = [OPEN + TEXT + delta(1, "Hi"), b"".join(delta(1, f"word{i} ") for i in range(40)),
              start(1, {"type": "text", "text": "new "}) + delta(1, "a") + delta(1, "b"), END]
    for max_bytes in (1, 300, 2_000, 5_000, 1 << 20):
        fast, slow, _ = both(stream, max_bytes)
        assert fast == slow


def test_deltas_to_a_block_never_started_and_unnamed_events_go_the_slow_way() -> None:
    unnamed = delta(1, "u").removeprefix(b"event: content_block_delta\n")
    fast, slow, read = both([OPEN, delta(1, "a") + delta(1, "b"), TEXT + unnamed + unnamed, END])
    assert fast == slow and read == 0


def test_deltas_after_an_event_the_splitter_holds_go_the_slow_way() -> None:
    """A chunk that ends inside an event (its name and a first data line) is followed by one that
    opens with text deltas: the first is that event's (its data, two lines, is not JSON), so
    nothing of the chunk is read by the template until the splitter holds nothing."""
    fast, slow, read = both([OPEN + TEXT + delta(1, "Hi"), b"event: content_block_delta\ndata: [1]\n",
                             delta(1, "a") + delta(1, "b") + END])
    assert fast == slow and read == 0
    assert fast[0]["content"] == [{"type": "text", "text": "Hib"}]


def test_a_chunk_that_opens_with_deltas_teaches_the_template_with_its_first() -> None:
    """A held start's tail (the first block's deltas, and the end): the first delta is read alone
    and the template learned from it reads the others; a delta that no delta follows is not."""
    fast, slow, read = both([OPEN + TEXT, b"".join(delta(1, p) for p in PIECES) + END])
    assert fast == slow and read == len(PIECES) - 1
    fast, slow, read = both([OPEN + TEXT, delta(1, "a") + END])
    assert fast == slow and read == 0
    fast, slow, read = both([OPEN + TEXT, delta(1, "a") + b"event: content_block_delta\r\n" + delta(1, "b")[27:] + END])
    assert fast == slow and read == 0  # (a CR: split as it came)
