"""proxy/forward/rounds.py, in process: one round loop for streams and not (tool rounds, overflow retry).

The proxy app and the fake provider run in the test's event loop (``tests.support.inprocess``). The
fake model reads back an offloaded tool result with the proxy's read tool (``tests/fakes/read_tool.py``)
and answers from it; a round of that loop is made to overflow with a provider error queued by a
responder (``FakeState.fail_next``), the way a provider answers a prompt the round made too long.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.read_tool import respond_read_tool
from tests.fakes.responders import Prompt, Reply
from tests.fakes.state import FakeState
from tests.support.inprocess import FakeProvider, InProcessProxy
from tests.support.shared import needs_exact_encodings

MODEL = "fake-32k-openai"
READ = "context_proxy_read"
TOOLS = [{"type": "function", "function": {"name": "fetch_log", "description": "Fetch a log.",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
def models_file(tmp_path: Path) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(f'"{MODEL}":\n  context_window_tokens: 32768\n')
    return str(path)


def history(fact: str, chat_turns: int = 0) -> list[dict[str, Any]]:
    """A conversation whose big tool result is offloaded (a stub goes upstream), the fact inside it;
    ``chat_turns`` earlier exchanges of plain text (about 150 tokens each) before it."""
    rows = [f"{i:05d} INFO worker-{i % 7} processed batch {i} in {i % 97} ms" for i in range(1500)]
    rows[500] = fact
    earlier: list[dict[str, Any]] = []
    for k in range(chat_turns):
        earlier += [{"role": "user", "content": f"Step {k}: check the worker pool and report. " + "details here " * 30},
                    {"role": "assistant", "content": f"Step {k} done: the pool looks healthy. " + "notes written " * 30}]
    return [
        {"role": "system", "content": "You are an ops agent."},
        *earlier,
        {"role": "user", "content": "Fetch the deploy log."},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "fetch_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "\n".join(rows)},
        {"role": "user", "content": "QUESTION: build_id"},
    ]


def body(stream: bool, chat_turns: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "messages": history("FACT: build_id=B-7741", chat_turns), "tools": TOOLS}
    if stream:
        out |= {"stream": True, "stream_options": {"include_usage": True}}
    return out


def window_shrinks_after_the_first_read(margin_tokens: int = 200) -> Any:
    """A responder: when the model first calls the proxy's read tool, the provider's window turns out
    to be ``margin_tokens`` above that request's prompt (less than the profile said), so the next
    request, the round with the read's result, overflows (the fake's OpenAI wording, its numbers)."""

    def respond(prompt: Prompt, state: FakeState) -> Reply | None:
        reply = respond_read_tool(prompt, state)
        if reply is not None and reply.tool_calls and MODEL not in state.windows:
            state.windows[MODEL] = (state.requests[-1].prompt_tokens or 0) + margin_tokens
        return reply

    return respond


async def send(proxy: InProcessProxy, payload: dict[str, Any], session: str) -> tuple[int, dict[str, str], str, str]:
    """``(status, headers, answer text, raw body)`` of one request, streamed or not."""
    headers = {"x-session-id": session}
    if not payload.get("stream"):
        resp = await proxy.chat(payload, headers=headers)
        message = resp.json()["choices"][0]["message"] if resp.status_code == 200 else {}
        assert not message.get("tool_calls")
        if resp.status_code == 200:
            assert resp.json()["choices"][0]["finish_reason"] == "stop"
        return resp.status_code, dict(resp.headers), message.get("content") or "", resp.text
    async with proxy.http.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as resp:
        raw = (await resp.aread()).decode()
    events = [e[6:] for e in raw.split("\n\n") if e.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]", raw
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), raw
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
    assert finishes == ["stop"], raw
    return resp.status_code, dict(resp.headers), text, raw


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_the_proxys_tool_rounds_are_served_and_hidden(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, models_file: str
) -> None:
    proxy = await inprocess_factory(models_file=models_file)
    status, headers, text, raw = await send(proxy, body(stream), "rounds")
    assert status == 200 and text == "ANSWER: B-7741"
    assert READ not in raw  # the client never sees the proxy's tool
    first, *rounds = fake_provider.state.model_requests
    assert [t["function"]["name"] for t in first.json["tools"]] == ["fetch_log", READ]
    assert rounds and rounds[-1].json["messages"][-1]["role"] == "tool"
    assert "x-context-proxy-overflow-retries" not in headers
    session = await proxy.wait_logged("rounds", requests=1)
    assert session["request_count"] == 1


@needs_exact_encodings  # the window is set a margin of tokens above a prompt, as the fake counts it
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_a_later_round_that_overflows_is_compacted_and_retried(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, models_file: str
) -> None:
    state = fake_provider.state
    state.responders.insert(0, window_shrinks_after_the_first_read())
    proxy = await inprocess_factory(models_file=models_file)
    status, headers, text, raw = await send(proxy, body(stream, chat_turns=30), "later")
    assert status == 200, raw
    assert text == "ANSWER: B-7741"  # a normal answer: the provider's overflow never reaches the client
    assert READ not in raw
    if not stream:  # (a stream's headers went out with its first round, before the overflow)
        assert headers["x-context-proxy-overflow-retries"] == "1"
    assert "x-context-proxy-overflow" not in headers  # recovered: no overflow returned as it came
    outcomes = [r.outcome for r in state.model_requests]
    failed = outcomes.index("overflow")
    assert failed >= 1  # a later round overflowed, not the first request
    assert state.model_requests[failed].json["messages"][-1]["role"] == "tool"  # it carried the read's result
    retried = state.model_requests[failed + 1].json["messages"]
    # the retry starts from the client's messages again, compacted for the window the error stated
    assert not any(m.get("tool_call_id", "").startswith("call_") for m in retried if m["role"] == "tool")
    if stream:
        assert ": context-proxy is compacting after an overflow" in raw
    await proxy.wait_logged("later", requests=1)
    metrics = (await proxy.http.get("/metrics")).text
    assert 'context_proxy_overflows_total{outcome="retried"} 1.0' in metrics
    assert 'context_proxy_overflows_total{outcome="recovered"} 1.0' in metrics


@needs_exact_encodings  # the window is set a margin of tokens above a prompt, as the fake counts it
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_an_overflow_with_no_retry_left_is_the_providers_answer(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, models_file: str
) -> None:
    state = fake_provider.state
    state.responders.insert(0, window_shrinks_after_the_first_read())
    proxy = await inprocess_factory(models_file=models_file, max_overflow_retries=0)
    payload = body(stream, chat_turns=30)
    headers = {"x-session-id": "noretry"}
    if not stream:
        resp = await proxy.chat(payload, headers=headers)
        assert resp.status_code == 400  # the provider's own error, as it sent it
        assert resp.json()["error"]["code"] == "context_length_exceeded"
        assert resp.headers["x-context-proxy-overflow"] and resp.headers["x-context-proxy-overflow-retries"] == "0"
        return
    async with proxy.http.stream("POST", "/v1/chat/completions", json=payload, headers=headers) as r:
        raw = (await r.aread()).decode()
    assert r.status_code == 200  # the stream had started: the error goes in-band, as the provider worded it
    assert "context_length_exceeded" in raw and "[DONE]" not in raw


def overflow_error_after_the_first_read(state: FakeState) -> Any:
    """A responder: when the model first calls the proxy's read tool, the next request gets an
    overflow error stating a window far below what the proxy estimated it sent (8,192 tokens for a
    prompt of about 1,000 by our count: the proxy learns a window of under 1,000 of its tokens)."""

    def respond(prompt: Prompt, st: FakeState) -> Reply | None:
        reply = respond_read_tool(prompt, st)
        if reply is not None and reply.tool_calls and not st.fail_next and len(st.model_requests) == 1:
            message = "This model's maximum context length is 8192 tokens. Please reduce the length of the messages."
            st.fail_next.append(("status", 400, {"error": {"message": message, "type": "invalid_request_error",
                                                           "param": "messages", "code": "context_length_exceeded"}}))
        return reply

    return respond


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_a_read_call_with_no_budget_left_still_gets_an_answer(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, models_file: str
) -> None:
    """After the retry the learned window leaves no read budget, yet the read tool stays offered (the
    tool list does not change with the budget): the model's call is answered ``BUDGET_SPENT`` in one
    last round without the proxy's tools, and the model answers (before: an empty ``stop``)."""
    state = fake_provider.state
    state.responders.insert(0, overflow_error_after_the_first_read(state))
    proxy = await inprocess_factory(models_file=models_file)
    status, headers, text, raw = await send(proxy, body(stream), "nobudget")
    assert status == 200 and text.startswith("ANSWER: "), raw
    if not stream:
        assert headers["x-context-proxy-overflow-retries"] == "1"
    assert READ not in raw
    requests = state.model_requests
    outcomes = [r.outcome for r in requests]
    assert outcomes.count("fault") == 1  # the overflow error queued after the first read
    retried = requests[outcomes.index("fault") + 1:]
    assert READ in [t["function"]["name"] for t in retried[0].json["tools"]]  # still offered after the retry
    last = retried[-1].json
    assert last["messages"][-1]["content"].startswith("[context-proxy] Not served: the read budget")
    assert [t["function"]["name"] for t in last["tools"]] == ["fetch_log"]  # that round is the last
    assert len(retried) == 2  # one such round, then the answer


