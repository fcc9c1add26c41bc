"""Graceful shutdown of ``context-proxy serve``: on SIGTERM it stops accepting connections, lets an
in-flight stream finish, logs it, closes the database and exits 0; its log lines are JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from proxy.cli import app
from tests.conftest import SHARED_DIR
from tests.deploy.conftest import REPO_DIR
from tests.fakes.server import UvicornServer
from tests.fakes.upstream import create_fake_upstream
from tests.support.ports import free_port

REPLY = " ".join(f"word{i}" for i in range(60))  # 20 chunks of three words


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the proxy exited during startup"
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("the proxy did not become healthy")


def test_sigterm_lets_the_stream_finish_then_exits_0(tmp_path: Path) -> None:
    fake, state = create_fake_upstream()
    state.chunk_delay_s = 0.1
    state.script.append({"role": "assistant", "content": REPLY})
    port = free_port()
    database_url = f"sqlite:///{tmp_path / 'proxy.db'}"
    stderr_path = tmp_path / "stderr.log"
    with UvicornServer(fake) as upstream, stderr_path.open("w") as stderr:
        env = os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken"), "CONTEXT_PROXY_SHUTDOWN_GRACE_S": "20"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--upstream-url", upstream.url + "/v1", "--database-url", database_url, "--log-format", "json"],
            cwd=REPO_DIR, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, proc)
            body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Tell me a story"}]}
            received = b""
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30,
                              headers={"authorization": "Bearer sk-test-0123456789", "x-session-id": "shutdown"}) as resp:
                assert resp.status_code == 200
                chunks = resp.iter_raw()
                received += next(chunks)
                sent_at = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.5)
                try:  # no new connections once shutting down
                    httpx.get(url + "/healthz", timeout=1)
                    accepted = True
                except httpx.TransportError:
                    accepted = False
                for chunk in chunks:
                    received += chunk
            assert not accepted, "a new connection was accepted after SIGTERM"
            assert time.monotonic() - sent_at > 1.0, "the stream was still running when SIGTERM came"
            assert received.rstrip().endswith(b"data: [DONE]")
            content = "".join(
                (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                for line in received.decode().splitlines()
                if line.startswith("data: {")
            )
            assert content == REPLY
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = [line for line in stderr_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert any(r["msg"] == "Shutting down" for r in records)
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    assert "sk-test-0123456789" not in stderr_path.read_text()
    # The streamed reply was logged before the database closed.
    shown = CliRunner().invoke(app, ["sessions", "show", "shutdown", "--database-url", database_url])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["message_count"] == 2
