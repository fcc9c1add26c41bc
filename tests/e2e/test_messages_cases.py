"""The public Anthropic Messages cases of ``../shared/cases`` (034, 035, 037, 044, 047) as
end-to-end tests: the case's request through the real proxy (uvicorn) to the strict fake Anthropic
provider, set up by the case's rules (its window from the model name, the cases' signature
convention with each block bound to the prefix of the client's own request, the harness's model:
a summarization request answered with the FACT lines it holds, ``QUESTION: key`` answered from
a ``FACT: key=value`` anywhere in the forwarded prompt). Each checks what the case expects of
every forwarded request and of the client's answer."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from proxy.defenses.summarize import SUMMARY_PHRASE
from tests.e2e.test_cases import expected_answer, load_case
from tests.fakes.anthropic import FakeAnthropicState, reply, text
from tests.fakes.anthropic.replies import Reply, last_user_text, strings
from tests.fakes.anthropic.thinking import issue_case_blocks
from tests.fakes.anthropic.turns import merge_turns
from tests.support.anthropic_server import ANTHROPIC_KEY

HEADERS = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}


def harness_model(request: Any) -> Reply:
    """The cases' model: a summarization request gets a summary keeping every FACT line; a
    ``QUESTION: key`` gets ``ANSWER: value`` from a FACT line anywhere in the prompt."""
    body = request.json
    prompt = "\n".join(strings({"system": body.get("system"), "messages": body.get("messages")}))
    last = last_user_text(body)
    if SUMMARY_PHRASE in last or "summary" in last.lower():
        facts = sorted({line.strip() for line in prompt.splitlines() if "FACT:" in line})
        return reply(text("## Summary of the conversation\n" + "\n".join(facts)))
    question = re.search(r"QUESTION: (\S+)", last)
    if question:
        found = re.search(rf"FACT: {re.escape(question.group(1))}=(\S+)", prompt)
        return reply(text(f"ANSWER: {found.group(1) if found else 'unknown'}"))
    return reply(text("OK"))


def setup(state: FakeAnthropicState, case: dict[str, Any]) -> dict[str, Any]:
    """The fake as the case's rules say; the client's request (its thinking blocks issued against
    its own prefix)."""
    body = case["request"]
    state.windows[body["model"]] = case["upstream"]["context_window_tokens"]
    state.responder = harness_model
    state.output_room_checked = False  # the cases' rules compare the prompt alone with the window
    issue_case_blocks(body, merge_turns(body["messages"]), state.issued)
    return body


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as http:
        return http.post("/v1/messages", content=orjson.dumps(body), headers={"content-type": "application/json"})


def summary_calls(state: FakeAnthropicState) -> list[Any]:
    return [r for r in state.message_requests if SUMMARY_PHRASE in last_user_text(r.json)]


def model_calls(state: FakeAnthropicState) -> list[Any]:
    return [r for r in state.message_requests if SUMMARY_PHRASE not in last_user_text(r.json)]


def assert_every_forwarded_accepted(state: FakeAnthropicState, window: int) -> None:
    """Every request the fake rejected was an overflow (at most one), and the last one was answered
    within the window."""
    rejected = [(r.outcome, r.error) for r in state.message_requests if r.status != 200]
    assert all(outcome == "overflow" for outcome, _ in rejected) and len(rejected) <= 1, rejected
    last = model_calls(state)[-1]
    assert last.status == 200 and last.input_tokens is not None and last.input_tokens <= window


def answer_text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    assert content[0]["type"] == "text"
    return str(content[0]["text"])


def test_case_034_the_latest_cycle_and_its_prefix_go_byte_identical_and_only_its_results_are_cut(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    case = load_case("034")
    body = setup(anthropic_state, case)
    r = post(anthropic_proxy(), body)
    assert answer_text(r) == expected_answer(case)
    assert_every_forwarded_accepted(anthropic_state, 4096)
    assert not summary_calls(anthropic_state)  # nothing before the latest turn was summarized
    for call in model_calls(anthropic_state):
        sent = call.json
        assert sent["system"] == body["system"]
        # the client's tools byte-identical, first; the proxy's read tool after them (results were offloaded)
        assert sent["tools"][:len(body["tools"])] == body["tools"]
        names_stored = "art_" in str(sent["messages"])
        assert [t["name"] for t in sent["tools"][len(body["tools"]):]] == (["context_proxy_read"] if names_stored else [])
        assert sent["messages"][:-1] == body["messages"][:-1]  # the latest assistant turn and all before it
        last, theirs = sent["messages"][-1], body["messages"][-1]
        assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
        assert last["content"][1] == theirs["content"][1]
        assert last["content"][0]["tool_use_id"] == "toolu_c3"
    cut = model_calls(anthropic_state)[-1].json["messages"][-1]["content"][0]
    assert cut["content"] != body["messages"][-1]["content"][0]["content"]
    assert "FACT: risky_migration=0042_drop_legacy_index" in str(cut["content"]) and "[context-proxy]" in str(cut)


def test_case_035_kept_turns_lose_their_stale_thinking_and_keep_their_text(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    case = load_case("035")
    body = setup(anthropic_state, case)
    r = post(anthropic_proxy(), body)
    assert answer_text(r) == expected_answer(case)
    assert_every_forwarded_accepted(anthropic_state, 4096)
    last = model_calls(anthropic_state)[-1].json
    assert last["system"] == body["system"]
    originals = {orjson.dumps(m) for m in body["messages"]}
    rewritten = False
    for m in last["messages"]:
        content = m["content"] if isinstance(m["content"], list) else []
        assert m["role"] != "assistant" or content, m  # never an empty assistant turn
        if any(b.get("type") == "thinking" for b in content):
            assert not rewritten, "a thinking block after the rewritten region"
        if orjson.dumps(m) not in originals:
            rewritten = True
        if m["role"] == "assistant":
            assert any(b["type"] == "text" and b["text"] for b in content)  # its text block kept
    assert rewritten and "FACT: billing_owner=team-ledger" in "\n".join(strings(last["messages"]))


def test_case_037_parallel_results_stay_first_and_together_the_big_one_cut_in_place(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    case = load_case("037")
    body = setup(anthropic_state, case)
    r = post(anthropic_proxy(), body)
    assert answer_text(r) == expected_answer(case)
    assert_every_forwarded_accepted(anthropic_state, 2048)
    theirs = body["messages"][-1]["content"]
    for call in model_calls(anthropic_state):
        msgs = call.json["messages"]
        results = msgs[-1]["content"]
        assert msgs[-2]["role"] == "assistant" and [b["type"] for b in msgs[-2]["content"]] == ["text", "tool_use",
                                                                                                   "tool_use"]
        assert [(b["type"], b.get("tool_use_id")) for b in results] == [
            ("tool_result", "toolu_p1"), ("tool_result", "toolu_p2"), ("text", None)]
        assert results[1] == theirs[1] and results[2] == theirs[2]  # the small result still a list of text blocks
    cut = model_calls(anthropic_state)[-1].json["messages"][-1]["content"][0]
    assert "[context-proxy]" in str(cut["content"]) and "FACT: db_port=5433" in str(cut["content"])


def test_case_044_a_stream_retried_after_the_overflow_carries_the_retrys_usage(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    case = load_case("044")
    body = setup(anthropic_state, case)
    with httpx.Client(base_url=anthropic_proxy(), headers=HEADERS, timeout=60) as http:
        with http.stream("POST", "/v1/messages", content=orjson.dumps(body),
                         headers={"content-type": "application/json"}) as r:
            assert r.status_code == 200
            raw = b"".join(r.iter_bytes())
    events = [(m.group(1), orjson.loads(m.group(2))) for m in re.finditer(rb"event: (\w+)\ndata: (.*)\n", raw)]
    names = [e for e, _ in events]
    assert names.count(b"message_start") == 1 and names.count(b"message_stop") == 1 and b"error" not in names
    assert names[0] == b"message_start" and names[-1] == b"message_stop"
    said = "".join(d["delta"].get("text", "") for e, d in events if e == b"content_block_delta")
    assert said == expected_answer(case)
    calls = model_calls(anthropic_state)
    assert [c.outcome for c in calls] == ["overflow", "ok"] and len(summary_calls(anthropic_state)) >= 1
    assert all(c.json.get("stream") is not True for c in summary_calls(anthropic_state))  # its own, not streamed
    retried = calls[-1]
    assert retried.json["stream"] is True
    start = next(d for e, d in events if e == b"message_start")["message"]["usage"]
    delta = next(d for e, d in events if e == b"message_delta")["usage"]
    assert start["input_tokens"] == retried.usage["input_tokens"] > 0 and retried.usage["input_tokens"] <= 2048
    assert delta["output_tokens"] == retried.usage["output_tokens"]
    for field in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        assert start[field] == retried.usage[field]


def test_case_047_the_clients_own_compaction_request_is_not_summarized_again(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState) -> None:
    case = load_case("047")
    body = setup(anthropic_state, case)
    r = post(anthropic_proxy(), body)
    said = answer_text(r)
    assert "FACT: blocked_license=AGPL-3.0" in said and "FACT: audit_scope=payments-service" in said
    assert_every_forwarded_accepted(anthropic_state, 2048)
    assert not summary_calls(anthropic_state)  # no summary of the proxy's own
    for call in anthropic_state.message_requests:
        msgs = call.json["messages"]
        assert msgs[0] == body["messages"][0] and msgs[-1] == body["messages"][-1]  # verbatim
        assert call.json.get("tools") is None  # no read tool added
    result = model_calls(anthropic_state)[-1].json["messages"][2]["content"][0]
    assert result["tool_use_id"] == "toolu_k1" and "[context-proxy]" in str(result["content"])


@pytest.mark.parametrize("case_id", ["034", "035", "037", "044", "047"])
def test_the_messages_cases_are_anthropic_cases(case_id: str) -> None:
    assert load_case(case_id)["api"] == "anthropic-messages"
