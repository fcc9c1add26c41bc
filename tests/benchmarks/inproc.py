"""The real proxy app driven in-process: ``httpx.ASGITransport`` in front, any httpx transport behind.

Used where the proxy's own work is measured or replayed without a network (pipeline cost,
storage growth, compression). ``InProcessProxy`` runs the app's lifespan (migration, store,
upstream client) on a SQLite file in a temporary directory, and ``chat`` waits for the request's
background log writes (``ChatPipeline.drain``) so their cost and their rows belong to the request.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.benchmarks.servers import COMPLETION

CLIENT_HEADERS = {"authorization": "Bearer sk-bench-client-0123456789", "content-type": "application/json"}


def fixed_upstream() -> httpx.MockTransport:
    """An upstream answering every request with ``servers.COMPLETION`` (also used as a summary)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        return httpx.Response(200, content=COMPLETION, headers={"content-type": "application/json"})

    return httpx.MockTransport(handler)


def write_models_file(path: Path, windows: dict[str, int]) -> str:
    """A models file (YAML) giving each model its context window in tokens; returns the path."""
    path.write_text("".join(f'"{model}":\n  context_window_tokens: {window}\n' for model, window in windows.items()))
    return str(path)


class InProcessProxy:
    """``async with InProcessProxy(transport, windows={...}) as p: await p.chat(body)``.

    ``transport``: the upstream (an httpx transport). ``windows``: model -> context window (tokens),
    written to a models file. ``settings``: extra ``proxy.settings.Settings`` fields. ``tune_gc``:
    once the lifespan started, tune the garbage collector as ``context-proxy serve`` does
    (``proxy.server.process.tune_gc``: freeze the startup objects, the young threshold of
    ``Settings.gc_young_threshold``), so the CPU measured is production's; a tree from before
    issue 18 did it in ``create_app``'s lifespan and has no such function (nothing to do).
    """

    def __init__(self, transport: httpx.AsyncBaseTransport, *, windows: dict[str, int] | None = None,
                 workdir: Path | None = None, tune_gc: bool = False, **settings: Any) -> None:
        self.transport = transport
        self.tune_gc = tune_gc
        self.windows = windows or {}
        self.extra = settings
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir = workdir

    async def __aenter__(self) -> InProcessProxy:
        from proxy.app import create_app
        from proxy.settings import Settings

        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bench-proxy-")
            self.workdir = Path(self._tmp.name)
        self.db_path = self.workdir / "proxy.db"
        values: dict[str, Any] = {
            "upstream_url": "http://upstream.bench/v1",
            "database_url": f"sqlite:///{self.db_path}",
            "tiktoken_cache_dir": os.environ.get("TIKTOKEN_CACHE_DIR"),
        }
        if self.windows:
            values["models_file"] = write_models_file(self.workdir / "models.yaml", self.windows)
        values.update(self.extra)
        self.settings = Settings(**values)
        self.app = create_app(self.settings, upstream_transport=self.transport)
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        if self.tune_gc:
            try:
                from proxy.server.process import tune_gc
            except ImportError:  # before issue 18: create_app's lifespan tuned it
                pass
            else:
                tune_gc(self.settings.gc_young_threshold)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://proxy.bench",
                                        timeout=600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self._lifespan.__aexit__(None, None, None)
        if self._tmp is not None:
            self._tmp.cleanup()

    @property
    def pipeline(self) -> Any:
        return self.app.state.proxy.pipeline

    @property
    def store(self) -> Any:
        return self.app.state.proxy.store

    async def chat(self, body: bytes | dict[str, Any], session: str | None = None) -> httpx.Response:
        """POST ``/v1/chat/completions`` and wait for the request's log writes; the response is read."""
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        headers = CLIENT_HEADERS | ({"x-session-id": session} if session else {})
        resp = await self.client.post("/v1/chat/completions", content=content, headers=headers)
        await getattr(self.pipeline, "writer", self.pipeline).drain()  # a baseline tree before the log writer drains on the pipeline
        return resp
