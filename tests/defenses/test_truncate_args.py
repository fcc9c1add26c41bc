"""Defense 1 (proxy/defenses/truncate_args.py): valid JSON kept, content form kept (case 025)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.conversation.messages_codec import MESSAGES
from proxy.defenses.truncate_args import MARKER, MAX_DEPTH, truncate_arguments, truncate_message
from proxy.json_depth import dumps
from tests.support.values import nested

TOOLS = frozenset({"write_file", "edit_file"})
LONG = "x" * 3000


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"path": "a.py"}', '{"path": "a.py"}'),
        (json.dumps({"path": "a.py", "content": LONG}), json.dumps({"path": "a.py", "content": "x" * 20 + MARKER})),
        (json.dumps({"edits": [{"old": LONG, "new": "y"}]}), json.dumps({"edits": [{"old": "x" * 20 + MARKER, "new": "y"}]})),
        (json.dumps({"content": "é" * 2500}), json.dumps({"content": "é" * 20 + MARKER}, ensure_ascii=False)),
        ('{"content": "' + LONG, ("{\"content\": \"" + LONG)[:20] + MARKER),  # not JSON: raw cut
        (json.dumps({"a": ["y" * 1000] * 5}), json.dumps({"a": ["y" * 1000] * 5})),  # long but no long string
    ],
)
def test_truncate_arguments(arguments, expected):
    out = truncate_arguments(arguments, 2000, 20)
    assert out == expected
    if expected == arguments:
        assert out is arguments


def test_truncated_json_keeps_keys_and_stays_valid():
    args = json.dumps({"path": "hello.py", "content": "print('hello world')\n" * 800, "mode": 420})
    out = json.loads(truncate_arguments(args, 2000, 20))
    assert list(out) == ["path", "content", "mode"]
    assert out["path"] == "hello.py" and out["mode"] == 420
    assert out["content"] == ("print('hello world')\n" * 800)[:20] + MARKER


@pytest.mark.parametrize("content", [None, "", "Writing the file."])
def test_truncate_message_keeps_content_form_ids_and_order(content):
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": "w1", "type": "function", "function": {"name": "write_file", "arguments": json.dumps({"path": "p", "content": LONG})}},
            {"id": "r1", "type": "function", "function": {"name": "run_command", "arguments": json.dumps({"command": LONG})}},
        ],
    }
    before = copy.deepcopy(message)
    out = truncate_message(message, TOOLS, 2000, 20, item=CHAT.item(message), codec=CHAT)
    assert message == before  # input not mutated
    assert out is not None
    assert "content" in out and out["content"] == content and type(out["content"]) is type(content)
    assert [c["id"] for c in out["tool_calls"]] == ["w1", "r1"]
    assert json.loads(out["tool_calls"][0]["function"]["arguments"])["content"].endswith(MARKER)
    assert out["tool_calls"][1] is message["tool_calls"][1]  # not a configured tool: untouched


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": LONG},
        {"role": "tool", "tool_call_id": "a", "content": LONG},
        {"role": "assistant", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "write_file", "arguments": '{"path": "short"}'}}]},
    ],
)
def test_truncate_message_unchanged_returns_none(message):
    assert truncate_message(message, TOOLS, 2000, 20, item=CHAT.item(message), codec=CHAT) is None


def test_truncate_message_shortens_anthropic_tool_use_input():
    message = {"role": "assistant", "content": [
        {"type": "text", "text": "writing"},
        {"type": "tool_use", "id": "tu", "name": "write_file", "input": {"path": "p", "content": LONG}},
    ]}
    out = truncate_message(message, TOOLS, 2000, 20, item=CHAT.item(message), codec=CHAT)
    assert out["content"][0] is message["content"][0]
    assert out["content"][1]["input"] == {"path": "p", "content": "x" * 20 + MARKER}
    assert out["content"][1]["id"] == "tu"


def test_a_call_whose_name_is_not_a_string_is_left_alone():
    """A malformed call (its name a list) is forwarded as it came; it used to raise ``TypeError``."""
    message = {"role": "assistant", "content": [{"type": "tool_use", "id": "u", "name": ["write_file"], "input": LONG}],
               "tool_calls": [{"id": "c", "type": "function", "function": {"name": {"x": 1}, "arguments": LONG}}]}
    assert truncate_message(message, TOOLS, 2000, 20, item=CHAT.item(message), codec=CHAT) is None


def test_arguments_nested_deeper_than_max_depth_are_kept_as_sent() -> None:
    """A call whose arguments nest past ``MAX_DEPTH`` (a provider's tool input 600 deep, or its
    JSON text) is left as sent, every time (before: ``RecursionError`` out of the defense, a
    failed request); within the bound its long strings are still cut."""
    for depth in (MAX_DEPTH + 1, 600, 5000):
        deep: Any = {"content": LONG, "tree": nested(depth, LONG)}
        text_call = {"id": "w1", "type": "function", "function": {"name": "write_file", "arguments": dumps(deep).decode()}}
        message = {"role": "assistant", "content": None, "tool_calls": [text_call]}
        assert truncate_message(message, TOOLS, 2000, 20, item=CHAT.item(message), codec=CHAT) is None
        turn = {"role": "assistant", "content": [{"type": "tool_use", "id": "w1", "name": "write_file", "input": deep}]}
        assert truncate_message(turn, TOOLS, 2000, 20, item=MESSAGES.item(turn), codec=MESSAGES) is None
    shallow = {"content": LONG, "tree": nested(MAX_DEPTH - 2, LONG)}
    turn = {"role": "assistant", "content": [{"type": "tool_use", "id": "w1", "name": "write_file", "input": shallow}]}
    out = truncate_message(turn, TOOLS, 2000, 20, item=MESSAGES.item(turn), codec=MESSAGES)
    assert out is not None and out["content"][0]["input"]["content"] == "x" * 20 + MARKER
