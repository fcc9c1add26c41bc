"""In-process ASGI plumbing: an httpx transport that streams, and an ASGI lifespan runner.

``StreamingASGITransport(app)`` is an ``httpx.AsyncBaseTransport`` that serves each request by
calling ``app`` in a task of its own on the caller's event loop. Unlike ``httpx.ASGITransport``
(which waits for the whole body) the response is returned at ``http.response.start`` and its body
streams as the app sends it, so relaying, time to first chunk and early closes behave as over a
socket. It follows uvicorn where a server has a choice:

- the request body reaches the app in pieces of at most ``chunk_bytes`` (64 KiB); once it is read,
  or the response is complete, or the client closed the response, ``receive()`` waits for and
  then returns ``http.disconnect``;
- closing the response before its end (``aclose``) is a client disconnect: the app's ``receive()``
  returns ``http.disconnect`` and its further ``send()`` calls are dropped; the app is not cancelled;
- an app that returns without completing its body is a connection closed mid-body: reading the
  response raises ``httpx.RemoteProtocolError`` (what httpx's socket transports raise); one that
  returns without starting a response, or raises before starting, is a 500 ``Internal Server
  Error``; an exception after the start closes the body as above.

``raise_app_exceptions=True`` (the default, as in httpx) re-raises an exception of the app to the
caller instead (from ``handle_async_request`` or from reading the body): a test of the proxy sees
the proxy's bug. The fake provider's transport sets it False: there an exception is a provider
fault, which the proxy must survive. Exceptions are also kept in ``app_errors``.

``aclose()`` (the httpx client closing it) waits up to ``close_timeout_s`` for apps still
running, then cancels them: no task outlives the test.

``LifespanManager(app)``: ``async with LifespanManager(app):`` runs the ASGI lifespan protocol
(startup, then shutdown at exit) in a task of its own, like a server. Raises ``RuntimeError``
when the app reports ``lifespan.startup.failed``/``shutdown.failed`` or does not answer within
``startup_timeout_s``/``shutdown_timeout_s``; an app without lifespan support (it raises or
returns at once) is served without one, like uvicorn's ``lifespan="auto"``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpx

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

_END = object()
"""Body queue marker: the response is complete."""


class _Cut(Exception):
    """Body queue marker: the connection closed before the end of the body."""


class _Exchange:
    """One request being served: the app's ``receive``/``send`` and the body queue read by httpx."""

    def __init__(self, body: bytes, chunk_bytes: int) -> None:
        self.pieces = [body[i:i + chunk_bytes] for i in range(0, len(body), chunk_bytes)] or [b""]
        self.started = asyncio.get_running_loop().create_future()
        self.body: asyncio.Queue[object] = asyncio.Queue()
        self.complete = False
        self.disconnected = asyncio.Event()

    async def receive(self) -> Message:
        if self.pieces and not self.disconnected.is_set():
            piece = self.pieces.pop(0)
            return {"type": "http.request", "body": piece, "more_body": bool(self.pieces)}
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.disconnected.is_set() and message["type"] != "http.response.start":
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started.done():
                raise RuntimeError("http.response.start sent twice")
            self.started.set_result(message)
        elif kind == "http.response.body":
            if not self.started.done() or self.complete:
                raise RuntimeError("http.response.body outside a response")
            chunk = bytes(message.get("body", b""))
            if chunk:
                self.body.put_nowait(chunk)
            if not message.get("more_body", False):
                self.complete = True
                self.body.put_nowait(_END)
                self.disconnected.set()  # uvicorn: receive() after the response is a disconnect

    def ended(self, error: BaseException | None) -> None:
        """The app returned (``error`` None) or raised."""
        if not self.started.done():
            if error is not None:
                self.started.set_exception(error)
            else:
                self.started.set_result(None)
        elif not self.complete:
            self.body.put_nowait(_Cut() if error is None else error)
        self.disconnected.set()


