"""Claude Code itself through the proxy (issue 19, item 8): the native binary of
``@anthropic-ai/claude-code`` runs ``claude -p`` on a scripted two-step task (its own ``Write`` and
``Bash`` tools) in a temporary git repository, offline, in a network namespace with only loopback,
against the strict fake Anthropic provider behind the proxy (``tests/e2e/claude_code_session.py``).

The binary: ``CONTEXT_PROXY_TEST_CLAUDE_CODE`` (``.ci/run`` installs it and sets it: then a missing
binary fails the test), else where ``.ci/run`` installs it
(``.ci/node/node_modules/@anthropic-ai/claude-code-linux-x64/claude``). The test skips, saying so,
only when neither is named nor there: the README's test command alone, on a machine that did not
run ``.ci/run`` (the binary is a 380 MB npm download)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.claude_code_session import FILE_TEXT, FINAL_TEXT

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ROOT / ".ci/node/node_modules/@anthropic-ai/claude-code-linux-x64/claude"


def claude_binary() -> Path | None:
    given = os.environ.get("CONTEXT_PROXY_TEST_CLAUDE_CODE")
    path = Path(given) if given else INSTALLED
    return path if path.is_file() and os.access(path, os.X_OK) else None


def run_claude_code(tmp_path: Path, steps: int = 0) -> tuple[Path, dict[str, Any]]:
    """Claude Code through the proxy in a new git repository (``claude_code_session``); the
    repository and the run's result."""
    binary = claude_binary()
    named = os.environ.get("CONTEXT_PROXY_TEST_CLAUDE_CODE")
    assert binary is not None or not named, f"CONTEXT_PROXY_TEST_CLAUDE_CODE={named} is not an executable"
    if binary is None:
        pytest.skip(f"Claude Code's native binary is not installed ({INSTALLED}; .ci/run installs it from npm, or "
                    "set CONTEXT_PROXY_TEST_CLAUDE_CODE)")
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to keep Claude Code off the network")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    result_path = tmp_path / "result.json"
    run = subprocess.run(["unshare", "-n", sys.executable, "-m", "tests.e2e.claude_code_session", str(binary),
                          str(repo), str(result_path), str(steps)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert result["returncode"] == 0, {k: v for k, v in result.items() if k != "requests"}
    return repo, result


def test_claude_code_finishes_a_tool_task_through_the_proxy(tmp_path: Path) -> None:
    repo, result = run_claude_code(tmp_path)
    assert FINAL_TEXT in result["stdout"], result
    assert (repo / "hello.txt").read_text() == FILE_TEXT  # Claude Code's own Write tool ran
    main = [r for r in result["requests"] if {"Write", "Bash"} <= set(r["tools"])]
    assert len(main) == 3, result["requests"]  # the task, the Write's result, the Bash's result
    assert [r["last_user_blocks"][:1] for r in main[1:]] == [["tool_result"], ["tool_result"]]
    assert all(r["outcome"] == "ok" and r["path"] == "/v1/messages" for r in result["requests"]), result["requests"]
    # logged once, in the session Claude Code named, its echoes continuing one branch
    sessions = result["sessions"]
    assert len(sessions) == 1, sessions
    (logged,) = sessions.values()
    assert logged["summary"]["branch_count"] == 1 and logged["requests"] == len(result["requests"]), logged
    assert logged["roles"][:2] == ["system", "user"] and logged["roles"][-1] == "assistant", logged


def test_claude_code_finishes_a_long_task_the_proxy_must_compact(tmp_path: Path) -> None:
    """Eight build steps of about 3,000 tokens each at a 32,000-token window, of which Claude Code's
    own prompt and tools take 19,000 and its replies 4,096: the proxy summarizes (the whole tool
    cycle, its signed turns included: ``Planner.plan_whole``) whenever the next request would not
    fit, and Claude Code, which never sees an error, runs every step and finishes."""
    repo, result = run_claude_code(tmp_path, steps=8)
    assert FINAL_TEXT in result["stdout"], result["stdout"]
    assert (repo / "hello.txt").read_text() == FILE_TEXT
    requests = result["requests"]
    rejected = [(r["outcome"], r["error"]) for r in requests if r["outcome"] != "ok"]
    assert rejected == [], rejected  # no overflow, no signature or pairing error
    summaries = [r for r in requests if r["summary_call"]]
    assert len(summaries) >= 2, [(r["input_tokens"], r["summary_call"]) for r in requests]
    assert all(r["input_tokens"] <= 32_000 for r in requests)
    seen = set().union(*(r["steps_seen"] for r in requests))
    assert seen == set(range(1, 9)), seen  # every step ran (its result forwarded, or summarized)
    (logged,) = result["sessions"].values()
    assert logged["requests"] == len(requests) - len(summaries), logged  # the proxy's calls are not the session's
