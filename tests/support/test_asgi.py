"""``tests.support.asgi``: the streaming in-process transport behaves like a socket where the proxy
can tell (body streamed as sent, early close = disconnect, cut body = ``RemoteProtocolError``), and
the lifespan runner starts and stops an app."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.support.asgi import LifespanManager, Message, Receive, Send, StreamingASGITransport


class Streamer:
    """An app that sends ``parts`` one by one, each after ``release`` lets it go; records what
    it received and whether it saw a disconnect."""

    def __init__(self, parts: list[bytes], finish: bool = True) -> None:
        self.parts, self.finish = parts, finish
        self.release = asyncio.Semaphore(0)
        self.body = b""
        self.messages: list[Message] = []
        self.disconnected = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            self.messages.append(message)
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in self.parts:
            await self.release.acquire()
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if self.finish:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        assert (await receive())["type"] == "http.disconnect"
        self.disconnected.set()


async def test_the_body_streams_as_the_app_sends_it() -> None:
    app = Streamer([b"one", b"two"])
    transport = StreamingASGITransport(app, chunk_bytes=4)
    async with (httpx.AsyncClient(transport=transport, base_url="http://t") as client,
                client.stream("POST", "/x?q=1", content=b"0123456789") as resp):
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/plain"
        pieces = resp.aiter_raw()
        app.release.release()
        assert await asyncio.wait_for(anext(pieces), 2) == b"one"  # before the app sent "two"
        app.release.release()
        assert await asyncio.wait_for(anext(pieces), 2) == b"two"
        with pytest.raises(StopAsyncIteration):
            await anext(pieces)
    assert app.body == b"0123456789"
    assert [len(m["body"]) for m in app.messages] == [4, 4, 2]  # in pieces of chunk_bytes


async def test_closing_the_response_early_is_a_disconnect_for_the_app() -> None:
    app = Streamer([b"one", b"two"], finish=False)
    transport = StreamingASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        async with client.stream("GET", "/") as resp:
            app.release.release()
            assert await anext(resp.aiter_raw()) == b"one"
        app.release.release()  # the app's next send is dropped, its receive() says disconnect
        await asyncio.wait_for(app.disconnected.wait(), 2)
    assert transport.app_errors == []


async def test_a_body_the_app_does_not_finish_is_a_cut_connection() -> None:
    async def cut(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"half", "more_body": True})

    async with httpx.AsyncClient(transport=StreamingASGITransport(cut), base_url="http://t") as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get("/")


async def failing(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    raise ValueError("boom")


async def test_an_app_exception_reaches_the_test_or_is_a_500() -> None:
    async with httpx.AsyncClient(transport=StreamingASGITransport(failing), base_url="http://t") as client:
        with pytest.raises(ValueError, match="boom"):
            await client.get("/")
    transport = StreamingASGITransport(failing, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        resp = await client.get("/")
    assert (resp.status_code, resp.text) == (500, "Internal Server Error")
    assert [str(e) for e in transport.app_errors] == ["boom"]


async def test_the_scope_carries_the_request() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        seen.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://proxy.test") as client:
        assert (await client.get("/a%2Fb/c?x=1&y=2", headers={"X-Thing": "v"})).status_code == 204
    scope = seen[0]
    assert (scope["method"], scope["path"], scope["raw_path"], scope["query_string"]) == ("GET", "/a/b/c", b"/a%2Fb/c", b"x=1&y=2")
    assert (b"x-thing", b"v") in scope["headers"] and scope["server"] == ("proxy.test", 80)


async def test_close_cancels_an_app_still_running() -> None:
    started = asyncio.Event()

    async def endless(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        started.set()
        await asyncio.sleep(3600)

    transport = StreamingASGITransport(endless, close_timeout_s=0.05)
    client = httpx.AsyncClient(transport=transport, base_url="http://t")
    async with client.stream("GET", "/"):
        await started.wait()
    await asyncio.wait_for(client.aclose(), 2)
    assert not transport._tasks


class LifespanApp:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[str] = []
        self.fail = fail

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            self.events.append(message["type"])
            if message["type"] == "lifespan.startup":
                kind = "lifespan.startup.failed" if self.fail else "lifespan.startup.complete"
                await send({"type": kind, "message": "no database"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return


async def test_the_lifespan_runs_around_the_block() -> None:
    app = LifespanApp()
    async with LifespanManager(app):
        assert app.events == ["lifespan.startup"]
    assert app.events == ["lifespan.startup", "lifespan.shutdown"]


async def test_a_failed_startup_raises() -> None:
    with pytest.raises(RuntimeError, match="startup failed: no database"):
        async with LifespanManager(LifespanApp(fail=True)):
            pass


async def test_an_app_without_lifespan_is_served_without_one() -> None:
    async with LifespanManager(failing):
        pass


async def test_a_startup_that_never_answers_times_out() -> None:
    async def silent(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await asyncio.sleep(3600)

    with pytest.raises(RuntimeError, match="did not complete lifespan startup"):
        async with LifespanManager(silent, startup_timeout_s=0.05, shutdown_timeout_s=0.05):
            pass
