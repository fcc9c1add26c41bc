"""The servers of the overhead benchmark, each run in a process of its own, pinned to one core.

    python -m tests.benchmarks.servers KIND --cpu N [--upstream URL] [--workdir DIR]

prints ``PORT <n>`` on stdout once its socket is bound (127.0.0.1, port 0), then serves until
SIGTERM. ``KIND``:

- ``upstream``: ``FastUpstream``, a raw ASGI app answering every POST with one fixed chat
  completion, or a fixed SSE stream when the body asks for ``"stream":true`` (no parsing);
- ``floor``: ``Relay``, a raw ASGI app relaying request and response bytes to ``--upstream`` with
  one shared ``aiohttp.ClientSession``; parses nothing (the least a Python proxy can do);
- ``proxy``: ``proxy.app.create_app`` with real settings (session log on SQLite in ``--workdir``,
  compaction on), on its default aiohttp transport;
- ``proxy-httpx``: the same on httpx's own ``AsyncHTTPTransport`` (the transport issue 2 rejected).

All run under uvicorn with the same options as ``context-proxy serve`` (no access log).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import orjson

REPLY_CONTENT = "The quick brown fox jumps over the lazy dog. " * 4
COMPLETION = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY_CONTENT}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160},
})
STREAM_EVENTS = 20
"""Events of the fixed SSE stream (one word each, then a finish chunk, a usage chunk and [DONE])."""


def _sse() -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        body: dict[str, Any] = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
                                "model": "bench-model", "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            body["usage"] = usage
        return b"data: " + orjson.dumps(body) + b"\n\n"

    words = REPLY_CONTENT.split()[:STREAM_EVENTS - 1]
    parts = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": w + " "}) for w in words]
    parts += [chunk({}, "stop"), chunk({}, usage={"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160}),
              b"data: [DONE]\n\n"]
    return b"".join(parts)


SSE_BODY = _sse()
SSE_PARTS = [p + b"\n\n" for p in SSE_BODY.split(b"\n\n") if p]


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class FastUpstream:
    """A fixed chat completion (``COMPLETION``) or SSE stream (``SSE_PARTS``, one send per event)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        body = await _read_body(receive)
        if b'"stream":true' in body:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
            for part in SSE_PARTS:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(COMPLETION)).encode())]})
        await send({"type": "http.response.body", "body": COMPLETION, "more_body": False})


class Relay:
    """The floor: relays bytes to ``upstream_url`` + path with aiohttp's client, parsing nothing."""

    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.session: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        import aiohttp

        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), auto_decompress=False)
        body = await _read_body(receive)
        headers = {"content-type": "application/json", "authorization": "Bearer bench"}
        async with self.session.request(scope["method"], self.upstream_url + scope["path"].removeprefix("/v1"),
                                        data=body, headers=headers) as resp:
            out = [(b"content-type", resp.headers.get("content-type", "application/json").encode())]
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def build_app(kind: str, upstream_url: str | None, workdir: Path) -> Any:
    """The ASGI app of ``kind`` (see the module docstring)."""
    if kind == "upstream":
        return FastUpstream()
    assert upstream_url, f"{kind} needs --upstream"
    if kind == "floor":
        return Relay(upstream_url)
    import httpx

    from proxy.app import create_app
    from proxy.logging_setup import configure_logging
    from proxy.settings import Settings

    settings = Settings(upstream_url=upstream_url, database_url=f"sqlite:///{workdir / (kind + '.db')}",
                        tiktoken_cache_dir=os.environ.get("TIKTOKEN_CACHE_DIR"))
    configure_logging(settings.log_level, settings.log_format, log_message_content=settings.log_message_content)
    transport = None
    if kind == "proxy-httpx":
        limits = httpx.Limits(max_connections=settings.upstream_pool_size, max_keepalive_connections=settings.upstream_pool_size)
        transport = httpx.AsyncHTTPTransport(limits=limits)
    return create_app(settings, upstream_transport=transport)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["upstream", "floor", "proxy", "proxy-httpx"])
    parser.add_argument("--cpu", type=int, default=None)
    parser.add_argument("--upstream", default=None)
    parser.add_argument("--workdir", default=".")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    app = build_app(args.kind, args.upstream, Path(args.workdir))
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says TCP; with proto 0 Nagle + delayed ACKs add ~40 ms per response.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # connections queue from now on, before uvicorn serves them
    config = uvicorn.Config(app, log_level="warning", access_log=False, log_config=None, ws="none",
                            timeout_graceful_shutdown=1, backlog=2048, timeout_keep_alive=75)
    server = uvicorn.Server(config)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))
    sys.exit(0)


if __name__ == "__main__":
    main()
