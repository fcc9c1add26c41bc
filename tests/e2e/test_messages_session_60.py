"""Issue 19, item 9: a 60-turn coding session with thinking and tools through the proxy at a
32,000-token window, streamed and not, against the strict fake Anthropic provider (signatures
bound to their prefix, pairing, breakpoints, prompt-cache emulation).

The client is the official ``anthropic`` SDK driving an agent loop as Claude Code does: a
breakpoint on the system prompt and on the newest turn's last block, every reply echoed back as
the SDK parsed it. The scripted model reads one file per turn (about 1,100 tokens, each with a
``FACT`` line); every ten turns the user asks the next thing (a new tool cycle); at the end the
user asks for every fact, and the model answers from the prompt it was given (a summary keeps
FACT lines, as a competent summarizer does). Measured and printed: turns completed, requests the
provider rejected, facts recalled, summary calls, prefix stability (the mean share of each
forwarded body's bytes that the next one repeats; without ``cache_control``, which the client
moves to its newest turn on every request, and with it), and the share of input tokens the
provider's prompt cache served."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.defenses.summarize import SUMMARY_PHRASE
from tests.e2e.test_messages_defenses import models_file
from tests.fakes.anthropic import FakeAnthropicState, Responder, reply, text, thinking, tool_use
from tests.fakes.anthropic.replies import Reply, last_user_text, strings
from tests.support.anthropic_server import anthropic_client
from tests.test_projection_stability import prefix_stability

MODEL = "claude-coding-32k"
WINDOW = 32_000
TURNS = 60
CYCLE = 10
READ: Any = {"name": "read_file", "description": "Read a file of the repository",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM: Any = [{"type": "text", "text": "You are a coding agent. Read files with read_file.",
                "cache_control": {"type": "ephemeral"}}]


def fact(k: int) -> str:
    return f"FACT: key{k}=value-{k * 7919 % 100_000}"


def file_text(k: int, size: int = 90) -> str:
    """Module ``k``'s source: ``size`` lines (about 12 tokens each), its fact in the middle."""
    lines = [f"src/module_{k}.py line {i}: result = transform(data[{i}], factor={k})" for i in range(size)]
    lines.insert(size // 2, fact(k))
    return "\n".join(lines)


def is_summary_call(body: Any) -> bool:
    return SUMMARY_PHRASE in last_user_text(body)


def coding_model(request: Any) -> Reply:
    """Reads file ``k`` while the last result names ``k - 1`` (or the user asked for more), answers
    a cycle's end with text, the final question with every fact the prompt holds."""
    body = request.json
    prompt = "\n".join(strings(body.get("messages")))
    if is_summary_call(body):
        kept = sorted({line.strip() for line in prompt.splitlines() if "FACT:" in line or "READ-DONE" in line})
        return reply(text("## Session intent\nRead the modules.\n## Summary and decisions\n" + "\n".join(kept)))
    last = last_user_text(body)
    if "every fact" in last:
        found = sorted(set(re.findall(r"FACT: (key\d+=value-\d+)", prompt)))
        return reply(thinking("Collect the facts."), text("\n".join(f"ANSWER: {f}" for f in found)))
    done = [int(n) for n in re.findall(r"READ-DONE (\d+)", prompt)]
    k = max(done) + 1 if done else 0
    if k % CYCLE == 0 and k and f"READ-DONE {k - 1}" in prompt and "Go on" not in last:
        return reply(thinking("This batch is read."), text(f"Read modules up to {k - 1}."))
    return reply(thinking(f"Module {k} is next."), tool_use("read_file", {"path": f"src/module_{k}.py"}))


def marked(messages: list[Any]) -> list[Any]:
    """The messages with a breakpoint on the newest turn's last block (Claude Code's marking)."""
    last = messages[-1]
    content = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
    return [*messages[:-1], {**last, "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]}]


def unmarked(value: Any) -> Any:
    """``value`` without ``cache_control`` keys and with a turn's string content as its one text
    block (the client moves its newest-turn breakpoint on every request, ``marked``: a change the
    proxy forwards as it came, not one it makes; the API reads a string content as that block)."""
    if isinstance(value, dict):
        if "role" in value and isinstance(value.get("content"), str):
            value = value | {"content": [{"type": "text", "text": value["content"]}]}
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def send(c: Any, messages: list[Any], stream: bool) -> Any:
    """One request as the agent sends it (the newest turn marked), streamed or not: the Message."""
    args: Any = {"model": MODEL, "max_tokens": 2048, "system": SYSTEM, "tools": [READ],
                 "thinking": {"type": "adaptive"}, "messages": marked(messages)}
    if stream:
        with c.messages.stream(**args) as s:
            return s.get_final_message()
    return c.messages.create(**args)


def echo(message: Any) -> dict[str, Any]:
    """The assistant turn the agent sends back (the SDK's parsed blocks)."""
    return {"role": "assistant", "content": [b.model_dump() for b in message.content]}


def read_modules(c: Any, stream: bool, between: Callable[[list[Any], int], list[Any]] | None = None,
                 source: Callable[[int], str] = file_text) -> tuple[list[Any], int]:
    """The agent loop until ``TURNS`` modules are read and the model said so: ``(history, turns)``,
    the history ending with the model's text; module ``k`` reads ``source(k)``. Every ten modules
    the user asks for the next ones; before that, ``between(history, modules read)`` may add turns
    of its own (it returns the history to go on with; its turns are its own to count)."""
    messages: list[Any] = [{"role": "user", "content": "Read the modules one by one."}]
    for turns in range(1, 2 * TURNS):
        message = send(c, messages, stream)
        messages.append(echo(message))
        calls = [b for b in message.content if b.type == "tool_use"]
        if calls:
            k = int(calls[0].input["path"][len("src/module_"):-3])
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": calls[0].id, "content": f"READ-DONE {k}\n" + source(k)}]})
            continue
        read = len(re.findall(r"READ-DONE \d+", orjson.dumps(messages).decode()))
        if read >= TURNS:
            return messages, turns
        if between is not None:
            messages = between(messages, read)
        messages.append({"role": "user", "content": "Go on with the next modules."})
    raise AssertionError(f"the modules were not read in {2 * TURNS} turns")


def figures(main: list[Any]) -> tuple[float, float, float]:
    """``(prefix stability, the same with the client's moving breakpoint, cache-read share of input
    tokens)`` over the forwarded requests ``main`` (the fake's records, in order)."""
    bodies = [{k: r.json[k] for k in ("system", "tools", "messages")} for r in main]
    raw_stability = prefix_stability([orjson.dumps(b) for b in bodies])
    stability = prefix_stability([orjson.dumps(unmarked(b)) for b in bodies])
    total_input = sum(r.usage["input_tokens"] + r.usage["cache_creation_input_tokens"]
                      + r.usage["cache_read_input_tokens"] for r in main)
    return stability, raw_stability, sum(r.usage["cache_read_input_tokens"] for r in main) / total_input


def started(anthropic_proxy: Callable[..., str], state: FakeAnthropicState, tmp_path: Path, model: Responder) -> str:
    """The proxy's URL, ``MODEL`` at a ``WINDOW``-token window there and at the fake, ``model`` answering."""
    state.windows[MODEL] = WINDOW
    state.responder = model
    return anthropic_proxy(models_file=models_file(tmp_path, {MODEL: WINDOW}))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_60_turn_coding_session_with_thinking_at_32k(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path, stream: bool) -> None:
    url = started(anthropic_proxy, anthropic_state, tmp_path, coding_model)
    with anthropic_client(url, default_headers={"x-claude-code-session-id": "9a1f3c5e-1d52-4c1e-9a52-5b8a3f0c9d60"}) as c:
        messages, turns = read_modules(c, stream)
        messages.append({"role": "user", "content": "Now tell me every fact you have read."})
        message = send(c, messages, stream)
        turns += 1
    answered = message.content[-1].text
    seen = anthropic_state.message_requests
    main = [r for r in seen if not is_summary_call(r.json)]
    rejected = [(r.status, r.error) for r in seen if r.status != 200]
    recalled = sum(f"ANSWER: {fact(k)[6:]}" in answered for k in range(TURNS))
    stability, raw_stability, cached = figures(main)
    summaries = [r for r in seen if is_summary_call(r.json)]
    print(f"\n60-turn Messages session at 32k ({'streamed' if stream else 'whole'}): {len(main)} requests, "
          f"{len(rejected)} rejected, {recalled}/{TURNS} facts recalled, {len(summaries)} summary calls, "
          f"prefix stability {stability:.4f} ({raw_stability:.4f} with the client's moving breakpoint), cache-read share of input tokens {cached:.3f}, "
          f"largest forwarded prompt {max(r.input_tokens or 0 for r in main)} tokens")
    assert rejected == [], rejected
    assert len(main) == turns and turns > TURNS  # every turn answered, none retried
    assert recalled == TURNS, answered
    assert summaries and max(r.input_tokens or 0 for r in main) <= WINDOW
    assert stability >= 0.95 and cached >= 0.8  # the measured values are printed above
