"""proxy/offline/replay.py: the offline replay of a trace through the projection and the plan loop."""

from __future__ import annotations

import pytest

from proxy.offline.replay import load_trace, offline_summary, replay, request_indices
from proxy.settings import Settings
from proxy.tokens.counter import load_counter
from tests.conftest import SHARED_DIR
from tests.support.shared import needs_traces

TRACES = sorted((SHARED_DIR / "traces").glob("*.jsonl"))


@pytest.fixture(scope="module")
def counter():
    return load_counter(str(SHARED_DIR / "tiktoken"))


def test_requests_are_sent_before_each_assistant_message() -> None:
    messages = [{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}]
    assert request_indices(messages) == [2, 4]


def test_offline_summary_keeps_first_lines_and_facts_within_budget(counter) -> None:
    messages = [
        {"role": "user", "content": "Fix the parser\nFACT: deadline=friday\n" + "noise line\n" * 50},
        {"role": "assistant", "content": "Looking at it", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
    ]
    text = offline_summary("- user: earlier work", messages, 200, counter)
    assert text.splitlines() == ["- user: earlier work", "- user: Fix the parser", "FACT: deadline=friday",
                                 "- assistant: Looking at it"]
    tight = offline_summary(None, messages * 40, 60, counter)
    assert counter.count_text(tight) <= 60 + len(tight.splitlines())
    assert "FACT: deadline=friday" in tight, "facts outlive first lines when cutting to the budget"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_every_trace_fits_a_16k_window_with_the_proxy(trace, counter) -> None:
    messages = load_trace(trace)
    report = replay(messages, model="gpt-4o", settings=Settings(), window_tokens=16_384, counter=counter)
    assert len(report.turns) == len(request_indices(messages))
    assert report.overflows_with == 0
    assert all(t.tokens_with <= t.tokens_without for t in report.turns)
    if report.overflows_without:
        assert report.defenses_applied, "a trace that overflows without the proxy needs a defense with it"
        assert report.tokens_with < report.tokens_without
        assert report.summary_calls >= report.compactions.get("summary", 0)


@needs_traces
def test_replay_is_deterministic_and_uses_the_model_profile(counter) -> None:
    messages = load_trace(SHARED_DIR / "traces" / "swe-agent__pydicom-1458__gpt-4.jsonl")
    first = replay(messages, model="gpt-4", settings=Settings(), window_tokens=8192, counter=counter)
    second = replay(messages, model="gpt-4", settings=Settings(), window_tokens=8192, counter=counter)
    assert first.turns == second.turns
    profiled = replay(messages, model="gpt-4o", settings=Settings(), counter=counter)
    assert profiled.window_tokens == 128_000 and profiled.compactions == {}
    assert profiled.tokens_with == profiled.tokens_without


@needs_traces
def test_replay_forwards_the_same_bytes_each_time_and_untouched_requests_as_sent(counter) -> None:
    import orjson

    messages = load_trace(SHARED_DIR / "traces" / "swe-agent__pydicom-1458__gpt-4.jsonl")
    runs: list[list[tuple[int, bytes]]] = [[], []]
    for bodies in runs:
        replay(messages, model="gpt-4o", settings=Settings(), window_tokens=128_000, counter=counter,
               on_forward=lambda turn, body, bodies=bodies: bodies.append((turn, body)))
    assert runs[0] == runs[1]
    first = request_indices(messages)[0]
    assert runs[0][0] == (1, orjson.dumps({"model": "gpt-4o", "messages": messages[:first]}))
