"""One Claude Code run through the proxy, for ``tests/e2e/test_claude_code.py``: run as a program
inside a network namespace with only loopback (``unshare -n``), so nothing the CLI tries reaches
a network.

    python -m tests.e2e.claude_code_session CLAUDE_BINARY WORKDIR RESULT_JSON

It starts the strict fake Anthropic provider (``tests.fakes.anthropic``) and the proxy in front of
it, each on a real socket, and runs ``claude -p`` in ``WORKDIR`` (a git repository) with
``ANTHROPIC_BASE_URL`` on the proxy. The fake plays a model doing a two-step task with Claude
Code's own tools: ``Write`` a file, then ``Bash`` to read it back, then a final answer, each turn
starting with a signed thinking block when the request turns thinking on (as Claude Code does). Requests
that offer no tools (Claude Code's side calls to its small model) get the fake's echo. Writes
``RESULT_JSON``: the CLI's exit code, stdout and stderr's tail, and each request the fake received
(path, query, outcome, error, the tools' names, the last user turn's block types), and what the
proxy logged of each session Claude Code named (``X-Claude-Code-Session-Id``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from proxy.app import create_app
from proxy.settings import Settings
from tests.fakes.anthropic import Reply, create_fake_anthropic, echo_responder, reply, text, thinking, tool_use
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


def main(binary: str, workdir: str, result_path: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    app, state = create_fake_anthropic()
    state.responder = scripted_model(workdir)
    home = tempfile.mkdtemp(prefix="claude-home-")
    with UvicornServer(app) as fake, tempfile.TemporaryDirectory() as db:
        settings = Settings(anthropic_upstream_url=fake.url, upstream_url="http://127.0.0.1:9/v1",
                            database_url=f"sqlite:///{db}/proxy.db", tiktoken_cache_dir=os.environ.get(
                                "TIKTOKEN_CACHE_DIR"))
        with UvicornServer(create_app(settings)) as proxy:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "ANTHROPIC_BASE_URL": proxy.url,
                   "ANTHROPIC_API_KEY": KEY, "IS_SANDBOX": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                   "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
            run = subprocess.run([binary, "-p", "Write hello.txt, then show it.", "--dangerously-skip-permissions",
                                  "--model", "claude-sonnet-4-5"], env=env, cwd=workdir, capture_output=True,
                                 text=True, timeout=240)
            sessions = _sessions(proxy.url, [r.headers.get("x-claude-code-session-id") for r in state.requests])
    received = [{"path": r.path, "query": r.query, "outcome": r.outcome, "error": r.error,
                 "tools": [t.get("name") for t in (r.json or {}).get("tools") or []] if isinstance(r.json, dict) else [],
                 "last_user_blocks": _last_blocks(r.json)} for r in state.requests]
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


def _last_blocks(body: Any) -> list[str]:
    if not isinstance(body, dict) or not body.get("messages"):
        return []
    content = body["messages"][-1].get("content")
    return [b.get("type") for b in content if isinstance(b, dict)] if isinstance(content, list) else ["string"]


if __name__ == "__main__":
    main(*sys.argv[1:4])
