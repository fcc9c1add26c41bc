"""``UvicornServer``: run any ASGI app under a real uvicorn server in a background thread.

    with UvicornServer(app) as server:          # or: async with UvicornServer(app) as server
        httpx.get(server.url + "/v1/models")

The socket is bound by us on 127.0.0.1 port 0 before the thread starts, so ``url`` and ``port``
are known at once and no fixed port is ever used. ``start()`` returns when uvicorn reports
started (raises ``RuntimeError`` if it fails or takes longer than ``startup_timeout_s``);
``stop()`` asks for a graceful exit, then forces it after ``shutdown_timeout_s``.

Defaults chosen to keep pytest's warnings-as-errors quiet: ``ws="none"`` (no websockets import),
``log_level="warning"``, ``lifespan="auto"``; any ``uvicorn.Config`` keyword overrides them.

The server is uvicorn's with its waits made prompt (``PromptServer``): ``stop()`` wakes its main
loop at once instead of at the next 100 ms tick, and the shutdown polls open connections and tasks
every 5 ms instead of every 100 ms (plus a fixed 100 ms pause): the same steps in the same order,
bounded by the same ``timeout_graceful_shutdown``. A stop took about 0.2 s, now about 0.01 s; two
servers per end-to-end test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from typing import Any

import uvicorn

_log = logging.getLogger("uvicorn.error")
POLL_S = 0.005
"""How often the shutdown looks whether connections and tasks are done (uvicorn: 0.1 s)."""


class PromptServer(uvicorn.Server):
    """``uvicorn.Server`` whose exit does not wait for polling ticks (see the module docstring)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _exit: asyncio.Event | None = None

    def wake(self) -> None:
        """Make the main loop look at ``should_exit`` now (thread-safe)."""
        loop, event = self._loop, self._exit
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        self._loop, self._exit = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 0.1)  # uvicorn's tick, cut short by wake()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn.Server.shutdown's steps, polled every POLL_S
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await asyncio.sleep(POLL_S)
        try:
            await asyncio.wait_for(self._wait_tasks_to_complete(), timeout=self.config.timeout_graceful_shutdown)
        except TimeoutError:
            _log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _wait_tasks_to_complete(self) -> None:
        while self.server_state.connections and not self.force_exit:  # noqa: ASYNC110 - uvicorn's own poll
            await asyncio.sleep(POLL_S)
        while self.server_state.tasks and not self.force_exit:  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
        for server in self.servers:
            await server.wait_closed()


class UvicornServer:
    """A uvicorn server for ``app`` on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", startup_timeout_s: float = 10.0,
                 shutdown_timeout_s: float = 5.0, **uvicorn_kwargs: Any) -> None:
        options = {"log_level": "warning", "ws": "none", "lifespan": "auto", "timeout_graceful_shutdown": 1}
        options.update(uvicorn_kwargs)
        self.config = uvicorn.Config(app, host=host, port=0, **options)
        self.server = PromptServer(self.config)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash); only valid after ``start()``."""
        if self.port is None:
            raise RuntimeError("UvicornServer is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> UvicornServer:
        """Bind, start the thread and wait until uvicorn has started."""
        if self._thread is not None:
            raise RuntimeError("UvicornServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit TCP_NODELAY; without it every response waits ~40 ms
        # (Nagle + delayed ACK) when uvicorn serves a socket it did not bind itself.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, 0))
        sock.set_inheritable(True)
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                self._close_socket()
                raise RuntimeError("uvicorn exited during startup (see its log)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn did not start within {self.startup_timeout_s} s")
            time.sleep(0.005)
        return self

    def _run(self) -> None:
        assert self._socket is not None
        asyncio.run(self.server.serve(sockets=[self._socket]))

    def stop(self) -> None:
        """Graceful exit, forced after ``shutdown_timeout_s``; idempotent."""
        thread = self._thread
        if thread is None:
            return
        self.server.should_exit = True
        self.server.wake()
        thread.join(self.shutdown_timeout_s)
        if thread.is_alive():
            self.server.force_exit = True
            self.server.wake()
            thread.join(self.shutdown_timeout_s)
        self._thread = None
        self._close_socket()

    def _close_socket(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> UvicornServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> UvicornServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)
