"""Every shared trace, converted to Anthropic Messages, replayed through the proxy at 16k and 32k
windows (issue 19, item 8), as ``test_trace_compaction.py`` does for chat.

Each trace runs turn by turn through the official ``anthropic`` SDK (streaming on every other
turn) against the strict fake Anthropic provider, with thinking on (adaptive, as Claude Code
sends it): the fake answers each turn with the trace's reply, a signed thinking block first, and
fills the tool ids; the client echoes the reply as the SDK parsed it and answers its calls with
the trace's tool results (one ``user`` turn of ``tool_result`` blocks per assistant turn). At 32k
the proxy knows the window from a models file; at 16k it learns it from the provider's first
``prompt is too long``. A fact planted in the first user turn must be answerable at the end; no
error may reach the client; every request the fake took must pass its checks (signatures bound
to their prefix, pairing, breakpoints, the window).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.defenses.summarize import SUMMARY_PHRASE
from tests.e2e.test_trace_compaction import NO_TRACES, TRACES, load_trace
from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.fakes.anthropic.replies import Reply, last_user_text, strings

FACT = "FACT: launch_code={code}"
MAX_TOKENS = 4096
"""Room for the longest reply of a trace (the fake cuts a reply at ``max_tokens``, its calls with it)."""


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else "\n".join(strings(content))


class TraceModel:
    """The fake's model: the trace's next reply (queued by the replay), a summary call answered with
    the FACT lines its transcript holds, the final question from the prompt's FACT lines."""

    def __init__(self) -> None:
        self.queue: list[Reply] = []

    def __call__(self, request: Any) -> Reply:
        body = request.json
        prompt = "\n".join(strings({"system": body.get("system"), "messages": body.get("messages")}))
        last = last_user_text(body)
        if SUMMARY_PHRASE in last:
            facts = sorted({line.strip() for line in prompt.splitlines() if "FACT:" in line})
            return reply(text("## Session intent\nReplay the trace.\n## Summary and decisions\n" + "\n".join(facts)))
        if "QUESTION: launch_code" in last:
            found = re.search(r"FACT: launch_code=(\S+)", prompt)
            return reply(text(f"ANSWER: {found.group(1) if found else 'unknown'}"))
        assert self.queue, "a request the replay did not expect"
        return self.queue.pop(0)


def _input(arguments: Any) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": str(arguments)}


