"""proxy/forward/text_template.py and ``ReplyAssembler.add_data``: a stream's chunks of text alone
read by the template learned from one of them give the reply that parsing each whole gives (the
fast path against the slow one, on the same bytes however they are cut), the fast path is taken
on a usual stream, and bytes that only look like the template go the slow way."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from proxy.forward.reply_assembler import ReplyAssembler
from proxy.forward.sse import SSESplitter
from proxy.forward.text_template import PROBE_TOKEN, TextTemplate

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}


def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    body = HEAD | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]} | extra
    return b"data: " + orjson.dumps(body) + b"\n\n"


def text(piece: str) -> bytes:
    return event({"content": piece})


ROLE = event({"role": "assistant", "content": ""})
END = event({}, "stop") + b"data: " + orjson.dumps(HEAD | {"choices": [], "usage": {"total_tokens": 9}}) + b"\n\ndata: [DONE]\n\n"
PIECES = ["Hello", " wörld", " \"quoted\"", " back\\slash", " tab\t", " line\nbreak", " 😀", "", " ,", " ]", " \u2028"]


def outcome(a: ReplyAssembler) -> tuple[Any, ...]:
    return (a.message(), a.chunks, a.seen_bytes, a.finish_reason, a.usage, a.done, a.errors, a.truncated,
            a.malformed, a.upstream_error, a.hidden_error, a.empty)


class Counted(TextTemplate):
    """A template that counts the events it read."""

    read = 0

    def run(self, chunk: bytes) -> tuple[list[str], int] | None:
        result = super().run(chunk)
        self.read += len(result[0]) if result is not None else 0
        return result


def both(chunks: list[bytes], max_bytes: int | None = None) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
    """The reply of ``chunks`` read by ``add_data`` (the template) and by ``add_events`` of the
    split events (the slow path, no template), and how many events the template read."""
    fast, slow = ReplyAssembler(max_bytes), ReplyAssembler(max_bytes)
    slow.template.learns = 0
    fast_split, slow_split = SSESplitter(), SSESplitter()
    fast.template = counted = Counted()
    for chunk in chunks:
        fast.add_data(fast_split, chunk)
        slow.add_events(slow_split.feed(chunk))
    fast.add_events(fast_split.flush())
    slow.add_events(slow_split.flush())
    return outcome(fast), outcome(slow), counted.read


def test_a_usual_stream_is_read_by_the_template_and_gives_the_same_reply() -> None:
    stream = [ROLE, *(text(p) for p in PIECES), END]
    fast, slow, read = both([ROLE, text("Hi"), b"".join(stream[1:])])
    assert fast == slow and read == len(PIECES)  # learned from "Hi", then every text chunk read by it
    assert fast[0]["content"] == "Hi" + "".join(PIECES)
    fast, slow, read = both(stream)  # one event a chunk
    assert fast == slow and read == len(PIECES) - 1  # (the first text chunk taught it)


def read_however_cut(both: Callable[[list[bytes]], tuple[Any, Any, int]], stream: bytes, rng: random.Random) -> int:
    """``both`` of ``stream`` cut in 2 to 31 chunks at random places, 200 times: the fast and the
    slow path agree each time; the events the template read in all."""
    taken = 0
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 30)))
        fast, slow, read = both([stream[i:j] for i, j in zip([0, *cuts], [*cuts, len(stream)], strict=True)])
        assert fast == slow
        taken += read
    return taken


def test_the_same_reply_however_the_stream_is_cut() -> None:
    rng = random.Random(7)
    stream = ROLE + b"".join(text(rng.choice(PIECES)) for _ in range(60)) + END
    assert read_however_cut(both, stream, rng) > 0


@pytest.mark.parametrize("odd", [
    b'"a","b"',             # two strings where one was
    b'"a",\n"b"',           # ... across a line
    b'"a\nb"',              # a raw line break in the string (not JSON; and a second SSE line)
    b'  "spaced"\t',        # blanks around the string (JSON all the same)
    b'"a"\n',               # a line break after the string: the event's rest is a line of its own
    b'\n"a"',               # ... before it
    b'"a"\n\n',             # ... a blank line: the event ends there
    b'"a"\r',               # a CR after the string: a JSON blank, a line end for SSE (the rest a line of its own)
    b'\r"a"',               # ... before it
    b'12',                  # not a string
    b'"\\ud800"',           # a lone surrogate escape (orjson refuses it; parse_json reads it)
    b'"\\u0000x"',          # an escape of a control character
    b'"unterminated',       # the string never ends
    b'""',                  # empty
    b'"a"],"x":["b"',       # the structure changed inside the slot
])
def test_bytes_in_the_texts_place_that_are_not_one_string_give_the_slow_paths_reply(odd: bytes) -> None:
    slot = text("zz")
    before, after = slot.split(b'"zz"')
    forged = before + odd + after
    for chunks in ([ROLE, text("Hi"), text("a") + forged + text("b") + END],
                   [ROLE, text("Hi"), forged + text("b") + END],
                   [ROLE, text("Hi"), text("a") + forged, END]):
        fast, slow, _ = both(chunks)
        assert fast == slow


def test_a_template_is_not_learned_from_a_key_that_only_looks_like_the_texts() -> None:
    """The last ``"content"`` of this chunk closes an escaped quote in another key: the probe parses
    to a chunk whose text is not the probe, so nothing is learned."""
    tricky = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"x":{"say \\"content":"y"}}\n\n')
    a = ReplyAssembler()
    splitter = SSESplitter()
    a.add_data(splitter, tricky)
    assert a.template.pre is None and a.template.learns == 3
    fast, slow, read = both([tricky, tricky.replace(b'"y"', b'"z"'), END])
    assert fast == slow and read == 0


def test_chunks_that_change_beside_the_text_go_the_slow_way() -> None:
    """A field that changes from chunk to chunk (other than a top-level ``obfuscation`` pad: a
    field of another name, a second choice, a finish reason with text) does not fit: each such
    chunk is parsed whole."""
    pads = [event({"content": f"w{i} "}, padding="x" * i) for i in range(12)]
    fast, slow, read = both([ROLE, *pads, END])
    assert fast == slow and read == 0
    a = ReplyAssembler()
    a.add_data(SSESplitter(), b"".join([ROLE, *pads, END]))
    assert a.template.learns == 3  # learned once (from the first pad), never again: the others only compared
    assert a.template.mid is None
    fast, slow, _ = both([ROLE, text("a"), text("b") + event({"content": "c"}, "stop") + text("d"), END])
    assert fast == slow and fast[3] == "stop"


OPENAI_HEAD = {"id": "chatcmpl-CXbq9", "object": "chat.completion.chunk", "created": 1761000000,
               "model": "gpt-4.1-mini-2025-04-14", "service_tier": "default", "system_fingerprint": "fp_4c2851f862"}
PAD_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def openai_text(piece: str, pad: Any) -> bytes:
    """A chunk of text alone as OpenAI streams it by default: ``logprobs``, then the ``obfuscation``
    pad (random characters of varying length) after the choices."""
    body = OPENAI_HEAD | {"choices": [{"index": 0, "delta": {"content": piece}, "logprobs": None,
                                       "finish_reason": None}], "obfuscation": pad}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def openai_stream(rng: random.Random, n: int, pads: list[str] | None = None) -> bytes:
    role = OPENAI_HEAD | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                                       "logprobs": None, "finish_reason": None}], "obfuscation": "Qx"}
    stop = OPENAI_HEAD | {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                          "obfuscation": "k2"}
    pads = pads or ["".join(rng.choices(PAD_CHARS, k=rng.randint(0, 12))) for _ in range(n)]
    texts = b"".join(openai_text(rng.choice(PIECES), pads[i % len(pads)]) for i in range(n))
    return b"data: " + orjson.dumps(role) + b"\n\n" + texts + b"data: " + orjson.dumps(stop) + b"\n\ndata: [DONE]\n\n"


def test_openai_chunks_with_an_obfuscation_pad_are_read_by_a_template_with_a_second_slot() -> None:
    """OpenAI pads each streamed chunk with random characters (``obfuscation``, on by default): the
    template learns the pad as a second slot, reads the chunks after the first by it, and gives
    the reply parsing each whole gives, however the stream is cut."""
    rng = random.Random(11)
    stream = openai_stream(rng, 40)
    a = ReplyAssembler()
    a.add_data(SSESplitter(), stream)
    assert a.template.pre is not None and a.template.mid == b'},"logprobs":null,"finish_reason":null}],"obfuscation":'
    cut = stream.index(b"\n\n", stream.index(b'"content":"', stream.index(b"\n\n"))) + 2
    fast, slow, read = both([stream[:cut], stream[cut:]])  # (the role and first text chunk, then the rest)
    assert fast == slow and read == 39  # (the first text chunk taught it)
    assert read_however_cut(both, stream, rng) > 0


@pytest.mark.parametrize("pad", [
    "", "\"", "\\", '\\"', '},"logprobs":null,"finish_reason":null}],"obfuscation":',  # the bytes between the slots
    "\u2028\x00\x1f", "😀", "\ud800",  # a lone surrogate: orjson writes it as is; parse_json reads it
])
def test_pads_of_any_string_give_the_slow_paths_reply(pad: str) -> None:
    rng = random.Random(3)
    try:
        stream = openai_stream(rng, 12, ["ab", pad, "c" * 30])
    except orjson.JSONEncodeError:  # (a lone surrogate: forged below)
        stream = openai_stream(rng, 12, ["ab", "SURROGATE", "c"]).replace(b'"SURROGATE"', b'"\\ud800"')
    fast, slow, _ = both([stream])
    assert fast == slow
    read_however_cut(both, stream, rng)


@pytest.mark.parametrize("odd", [
    b'12', b'null', b'"a","b"', b'"a"\n', b'"unterminated', b'', b'"a"}],"x":{"y":"z"',
])
def test_bytes_in_the_pads_place_that_are_not_one_string_give_the_slow_paths_reply(odd: bytes) -> None:
    rng = random.Random(5)
    slot = openai_text("zz", "PAD")
    before, after = slot.split(b'"PAD"')
    forged = before + odd + after
    good = [openai_text("a", "p1"), openai_text("b", "p22")]
    for chunks in ([good[0] + good[1] + forged + good[0]], [good[0], forged + good[1]], [good[1] + forged]):
        fast, slow, _ = both([openai_stream(rng, 2)[:0] + b"".join(chunks) + END])
        assert fast == slow


def test_a_pad_before_the_choices_or_of_another_type_is_no_second_slot() -> None:
    """The pad is a slot only as the top-level ``obfuscation`` string after the text: elsewhere, or
    a number, or the probe itself, nothing is learned from it (those chunks go the slow way); a
    number that does not change is part of a one-slot template."""
    before = [b"data: " + orjson.dumps({"obfuscation": "x" * i} | OPENAI_HEAD | {"choices": [
        {"index": 0, "delta": {"content": f"w{i}"}, "finish_reason": None}]}) + b"\n\n" for i in range(6)]
    numbers = [openai_text(f"w{i}", i) for i in range(6)]
    for chunks in (before, numbers, [openai_text("w", "\x00\"~")] * 3):
        fast, slow, read = both([ROLE, b"".join(chunks), END])
        assert fast == slow and read == 0
        a = ReplyAssembler()
        a.add_data(SSESplitter(), b"".join([ROLE, *chunks, END]))
        assert a.template.mid is None
    same = [openai_text(f"w{i}", 7) for i in range(6)]  # a number that does not change: one slot, the text's
    fast, slow, read = both([ROLE + same[0], b"".join(same[1:]) + END])
    assert fast == slow and read == 5


def test_the_pads_slot_is_the_top_level_member() -> None:
    """A member of the same name inside the choice is part of the template (it changes: the chunk
    goes the slow way); the top-level one is the slot, and only it (not a nested one after the
    text when the top-level one is before it, even one the probe would fit)."""
    def nested(i: int, inner: str) -> bytes:
        return b"data: " + orjson.dumps(OPENAI_HEAD | {"choices": [{"index": 0, "delta": {"content": f"w{i}"},
                                        "finish_reason": None, "obfuscation": inner}], "obfuscation": "t" * i}) + b"\n\n"
    fast, slow, read = both([ROLE + nested(0, "n"), b"".join(nested(i, "n") for i in range(1, 6)) + END])
    assert fast == slow and read == 5
    fast, slow, read = both([ROLE + nested(0, "n"), b"".join(nested(i, "n" * i) for i in range(1, 6)) + END])
    assert fast == slow and read == 0
    # (the top-level one before the text, a nested one after it with the probe's value: no slot at all)
    late = [b"data: " + orjson.dumps({"obfuscation": "t"} | OPENAI_HEAD | {"choices": [{"index": 0, "delta": {
        "content": f"w{i}"}, "finish_reason": None, "obfuscation": "n" * i if i else "\x00\"~"}]}) + b"\n\n" for i in range(6)]
    fast, slow, read = both([ROLE + late[0], b"".join(late[1:]) + END])
    assert fast == slow and read == 0


def test_an_event_without_the_bytes_between_the_slots_goes_the_slow_way() -> None:
    """An event of the template's bytes before the text and after the pad, but without the pad or
    the bytes between (``mid``), whose one string reads as two when cut where ``mid`` would end
    (an escaped quote there): its data is not JSON, an error for the slow path, not a text."""
    a = ReplyAssembler()
    a.add_data(SSESplitter(), ROLE + openai_text("w", "p"))
    mid = a.template.mid
    assert mid is not None
    before, after = openai_text("zz", "PAD").split(b'"zz"')[0], openai_text("zz", "PAD").split(b'"PAD"')[1]
    one = b'"' + b"x" * (len(mid) - 3) + b'\\"BB" '  # (one string; from byte len(mid) - 1 on, "BB" is one too)
    assert orjson.loads(one) and orjson.loads(one[len(mid) - 1:]) == "BB"
    fast, slow, read = both([ROLE + openai_text("w", "p"), before + one + after + openai_text("v", "q") + END])
    assert fast == slow and read == 0
    assert fast[0]["content"] == "wv" and len(fast[6]) == 1  # (``errors``: the event without its pad)


def test_a_template_with_a_pad_stops_at_a_chunk_without_one() -> None:
    """Chunks without the pad (or with another key after the text) after a learned two-slot
    template: read the slow way, the same reply."""
    rng = random.Random(9)
    head = b"".join(openai_text(f"w{i} ", "pp" * i) for i in range(5))
    for odd in (text("plain"), event({"content": "c"}, obfuscation="x", more="y"),
                openai_text("a", "p").replace(b'"obfuscation"', b'"obfuscatio"')):
        stream = ROLE + head + odd + head + END
        fast, slow, _ = both([stream])
        assert fast == slow and fast[0]["content"].count("w1 ") == 2
        read_however_cut(both, stream, rng)


def test_the_bound_on_kept_bytes_is_the_same() -> None:
    stream = [ROLE, text("Hi"), b"".join(text(f"word{i} ") for i in range(40)), END]
    for max_bytes in (1, 200, 2_000, 4_000, 10_000):
        fast, slow, _ = both(stream, max_bytes)
        assert fast == slow


def test_an_event_of_another_head_as_long_as_the_templates_goes_the_slow_way() -> None:
    """A refusal chunk has the text chunk's bytes but for ``"refusal"`` in place of ``"content"``
    (as long): after the template's length of bytes it reads as a text chunk, so only the
    comparison of the chunk's first bytes with the template's keeps its string out of the text."""
    refusal = event({"refusal": "no"})
    for chunks in ([ROLE, text("Hi"), refusal + text("a"), END], [ROLE, text("Hi"), refusal, END]):
        fast, slow, read = both(chunks)
        assert fast == slow and read == 0
        assert fast[0]["refusal"] == "no" and "no" not in fast[0]["content"]


def test_an_event_cut_before_the_templates_end_goes_the_slow_way() -> None:
    """The last event of a chunk ends (its blank line) right after its string, without the bytes
    that follow the text in the template: its data is not JSON, an error for the slow path,
    and the run of events must not stretch past the chunk's end to take it."""
    before = text("zz").split(b'"zz"')[0]
    for cut in (before + b'"b"\n\n', before + b'"b"\n\nZ'):
        fast, slow, read = both([ROLE, text("Hi"), text("a") + cut, END])
        assert fast == slow and read == 0
        assert fast[0]["content"] == "Hia" and len(fast[6]) == 1  # (``errors``: the cut event's data)


