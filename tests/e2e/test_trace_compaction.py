"""Every shared trace replayed through the proxy at 16k and 32k windows (issue 3, item 10).

Each trace runs turn by turn as its agent did, through the official ``openai`` SDK (streaming on
every other turn) against the strict fake provider, which enforces the window, validates tool-call
pairing and answers overflows in one provider's style (rotated across traces). At 32k the proxy
knows the window from a models file and compacts before the provider objects; at 16k it does not,
and learns the window from the first overflow error. A fact planted in the first user message
must still be answerable at the end; no error may reach the client; the log must equal the trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SHARED_DIR
from tests.e2e.conftest import Proxy, Upstream, wait_logged
from tests.strict import validate_chat_messages

TRACES = sorted((SHARED_DIR / "traces").glob("*.jsonl")) if (SHARED_DIR / "traces").is_dir() else []
STYLES = ["openai", "vllm", "anthropic", "gemini", "llamacpp", "lmstudio", "tgi", "mistral", "deepseek",
          "fireworks", "together", "openrouter", "xai", "moonshot", "dashscope", "sglang", "azure"]
FACT = "FACT: launch_code={code}"


def load_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def turns(trace: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(index of the assistant reply, reply) for each assistant message: the history before it is a request."""
    return [(i, m) for i, m in enumerate(trace) if m["role"] == "assistant"]


def canonical_view(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: m.get(k) for k in ("role", "content", "tool_calls", "tool_call_id") if m.get(k) not in (None, "", [])}
    if out.get("role") == "assistant" and out.get("content") == "":
        out.pop("content")
    return out


def replay(proxy: Proxy, upstream: Upstream, trace: list[dict[str, Any]], model: str, session: str, code: str) -> None:
    trace = [dict(m) for m in trace]
    first_user = next(i for i, m in enumerate(trace) if m["role"] == "user")
    trace[first_user]["content"] = f"{trace[first_user]['content']}\n{FACT.format(code=code)}"
    client = proxy.client(default_headers={"x-session-id": session})
    for n, (i, reply) in enumerate(turns(trace)):
        upstream.state.script.append({k: v for k, v in reply.items() if k in ("content", "tool_calls")})
        history = trace[:i]
        if n % 2:
            stream = client.chat.completions.create(model=model, messages=history, stream=True)
            chunks = list(stream)
            assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        else:
            client.chat.completions.create(model=model, messages=history)
    # the last question: answer any calls the trace's final reply left open, as the client would
    tail = trace[-1]
    answers = [{"role": "tool", "tool_call_id": c["id"], "content": "done"} for c in tail.get("tool_calls") or []]
    question = {"role": "user", "content": "QUESTION: launch_code"}
    final = client.chat.completions.create(model=model, messages=[*trace, *answers, question])
    assert final.choices[0].message.content == f"ANSWER: {code}"
    wait_logged(proxy, session, len(turns(trace)) + 1)
    with proxy.http() as http:
        logged: list[dict[str, Any]] = []
        after = None
        while True:
            page = http.get(f"/sessions/{session}/messages", params={"limit": 1000, **({"after": after} if after else {})}).json()
            logged += page["data"]
            if not page["has_more"]:
                break
            after = page["last_id"]
    assert [canonical_view(m) for m in logged[: len(trace)]] == [canonical_view(m) for m in trace]
    assert not any(m["internal"] for m in logged)


def check_forwarded(upstream: Upstream, window: int) -> None:
    for call in upstream.state.chat_requests:
        assert validate_chat_messages(call.json["messages"]) == [], call.is_summary
        if call.outcome == "ok":
            assert call.prompt_tokens <= window
    bad = [c for c in upstream.state.chat_requests if c.outcome not in ("ok", "overflow")]
    assert bad == [], [(c.outcome, c.status) for c in bad]


def run_trace(path: Path, window: int, proxy_factory: Any, upstream: Upstream, tmp_path: Path) -> None:
    style = STYLES[(TRACES.index(path) + (window == 32_768)) % len(STYLES)]
    model = f"fake-{window // 1024}k-{style}"
    settings: dict[str, Any] = {}
    if window == 32_768:
        models = tmp_path / "models.yaml"
        models.write_text(f'"{model}":\n  context_window_tokens: {window}\n')
        settings["models_file"] = str(models)
    proxy = proxy_factory(**settings)
    replay(proxy, upstream, load_trace(path), model, f"replay-{path.stem[:40]}-{window}", code=f"LC-{window}-{len(path.stem)}")
    check_forwarded(upstream, window)
    summaries = upstream.state.summary_requests
    total = sum(len(json.dumps(m)) for m in load_trace(path)) // 4
    if total > window:  # a trace longer than the window must have been compacted
        assert summaries or any(c.json and "art_" in c.body.decode() for c in upstream.state.chat_requests)


NO_TRACES = f"{SHARED_DIR}/traces is absent (the shared traces live there)"


@pytest.mark.skipif(not TRACES, reason=NO_TRACES)
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem.split("__")[1])
def test_trace_replay_at_16k_learning_the_window(path: Path, proxy_factory: Any, upstream: Upstream, tmp_path: Path) -> None:
    """16k, window unknown to the proxy: learned from the first overflow (SQLite and PostgreSQL)."""
    run_trace(path, 16_384, proxy_factory, upstream, tmp_path)