def calls_the_read_tool_always(content: str | None) -> Any:
    """A responder: the model calls the proxy's read tool in every answer, offered or not (a model
    repeating a call it made earlier in the request), with ``content`` beside it."""

    def respond(prompt: Prompt, state: FakeState) -> Reply | None:
        if prompt.is_summary:
            return None
        n = len(state.model_requests)
        call = {"id": f"call_again_{n}", "type": "function",
                "function": {"name": READ, "arguments": json.dumps({"query": "FACT build_id"})}}
        return Reply(content, [call])

    return respond


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
@pytest.mark.parametrize("content", [None, "Partial: the build id was not read."], ids=["empty", "text"])
async def test_a_read_call_no_round_can_serve_is_never_an_empty_answer(
    stream: bool, content: str | None, inprocess_factory: Any, fake_provider: FakeProvider, models_file: str
) -> None:
    """Rounds spent (``read_tool_max_rounds``) and the model calls the read tool again: the call is
    removed; its text is the answer, and with no text the client gets our 502 (in a stream, an error
    event), not an empty ``stop``."""
    state = fake_provider.state
    state.responders.insert(0, calls_the_read_tool_always(content))
    proxy = await inprocess_factory(models_file=models_file, read_tool_max_rounds=1)
    payload = body(stream)
    assert len(state.model_requests) == 0
    if content is not None:
        status, _, text, raw = await send(proxy, payload, f"unserved-{stream}")
        assert status == 200 and READ not in raw
        assert text == (content * 2 if stream else content)  # (a stream relays the text of every round)
    elif not stream:
        resp = await proxy.chat(payload, headers={"x-session-id": "unserved"})
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "unserved_tool_call"
        assert READ not in resp.text
    else:
        async with proxy.http.stream("POST", "/v1/chat/completions", json=payload,
                                     headers={"x-session-id": "unserved-s"}) as r:
            raw = (await r.aread()).decode()
        assert "unserved_tool_call" in raw and READ not in raw
        assert '"finish_reason":"' not in raw and "[DONE]" not in raw  # no end of an answer before the error
    assert len(state.model_requests) == 2  # one round served, then the call nothing could serve
    assert [t["function"]["name"] for t in state.model_requests[1].json["tools"]] == ["fetch_log"]