def replay(url: str, trace: list[dict[str, Any]], model: str, session: str, code: str, model_fake: TraceModel) -> None:
    from tests.support.anthropic_server import anthropic_client

    system = "\n\n".join(text_of(m["content"]) for m in trace if m["role"] == "system") or None
    rest = [m for m in trace if m["role"] != "system"]
    messages: list[Any] = []
    results: list[Any] = []  # the pending tool_result blocks of the last assistant turn
    ids: dict[str, str] = {}  # the trace's call id -> the tool_use id the fake gave
    open_calls: list[str] = []
    planted = False
    turn = 0

    def flush() -> None:
        nonlocal results, open_calls
        answered = {b["tool_use_id"] for b in results}
        results += [{"type": "tool_result", "tool_use_id": cid, "content": "(no output)"} for cid in open_calls
                    if cid not in answered]  # a call the trace left unanswered, answered as a client would
        if results:
            messages.append({"role": "user", "content": results})
        results, open_calls = [], []

    with anthropic_client(url, default_headers={"x-claude-code-session-id": session}) as c:
        for m in rest:
            if m["role"] == "tool":
                cid = ids.get(str(m.get("tool_call_id")))
                if cid is not None and cid in open_calls:
                    results.append({"type": "tool_result", "tool_use_id": cid, "content": text_of(m["content"]) or "(empty)"})
                continue
            if m["role"] == "user":
                flush()
                said = text_of(m["content"]) or "(empty)"
                if not planted:
                    said, planted = f"{said}\n{FACT.format(code=code)}", True
                if messages and messages[-1]["role"] == "user":  # (the API merges them; kept apart as sent)
                    messages.append({"role": "assistant", "content": [{"type": "text", "text": "(noted)"}]})
                messages.append({"role": "user", "content": said})
                continue
            if m["role"] != "assistant":
                continue
            flush()
            if not messages or messages[-1]["role"] != "user":
                messages.append({"role": "user", "content": "Continue."})
            calls = m.get("tool_calls") or []
            blocks: list[Any] = [thinking(f"Turn {turn} of the trace.")]
            if text_of(m.get("content")).strip():
                blocks.append(text(text_of(m["content"])))
            blocks += [tool_use(str((call.get("function") or {}).get("name") or "tool"),
                                _input((call.get("function") or {}).get("arguments"))) for call in calls]
            if len(blocks) == 1:
                blocks.append(text("(no output)"))
            model_fake.queue.append(reply(*blocks))
            args: Any = {"model": model, "max_tokens": MAX_TOKENS, "thinking": {"type": "adaptive"}, "messages": messages,
                         **({"system": system} if system else {})}
            if turn % 2:
                with c.messages.stream(**args) as s:
                    message = s.get_final_message()
            else:
                message = c.messages.create(**args)
            turn += 1
            messages = [*messages, {"role": "assistant", "content": [b.model_dump() for b in message.content]}]
            given = [b.id for b in message.content if b.type == "tool_use"]
            ids.update(zip((str(call.get("id")) for call in calls), given, strict=True))
            open_calls = given
        flush()
        if messages[-1]["role"] == "user":
            messages[-1] = {**messages[-1], "content": [
                *(messages[-1]["content"] if isinstance(messages[-1]["content"], list)
                  else [{"type": "text", "text": messages[-1]["content"]}]),
                {"type": "text", "text": "QUESTION: launch_code"}]}
        else:
            messages.append({"role": "user", "content": "QUESTION: launch_code"})
        final = c.messages.create(model=model, max_tokens=MAX_TOKENS, thinking={"type": "adaptive"}, messages=messages,
                                  **({"system": system} if system else {}))
    assert final.content[-1].type == "text" and final.content[-1].text == f"ANSWER: {code}"


def run(path: Path, window: int, anthropic_proxy: Callable[..., str], state: FakeAnthropicState,
        tmp_path: Path) -> None:
    model = f"claude-trace-{window // 1024}k"
    state.windows[model] = window
    model_fake = TraceModel()
    state.responder = model_fake
    settings: dict[str, Any] = {}
    if window == 32_768:  # known: compacted before the provider objects
        models = tmp_path / "models.yaml"
        models.write_text(f'"{model}":\n  context_window_tokens: {window}\n')
        settings["models_file"] = str(models)
    url = anthropic_proxy(**settings)
    replay(url, load_trace(path), model, f"messages-replay-{path.stem[:40]}-{window}",
           f"LC-{window}-{len(path.stem)}", model_fake)
    seen = state.message_requests
    bad = [(r.status, r.outcome, r.error) for r in seen if r.status != 200 and r.outcome != "overflow"]
    assert bad == [], bad
    overflows = [r for r in seen if r.outcome == "overflow"]
    assert len(overflows) <= (0 if window == 32_768 else 3), [r.error for r in overflows]
    assert all(r.input_tokens is not None and r.input_tokens <= window for r in seen if r.status == 200)


@pytest.mark.skipif(not TRACES, reason=NO_TRACES)
@pytest.mark.parametrize("window", [16_384, 32_768], ids=["16k", "32k"])
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem.split("__")[1])
def test_trace_replayed_as_messages(path: Path, window: int, anthropic_proxy: Callable[..., str],
                                    anthropic_state: FakeAnthropicState, tmp_path: Path) -> None:
    run(path, window, anthropic_proxy, anthropic_state, tmp_path)
