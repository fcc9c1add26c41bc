"""Issue 19, item 9, through the read tool: the 60-turn coding session of
``test_messages_session_60`` (official ``anthropic`` SDK, thinking and tools, 32,000-token window,
streamed and not, the strict fake Anthropic provider: signatures bound to their prefix, pairing,
breakpoints, prompt cache), with a lossy summarizer: a summary keeps what was done (``READ-DONE``
lines) and none of the ``FACT`` lines. Every tenth module is big enough to be offloaded, its fact
in the middle, out of the preview. So a fact summarized or offloaded away is kept only by the
session's archive or an artifact.

The user asks for the facts in the session itself, ``GROUP`` keys a question, kept in the history
as Claude Code keeps them: at each ten modules' end those of modules read twenty or more modules
before, at the end the rest. The scripted model answers a key from its prompt when the fact is
there; the keys it cannot, it searches for with the proxy's read tool (``context_proxy_read``,
offered in Anthropic's shape after the client's tools, found as the chat path's fake model finds
it: ``tests/fakes/read_tool.py``), one search for them all, and answers from the results; without
the tool it can only answer ``unknown``. The rounds are put back on later requests and summarized
with the rest.

Asserted: every turn answered, none retried, no request refused; every fact recalled, and each
fact absent from the request its question was first forwarded in came back through a read round
the proxy served (its result carries the fact), the offloaded ones included; the client never
sees the proxy's call; the tool, once offered, stays offered; the forwarded prefix changes only at
a compaction or the tool's first offer. Printed: facts recalled, via the read tool, rounds served,
prefix stability and the cache-read share of input tokens."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.test_messages_session_60 import (
    CYCLE,
    READ,
    TURNS,
    WINDOW,
    coding_model,
    echo,
    fact,
    figures,
    file_text,
    is_summary_call,
    read_modules,
    send,
    started,
    unmarked,
)
from tests.fakes.anthropic import FakeAnthropicState, reply, text, thinking, tool_use
from tests.fakes.anthropic.replies import Reply, last_user_text, strings
from tests.fakes.read_tool import QUESTION, read_tool_name
from tests.support.anthropic_server import anthropic_client
from tests.test_projection_stability import prefix_stability

GROUP = CYCLE
"""Keys asked per question."""
BIG = range(5, TURNS, CYCLE)
"""Modules of 800 lines (about 9,600 tokens, over a quarter of the window: offloaded, their facts
in the middle left out of the preview); the others have 90."""


def module(k: int) -> str:
    return file_text(k, 800 if k in BIG else 90)


def key(k: int) -> str:
    return fact(k)[len("FACT: "):].split("=")[0]


def lossy_summary(body: Any) -> Reply:
    """A summary that keeps the progress (``READ-DONE`` lines) and drops every fact."""
    prompt = "\n".join(strings(body.get("messages")))
    kept = sorted({line.strip() for line in prompt.splitlines() if "READ-DONE" in line})
    return reply(text("## Session intent\nRead the modules.\n## Progress\n" + "\n".join(kept)))


def asked(messages: list[Any]) -> tuple[list[str], bool]:
    """``(keys the question asks, answered by a read round)``: the question is the last user turn
    with text; after a round, the turn before the round's call."""
    last = messages[-1]
    results = isinstance(last.get("content"), list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"])
    question = messages[:-2] if results else messages
    return QUESTION.findall(last_user_text({"messages": question})), bool(results)


def readback_model(request: Any) -> Reply:
    """``coding_model`` with a lossy summarizer; asked ``QUESTION: <key>``s, it answers each key
    from the prompt; the keys it cannot, it searches for with the offered read tool (one search,
    once), then answers from the results, or ``unknown``."""
    body = request.json
    if is_summary_call(body):
        return lossy_summary(body)
    keys, after_round = asked(body["messages"])
    if not keys:
        return coding_model(request)
    prompt = "\n".join(strings(body["messages"]))
    values = {k: m.group(1) for k in keys if (m := re.search(rf"FACT: {k}=(value-\d+)", prompt))}
    name = read_tool_name(body)
    missing = [k for k in keys if k not in values]
    if missing and name is not None and not after_round:  # one search: a line matches any of its words
        return reply(thinking("Some of these were in files read long ago; search for them."),
                     text("Let me look those up."), tool_use(name, {"query": " ".join(f"{k}=" for k in missing)}))
    return reply(thinking("Answer from what I have."),
                 text("\n".join(f"ANSWER: {k}={values.get(k, 'unknown')}" for k in keys)))


def own_round(request: Any, name: str) -> tuple[str, ...]:
    """The results of a read round the request carries last (the proxy's call answered), else ``()``."""
    messages = request.json["messages"]
    if len(messages) < 2 or not all(isinstance(m["content"], list) for m in messages[-2:]):
        return ()
    calls = {b["id"] for b in messages[-2]["content"] if b.get("type") == "tool_use" and b["name"] == name}
    return tuple(s for b in messages[-1]["content"] if b.get("type") == "tool_result" and b["tool_use_id"] in calls
                 for s in strings(b.get("content")))


class Questions:
    """The user's questions, asked in the session itself: ``GROUP`` keys a question, answered and
    kept; per key, whether the request its question was first forwarded in showed its fact, and
    whether a read round the proxy served carried it."""

    def __init__(self, c: Any, state: FakeAnthropicState, stream: bool) -> None:
        self.c, self.state, self.stream = c, state, stream
        self.asked: list[str] = []
        self.answers: dict[str, str] = {}
        self.in_prompt: set[str] = set()
        self.via_tool: set[str] = set()
        self.turns = self.rounds = 0

    def ask(self, messages: list[Any], keys: list[str]) -> list[Any]:
        """Ask for ``keys`` after ``messages``; the history with the question and its answer."""
        before = len(self.state.message_requests)
        question = {"role": "user", "content": "What were these? " + " ".join(f"QUESTION: {k}" for k in keys)}
        message = send(self.c, [*messages, question], self.stream)
        self.turns += 1
        self.asked += keys
        assert message.stop_reason == "end_turn", message.content
        assert all(b.type != "tool_use" for b in message.content)  # the proxy's call never reaches the client
        self.answers |= dict(re.findall(r"ANSWER: (key\d+)=(\S+)", message.content[-1].text))
        forwarded = [r for r in self.state.message_requests[before:] if not is_summary_call(r.json)]
        shown = {k for k in keys if f"FACT: {k}=".encode() in forwarded[0].raw}
        served = [own_round(r, "context_proxy_read") for r in forwarded[1:]]
        read = "\n".join(s for results in served for s in results)
        self.in_prompt |= shown
        self.via_tool |= {k for k in keys if k not in shown and f"FACT: {k}=" in read}
        self.rounds += sum(bool(results) for results in served)
        return [*messages, question, echo(message)]

    def up_to(self, messages: list[Any], end: int) -> list[Any]:
        """Ask, ``GROUP`` keys a question, for the facts of modules before ``end`` not asked yet."""
        keys = [key(k) for k in range(end) if key(k) not in self.asked]
        for at in range(0, len(keys), GROUP):
            messages = self.ask(messages, keys[at:at + GROUP])
        return messages


def breaks(seen: list[Any]) -> list[str]:
    """Why each forwarded request kept less than 90% of the one before it (``figures``' measure):
    ``compaction`` (a summary call came between them), ``offer`` (the read tool was offered for the
    first time: the tool list comes first in the cache's order) or ``other``. Each such pair costs the
    prefix stability about 1/(requests - 1): this session's extra content (the questions, their
    rounds, the big modules) makes one compaction more than ``test_messages_session_60``'s, and the
    first offload offers the tool before the first summary, hence a mean under its 0.95."""
    out = []
    forwarded = [(i, r) for i, r in enumerate(seen) if not is_summary_call(r.json)]
    for (i, a), (j, b) in zip(forwarded, forwarded[1:]):
        if prefix_stability([orjson.dumps(unmarked({k: r.json[k] for k in ("system", "tools", "messages")}))
                             for r in (a, b)]) >= 0.9:
            continue
        if any(is_summary_call(r.json) for r in seen[i + 1:j]):
            out.append("compaction")
        else:
            out.append("offer" if read_tool_name(a.json) is None and read_tool_name(b.json) else "other")
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_60_turn_session_with_a_lossy_summarizer_recalls_every_fact_through_the_read_tool(
        anthropic_proxy: Callable[..., str], anthropic_state: FakeAnthropicState, tmp_path: Path, stream: bool) -> None:
    url = started(anthropic_proxy, anthropic_state, tmp_path, readback_model)
    session = {"x-claude-code-session-id": "5c0e7d21-8b4f-4d0a-a1f3-6e0a2d5b9c61"}
    with anthropic_client(url, default_headers=session) as c:
        q = Questions(c, anthropic_state, stream)
        history, turns = read_modules(c, stream, lambda messages, read: q.up_to(messages, read - 2 * CYCLE), module)
        q.up_to(history, TURNS)

    seen = anthropic_state.message_requests
    main = [r for r in seen if not is_summary_call(r.json)]
    rejected = [(r.status, r.error) for r in seen if r.status != 200]
    recalled = [k for k in range(TURNS) if q.answers.get(key(k)) == fact(k).split("=")[1]]
    lost = {key(k) for k in range(TURNS)} - q.in_prompt
    summaries = [r for r in seen if is_summary_call(r.json)]
    stability, raw_stability, cached = figures(main)
    print(f"\n60-turn Messages session at 32k, lossy summaries ({'streamed' if stream else 'whole'}): "
          f"{len(main)} requests, {len(rejected)} rejected, {len(recalled)}/{TURNS} facts recalled, "
          f"{len(lost)} of them not in the question's prompt ({len(BIG)} offloaded), {len(q.via_tool)} recalled "
          f"via the read tool in "
          f"{q.rounds} rounds, {len(summaries)} summary calls, prefix stability {stability:.4f} ({raw_stability:.4f} "
          f"with the client's moving breakpoint), cache-read share of input tokens {cached:.3f}, "
          f"largest forwarded prompt {max(r.input_tokens or 0 for r in main)} tokens")
    assert rejected == [], rejected
    assert len(main) == turns + q.turns + q.rounds  # every turn answered, a read round one request more, none retried
    assert sorted(q.asked) == sorted(key(k) for k in range(TURNS)) and len(recalled) == TURNS, q.answers
    assert lost == q.via_tool and len(lost) >= TURNS // 2  # each fact summarized away came back through the tool
    assert {key(k) for k in BIG} <= q.via_tool  # offloaded: their facts came back through the tool too
    offered = [read_tool_name(r.json) for r in main]
    assert offered == sorted(offered, key=bool) and offered[-1] == "context_proxy_read"  # once offered, kept
    assert all(r.json["tools"][0] == READ for r in main)  # ours after the client's tool
    assert summaries and max(r.input_tokens or 0 for r in main) <= WINDOW
    assert breaks(seen) == ["offer", *["compaction"] * (len(breaks(seen)) - 1)]
    assert cached >= 0.8  # the measured values are printed above
