"""Second review of BodyMemo: each test is a body (or a sequence of bodies of one tenant) whose
parse with the memo differed from its whole parse, or that the memo's bounds did not hold."""

from __future__ import annotations

import contextlib
import gc
import sys
import tracemalloc
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import proxy.conversation.body_memo as body_memo
import proxy.conversation.chat_request as chat_request
import proxy.conversation.json_spans as json_spans
from proxy.conversation.body_memo import BodyMemo
from proxy.conversation.chat_request import parse_chat_request
from proxy.errors import BadRequest
from tests.conversation.test_body_memo import history, same


def tools(n: int) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 100}} for i in range(n)]



def _count_parsed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes parsed by orjson in the memo's modules from now on (``[n]``, growing)."""
    parsed = [0]

    def counting(data: Any) -> Any:
        parsed[0] += len(data)
        return orjson.loads(data)

    for module in (body_memo, json_spans, chat_request):
        monkeypatch.setattr(module, "orjson", SimpleNamespace(loads=counting, dumps=orjson.dumps,
                                                              JSONDecodeError=orjson.JSONDecodeError))
    return parsed


def test_a_body_that_differs_from_the_kept_one_before_its_messages_parses_as_a_whole_parse() -> None:
    """Members written before ``messages`` (here ``tools``, 2.6 kB: past the first ``KEY_BYTES``
    that index a kept body) where the new body adds an element to an array: the two bodies first
    differ where the old one has ``]`` and the new one ``,``, before either's messages array; the
    kept array was then taken to end there (an ``IndexError``: a 500 for a valid body)."""
    memo = BodyMemo(min_bytes=1024)
    same(orjson.dumps({"model": "m", "tools": tools(20), "messages": history()}), memo)
    added = orjson.dumps({"model": "m", "tools": [*tools(20), {"type": "function", "function": {"name": "new"}}],
                          "messages": history()})
    assert same(added, memo)["tools"][-1]["function"]["name"] == "new"


def held_after(memo: BodyMemo, bodies: list[bytes]) -> int:
    """Bytes ``tracemalloc`` sees still allocated once ``bodies`` went through ``memo`` (each
    parsed with it and whole: ``same``) and the caller's references to them and their parses are gone."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for raw in bodies:
            try:
                same(raw, memo)
            except BadRequest:
                pass
        bodies.clear()
        gc.collect()
        return int(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


def test_kept_messages_of_many_small_values_stay_within_the_bound() -> None:
    """The weight of an entry is ``PARSED_COST`` times its bytes (1.55 bytes of Python objects a
    byte for the benchmark's text), but a client chooses the shape: ``{}`` is 3 bytes of JSON and a
    72-byte dict in its list, so a 1.5 MB body holds 52 MB against a 4 MB bound (at the default
    32 MB bound: about 450 MB held)."""
    memo = BodyMemo(max_bytes=4_000_000)
    messages: list[Any] = [{"role": "user", "content": [{}] * 50_000} for _ in range(10)]
    bodies = [orjson.dumps({"model": "m", "messages": messages}),
              orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "next"}]})]
    del messages
    held = held_after(memo, bodies)
    assert memo.reused == 1
    assert held <= memo.max_bytes, f"{held / 1e6:.1f} MB held, {memo._total / 1e6:.1f} MB accounted"


def test_an_entry_that_learns_its_messages_on_a_refused_body_keeps_the_bound() -> None:
    """Kept whole, a body weighs its bytes; the next body of its conversation has its messages
    parsed (``_end``) and its weight raised to ``PARSED_COST`` times them, but nothing is evicted
    for it until the next store: bodies refused with a 400 (here a NUL in a new role) raise every
    kept body to 2.5 times the bytes it was admitted at, past ``max_bytes``."""
    memo = BodyMemo(min_bytes=1024, max_bytes=1_000_000)
    conversations = [[{"role": "system", "content": f"conversation {c} " * 80}, *history(560)] for c in range(4)]
    for messages in conversations:
        same(orjson.dumps({"model": "m", "messages": messages}), memo)
    assert len(memo) == 4 and memo._total <= memo.max_bytes
    bad = [orjson.dumps({"model": "m", "messages": [*m, {"role": "user\u0000", "content": "x"}]}) for m in conversations]
    held = held_after(memo, bad)
    assert memo._total <= memo.max_bytes, f"{memo._total / 1e6:.2f} MB accounted ({held / 1e6:.2f} MB held)"


def test_a_small_body_does_not_parse_a_big_kept_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept body (2 MB) whose members after its messages array are most of it (``metadata``),
    then a 69 kB body extending its messages without them: learning where the kept messages end
    parses everything after them (``_end``'s check that no later ``messages`` member wins), 2 MB
    of parsing on the event loop for a 69 kB body (30 times its size) (the ratio grows with the kept body, to 12.8 MB)."""
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages, "metadata": {"note": "x" * 2_000_000}}), memo)
    raw = orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": "next"}]})
    parsed = _count_parsed(monkeypatch)
    parse_chat_request(raw, memo, "t")
    assert parsed[0] <= 3 * len(raw), f"{parsed[0] / len(raw):.1f} times the body's bytes parsed"


