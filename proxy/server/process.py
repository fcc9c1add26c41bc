"""The serving process: uvicorn's server, and what is tuned for the whole process once it started.

``ProxyServer`` is ``uvicorn.Server`` that, once the app's lifespan started (tokenizer tables,
routes, the model table loaded), tunes Python's garbage collector for the process
(``tune_gc``). This is process-wide state, so it belongs to the command that owns the process
(``context-proxy serve``, the benchmarks' server), never to ``create_app``: a test that builds many
apps in one process keeps Python's defaults.
"""

from __future__ import annotations

import gc
import socket
import sys

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


class ProxyServer(uvicorn.Server):
    """``uvicorn.Server`` calling ``tune_gc(gc_young_threshold)`` after the app's lifespan started."""

    def __init__(self, config: uvicorn.Config, *, gc_young_threshold: int) -> None:
        super().__init__(config)
        self.gc_young_threshold = gc_young_threshold

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
