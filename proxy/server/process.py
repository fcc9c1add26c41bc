"""The serving process: uvicorn's server, and what is tuned for the whole process once it started.

``ProxyServer`` is ``uvicorn.Server`` that, once the app's lifespan started (tokenizer tables,
routes, the model table loaded), tunes Python's garbage collector for the process
(``tune_gc``). This is process-wide state, so it belongs to the command that owns the process
(``context-proxy serve``, the benchmarks' server), never to ``create_app``: a test that builds many
apps in one process keeps Python's defaults. Its main loop ticks once a second instead of ten
times (``IDLE_TICK_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import sys
from types import FrameType

import uvicorn

STARTUP_FAILURE = 3
"""Exit status when the app did not start (uvicorn's own)."""


def tune_gc(young_threshold: int) -> None:
    """Freeze what exists now (the startup objects live as long as the process: out of the
    collector's sight, a full collection no longer walks them, about 8 ms each, measured in the
    pipeline benchmark, once every few requests of a long history), and set the youngest
    generation's threshold to ``young_threshold`` allocations (``Settings.gc_young_threshold``;
    0 leaves Python's)."""
    gc.freeze()
    if young_threshold:
        gc.set_threshold(young_threshold, *gc.get_threshold()[1:])


IDLE_TICK_S = 1.0
"""Seconds between two ticks of the server's main loop (uvicorn's: 0.1). A tick refreshes the
``date`` header (uvicorn does it every tenth tick: once a second either way) and looks whether the
server should exit; a signal wakes the loop at once (``handle_exit``). At uvicorn's ten ticks a
second an idle server spent about 2 ms of CPU a second (10 wake-ups; the floor relay, on uvicorn
too, the same; awecompress on aiohttp's server none), each one on the core that the servers beside
it share (issue 21's crowded benchmark)."""


class ProxyServer(uvicorn.Server):
    """``uvicorn.Server`` calling ``tune_gc(gc_young_threshold)`` after the app's lifespan started,
    its main loop ticking every ``IDLE_TICK_S``."""

    def __init__(self, config: uvicorn.Config, *, gc_young_threshold: int) -> None:
        super().__init__(config)
        self.gc_young_threshold = gc_young_threshold
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """uvicorn's (``should_exit``, or ``force_exit`` on a second SIGINT), then the main loop
        woken to see it now rather than at its next tick."""
        super().handle_exit(sig, frame)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        """uvicorn's main loop at ``IDLE_TICK_S`` a tick: ``on_tick`` gets a counter that grows by
        10 a tick, so its once-every-ten-ticks work (the ``date`` header) runs at every tick."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), IDLE_TICK_S)
            should_exit = await self.on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            tune_gc(self.gc_young_threshold)


def run(config: uvicorn.Config, *, gc_young_threshold: int, sockets: list[socket.socket] | None = None) -> None:
    """Serve ``config`` as ``uvicorn.run`` does (Ctrl-C ends it quietly; an app that did not start
    exits with ``STARTUP_FAILURE``), through ``ProxyServer``."""
    server = ProxyServer(config, gc_young_threshold=gc_young_threshold)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