def test_chunks_after_an_event_the_splitter_holds_go_the_slow_way() -> None:
    """A chunk that ends inside an event (after its first data line) is followed by one that opens
    with text chunks: the first of them is that event's second data line (its data is not JSON),
    so nothing of the chunk is read by the template until the splitter holds nothing."""
    fast, slow, read = both([ROLE, text("Hi"), b"data: [1]\n", text("a") + text("b"), END])
    assert fast == slow and read == 0
    assert fast[0]["content"] == "Hib" and len(fast[6]) == 1  # (``errors``: the event of two data lines)


def test_a_cr_in_the_chunk_and_a_split_event_go_the_slow_way() -> None:
    crlf = text("b").replace(b"\n\n", b"\r\n\r\n")
    fast, slow, read = both([ROLE, text("Hi"), text("a") + crlf, text("c")[:20], text("c")[20:] + END])
    assert fast == slow and read == 0


def test_the_probe_token_is_escaped_json() -> None:
    assert orjson.loads(PROBE_TOKEN) == "\x00\"~" and b"\\" in PROBE_TOKEN
    template = TextTemplate()
    assert not template.learn(b'{"content":"\\u0000\\"~"}', b'"content"', "\x00\"~", lambda parsed: True)
    assert template.learns == 4  # (text equal to the probe: not even tried)


