"""Replay reproduces the live bytes (issue 18, item 3): a session recorded through the real proxy
(in-process: ``httpx.ASGITransport`` in front, the fake provider behind), with compactions
happening in a small window, is replayed offline with the fake provider's summarizer, and every
body replay forwards, model requests and summary calls alike, is byte-equal to what the fake
provider received.

Before this issue replay copied the plan loop and hashed event ids without the session, so the
summary message it built named another event id (and its read tool was never counted or sent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.compaction.apis import summary_request_body
from proxy.conversation.chat_codec import CHAT
from proxy.defenses.summarize import render_transcript
from proxy.offline.replay import ReplaySession, areplay, load_trace, request_indices
from tests.benchmarks.inproc import CLIENT_HEADERS, InProcessProxy
from tests.conftest import SHARED_DIR
from tests.fakes.responders import build_prompt, respond_summary
from tests.fakes.state import FakeState
from tests.fakes.upstream import create_fake_upstream

TRACE = SHARED_DIR / "traces" / "swe-agent__pydicom-1458__gpt-4.jsonl"
MODEL = "fake-8k-openai"
WINDOW = 8192
SESSION = "replay-live-bytes"

pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason="needs ../shared/traces (see README)")


class FakeSummaries:
    """The fake provider's summarizer, offline: the summary call the proxy would send, answered by
    ``tests.fakes.responders.respond_summary``; keeps the bodies it built."""

    def __init__(self, state: FakeState, client_body: dict[str, Any]) -> None:
        self.state, self.client_body = state, client_body
        self.bodies: list[bytes] = []

    async def summarize(self, previous: str | None, chunk: list[dict[str, Any]], reply_tokens: int) -> str:
        body = summary_request_body(MODEL, self.client_body, previous, render_transcript(chunk, CHAT), reply_tokens)
        self.bodies.append(orjson.dumps(body))
        reply = respond_summary(build_prompt(body, self.state.summary_substring), self.state)
        assert reply is not None and reply.content
        return reply.content


async def record(trace: list[dict[str, Any]], workdir: Path) -> tuple[FakeState, Any, int]:
    """Send the trace through the proxy as its agent did; the fake's state, the settings, the session's pk."""
    app, state = create_fake_upstream()
    async with InProcessProxy(httpx.ASGITransport(app=app), windows={MODEL: WINDOW}, workdir=workdir) as p:
        for n in request_indices(trace):
            body = orjson.dumps({"model": MODEL, "messages": trace[:n]})
            resp = await p.client.post("/v1/chat/completions", content=body,
                                       headers=CLIENT_HEADERS | {"x-session-id": SESSION})
            assert resp.status_code == 200, resp.text[:300]
            await p.pipeline.writer.drain()
        session = await p.store.find_session(SESSION, None)
        assert session is not None
        return state, p.settings, session.pk


async def test_replaying_a_recorded_session_forwards_the_bytes_the_proxy_forwarded(tmp_path: Path) -> None:
    trace = load_trace(TRACE)
    state, settings, pk = await record(trace, tmp_path)
    live = state.model_requests
    assert all(r.outcome == "ok" for r in state.chat_requests), "no overflow: the proxy compacted first"
    assert state.summary_requests, "the window is small enough for summaries"
    assert any(settings.read_tool_name.encode() in r.body for r in live), "the read tool goes with a summary"

    summaries = FakeSummaries(state, {"model": MODEL})
    forwarded: list[tuple[int, bytes]] = []
    report = await areplay(trace, model=MODEL, settings=settings, session=ReplaySession(pk, SESSION),
                           summary_model=summaries, on_forward=lambda turn, body: forwarded.append((turn, body)))

    assert [turn for turn, _ in forwarded] == list(range(1, len(report.turns) + 1)), "one forward per turn"
    assert len(forwarded) == len(live)
    for (turn, body), sent in zip(forwarded, live, strict=True):
        assert body == sent.body, f"turn {turn}: replay forwards other bytes than the proxy did"
    assert summaries.bodies == [r.body for r in state.summary_requests]
    assert report.compactions.get("summary", 0) >= 1
    assert report.summary_calls == len(state.summary_requests)
