"""Opaque where the proxy does not understand (issue 15, item 3), on the real servers.

A role the proxy does not know is the provider's to judge: refused, the provider's own 400 reaches
the client byte for byte; accepted (Llama's ``ipython``), the message is forwarded as sent, logged,
and kept next to the message before it when a summary cuts the history. Fields the proxy does not
know, on the body, on messages and on content parts, survive every rewrite in their place, and
the summarizer sees those of the messages it summarizes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.conftest import Proxy, Upstream, wait_logged
from tests.strict import validate_chat_messages

MODEL = "fake-32k-openai"
"""No profile in the proxy (fallback thresholds, set per test); a 32k window upstream."""

SYSTEM = {"role": "system", "content": "You are a Llama agent with a python tool."}


def post(proxy: Proxy, raw: bytes, session: str | None = None) -> httpx.Response:
    headers = {"content-type": "application/json", **({"x-session-id": session} if session else {})}
    with proxy.http() as http:
        return http.post("/v1/chat/completions", content=raw, headers=headers)


def model_calls(upstream: Upstream) -> list[Any]:
    return upstream.state.model_requests


# --- (a) a role the provider refuses: its own 400, unchanged --------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_role_the_provider_refuses_gets_the_providers_own_400(proxy: Proxy, upstream: Upstream, stream: bool) -> None:
    raw = orjson.dumps({"model": MODEL, "stream": stream,
                        "messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "abracadabra"}]})
    with httpx.Client(timeout=30) as direct:
        expected = direct.post(upstream.url + "/chat/completions", content=raw, headers={"content-type": "application/json"})
    upstream.state.requests.clear()
    r = post(proxy, raw, session=f"wizard-{stream}")
    assert (r.status_code, r.content) == (expected.status_code, expected.content)  # byte for byte
    assert r.headers["content-type"] == expected.headers["content-type"]
    assert r.json() == {"error": {  # OpenAI's published answer (the fake plays it)
        "message": "Invalid value: 'wizard'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.",
        "type": "invalid_request_error", "param": "messages[1].role", "code": "invalid_value"}}
    (call,) = upstream.state.chat_requests  # forwarded once, as sent, and not retried
    assert call.body == raw
    wait_logged(proxy, f"wizard-{stream}", 1)
    with proxy.http() as http:
        logged = http.get(f"/sessions/wizard-{stream}/messages").json()["data"]
    assert [(m["role"], m["content"]) for m in logged] == [("user", "hi"), ("wizard", "abracadabra")]  # kept in the log


def test_the_sdk_sees_the_providers_error_for_an_unknown_role(proxy: Proxy) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        proxy.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}])
    assert err.value.code == "invalid_value" and err.value.param == "messages[1].role"


# --- (b) a role the provider accepts: forwarded, logged, kept with its neighbour ------------------

def llama_history(turns: int) -> list[dict[str, Any]]:
    """Llama's built-in code tool: the call is assistant text after ``<|python_tag|>``, its result
    an ``ipython`` message (no ``tool_calls``, no ``tool_call_id``)."""
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Compute for me. FACT: project=apollo"}]
    for k in range(turns):
        history += [
            {"role": "assistant", "content": f"<|python_tag|>print({k} * 7)"},
            {"role": "ipython", "content": f"{k * 7}\n" + f"step {k} output line\n" * 20, "x_exec_ms": k},
            {"role": "assistant", "content": f"{k} times 7 is {k * 7}."},
            {"role": "user", "content": f"Next: {k + 1} times 7."},
        ]
    return history[:-1] + [{"role": "user", "content": "QUESTION: project"}]


def test_an_accepted_unknown_role_is_forwarded_logged_and_kept_with_its_neighbour(
    proxy_factory: Callable[..., Proxy], upstream: Upstream
) -> None:
    upstream.state.extra_roles = ("ipython",)
    history = llama_history(12)
    keep = 3  # counted from the end, the kept tail would start at an ipython answer
    assert history[-keep]["role"] == "ipython" and history[-keep - 1]["content"].startswith("<|python_tag|>")
    proxy = proxy_factory(fallback_trigger_tokens=1500, fallback_keep_messages=keep, summary_max_tokens=128)
    r = post(proxy, orjson.dumps({"model": MODEL, "messages": history}), session="llama")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "ANSWER: apollo"
    assert "summary" in r.headers["x-context-proxy-defenses"].split(",")
    (call,) = model_calls(upstream)
    sent = call.json["messages"]
    assert validate_chat_messages(sent, extra_roles=("ipython",)) == []
    tail = [m for m in sent if m["role"] != "system" and not str(m.get("content")).startswith("[context-proxy]")]
    assert tail[0]["role"] == "assistant" and tail[0]["content"].startswith("<|python_tag|>")  # the call, then its answer
    assert [orjson.dumps(m) for m in tail] == [orjson.dumps(m) for m in history[-len(tail):]]  # as sent, key order too
    assert len(tail) == keep + 1
    transcript = "".join(c.json["messages"][0]["content"] for c in upstream.state.summary_requests)  # chunks
    assert "### ipython\n0\nstep 0 output line" in transcript and "[x_exec_ms] 1" in transcript  # by name
    wait_logged(proxy, "llama", 1)
    with proxy.http() as http:
        logged = http.get("/sessions/llama/messages").json()["data"]
    assert [m["role"] for m in logged] == [m["role"] for m in history] + ["assistant"]
    ipython = [m for m in logged if m["role"] == "ipython"]
    assert len(ipython) == 12 and ipython[2]["content"] == history[11]["content"] and ipython[2]["x_exec_ms"] == 2


# --- (c) unknown fields survive the rewrites, in their place --------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}, "x_tool_meta": 1},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
]


def tool_call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}, "x_call": cid}


def fields_history() -> list[dict[str, Any]]:
    """An agent's history with unknown fields everywhere: an old ``write_file`` call with a long
    argument (truncated), a large tool result (offloaded), a call the user interrupted (patched)."""
    log = "".join(f"2025-01-01 12:00:{i % 60:02d} worker {i} did a thing\n" for i in range(900))
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"x_first": "before the role", "role": "user", "x_vendor_note": "FACT: color=blue",
         "content": [{"x_part_first": 0, "type": "text", "text": "Write the config, then read the log.", "x_part": {"c": "e"}}]},
        {"role": "assistant", "content": None, "x_asst": {"b": 2, "a": 1},
         "tool_calls": [tool_call("call_w1", "write_file", {"path": "a.cfg", "content": "key = value\n" * 400})]},
        {"x_tool_first": True, "role": "tool", "tool_call_id": "call_w1", "content": "written", "x_tool": [1]},
        {"role": "assistant", "content": "Now the log.", "tool_calls": [tool_call("call_r1", "read_file", {"path": "app.log"})]},
        {"role": "tool", "tool_call_id": "call_r1", "x_tool_first": 1,
         "content": [{"type": "text", "text": log, "x_part": "p"}, {"type": "text", "text": "end", "x_end": None}]},
        {"role": "assistant", "content": "Checking one more file.", "x_interrupted": "yes",
         "tool_calls": [tool_call("call_r2", "read_file", {"path": "b.cfg"})]},  # dangling: the user interrupted
        {"role": "user", "content": [{"type": "text", "text": "Go on.", "x_last_part": [0]}], "x_user": "z"},
    ]


def in_place(sent: dict[str, Any], original: dict[str, Any]) -> None:
    """``sent`` has the keys of ``original`` in their order (none added, none dropped), and the
    unknown ones (``x_`` prefix) with their values."""
    assert list(sent) == list(original), (list(sent), list(original))
    for key, value in original.items():
        if key.startswith("x_"):
            assert sent[key] == value, key


def check_body(sent: dict[str, Any], body: dict[str, Any]) -> None:
    assert [k for k in sent if k in body] == list(body)  # in their order (the proxy may add its read tool)
    assert sent["x_body_first"] == body["x_body_first"] and sent["x_body_last"] == body["x_body_last"]
    assert sent["tools"][: len(TOOLS)] == TOOLS


def test_unknown_fields_survive_the_rewrites_in_their_place(proxy_factory: Callable[..., Proxy], upstream: Upstream) -> None:
    history = fields_history()
    body = {"x_body_first": {"trace": "t-1"}, "model": MODEL, "messages": history, "tools": TOOLS,
            "x_body_last": [1, None, {"z": 0, "a": 1}]}
    proxy = proxy_factory(fallback_trigger_tokens=1200, fallback_keep_messages=4, summary_max_tokens=128,
                          offload_tool_tokens=1000, truncate_args_max_chars=500)
    # turn 1: the old write_file argument is truncated, the log offloaded, the interrupted call answered
    r = post(proxy, orjson.dumps(body), session="fields")
    assert r.status_code == 200, r.text
    assert {"truncate_args", "offload", "patch_dangling"} <= set(r.headers["x-context-proxy-defenses"].split(","))
    (first,) = model_calls(upstream)
    check_body(first.json, body)
    msgs = first.json["messages"]
    assert validate_chat_messages(msgs) == []
    assert [orjson.dumps(m) for m in msgs[:2]] == [orjson.dumps(m) for m in history[:2]]
    truncated = msgs[2]
    in_place(truncated, history[2])
    in_place(truncated["tool_calls"][0], history[2]["tool_calls"][0])
    assert "truncated" in truncated["tool_calls"][0]["function"]["arguments"]
    offloaded = msgs[5]
    in_place(offloaded, history[5])
    assert offloaded["content"][0]["text"].startswith("[context-proxy]")  # the stub, in the part that held the log
    in_place(offloaded["content"][0], history[5]["content"][0])
    assert offloaded["content"][1] == history[5]["content"][1] and list(offloaded["content"][1]) == ["type", "text", "x_end"]
    assert orjson.dumps(msgs[6]) == orjson.dumps(history[6])
    assert msgs[7]["tool_call_id"] == "call_r2"  # the synthetic answer, right after the interrupted call
    assert orjson.dumps(msgs[8]) == orjson.dumps(history[7])
    # turn 2: more conversation; the summary sees the unknown fields of what it summarizes
    history = history + [r.json()["choices"][0]["message"]]
    for k in range(6):
        history += [{"role": "user", "content": f"Explain part {k} of the log. " + "Details please. " * 40},
                    {"role": "assistant", "content": f"Part {k} shows workers starting. " + "They did things. " * 40}]
    history.append({"role": "user", "content": [{"type": "text", "text": "QUESTION: color", "x_q": 1}], "x_user": "q"})
    body = body | {"messages": history}
    upstream.state.requests.clear()
    r = post(proxy, orjson.dumps(body), session="fields")
    assert r.status_code == 200, r.text
    assert "summary" in r.headers["x-context-proxy-defenses"].split(",")
    assert "[x_vendor_note] FACT: color=blue" in "".join(c.json["messages"][0]["content"] for c in upstream.state.summary_requests)
    assert r.json()["choices"][0]["message"]["content"] == "ANSWER: blue"  # the summary kept the field's fact
    (second,) = model_calls(upstream)
    check_body(second.json, body)
    assert orjson.dumps(second.json["messages"][-1]) == orjson.dumps(history[-1])