WS_RUN = b" " * 50_000
"""Whitespace a client may put between any two tokens (JSON allows any amount)."""


def memo_lines(bodies: list[bytes], memo: BodyMemo) -> int:
    """Python lines run in ``body_memo`` and ``json_spans`` while the last of ``bodies`` is parsed
    with ``memo`` (the others first): a count of the work done in Python, unlike orjson's."""
    for raw in bodies[:-1]:
        with contextlib.suppress(BadRequest):
            parse_chat_request(raw, memo, "t")
    files = {body_memo.__file__, json_spans.__file__}
    lines = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        if frame.f_code.co_filename not in files:
            return None
        lines += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        with contextlib.suppress(BadRequest):
            parse_chat_request(bodies[-1], memo, "t")
    finally:
        sys.settrace(None)
    return lines


def ws_cases() -> dict[str, list[bytes]]:
    head = orjson.dumps({"model": "m", "messages": history()})[:-2]  # ... the last message's "}"
    new = b'{"role":"user","content":"next"}'
    return {
        # kept whole with a run before its "]"; a body ending its array where the run starts: skip_ws(old, p),
        # and no parse (repeated by every such body, each a 400 or a valid body of its own)
        "run before the kept array's end": [head + WS_RUN + b"]}", head + b"]}"],
        # the new body's run before its ",": skip_ws(raw, end) in _extend
        "run before the new comma": [head + b"]}", head + b",1]}", head + WS_RUN + b"," + new + b"]}"],
        # both with the run, then a "," against a "]": the kept end trimmed back over it (_end)
        "run the two bodies share": [head + WS_RUN + b"]}", head + WS_RUN + b"," + new + b"]}"],
        # new messages then a run before "]": the new end trimmed back over it (_extend)
        "run after the new messages": [head + b"]}", head + b",1]}", head + b"," + new + WS_RUN + b"]}"],
        # a run after the new array's "]": orjson's error position comes after it (array_close)
        "run after the new array": [head + b"]}", head + b",1]}", head + b"," + new + b"]" + WS_RUN + b',"n":1}'],
    }


@pytest.mark.parametrize("case", ws_cases().keys())
def test_python_work_per_body_does_not_grow_with_a_whitespace_run(case: str) -> None:
    """``skip_ws`` and the trims of a kept or new end step over whitespace one byte at a time in
    Python (0.7 s on the event loop for a 70 kB body against a kept body with a 10 MB run, each
    time, where a whole parse takes 0.04 ms); a bound of 10,000 lines whatever the run's length."""
    lines = memo_lines(ws_cases()[case], BodyMemo(min_bytes=1024))
    assert lines <= 10_000, f"{lines} lines of Python for a {len(WS_RUN)}-byte whitespace run"


