"""The part rewriters (truncate arguments, offload, media) and the summary transcript are the same
code for every API: they decide over the codec's parts and rewrite through it. Here they run,
unchanged, on a Responses-shaped conversation (the test sketch) and a Messages one, directly and
through ``project``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.conversation.canonical import digests_and_chain
from proxy.conversation.chat_codec import CHAT, ChatCodec
from proxy.conversation.codec import UNCOUNTED, Codec, PartCounter
from proxy.conversation.messages_codec import MESSAGES
from proxy.conversation.model import TOOL_CALL, Part
from proxy.defenses.config import DefenseConfig
from proxy.defenses.media import UNSTORED_TEXT, offload_media
from proxy.defenses.offload import artifact_id, offload_message
from proxy.defenses.plans import TruncatePlan
from proxy.defenses.summarize import render_transcript, summary_chunks
from proxy.defenses.truncate_args import MARKER, truncate_message
from proxy.projection import ProjectionMemos, project
from proxy.tokens.counter import TokenCounter
from tests.conversation.test_responses_sketch import SKETCH
from tests.defenses.helpers import fabricate_event

TOOLS = frozenset({"write_file"})
LONG = "x" * 3000
DATA_URL = "data:image/png;base64," + "iVBORw0KGgo" * 400
SMALL = DefenseConfig(offload_tool_tokens=200, offload_user_tokens=400, context_window_tokens=None)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter("o200k_base")


# --- Responses: a function_call item, its output item, input_text / input_image parts ---

def test_truncate_args_on_a_responses_function_call() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "write_file",
            "arguments": json.dumps({"path": "p.py", "content": LONG}), "status": "completed"}
    out = truncate_message(call, TOOLS, 2000, 20, item=SKETCH.item(call), codec=SKETCH)
    assert out is not None and list(out) == list(call)
    assert json.loads(out["arguments"]) == {"path": "p.py", "content": "x" * 20 + MARKER}
    assert {k: v for k, v in out.items() if k != "arguments"} == {k: v for k, v in call.items() if k != "arguments"}
    renamed = {**call, "name": "read_file"}
    assert truncate_message(renamed, TOOLS, 2000, 20, item=SKETCH.item(renamed), codec=SKETCH) is None
    output = {"type": "function_call_output", "call_id": "c1", "output": LONG}
    assert truncate_message(output, TOOLS, 2000, 20, item=SKETCH.item(output), codec=SKETCH) is None  # not a call


def test_offload_on_a_responses_function_call_output(counter: TokenCounter) -> None:
    output = {"type": "function_call_output", "call_id": "c1", "output": "line of output\n" * 400}
    new, artifacts = offload_message(output, counter.bind(CHAT).count_message(output), counter.count_text, SMALL, item=SKETCH.item(output), codec=SKETCH)
    assert new is not None and list(new) == ["type", "call_id", "output"] and new["call_id"] == "c1"
    assert new["output"].startswith("[context-proxy] This tool result was too large")
    assert [a.id for a in artifacts] == [artifact_id(output["output"])] and artifacts[0].id in new["output"]


def test_offload_on_responses_input_text_parts(counter: TokenCounter) -> None:
    big = "user pasted line\n" * 600
    message = {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "see below"}, {"type": "input_text", "text": big}]}
    new, artifacts = offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, SMALL,
                                     item=SKETCH.item(message), codec=SKETCH)
    assert new is not None and new["content"][0] is message["content"][0]
    assert new["content"][1]["type"] == "input_text" and "This user message was too large" in new["content"][1]["text"]
    assert [a.content for a in artifacts] == [big]


def test_media_on_a_responses_input_image() -> None:
    message = {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": DATA_URL, "detail": "auto"},
        {"type": "input_image", "image_url": "https://example.com/x.png"},
    ]}
    new, artifacts = offload_media(message, codec=SKETCH)
    assert new is not None and len(new["content"]) == 3
    assert new["content"][0] is message["content"][0] and new["content"][2] is message["content"][2]
    assert new["content"][1]["type"] == "input_text" and artifact_id(DATA_URL) in new["content"][1]["text"]
    assert [(a.id, a.media_type) for a in artifacts] == [(artifact_id(DATA_URL), "image/png")]
    unstored, none = offload_media(message, frozenset({artifact_id(DATA_URL)}), codec=SKETCH)
    assert unstored is not None and unstored["content"][1] == {"type": "input_text", "text": UNSTORED_TEXT} and none == []


def _responses_input() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Write the files."}]
    for k in range(6):
        items += [
            {"type": "function_call", "call_id": f"w{k}", "name": "write_file",
             "arguments": json.dumps({"path": f"f{k}.py", "content": f"print({k})\n" * 1500})},
            {"type": "function_call_output", "call_id": f"w{k}", "output": "ok"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"Wrote f{k}."}]},
        ]
    items.append({"type": "function_call_output", "call_id": "big", "output": "result line\n" * 30_000})
    return items


def test_the_projection_truncates_and_offloads_responses_items(counter: TokenCounter) -> None:
    pieces = [{"type": "function_call", "call_id": "big", "name": "run", "arguments": "{}"}]
    pieces = _responses_input()[:-1] + pieces + _responses_input()[-1:]
    digests, chain = digests_and_chain(pieces)
    kw: dict[str, Any] = {"digests": digests, "chain_hashes": chain, "counter": counter, "session_id": "s",
                          "memos": ProjectionMemos(), "codec": SKETCH}
    cfg = DefenseConfig(context_window_tokens=10_000_000)
    first = project(pieces, events=[], config=cfg, **kw)
    assert first.applied == ("offload",)  # the last output, ~60k tokens, is over the tool threshold
    assert first.messages[-1]["call_id"] == "big" and first.messages[-1]["output"].startswith("[context-proxy]")
    anchor = 12  # the 4th answer: calls 0..3 (at 1, 4, 7, 10) are before it, 4 and 5 after
    plan = TruncatePlan(chain[anchor], first.tokens_forwarded, first.tokens_forwarded - 1)
    p = project(pieces, events=[fabricate_event(plan)], config=cfg, **kw)
    assert p.applied == ("truncate_args", "offload")
    for i, piece in enumerate(p.messages[:-2]):
        if piece.get("type") == "function_call":
            args = json.loads(piece["arguments"])
            assert args["content"].endswith(MARKER) == (i <= anchor), i
            assert piece["call_id"] == pieces[i]["call_id"]
        else:
            assert piece is pieces[i]


# --- Messages: tool_use / tool_result / image blocks (cache_control kept) ---

def test_the_rewriters_on_messages_blocks(counter: TokenCounter) -> None:
    turn = {"role": "assistant", "content": [
        {"type": "text", "text": "writing"},
        {"type": "tool_use", "id": "tu", "name": "write_file", "input": {"path": "p", "content": LONG},
         "cache_control": {"type": "ephemeral"}},
    ]}
    out = truncate_message(turn, TOOLS, 2000, 20, item=MESSAGES.item(turn), codec=MESSAGES)
    assert out is not None and out["content"][0] is turn["content"][0]
    assert out["content"][1] == {**turn["content"][1], "input": {"path": "p", "content": "x" * 20 + MARKER}}
    signed = {**turn, "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"}, *turn["content"]]}
    assert truncate_message(signed, TOOLS, 2000, 20, item=MESSAGES.item(signed), codec=MESSAGES) is None  # sealed: never rewritten

    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu", "content": "row\n" * 2000, "cache_control": {"type": "ephemeral"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo" * 400}},
    ]}
    new, artifacts = offload_message(results, counter.bind(CHAT).count_message(results), counter.count_text, SMALL,
                                     item=MESSAGES.item(results), codec=MESSAGES)
    assert new is not None and new["content"][1] is results["content"][1] and len(artifacts) == 1
    block = new["content"][0]
    assert list(block) == ["type", "tool_use_id", "content", "cache_control"]
    assert block["content"].startswith("[context-proxy] This tool result was too large")
    media, arts = offload_media(results, codec=MESSAGES)
    assert media is not None and media["content"][0] is results["content"][0]
    assert media["content"][1]["type"] == "text" and arts[0].media_type == "image/png"


# --- every codec: the parts a rewrite names are the parts it replaces ---

@pytest.mark.parametrize(("codec", "piece"), [
    (CHAT, {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                             {"type": "tool_use", "id": "u", "name": "write_file", "input": {}}],
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "write_file", "arguments": "{}"}}]}),
    (MESSAGES, {"role": "assistant", "content": [{"type": "tool_use", "id": "u", "name": "write_file", "input": {}}]}),
    (SKETCH, {"type": "function_call", "call_id": "c", "name": "write_file", "arguments": "{}"}),
])
def test_with_parts_replaces_exactly_the_named_parts(codec: Codec, piece: dict[str, Any]) -> None:
    parts = codec.parts(piece, UNCOUNTED)
    calls = [i for i, p in enumerate(parts) if p.kind == TOOL_CALL]
    assert calls and all(codec.tool_call(parts[i]) is not None for i in calls)
    new = {i: codec.with_arguments(parts[i], "{}" if isinstance(codec.tool_call(parts[i]).arguments, str)
                                   else {"k": 1}) for i in calls}
    out = codec.with_parts(piece, new)
    assert list(out) == list(piece)
    after = codec.parts(out, UNCOUNTED)
    assert [p.kind for p in after] == [p.kind for p in parts]
    for i, (a, b) in enumerate(zip(parts, after, strict=True)):
        assert (b.native is a.native) == (i not in calls) or piece.get("type") == "function_call"
    assert codec.with_parts(piece, {}) is piece


# --- the summary transcript ---

def test_the_transcript_of_a_responses_conversation(counter: TokenCounter) -> None:
    pieces = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it. FACT: bug=42"},
                                                         {"type": "input_image", "image_url": DATA_URL}]},
        {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAAA" + "x" * 50},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": '{"path": "a.py"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "def f(): pass"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed."}]},
    ]
    assert render_transcript(pieces, SKETCH) == (
        f"### user\nFix it. FACT: bug=42\n[image: inline data, {len(DATA_URL)} chars]\n\n"
        "### reasoning\n[reasoning: opaque, not shown]\n\n"
        '### function_call\n-> tool call read_file (id c1): {"path": "a.py"}\n\n'
        "### tool [answer to call c1]\ndef f(): pass\n\n"
        "### assistant\nFixed.")
    big = {"type": "function_call_output", "call_id": "c2", "output": "output line\n" * 3000}
    chunks = summary_chunks([*pieces, big], 200, counter, SKETCH)
    cut = chunks[-1][-1]
    assert cut["type"] == "function_call_output" and cut["call_id"] == "c2" and "chars omitted" in cut["output"]
    assert counter.count_text(render_transcript([cut], SKETCH)) <= 200


def test_the_transcript_of_messages_turns() -> None:
    pieces = [
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "tool_use", "id": "tu", "name": "read_file", "input": {"path": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu", "content": "text of a"}]},
    ]
    assert render_transcript(pieces, MESSAGES) == (
        "### system\nBe brief.\n\n"
        '### assistant\n{"signature": "sig", "thinking": "hm", "type": "thinking"}\n'
        '-> tool call read_file (id tu): {"path": "a"}\n\n'
        "### user\n<- tool result (id tu):\ntext of a")


class _CountingChat(ChatCodec):
    name = "chat"  # the same items as chat

    def __init__(self) -> None:
        self.calls = 0

    def parts(self, piece: dict[str, Any], counter: PartCounter) -> list[Part]:
        self.calls += 1
        return super().parts(piece, counter)


def test_a_request_the_defenses_leave_alone_builds_no_parts(counter: TokenCounter) -> None:
    """The hot path: parts are built only for a piece a rewrite may change (over an offload
    threshold, or inside a truncate/media event's range)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(40):
        messages += [
            {"role": "user", "content": f"step {k}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": "write_file", "arguments": '{"p": 1}'}}]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": "ok " * 200},
        ]
    digests, chain = digests_and_chain(messages)
    codec = _CountingChat()
    kw: dict[str, Any] = {"digests": digests, "chain_hashes": chain, "counter": counter, "session_id": "s",
                          "codec": codec}
    p = project(messages, events=[], config=DefenseConfig(context_window_tokens=200_000), **kw)
    assert p.applied == () and p.messages is messages and codec.calls == 0
    big = [*messages, {"role": "tool", "tool_call_id": "c39", "content": "row\n" * 40_000}]
    digests, chain = digests_and_chain(big)
    p = project(big, events=[], config=DefenseConfig(context_window_tokens=10_000_000),
                **{**kw, "digests": digests, "chain_hashes": chain})
    assert p.applied == ("offload",) and codec.calls == 1  # only the one piece over the threshold
