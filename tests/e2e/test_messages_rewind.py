"""A rewind after a compaction (Claude Code's Esc Esc: the user edits a prompt the proxy already
compacted past): the summary still applies (its anchor is in the new branch), and the turns made
on the new branch, over the projected prefix, keep their thinking; only the turns made before the
event lose theirs (found by breaking the route: every kept turn lost its thinking, and in
``enabled`` mode the branch then failed on every request)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.test_messages_defenses import MODEL, READ, SYSTEM, file_text, is_summary_call, models_file
from tests.fakes.anthropic import reply, text, thinking, tool_use
from tests.support.anthropic_server import ANTHROPIC_KEY

SESSION = "0f6a3a5e-1d52-4c1e-9a52-5b8a3f0c9d55"
H = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01", "x-claude-code-session-id": SESSION}


def model(req: Any) -> Any:
    body = req.json
    if is_summary_call(body):
        return reply(text("## Summary\nearlier tasks done"))
    last = body["messages"][-1]
    if isinstance(last["content"], str):  # a new task: one tool call
        return reply(thinking("I will read a file."), tool_use("read_file", {"path": "src/f1.py"}))
    return reply(thinking("Got it."), text("Task done."))


def call(c: httpx.Client, messages: list[Any], mode: str) -> httpx.Response:
    cfg = {"type": "enabled", "budget_tokens": 1024} if mode == "enabled" else {"type": "adaptive"}
    return c.post("/v1/messages", json={"model": MODEL, "max_tokens": 2048, "system": SYSTEM, "tools": [READ],
                                        "thinking": cfg, "messages": messages})


def task(c: httpx.Client, messages: list[Any], t: int, mode: str) -> list[Any]:
    """Run one task: user text -> thinking+tool_use -> result -> thinking+text. Returns the history."""
    messages = messages + [{"role": "user", "content": f"Task {t}: read a file."}]
    r = call(c, messages, mode)
    assert r.status_code == 200, (t, r.text)
    a = r.json()["content"]
    (tu,) = [b for b in a if b["type"] == "tool_use"]
    messages = messages + [{"role": "assistant", "content": a},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu["id"],
                                                         "content": file_text(t)}]}]
    r = call(c, messages, mode)
    assert r.status_code == 200, (t, r.text, r.headers.get("x-context-proxy-defenses"))
    return messages + [{"role": "assistant", "content": r.json()["content"]}]


def until_summarized(c: httpx.Client, mode: str, state: Any) -> tuple[list[Any], int]:
    """Tasks until the proxy summarizes; the history before the last task's prompt (the request
    that sent it planned the summary) and the number of tasks run."""
    messages: list[Any] = []
    before: list[Any] = []
    t = 0
    while not any(is_summary_call(q.json) for q in state.message_requests):
        before = messages
        messages = task(c, messages, t, mode)
        t += 1
        assert t < 20
    return before, t


@pytest.mark.parametrize("mode", ["enabled", "adaptive"])
def test_rewind_of_the_prompt_that_planned_a_summary(mode: str, anthropic_proxy: Any, anthropic_state: Any,
                                                     tmp_path: Any) -> None:
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = model
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}), keep_fraction=0.35)
    with httpx.Client(base_url=url, headers=H, timeout=60) as c:
        before, t = until_summarized(c, mode, anthropic_state)
        # the summary was planned by the request that sent "Task {t-1}" (a user text turn)
        events = c.get(f"/sessions/{SESSION}/events").json()["data"]
        assert events and all(e["payload"]["made_before"] for e in events)
        # the user rewinds and edits that prompt (Claude Code: Esc Esc), then the task goes on
        edited = before + [{"role": "user", "content": f"Task {t-1} (edited): read a file."}]
        r = call(c, edited, mode)
        assert r.status_code == 200, r.text
        a = r.json()["content"]
        (tu,) = [b for b in a if b["type"] == "tool_use"]
        edited += [{"role": "assistant", "content": a},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu["id"], "content": "short"}]}]
        r = call(c, edited, mode)
        fwd = anthropic_state.message_requests[-1].json["messages"]
        assert r.status_code == 200, r.text
        assert [m for m in fwd if m["role"] == "assistant"][-1]["content"] == a  # made over the projection: kept


def test_after_a_rewind_the_branch_goes_on_working(anthropic_proxy: Any, anthropic_state: Any, tmp_path: Any) -> None:
    mode = "enabled"
    anthropic_state.windows[MODEL] = 12_000
    anthropic_state.responder = model
    url = anthropic_proxy(models_file=models_file(tmp_path, {MODEL: 12_000}), keep_fraction=0.35)
    with httpx.Client(base_url=url, headers=H, timeout=60) as c:
        before, t = until_summarized(c, mode, anthropic_state)
        edited = list(before)
        statuses = []
        for n in range(3):  # the user edits the prompt, and later keeps giving new tasks
            edited = edited + [{"role": "user", "content": f"Task {t-1} (edited {n}): read a file."}]
            r = call(c, edited, mode)
            a = r.json()["content"]
            (tu,) = [b for b in a if b["type"] == "tool_use"]
            edited += [{"role": "assistant", "content": a},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu["id"], "content": "short"}]}]
            r = call(c, edited, mode)
            statuses.append(r.status_code)
            if r.status_code == 200:
                edited += [{"role": "assistant", "content": r.json()["content"]}]
            else:
                edited += [{"role": "assistant", "content": [{"type": "text", "text": "(API error)"}]}]
        assert statuses == [200, 200, 200]
