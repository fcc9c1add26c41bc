"""``UvicornServer``: a stop is prompt, and still graceful (a request in flight is answered first)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.fakes.server import UvicornServer


async def _slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(0.3)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_stop_with_an_idle_keep_alive_connection_is_prompt() -> None:
    with UvicornServer(_slow_app, lifespan="off") as server, httpx.Client(base_url=server.url) as client:
        assert client.get("/").text == "ok"  # the connection stays open, idle
        started = time.monotonic()
        server.stop()
        took_s = time.monotonic() - started
    assert took_s < 0.1, took_s  # uvicorn's own polling made it about 0.2 s


def test_a_stop_lets_a_request_in_flight_finish() -> None:
    server = UvicornServer(_slow_app, lifespan="off").start()
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=server.url) as client:
        pending = pool.submit(client.get, "/slow")
        deadline = time.monotonic() + 5
        while not server.server.server_state.tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        assert pending.result(timeout=5).text == "ok"
        stopper.join(5)
    assert not stopper.is_alive()
