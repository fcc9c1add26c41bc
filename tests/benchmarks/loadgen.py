"""Closed-loop load generator (raw HTTP/1.1 over asyncio protocols), run as a process of its own
pinned to one core.

    python -m tests.benchmarks.loadgen --cpu 0

reads one JSON command per line on stdin and answers one JSON line on stdout:
``{"url", "body" (str), "concurrency", "requests", "warmup", "stream"}`` ->
``{"total_ms": [...], "ttfb_ms": [...], "wall_s", "errors"}``. ``concurrency`` keep-alive
connections, each a worker that sends its next request as soon as the previous response is read
to its end. ``warmup`` requests (not recorded) open the connections first. Latency is measured
from just before the request is written to the last byte (``total_ms``) and to the first body
byte (``ttfb_ms``, the first streamed event for SSE).

Why not aiohttp's client: the generator shares a core with the upstream, and through aiohttp
(about 0.1 ms of CPU a request) that core saturated before the floor relay did, so the floor
showed no added latency at concurrency 16 and 64 and no ratio could be computed. This client
writes one prebuilt request and parses only the status line, ``Content-Length`` and chunk
sizes (tens of microseconds a request, on uvloop when installed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import orjson


class ResponseParser:
    """Incremental HTTP/1.1 response parser: ``feed(data)`` returns ``True`` once a whole
    response (``Content-Length`` or chunked body) is in; ``status`` and ``first_body_at``
    (``time.perf_counter()`` of the first body byte) are then set. ``reset()`` for the next one."""

    __slots__ = ("_body_left", "_buf", "_chunked", "_in_body", "first_body_at", "status")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._buf = b""
        self._in_body = False
        self._chunked = False
        self._body_left = 0
        self.status = 0
        self.first_body_at: float | None = None

    def feed(self, data: bytes) -> bool:
        buf = self._buf + data
        if not self._in_body:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._buf = buf
                return False
            head = buf[:end].lower()
            self.status = int(head[9:12])
            self._chunked = b"transfer-encoding: chunked" in head
            at = head.find(b"\r\ncontent-length:")
            if not self._chunked and at >= 0:
                eol = head.find(b"\r\n", at + 2)
                self._body_left = int(head[at + 17:eol if eol >= 0 else len(head)])
            self._in_body = True
            buf = buf[end + 4:]
        if buf and self.first_body_at is None:
            self.first_body_at = time.perf_counter()
        if not self._chunked:
            self._body_left -= len(buf)
            self._buf = b""
            return self._body_left <= 0
        pos = 0  # chunked: skip whole chunks; the last is "0\r\n\r\n"
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            if size == 0:
                if len(buf) >= eol + 4:
                    self._buf = b""
                    return True
                break
            if len(buf) < eol + 2 + size + 2:
                break
            pos = eol + 2 + size + 2
        self._buf = buf[pos:]
        return False


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``request()`` writes the prebuilt request and waits for the
    whole response: ``(status, first body byte time)``."""

    def __init__(self) -> None:
        self.parser = ResponseParser()
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[tuple[int, float | None]] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.parser.feed(data) and self.done is not None and not self.done.done():
            self.done.set_result((self.parser.status, self.parser.first_body_at))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    async def request(self, raw: bytes) -> tuple[int, float | None]:
        assert self.transport is not None
        self.parser.reset()
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.done


async def run_point(url: str, body: bytes, concurrency: int, requests: int, warmup: int, stream: bool) -> dict[str, Any]:
    """Send ``warmup`` then ``requests`` requests with ``concurrency`` workers; latencies in ms."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    raw = (f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
           f"authorization: Bearer sk-bench-client-0123456789\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
    loop = asyncio.get_running_loop()
    total_ms: list[float] = []
    ttfb_ms: list[float] = []
    errors = 0

    async def connect() -> _Connection:
        _, proto = await loop.create_connection(_Connection, host, port)
        return proto

    conns = [await connect() for _ in range(concurrency)]

    async def worker(k: int, queue: list[bool]) -> None:
        nonlocal errors
        while queue:
            record = queue.pop()
            t0 = time.perf_counter()
            try:
                if conns[k].lost:
                    conns[k] = await connect()
                status, first = await conns[k].request(raw)
            except OSError:  # ConnectionError included
                errors += 1
                continue
            t1 = time.perf_counter()
            if status != 200:
                errors += 1
            if record:
                total_ms.append((t1 - t0) * 1000)
                ttfb_ms.append(((first or t1) - t0) * 1000)

    warm = [False] * max(warmup, concurrency)
    await asyncio.gather(*(worker(k, warm) for k in range(concurrency)))
    jobs = [True] * requests
    start = time.perf_counter()
    await asyncio.gather(*(worker(k, jobs) for k in range(concurrency)))
    wall_s = time.perf_counter() - start
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    return {"total_ms": total_ms, "ttfb_ms": ttfb_ms, "wall_s": wall_s, "errors": errors, "stream": stream}


def run(coro: Any) -> Any:
    """``asyncio.run`` on uvloop when installed (it comes with ``uvicorn[standard]``)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = orjson.loads(line)
        result = run(run_point(cmd["url"], cmd["body"].encode(), cmd["concurrency"], cmd["requests"],
                               cmd.get("warmup", 0), cmd.get("stream", False)))
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
