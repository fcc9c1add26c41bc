"""Defense 2 (proxy/defenses/offload.py): stubs, previews, part-by-part offload, fail-safe."""

from __future__ import annotations

import copy
import hashlib
import re

import pytest

from proxy.conversation.chat_codec import CHAT
from proxy.defenses.config import DefenseConfig
from proxy.defenses.offload import artifact_id, preview
from proxy.defenses.offload import offload_message as _offload_message

CFG = DefenseConfig(context_window_tokens=None)  # thresholds 20,000 (tool) / 50,000 (user)
SMALL = DefenseConfig(context_window_tokens=4096)  # tool threshold: a quarter of the window = 1,024


def offload_message(message, tokens, count_text, config, unavailable=frozenset()):
    """``offload_message`` of a chat message (its item and the chat codec)."""
    return _offload_message(message, tokens, count_text, config, unavailable, item=CHAT.item(message), codec=CHAT)


def big_text(lines: int, first: str = "FACT: slowest=req-9931") -> str:
    return "\n".join([first] + [f"2025-01-01 12:00:{i % 60:02d} INFO request {i} handled in 12 ms" for i in range(1, lines)])


def test_artifact_id_is_content_addressed():
    assert artifact_id("abc") == "art_" + hashlib.sha256(b"abc").hexdigest()[:32]
    assert re.fullmatch(r"art_[0-9a-f]{32}", artifact_id("é"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\nb\nc", "a\nb\nc"),
        ("\n".join(str(i) for i in range(10)), "\n".join(str(i) for i in range(10))),
        ("\n".join(str(i) for i in range(25)), "0\n1\n2\n3\n4\n... [15 lines truncated] ...\n20\n21\n22\n23\n24"),
        ("y" * 1005, "y" * 1000 + "... [5 chars truncated]"),
    ],
)
def test_preview(text, expected):
    assert preview(text, 5, 1000) == expected


@pytest.mark.parametrize(
    ("window", "expected"),
    [(None, 20_000), (16_384, 4096), (200_000, 20_000), (2048, 512)],
)
def test_offload_threshold_is_the_smaller_of_20000_and_a_quarter_window(window, expected):
    assert DefenseConfig(context_window_tokens=window).offload_tool_threshold_tokens == expected


def test_large_tool_result_becomes_a_tool_stub(counter):
    text = big_text(2500)
    message = {"role": "tool", "tool_call_id": "call_log", "content": text}
    before = copy.deepcopy(message)
    tokens = counter.bind(CHAT).count_message(message)
    new, artifacts = offload_message(message, tokens, counter.count_text, SMALL)
    assert message == before
    assert new["role"] == "tool" and new["tool_call_id"] == "call_log"  # case 020
    art = artifacts[0]
    assert art.id == artifact_id(text) and art.content == text and art.media_type == "text/plain"
    stub = new["content"]
    assert f"/artifacts/{art.id}" in stub and "?offset=LINE&limit=LINES" in stub
    assert "2500 lines" in stub and f"{len(text)} chars" in stub
    assert "FACT: slowest=req-9931" in stub  # head of the preview
    assert "... [2490 lines truncated] ..." in stub
    assert text.splitlines()[-1] in stub
    assert counter.count_text(stub) < 400


@pytest.mark.parametrize(
    ("message", "config"),
    [
        ({"role": "tool", "tool_call_id": "a", "content": big_text(20)}, SMALL),  # under 1,024 tokens
        ({"role": "user", "content": big_text(1000)}, SMALL),  # user threshold stays 50,000
        ({"role": "assistant", "content": big_text(2500)}, SMALL),
        ({"role": "system", "content": big_text(2500)}, SMALL),
    ],
)
def test_small_or_other_roles_are_not_offloaded(counter, message, config):
    assert offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, config) == (None, [])


def test_user_message_over_50000_tokens_is_offloaded(counter):
    message = {"role": "user", "name": "alice", "content": big_text(6000)}
    new, artifacts = offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, CFG)
    assert new["role"] == "user" and new["name"] == "alice"
    assert "user message" in new["content"] and artifacts[0].id in new["content"]


def test_content_list_is_offloaded_part_by_part_and_keeps_its_shape(counter):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    message = {"role": "tool", "tool_call_id": "t", "content": [
        {"type": "text", "text": "short header"}, {"type": "text", "text": big_text(2500)}, image]}
    new, artifacts = offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, SMALL)
    assert [p["type"] for p in new["content"]] == ["text", "text", "image_url"]
    assert new["content"][0] is message["content"][0] and new["content"][2] is image
    assert artifacts[0].id in new["content"][1]["text"]


def test_anthropic_tool_result_block_is_offloaded_in_place(counter):
    message = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": big_text(2500)}]}
    new, artifacts = offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, SMALL)
    part = new["content"][0]
    assert part["type"] == "tool_result" and part["tool_use_id"] == "tu1"
    assert artifacts[0].id in part["content"]


def test_unavailable_artifact_keeps_the_original(counter):
    text = big_text(2500)
    message = {"role": "tool", "tool_call_id": "a", "content": text}
    new, artifacts = offload_message(
        message, counter.bind(CHAT).count_message(message), counter.count_text, SMALL, frozenset({artifact_id(text)})
    )
    assert new is None and artifacts == []


def test_stub_names_the_read_tool_when_configured(counter):
    cfg = DefenseConfig(context_window_tokens=4096, read_tool_name="context_proxy_read")
    message = {"role": "tool", "tool_call_id": "a", "content": big_text(2500)}
    new, _ = offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, cfg)
    assert "`context_proxy_read`" in new["content"]


def test_only_parts_the_codec_reads_as_text_are_offloaded(counter):
    """Chat, as before the codecs: a bare string inside a content list, an ``input_text`` part and a
    ``tool_result`` with block content are kept as sent; a ``text`` part is offloaded."""
    text = big_text(2500)
    message = {"role": "tool", "tool_call_id": "c", "content": [
        text, {"type": "input_text", "text": text},
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": text}]},
        {"type": "text", "text": text},
    ]}
    new, artifacts = offload_message(message, counter.bind(CHAT).count_message(message), counter.count_text, SMALL)
    assert new is not None and new["content"][:3] == message["content"][:3]
    assert new["content"][3]["text"].startswith("[context-proxy] This tool result")
    assert len(artifacts) == 1
