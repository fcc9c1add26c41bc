"""proxy/cli.py: operator commands (sessions, archive, db upgrade) on a database a real proxy wrote,
and ``replay`` of a real trace (CliRunner and a subprocess)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proxy.cli import app
from tests.conftest import REPO_DIR, SHARED_DIR
from tests.support.real_server import Proxy
from tests.support.shared import needs_traces

TRACE = SHARED_DIR / "traces" / "swe-agent__pydicom-1458__gpt-4.jsonl"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def logged_session(proxy: Proxy) -> str:
    """A two-turn session ``cli-session`` logged by a real proxy; returns its database URL."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "First question"}]
    with proxy.http() as http:
        for _ in range(2):
            resp = http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": messages},
                             headers={"X-Session-Id": "cli-session"})
            assert resp.status_code == 200
            messages += [resp.json()["choices"][0]["message"], {"role": "user", "content": "Second question"}]
        for _ in range(100):  # the reply is logged by a task after the response
            if http.get("/sessions/cli-session").json()["request_count"] == 2:
                break
            time.sleep(0.05)
    return proxy.settings.database_url


def test_sessions_list_show_and_archive(runner: CliRunner, logged_session: str) -> None:
    db = ["--database-url", logged_session]
    listed = runner.invoke(app, ["sessions", "list", *db])
    assert listed.exit_code == 0, listed.output
    assert "cli-session" in listed.output and "gpt-4o" in listed.output
    as_json = json.loads(runner.invoke(app, ["sessions", "list", "--json", *db]).output)
    assert [s["id"] for s in as_json["data"]] == ["cli-session"]

    shown = runner.invoke(app, ["sessions", "show", "cli-session", *db])
    assert shown.exit_code == 0, shown.output
    detail = json.loads(shown.output)
    assert detail["id"] == "cli-session" and detail["request_count"] == 2 and detail["message_count"] == 5  # system, 2 x (user, reply)
    assert detail["events"] == []

    archived = runner.invoke(app, ["archive", "cli-session", *db])
    assert archived.exit_code == 0, archived.output
    assert archived.output.startswith("# Archive of session `cli-session`")
    assert "First question" in archived.output and "Second question" in archived.output


def test_unknown_session_exits_1(runner: CliRunner, logged_session: str) -> None:
    for command in (["sessions", "show", "nope"], ["archive", "nope"]):
        result = runner.invoke(app, [*command, "--database-url", logged_session])
        assert result.exit_code == 1
        assert "no session 'nope'" in result.output


def test_db_upgrade_creates_the_schema(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    result = runner.invoke(app, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    listed = runner.invoke(app, ["sessions", "list", "--json", "--database-url", url])
    assert listed.exit_code == 0 and json.loads(listed.output)["data"] == []


@needs_traces
def test_replay_prints_savings_and_writes_a_plot(runner: CliRunner, tmp_path: Path) -> None:
    plot = tmp_path / "tokens.png"
    result = runner.invoke(app, ["replay", str(TRACE), "--model", "gpt-4", "--window", "8192", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "offline estimate" in out
    turn_lines = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(turn_lines) == 12, "one line per request: the trace has 12 assistant replies"
    assert "summary" in out.split("total:")[0], "a compaction shows on the turn it happened"
    total = out.split("total:")[1]
    without = int(total.split("without the proxy:")[1].split()[0].replace(",", ""))
    with_proxy = int(total.split("with the proxy:")[1].split()[0].replace(",", ""))
    assert 0 < with_proxy < without
    assert "compactions: summary" in total
    assert "without the proxy, 0 with it" in total
    data = plot.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


@needs_traces
def test_replay_as_a_subprocess(tmp_path: Path) -> None:
    env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken")}
    done = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "replay", str(TRACE), "--model", "gpt-4", "--window", "8192", "--no-turns",
         "--plot", str(tmp_path / "p.png")],
        cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "saved)" in done.stdout and "turn " not in done.stdout
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_SIGNATURE)


WITHOUT_MATPLOTLIB = """
import runpy, sys
from importlib.abc import MetaPathFinder

class NoMatplotlib(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoMatplotlib())
sys.argv = ["context-proxy", *sys.argv[1:]]
runpy.run_module("proxy.cli", run_name="__main__")
"""


def test_replay_plot_without_matplotlib_says_what_to_install(tmp_path: Path) -> None:
    """Issue 20: the friendly message fired only if importing ``proxy.offline.plot`` failed, and that
    module imported matplotlib only when drawing, after the replay: a 27-line traceback."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(m) for m in [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi."}]) + "\n")
    env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken")}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, "replay", str(trace), "--model", "gpt-4", "--plot",
         str(tmp_path / "p.png")],
        cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip() == ("error: --plot needs matplotlib: pip install matplotlib "
                                   "(or, in a checkout of context-proxy, pip install -e '.[plot]')")
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "p.png").exists() and "total:" not in done.stdout, "refused before replaying"


def test_replay_rejects_a_file_that_is_not_a_trace(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "hi"}\nnot json\n')
    result = runner.invoke(app, ["replay", str(bad), "--model", "gpt-4o"])
    assert result.exit_code == 1
    assert "bad.jsonl:2: not JSON" in result.output


COMMANDS = [[], ["serve"], ["db"], ["db", "upgrade"], ["sessions"], ["sessions", "list"], ["sessions", "show"],
            ["archive"], ["retention"], ["replay"], ["limits"], ["limits", "list"], ["limits", "reset"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "context-proxy")
def test_help_reads_cleanly(command: list[str]) -> None:
    """A new user's ``serve --help`` read "Address to bind ." (a ``[env ...]`` note taken for Rich
    markup), the docstring's ``shutdown_grace_s`` markup, a source path, and lines broken where the
    docstring's were. Now: no stray " ." nor markup nor path, and each paragraph reflowed."""
    done = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"})
    assert done.exit_code == 0, done.output
    text = done.output
    assert not re.search(r" \.(\s|$)", text), text
    assert "``" not in text and "[env" not in text, text
    assert not re.search(r"[\w/]+\.py\b|\b(proxy|storage)/\w", text), text
    if command == ["serve"]:
        assert "Address to bind (env CONTEXT_PROXY_HOST, default 127.0.0.1)." in text
        assert ("On SIGTERM or Ctrl-C: stop accepting connections, let in-flight requests and streams finish within "
                "--shutdown-grace-s seconds, drain the log writes, close the database, exit 0.") in text
