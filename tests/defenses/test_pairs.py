"""Tool-pair safety and dangling-call patching (proxy/defenses/pairs.py); cases 001, 002, 004."""

from __future__ import annotations

import copy
import itertools

import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.conversation.model import CANCELLED_TEXT, group_start
from proxy.defenses.pairs import dangling_calls, patch_dangling
from tests.strict import validate_chat_messages


def call(cid: str, name: str = "read_file", args: str = "{}") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def asst(*ids: str, content=None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": [call(i) for i in ids]}


def tool(cid: str, content: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": content}


SYS = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "u"}
TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "tu1", "name": "w", "input": {}}]}
TOOL_RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "r"}]}


@pytest.mark.parametrize(
    ("message", "expected"),
    [(tool("a"), True), ({"role": "function", "name": "f", "content": "x"}, True), (TOOL_RESULT, True),
     (USER, False), (asst("a"), False), (TOOL_USE, False), ({"role": "user", "content": [{"type": "text", "text": "x"}]}, False)],
)
def test_is_answer(message, expected):
    assert CHAT.item(message).is_answer is expected


PARALLEL = [SYS, USER, asst("a", "b", "c"), tool("a"), tool("b"), tool("c")]


@pytest.mark.parametrize(
    ("messages", "start", "expected"),
    [
        (PARALLEL, 5, 2),  # case 001: inside a block of parallel results -> before the calling assistant
        (PARALLEL, 3, 2),
        (PARALLEL, 2, 2),
        (PARALLEL, 1, 1),
        ([SYS, USER, TOOL_USE, TOOL_RESULT], 3, 2),  # case 002: tool_result block stays with its tool_use
        ([tool("x"), tool("y")], 1, 0),
    ],
)
def test_group_start_never_splits_a_pair(messages, start, expected):
    assert group_start(CHAT.items(messages), start) == expected


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (PARALLEL, []),
        ([SYS, USER, asst("x1"), {"role": "user", "content": "stop"}], [(3, ["x1"])]),  # case 004 shape
        ([USER, asst("a", "b"), tool("b"), USER], [(3, ["a"])]),
        ([USER, asst("a")], [(2, ["a"])]),
        ([USER, asst("a"), tool("a"), asst("b", "c"), tool("c")], [(5, ["b"])]),
        ([USER, TOOL_USE, USER], []),  # Anthropic blocks are not patched here
    ],
)
def test_dangling_calls(messages, expected):
    assert dangling_calls(CHAT.items(messages)) == expected


@pytest.mark.parametrize(
    "messages",
    [
        [SYS, USER, asst("x1"), {"role": "user", "content": "stop"}],
        [USER, asst("a", "b"), tool("b"), USER],
        [USER, asst("a")],
        [USER, asst("a"), tool("a"), asst("b", "c"), tool("c"), USER],
    ],
)
def test_patch_dangling_makes_a_strictly_valid_request_without_mutating_input(messages):
    before = copy.deepcopy(messages)
    assert validate_chat_messages(messages)  # the strict provider rejects the input
    patched = patch_dangling(messages, CHAT.items(messages), CHAT)
    assert messages == before
    assert patched is not None and validate_chat_messages(patched) == []
    synthetic = [m for m in patched if m.get("content") == CANCELLED_TEXT]
    assert len(patched) == len(messages) + len(synthetic) and synthetic
    assert all(m["role"] == "tool" and "name" not in m for m in synthetic)
    originals = [m for m in patched if m.get("content") != CANCELLED_TEXT]
    assert all(a is b for a, b in zip(originals, messages, strict=True))  # shared, not copied


def test_patch_dangling_returns_none_when_every_call_is_answered():
    assert patch_dangling(PARALLEL, CHAT.items(PARALLEL), CHAT) is None


# --- roles the proxy does not know (issue 15): opaque, bound to the message before ----------------

IPYTHON = {"role": "ipython", "content": "42"}  # Llama's answer to a tool call (no tool_call_id)
WIZARD = {"role": "wizard", "content": "w", "x_vendor": {"k": 1}}
LISTED = {"role": ["tool"], "content": "a role that is not a string (unhashable)"}


@pytest.mark.parametrize(
    ("messages", "start", "expected"),
    [
        ([SYS, USER, asst("a"), IPYTHON, USER], 3, 2),  # an ipython answer stays with its call
        ([SYS, USER, {"role": "assistant", "content": "<|python_tag|>print(6*7)"}, IPYTHON], 3, 2),
        ([SYS, USER, asst("a", "b"), tool("a"), WIZARD, tool("b")], 5, 2),  # through a mixed block
        ([SYS, USER, WIZARD, WIZARD], 3, 1),  # a run of them stays with the message before the run
        ([USER, LISTED], 1, 0),
        ([WIZARD, USER], 0, 0),
        ([SYS, USER, IPYTHON, USER], 3, 3),  # a known message after one is a fine start
    ],
)
def test_group_start_never_starts_at_an_unknown_role(messages, start, expected):
    assert group_start(CHAT.items(messages), start) == expected


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([USER, asst("a"), IPYTHON, USER], []),  # ipython may be the answer: the provider judges
        ([USER, asst("a", "b"), tool("a"), WIZARD, USER], []),
        ([USER, asst("a"), WIZARD], []),
        ([USER, asst("a"), LISTED, USER], []),
        ([USER, asst("a"), USER, WIZARD], [(2, ["a"])]),  # not in the block: patched as before, before the user
        ([USER, asst("a"), tool("a"), WIZARD, asst("b"), USER], [(5, ["b"])]),
    ],
)
def test_dangling_calls_leave_a_block_with_an_unknown_role_alone(messages, expected):
    assert dangling_calls(CHAT.items(messages)) == expected


ALPHABET = [USER, asst("a"), asst("b"), tool("a"), tool("b"), IPYTHON, WIZARD, LISTED]


def test_no_rewrite_separates_an_unknown_role_from_the_message_before_it():
    """Every history of a system message and up to 4 of these: a kept tail never starts at an
    unknown role, and patching (which only inserts) never inserts right before one."""
    checked = 0
    for n in range(1, 5):
        for combo in itertools.product(ALPHABET, repeat=n):
            messages = [SYS, *combo]
            for start in range(len(messages)):
                s = group_start(CHAT.items(messages), start)
                assert s == 0 or messages[s]["role"] in ("system", "user", "assistant"), (messages, start)
            patched = patch_dangling(messages, CHAT.items(messages), CHAT) or messages
            for before, m in itertools.pairwise(patched):
                if m["role"] not in ("system", "user", "assistant", "tool"):
                    assert before.get("content") != CANCELLED_TEXT, (messages, patched)
            checked += 1
    assert checked == sum(len(ALPHABET) ** n for n in range(1, 5))
