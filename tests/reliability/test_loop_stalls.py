"""A big chat body does not stall the event loop (issue 16, item 3: a healthy client waited 2.1-4.6 s
while 60 MB bodies were processed).

The real app in-process (``tests.benchmarks.inproc``: ASGI transport, SQLite, lifespan), one event
loop shared with a ticker task that wakes every 5 ms and records the longest gap between its
wake-ups: that gap is how long any other client's request would have waited for the loop. The
projection of a big body must run in a worker thread (recorded where ``project`` really ran), a
small one on the loop (no thread hop), and both paths must forward the same bytes.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Self

import httpx
import orjson
import pytest

import proxy.compaction.plan_loop
import proxy.conversation.canonical
from tests.benchmarks.inproc import InProcessProxy
from tests.benchmarks.servers import COMPLETION

MODEL = "fake-128k-openai"
WINDOWS = {MODEL: 128_000}
MAX_STALL_S = 1.0
"""The issue's bound for a healthy client's answer; the old code stalled 2-4 s at these sizes."""
STALL_SHARE_OF_REQUEST = 0.5
"""30,000 messages: the longest stall ÷ the request's whole time (about 0.2 off the loop, 0.6 on it)."""


class Capture(httpx.AsyncBaseTransport):
    """An upstream answering every request with ``COMPLETION``, keeping the bodies it received."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(await request.aread())
        return httpx.Response(200, content=COMPLETION, headers={"content-type": "application/json"})


class Ticker:
    """``async with Ticker() as t``: ``t.max_gap_s`` is the longest the loop left it waiting."""

    async def __aenter__(self) -> Self:
        self.max_gap_s = 0.0
        self._stop = False
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0.02)
        return self

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self._stop:
            await asyncio.sleep(0.005)
            now = loop.time()
            self.max_gap_s = max(self.max_gap_s, now - last)
            last = now

    async def __aexit__(self, *exc: object) -> None:
        self._stop = True
        await self._task


@pytest.fixture
def where_projected(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per projection: ``True`` when it ran on the event loop's (main) thread."""
    seen: list[bool] = []
    real = proxy.compaction.plan_loop.project

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(proxy.compaction.plan_loop, "project", recording)
    return seen


def one_big_tool_result(mb: int) -> bytes:
    """A turn whose tool result is ``mb`` MB of prose (as the adversarial harness sends)."""
    text = "lorem ipsum dolor sit amet " * ((mb << 20) // 27)
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
    return orjson.dumps({"model": MODEL, "messages": [
        {"role": "user", "content": "read a.txt"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": text},
    ]})


def many_messages(n: int) -> bytes:
    """``n`` short messages (~200 characters each): far past the window, so a summary is planned."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "words and more words " * 9}
            for i in range(n)]
    return orjson.dumps({"model": MODEL, "messages": msgs})


async def test_a_40_mb_tool_result_leaves_the_loop_responsive(where_projected: list[bool]) -> None:
    body = one_big_tool_result(40)
    async with InProcessProxy(Capture(), windows=WINDOWS) as p:
        async with Ticker() as t:
            resp = await p.chat(body, session="big-one")
        assert resp.status_code == 200, resp.text[:300]
    assert t.max_gap_s < MAX_STALL_S, f"the event loop stalled {t.max_gap_s:.2f} s"
    assert where_projected and not any(where_projected)  # counted and offloaded in a worker thread


async def test_30000_messages_leave_the_loop_responsive_and_forward_the_same_bytes(
    where_projected: list[bool], monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = many_messages(30_000)
    off = Capture()
    async with InProcessProxy(off, windows=WINDOWS) as p:
        async with Ticker() as t:
            t0 = asyncio.get_running_loop().time()
            resp = await p.chat(body, session="many")
            took_s = asyncio.get_running_loop().time() - t0
        assert resp.status_code == 200, resp.text[:300]
    assert where_projected and not any(where_projected)
    # No one stall takes half the request (here 0.42 s of 2.05 s; with everything on the loop 1.4 s of
    # 2.2 s): judged against the request's own time, so the bound follows the machine's speed (an
    # absolute 1 s failed at 1.06 s on a loaded CI machine). The structural check is the one above.
    assert t.max_gap_s < took_s * STALL_SHARE_OF_REQUEST, (
        f"the event loop stalled {t.max_gap_s:.2f} s of the request's {took_s:.2f} s")
    # the same request with every stage on the loop: the summary calls and the forwarded body alike
    monkeypatch.setattr(proxy.compaction.plan_loop, "OFF_LOOP_BYTES", 1 << 62)
    monkeypatch.setattr(proxy.conversation.canonical, "OFF_LOOP_DIGEST_BYTES", 1 << 62)
    monkeypatch.setattr(proxy.conversation.canonical, "OFF_LOOP_DIGEST_MESSAGES", 1 << 62)
    where_projected.clear()
    on = Capture()
    async with InProcessProxy(on, windows=WINDOWS) as p:
        resp = await p.chat(body, session="many")
        assert resp.status_code == 200
    assert where_projected and all(where_projected)
    assert len(off.bodies) > 1  # summary calls, then the compacted request
    assert off.bodies == on.bodies


async def test_small_requests_stay_on_the_loop(where_projected: list[bool]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 2000}]}
    async with InProcessProxy(Capture(), windows=WINDOWS) as p:
        for _ in range(3):
            assert (await p.chat(body, session="small")).status_code == 200
    assert where_projected == [True, True, True]