def test_python_work_per_body_does_not_grow_with_the_members_before_messages() -> None:
    """``messages_start`` (run on every big body parsed whole, to keep it) steps over the members
    before ``messages`` one string or bracket at a time in Python: 984 ms for 9.1 MB of ``"",``
    before the messages, which orjson parses whole in 81 ms (on the event loop, every such body).
    Ten times the strings must not take more lines of Python."""
    counts = []
    for n in (20_000, 200_000):
        raw = orjson.dumps({"model": "m", "x": [""] * n, "messages": history()})
        counts.append(memo_lines([raw], BodyMemo(min_bytes=1024)))
    assert counts[1] <= counts[0] * 1.1 + 1_000, f"lines of Python for 20,000 and 200,000 strings: {counts}"


@pytest.mark.parametrize("switch_at", range(6))
def test_a_kept_body_learning_its_end_in_another_thread_meanwhile(switch_at: int) -> None:
    """``BodyMemo`` is documented thread-safe, and ``_end`` learns a kept body's end outside its
    lock (``prefix`` set, then ``raw`` cleared). Another thread doing so for the same entry between
    two lines of this thread's ``_end`` (simulated: the trace function runs it there, as a thread
    switch would) left this one with ``prefix`` read as ``None`` and ``raw`` as ``None``: an
    ``AssertionError`` (a 500) for a valid body."""
    memo = BodyMemo(min_bytes=1024)
    messages = history()
    same(orjson.dumps({"model": "m", "messages": messages}), memo)
    branches = [orjson.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": f"branch {b}"}]})
                for b in range(2)]
    lines = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        if frame.f_code is not BodyMemo._end.__code__:
            return None
        if event == "line":
            lines += 1
            if lines == switch_at + 1:
                memo.reuse(branches[1], "t")  # the other thread (tracing is off inside a trace function)
        return tracer

    sys.settrace(tracer)
    try:
        got = parse_chat_request(branches[0], memo, "t")
    finally:
        sys.settrace(None)
    assert got == parse_chat_request(branches[0])


def test_a_body_verifies_one_kept_body_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 kept bodies of one tenant (kept whole), each with the same messages overridden by a later
    ``messages`` member: a body that extends those messages passes ``_end``'s first test with each,
    and each fails its verification parse (dropped, and the next tried): 16 parses of the array
    for one body (18 times its bytes parsed). One verification a body, as one candidate a body after a success."""
    memo = BodyMemo(min_bytes=1024)
    head = orjson.dumps({"model": "m", "messages": history()})[:-2]  # ... the last message's "}"
    for i in range(16):
        same(head + b'],"messages":[{"role":"user","content":"override %d"}]}' % i, memo)
    assert len(memo) == 16
    attack = head + b',{"role":"user","content":"%s"}]}' % (b"next " * 20)
    parsed = _count_parsed(monkeypatch)
    same(attack, memo)
    assert parsed[0] <= 4 * len(attack), f"{parsed[0] / len(attack):.1f} times the body's bytes parsed"


def test_bodies_kept_whole_with_big_members_before_their_messages_stay_within_the_bound() -> None:
    """A body kept whole weighs its bytes, but its entry also holds a copy of them up to its
    messages (``head``): members written before ``messages`` (here 1.4 MB of ``tools`` in 1.5 MB
    bodies) are held twice."""
    memo = BodyMemo(max_bytes=4_000_000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for c in range(2):
            tools = [{"type": "function", "function": {"name": f"c{c}_tool_{i}", "description": "d" * 10_000}}
                     for i in range(140)]
            parse_chat_request(orjson.dumps({"model": "m", "tools": tools, "messages": history()}), memo, "t")
            del tools
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(memo) >= 1  # (weighed with their heads, the second pushes the first out)
    assert held <= memo.max_bytes, f"{held / 1e6:.2f} MB held, {memo._total / 1e6:.2f} MB accounted"
