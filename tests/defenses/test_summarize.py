"""Summary helpers (proxy/defenses/summarize.py): request shape (cases 023, 026), chunks, message."""

from __future__ import annotations

import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.defenses.summarize import (
    SUMMARY_PHRASE,
    build_summary_request_messages,
    render_transcript,
    summary_chunks,
    summary_message,
)

HISTORY = [
    {"role": "user", "name": "alice", "content": "Task: migrate configs. FACT: deploy_token=T-4471"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.ini"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "key = value"},
    {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                      {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "Oslo"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "FACT: oslo_temp=12C"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
]


def test_render_transcript_is_readable_and_deterministic():
    text = render_transcript(HISTORY, CHAT)
    assert text == render_transcript(HISTORY, CHAT)
    for expected in ("### user (alice)", "FACT: deploy_token=T-4471", '-> tool call read_file (id c1): {"path": "a.ini"}',
                     "### tool [answer to call c1]", "key = value", '-> tool call get_weather (id tu1): {"city": "Oslo"}',
                     "<- tool result (id tu1):\nFACT: oslo_temp=12C", "[image: inline data, 26 chars]"):
        assert expected in text


@pytest.mark.parametrize("previous", [None, "## Session intent\nold. FACT: a=1"])
def test_summary_request_is_one_plain_user_message(previous):
    messages = build_summary_request_messages(previous, "### user\nhello")
    assert len(messages) == 1
    (m,) = messages
    assert set(m) == {"role", "content"} and m["role"] == "user"  # no system/developer, no name
    text = m["content"]
    assert SUMMARY_PHRASE in text
    for section in ("Session intent", "Summary and decisions", "Artifacts", "Next steps", "FACT: key=value",
                    "Do not repeat finished work", "### user\nhello"):
        assert section in text
    assert (previous in text) if previous else ("previous_summary" not in text)


def test_summary_message_header_and_pinned_request():
    m = summary_message("## Session intent\nx", "sess-1", "evt_1", 42, pinned_user_text="QUESTION: table",
                        read_tool_name="read_archive")
    assert set(m) == {"role", "content"} and m["role"] == "user"
    c = m["content"]
    assert c.startswith("[context-proxy] The earlier conversation (42 messages) was summarized by context-proxy")
    assert "/sessions/sess-1/archive" in c and "`read_archive`" in c and "evt_1" in c
    assert c.index("## Session intent") < c.index("QUESTION: table")
    assert m == summary_message("## Session intent\nx", "sess-1", "evt_1", 42, pinned_user_text="QUESTION: table",
                                read_tool_name="read_archive")


@pytest.mark.parametrize("budget", [60, 200, 5000])
def test_summary_chunks_fit_the_budget_and_keep_order(counter, budget):
    history = HISTORY + [{"role": "tool", "tool_call_id": "c1", "content": "line of log output\n" * 400}]
    chunks = summary_chunks(history, budget, counter, CHAT)
    assert all(chunks)
    for chunk in chunks:
        assert counter.count_text(render_transcript(chunk, CHAT)) <= budget + 2 * len(chunk)
    flat = [m for chunk in chunks for m in chunk]
    assert len(flat) == len(history)
    assert [m["role"] for m in flat] == [m["role"] for m in history]
    cut = "message cut to fit the summary request" in flat[-1]["content"]
    assert cut == (budget < counter.count_text(render_transcript(history[-1:], CHAT)))
    assert chunks == summary_chunks(history, budget, counter, CHAT)


def test_summary_chunks_one_chunk_when_it_fits(counter):
    assert summary_chunks(HISTORY, 10_000, counter, CHAT) == [HISTORY]


@pytest.mark.parametrize(
    ("window", "reply", "previous", "expected"),
    [(32_000, 2048, 0, 28_800 - 2048 - 400), (4096, 1024, 500, 3686 - 1024 - 400 - 500), (2048, 2048, 0, 64)],
)
def test_chunk_budget_tokens(window, reply, previous, expected):
    from proxy.defenses.summarize import chunk_budget_tokens

    assert chunk_budget_tokens(window, reply, previous) == expected


def test_the_transcript_shows_unknown_roles_and_fields_by_name():
    text = render_transcript([
        {"role": "assistant", "content": "<|python_tag|>print(6*7)"},
        {"role": "ipython", "content": "42"},
        {"role": "wizard", "content": "FACT: spell=lumos", "x_vendor": {"b": 2, "a": 1}, "reasoning_content": "thought",
         "refusal": None, "annotations": []},
        {"role": ["odd"], "content": "a role that is not a string"},
        {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": '{"q": 1}'}},
    ], CHAT)
    assert text == (
        "### assistant\n<|python_tag|>print(6*7)\n\n"
        "### ipython\n42\n\n"
        '### wizard\nFACT: spell=lumos\n[x_vendor] {"a": 1, "b": 2}\n[reasoning_content] thought\n\n'
        '### ["odd"]\na role that is not a string\n\n'
        '### assistant\n-> function call lookup: {"q": 1}'
    )


def test_a_cut_stand_in_keeps_the_header_once(counter):
    big = {"role": "ipython", "name": "py", "content": "line of output\n" * 400, "x_exec_ms": 3}
    (chunk,) = summary_chunks([big], 60, counter, CHAT)
    text = render_transcript(chunk, CHAT)
    assert text.startswith("### ipython (py)\nline of output\n") and text.count("### ") == 1
    assert "message cut to fit the summary request" in text
