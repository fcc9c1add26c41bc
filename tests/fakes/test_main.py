"""``python -m tests.fakes``: the fake providers as one server, behind ``context-proxy serve``, as the
README's "Trying it without a key" runs them (both real processes; the official SDKs as clients)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.benchmarks.candidates import free_port
from tests.fakes.__main__ import KEEP_REQUESTS, FakeProviders

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fakes() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes"], cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("PORT "), line
        yield int(line.split()[1])
    finally:
        proc.terminate()
        proc.wait(10)


def serve(port: int, fake_port: int, db: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, CONTEXT_PROXY_TIKTOKEN_CACHE_DIR=os.environ.get("TIKTOKEN_CACHE_DIR", ""))
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port),
                             "--upstream-url", f"http://127.0.0.1:{fake_port}/v1",
                             "--anthropic-upstream-url", f"http://127.0.0.1:{fake_port}",
                             "--database-url", f"sqlite:///{db}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("context-proxy serve did not get ready")
        time.sleep(0.1)


def test_both_apis_answer_through_the_proxy(fakes: int, tmp_path: Path) -> None:
    port = free_port()
    proxy = serve(port, fakes, tmp_path / "p.db")
    try:
        chat = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-try", max_retries=0)
        reply = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
        claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-ant-try", max_retries=0)
        message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=64,
                                         messages=[{"role": "user", "content": "hello"}])
        assert message.role == "assistant" and message.content and message.content[0].type == "text"
        sessions = httpx.get(f"http://127.0.0.1:{port}/sessions", headers={"authorization": "Bearer sk-try"}).json()
        assert len(sessions["data"]) == 1  # the chat turn, logged under the client's key
    finally:
        proxy.terminate()
        proxy.wait(10)


async def test_a_long_running_fake_keeps_only_the_last_requests() -> None:
    app = FakeProviders()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as http:
        for _ in range(KEEP_REQUESTS + 5):
            await http.get("/v1/models")
    assert len(app.openai_state.requests) == KEEP_REQUESTS