def test_pads_and_texts_of_json_syntax_give_the_slow_paths_reply() -> None:
    """Pads and texts drawn from JSON's own syntax characters (quotes, backslashes, brackets,
    commas, colons), cut anywhere: the two paths agree, and the template still reads."""
    rng = random.Random(13)
    alphabet = PAD_CHARS[:8] + '"\\}]),:{[ \t\u2028😀'
    taken = 0
    for _ in range(20):
        pads = ["".join(rng.choices(alphabet, k=rng.randint(0, 20))) for _ in range(8)]
        stream = openai_stream(rng, 20, pads).replace(
            b'"content":"', b'"content":"' + "".join(rng.choices(alphabet, k=3)).encode().replace(b"\\", b"\\\\").replace(b'"', b'\\"'), 5)
        taken += read_however_cut(both, stream, rng)
    assert taken > 0


def test_the_fake_openai_streams_are_read_by_the_template() -> None:
    """The streams the fake upstream sends (OpenAI's chunks, padded: ``tests.fakes.completions``)
    take the fast path after their first text chunk, with the slow path's reply."""
    from tests.fakes.completions import obfuscate
    from tests.fakes.wire import Reply, sse_data, stream_chunks

    chunks = stream_chunks(Reply("one two three four five six seven eight nine ten eleven twelve"),
                           completion_id="chatcmpl-1", created=1, model="m", usage=None)
    obfuscate(chunks)
    frames = [sse_data(c) for c in chunks] + [b"data: [DONE]\n\n"]
    fast, slow, read = both([frames[0] + frames[1], b"".join(frames[2:])])
    assert fast == slow and read == 3 and fast[0]["content"].endswith("twelve")