class _BodyStream(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange, raise_app_exceptions: bool) -> None:
        self.exchange = exchange
        self.raise_app_exceptions = raise_app_exceptions

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.exchange.body.get()
            if item is _END:
                return
            if isinstance(item, bytes):
                yield item
                continue
            if isinstance(item, BaseException) and self.raise_app_exceptions and not isinstance(item, _Cut):
                raise item
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def aclose(self) -> None:
        self.exchange.disconnected.set()


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Serve httpx requests with ``app`` in-process, streaming the body (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, raise_app_exceptions: bool = True, chunk_bytes: int = 65_536,
                 client: tuple[str, int] = ("127.0.0.1", 50_000), close_timeout_s: float = 5.0) -> None:
        self.app = app
        self.raise_app_exceptions = raise_app_exceptions
        self.chunk_bytes = chunk_bytes
        self.client = client
        self.close_timeout_s = close_timeout_s
        self.app_errors: list[BaseException] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def _scope(self, request: httpx.Request) -> dict[str, Any]:
        url = request.url
        port = url.port or {"http": 80, "https": 443}[url.scheme]
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": self.client,
            "server": (url.host, port),
            "state": {},
        }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        exchange = _Exchange(body, self.chunk_bytes)
        task = asyncio.get_running_loop().create_task(self._run(self._scope(request), exchange))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            start = await exchange.started
        except Exception:
            if self.raise_app_exceptions:
                raise
            start = None
        if start is None:
            return httpx.Response(500, headers={"content-type": "text/plain; charset=utf-8"},
                                  content=b"Internal Server Error", request=request)
        headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
        return httpx.Response(start["status"], headers=headers, request=request,
                              stream=_BodyStream(exchange, self.raise_app_exceptions))

    async def _run(self, scope: dict[str, Any], exchange: _Exchange) -> None:
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except Exception as exc:  # noqa: BLE001 - reported to the reader of the response
            self.app_errors.append(exc)
            exchange.ended(exc)
        else:
            exchange.ended(None)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.close_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self.close_timeout_s)


class LifespanManager:
    """Run ``app``'s ASGI lifespan around a block (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, startup_timeout_s: float = 30.0, shutdown_timeout_s: float = 30.0) -> None:
        self.app = app
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.state: dict[str, Any] = {}
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._supported = True

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}
        try:
            await self.app(scope, self._to_app.get, self._from_app.put)
        except Exception:  # noqa: BLE001 - an app without lifespan support raises at once
            if self._supported:
                self._supported = False
                await self._from_app.put({"type": "lifespan.unsupported"})
        else:
            await self._from_app.put({"type": "lifespan.returned"})

    async def _expect(self, phase: str, timeout_s: float) -> None:
        await self._to_app.put({"type": f"lifespan.{phase}"})
        try:
            answer = await asyncio.wait_for(self._from_app.get(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"the app did not complete lifespan {phase} within {timeout_s} s") from None
        kind = answer["type"]
        if kind == f"lifespan.{phase}.failed":
            raise RuntimeError(f"lifespan {phase} failed: {answer.get('message', '')}")
        if kind in ("lifespan.unsupported", "lifespan.returned") and phase == "startup":
            self._supported = False

    async def __aenter__(self) -> LifespanManager:
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            await self._expect("startup", self.startup_timeout_s)
        except BaseException:
            await self._stop_task(wait_s=0.0)  # a server exits at a failed startup
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            if self._supported:
                await self._expect("shutdown", self.shutdown_timeout_s)
        finally:
            await self._stop_task()

    async def _stop_task(self, wait_s: float | None = None) -> None:
        """Let the lifespan task end by itself within ``wait_s`` (default ``shutdown_timeout_s``),
        then cancel it."""
        task, self._task = self._task, None
        if task is None:
            return
        if wait_s is None:
            wait_s = self.shutdown_timeout_s
        if wait_s > 0:
            await asyncio.wait({task}, timeout=wait_s)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
