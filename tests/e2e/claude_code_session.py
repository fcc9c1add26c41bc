"""One Claude Code run through the proxy, for ``tests/e2e/test_claude_code.py``: run as a program
inside a network namespace with only loopback (``unshare -n``), so nothing the CLI tries reaches
a network.

    python -m tests.e2e.claude_code_session CLAUDE_BINARY WORKDIR RESULT_JSON [STEPS]

It starts the strict fake Anthropic provider (``tests.fakes.anthropic``) and the proxy in front of
it, each on a real socket, and runs ``claude -p`` in ``WORKDIR`` (a git repository) with
``ANTHROPIC_BASE_URL`` on the proxy. The fake plays a model doing a two-step task with Claude
Code's own tools: ``Write`` a file, then ``Bash`` to read it back (or, with ``STEPS``, that many
``Bash`` build steps of about 3,000 tokens each at a 32,000-token window: ``long_model``), then a
final answer, each turn
starting with a signed thinking block when the request turns thinking on (as Claude Code does). Requests
that offer no tools (Claude Code's side calls to its small model) get the fake's echo. Writes
``RESULT_JSON``: the CLI's exit code, stdout and stderr's tail, and each request the fake received
(path, query, outcome, error, input tokens, the tools' names, the last user turn's block types,
the build steps it names, whether it is a summary call of the proxy's), and what the
proxy logged of each session Claude Code named (``X-Claude-Code-Session-Id``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from proxy.app import create_app
from proxy.defenses.summarize import SUMMARY_PHRASE
from proxy.settings import Settings
from tests.fakes.anthropic import Reply, create_fake_anthropic, echo_responder, reply, text, thinking, tool_use
from tests.fakes.anthropic.replies import last_user_text
from tests.fakes.server import UvicornServer
from tests.support.polling import wait_for

KEY = "sk-ant-claude-code-test"
FILE_TEXT = "context-proxy was here\n"
FINAL_TEXT = "Done: hello.txt says context-proxy was here."


def _tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    last = body["messages"][-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def scripted_model(workdir: str) -> Any:
    """The fake's responder: the task's steps, decided from the conversation so far."""

    def respond(request: Any) -> Reply:
        body = request.json
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if not {"Write", "Bash"} <= tools:
            return echo_responder(request)
        done = {m["content"][i].get("name") for m in body["messages"] if m.get("role") == "assistant"
                and isinstance(m.get("content"), list) for i in range(len(m["content"]))
                if isinstance(m["content"][i], dict) and m["content"][i].get("type") == "tool_use"}
        # with thinking on, an assistant turn of a tool loop starts with a (signed) thinking block
        think = [thinking("Next step of the task.")] if (body.get("thinking") or {}).get("type") in (
            "enabled", "adaptive") else []
        if "Write" not in done:
            return reply(*think, text("I will write the file."),
                         tool_use("Write", {"file_path": f"{workdir}/hello.txt", "content": FILE_TEXT}))
        if "Bash" not in done:
            return reply(*think, tool_use("Bash", {"command": "cat hello.txt", "description": "Show hello.txt"}))
        return reply(*think, text(FINAL_TEXT))

    return respond


MODEL = "claude-sonnet-4-5"
LONG_WINDOW_TOKENS = 32_000
"""The long task's window (the fake's and the proxy's): Claude Code's system prompt and tools alone
take about 19,000 tokens of it, its replies 4,096 (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``)."""
LONG_OUTPUT_TOKENS = 4_096
STEP_MARK = "STEP-DONE"


def long_model(steps: int, workdir: str) -> Any:
    """The long task: ``Write`` hello.txt, then ``steps`` ``Bash`` commands each printing a build
    log of about 3,000 tokens (its first line ``STEP-DONE k``, so the step is read from the latest
    result, whatever was summarized before it), then the final answer. A summary call is answered
    with the markers its transcript holds."""

    def respond(request: Any) -> Reply:
        body = request.json
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if not {"Write", "Bash"} <= tools or "detailed summary" in last_user_text(body).lower():
            # a summary call: the proxy's (no tools), or Claude Code's own compaction
            said = "\n".join(sorted(set(re.findall(rf"{STEP_MARK} \d+", json.dumps(body)))))
            return reply(text("<summary>\n## Session intent\nWrite hello.txt, then run the build steps.\n"
                              f"{said}\n</summary>"))
        think = [thinking("Next step of the task.")] if (body.get("thinking") or {}).get("type") in (
            "enabled", "adaptive") else []
        results = _tool_results(body)
        # the steps done: the latest result's mark, or (after a summary) the marks the summary kept
        marks = [int(n) for n in re.findall(rf"{STEP_MARK} (\d+)", json.dumps(results or body["messages"]))]
        if not results and not marks:
            return reply(*think, tool_use("Write", {"file_path": f"{workdir}/hello.txt", "content": FILE_TEXT}))
        k = max(marks) + 1 if marks else 1
        if k > steps:
            return reply(*think, text(FINAL_TEXT))
        command = (f"printf '{STEP_MARK} {k}\\n'; seq -f 'step {k} build log line %g: compiling module "
                   f"with -O2 -Wall and linking' 1 230")
        return reply(*think, tool_use("Bash", {"command": command, "description": f"Build step {k}"}))

    return respond


def main(binary: str, workdir: str, result_path: str, steps: str = "0") -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    app, state = create_fake_anthropic()
    long = int(steps)
    state.responder = long_model(long, workdir) if long else scripted_model(workdir)
    home = tempfile.mkdtemp(prefix="claude-home-")
    with UvicornServer(app) as fake, tempfile.TemporaryDirectory() as db:
        windows = {}
        if long:  # the proxy knows the window as the provider has it
            state.windows[MODEL] = LONG_WINDOW_TOKENS
            models = Path(db) / "models.yaml"
            models.write_text(f'"{MODEL}":\n  context_window_tokens: {LONG_WINDOW_TOKENS}\n')
            windows = {"models_file": str(models)}
        settings = Settings(anthropic_upstream_url=fake.url, upstream_url="http://127.0.0.1:9/v1",
                            database_url=f"sqlite:///{db}/proxy.db", tiktoken_cache_dir=os.environ.get(
                                "TIKTOKEN_CACHE_DIR"), **windows)
        with UvicornServer(create_app(settings)) as proxy:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "ANTHROPIC_BASE_URL": proxy.url,
                   "ANTHROPIC_API_KEY": KEY, "IS_SANDBOX": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                   "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
            if long:
                env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(LONG_OUTPUT_TOKENS)
            task = "Write hello.txt, then run the build steps." if long else "Write hello.txt, then show it."
            try:
                run = subprocess.run([binary, "-p", task, "--dangerously-skip-permissions", "--model", MODEL],
                                     env=env, cwd=workdir, capture_output=True, text=True, timeout=240)
            except subprocess.TimeoutExpired as exc:  # recorded as a failed run, with what the fake saw
                run = subprocess.CompletedProcess(exc.cmd, -9, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)")
            sessions = _sessions(proxy.url, [r.headers.get("x-claude-code-session-id") for r in state.requests])
    received = [{"path": r.path, "query": r.query, "outcome": r.outcome, "error": r.error,
                 "input_tokens": r.input_tokens, "max_tokens": (r.json or {}).get("max_tokens") if isinstance(
                     r.json, dict) else None,
                 "tools": [t.get("name") for t in (r.json or {}).get("tools") or []] if isinstance(r.json, dict) else [],
                 "last_user_blocks": _last_blocks(r.json),
                 "summary_call": isinstance(r.json, dict) and SUMMARY_PHRASE in last_user_text(r.json),
                 "steps_seen": sorted({int(n) for n in re.findall(rf"{STEP_MARK} (\d+)", json.dumps(r.json))})}
                for r in state.requests]
    Path(result_path).write_text(json.dumps({"returncode": run.returncode, "stdout": run.stdout[-4000:],
                                             "stderr": run.stderr[-4000:], "requests": received,
                                             "sessions": sessions}))


def _sessions(url: str, named: list[str | None]) -> dict[str, Any]:
    """What the proxy logged of each session Claude Code named (``named``: one per request): its
    JSON, roles, request records (the log is written after the answer: waited for until every
    request named it is recorded, up to 10 s)."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, headers={"x-api-key": KEY}, timeout=30) as http:
        for session_id in sorted({s for s in named if s}):
            def found(session_id: str = session_id) -> Any:
                r = http.get(f"/sessions/{session_id}")
                complete = r.status_code == 200 and r.json()["request_count"] >= named.count(session_id)
                return r.json() if complete else None

            summary = wait_for(found, 10.0)
            out[session_id] = {"summary": summary,
                               "roles": [m["role"] for m in http.get(f"/sessions/{session_id}/messages").json()["data"]],
                               "requests": len(http.get(f"/sessions/{session_id}/requests").json()["data"])}
    return out


def _text(output: str | bytes | None) -> str:
    return output.decode("utf-8", "replace") if isinstance(output, bytes) else output or ""


def _last_blocks(body: Any) -> list[str]:
    if not isinstance(body, dict) or not body.get("messages"):
        return []
    content = body["messages"][-1].get("content")
    return [b.get("type") for b in content if isinstance(b, dict)] if isinstance(content, list) else ["string"]


if __name__ == "__main__":
    main(*sys.argv[1:5])