@needs_exact_encodings  # the window is set a margin of tokens above a prompt, as the fake counts it
@pytest.mark.parametrize("stream", [False, True], ids=["complete", "streamed"])
async def test_only_a_stream_builds_its_reply_assembler(
    stream: bool, inprocess_factory: Any, fake_provider: FakeProvider, models_file: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Turn.assembler`` is built when read: a complete answer never reads it, not even through
    the overflow retry that resets it (``Turn.reset_round``), and answers as before."""
    import proxy.forward.answers as answers

    built: list[Any] = []

    class Counted(answers.ReplyAssembler):
        def __init__(self, max_bytes: int | None = None) -> None:
            super().__init__(max_bytes)
            built.append(self)

    monkeypatch.setattr(answers, "ReplyAssembler", Counted)
    fake_provider.state.responders.insert(0, window_shrinks_after_the_first_read())
    proxy = await inprocess_factory(models_file=models_file)
    status, _, text, _ = await send(proxy, body(stream, chat_turns=30), "lazy")
    assert status == 200 and text == "ANSWER: B-7741"
    assert "overflow" in [r.outcome for r in fake_provider.state.model_requests]  # the retry ran
    assert len(built) == (1 if stream else 0)
    if stream:
        assert built[0].max_bytes == proxy.settings.stream_log_max_bytes
    await proxy.wait_logged("lazy", requests=1)


def test_a_fresh_assemblers_reset_changes_nothing() -> None:
    """What ``Turn.reset_round`` skips for an assembler never built: resetting a new one."""
    from proxy.forward.answers import Turn
    from proxy.forward.reply_assembler import ReplyAssembler

    reset = ReplyAssembler(100)
    reset.reset_round()
    assert vars(reset) == vars(ReplyAssembler(100))
    turn = Turn(100)
    turn.reset_round()
    assert turn.built is None
    assert turn.assembler is turn.built is turn.assembler and turn.built.max_bytes == 100


async def _answered(path: str, scenario: str, database_url: str, monkeypatch: pytest.MonkeyPatch,
                    models_file: str) -> tuple[Any, ...]:
    """One request that is not a stream, through ``RoundLoop.complete`` (``path`` "coroutine", its
    calls counted) or through ``exchanges`` driven to its end in its place ("generator"), on a fresh
    fake provider: what the client got and what the provider was sent."""
    from proxy.forward.rounds import RoundLoop
    from tests.fakes.upstream import create_fake_upstream
    from tests.support.inprocess import default_settings, start_inprocess

    calls: list[str] = []
    complete = RoundLoop.complete

    async def counted(self: RoundLoop, ctx: Any, turn: Any) -> None:
        calls.append("complete")
        await complete(self, ctx, turn)

    async def through_exchanges(self: RoundLoop, ctx: Any, turn: Any) -> None:
        calls.append("exchanges")
        async for _ in self.exchanges(ctx, turn):
            raise AssertionError("a request that is not a stream yielded")

    monkeypatch.setattr(RoundLoop, "complete", counted if path == "coroutine" else through_exchanges)
    app, state = create_fake_upstream()
    provider = FakeProvider(app, state)
    overrides: dict[str, Any] = {"models_file": models_file}
    payload = body(False)
    if scenario in ("retried", "no retry left"):
        state.responders.insert(0, window_shrinks_after_the_first_read())
        payload = body(False, chat_turns=30)
        if scenario == "no retry left":
            overrides["max_overflow_retries"] = 0
    elif scenario == "unserved":
        state.responders.insert(0, calls_the_read_tool_always(None))
        overrides["read_tool_max_rounds"] = 1
    elif scenario == "plain":
        payload = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}]}
    async with start_inprocess(default_settings(database_url, provider, **overrides), provider) as proxy:
        resp = await proxy.chat(payload, headers={"x-session-id": "paths"})
        await proxy.wait_logged("paths", requests=1)
        logged = (await proxy.http.get("/sessions/paths/messages")).json()["data"]
        records = (await proxy.http.get("/sessions/paths/requests")).json()["data"]
    assert calls == [path.replace("coroutine", "complete").replace("generator", "exchanges")]
    answer = resp.json()
    for key in ("id", "created"):
        answer.pop(key, None)
    headers = {k: v for k, v in resp.headers.items() if k.startswith("x-context-proxy-") and k != "x-context-proxy-request-id"}
    sent = [r.json for r in state.model_requests]
    rows = [(m["id"], m["seq"], m.get("role"), m.get("content"), m["internal"]) for m in logged]
    timed = ("id", "created_at", "latency_ms", "upstream_latency_ms")
    kept = [{k: v for k, v in r.items() if k not in timed} for r in records]
    return resp.status_code, answer, headers, sent, rows, kept


@needs_exact_encodings  # the window is set a margin of tokens above a prompt, as the fake counts it
@pytest.mark.parametrize("scenario", ["plain", "rounds", "retried", "no retry left", "unserved"])
async def test_a_complete_answer_through_the_coroutine_is_the_generators(
    scenario: str, tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch, models_file: str,
) -> None:
    """``RoundLoop.complete`` (what a request that is not a stream runs) answers, forwards and logs
    what ``exchanges`` run to its end does: the same status, answer, headers, upstream bodies and
    logged messages, in each kind of loop (a plain answer, tool rounds, an overflow retried, one
    with no retry left, a call no round can serve)."""
    import shutil

    results = []
    for path in ("coroutine", "generator"):
        db = tmp_path / f"{path}.db"
        shutil.copyfile(sqlite_template, db)
        results.append(await _answered(path, scenario, f"sqlite:///{db}", monkeypatch, models_file))
    assert results[0] == results[1]
    assert results[0][0] == {"no retry left": 400, "unserved": 502}.get(scenario, 200)
