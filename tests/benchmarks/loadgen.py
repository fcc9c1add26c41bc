"""Closed-loop load generator (aiohttp), run as a process of its own pinned to one core.

    python -m tests.benchmarks.loadgen --cpu 0

reads one JSON command per line on stdin and answers one JSON line on stdout:
``{"url", "body" (str), "concurrency", "requests", "warmup", "stream"}`` ->
``{"total_ms": [...], "ttfb_ms": [...], "wall_s", "errors"}``. ``concurrency`` workers share one
connection pool (``limit=concurrency``); each sends its next request as soon as the previous one
is read to the end. ``warmup`` requests (not recorded) open the connections first. Latency is
measured from just before the request is sent to the last byte (``total_ms``) and to the first
body byte (``ttfb_ms``, the first streamed event for SSE).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import aiohttp
import orjson


async def run_point(url: str, body: bytes, concurrency: int, requests: int, warmup: int, stream: bool) -> dict[str, Any]:
    """Send ``warmup`` then ``requests`` requests with ``concurrency`` workers; latencies in ms."""
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-client-0123456789"}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    total_ms: list[float] = []
    ttfb_ms: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:

        async def one(record: bool) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            first = None
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    async for _chunk in resp.content.iter_any():
                        if first is None:
                            first = time.perf_counter()
                    if resp.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
                return
            t1 = time.perf_counter()
            if record:
                total_ms.append((t1 - t0) * 1000)
                ttfb_ms.append(((first or t1) - t0) * 1000)

        async def worker(queue: list[bool]) -> None:
            while queue:
                await one(queue.pop())

        warm = [False] * max(warmup, concurrency)
        await asyncio.gather(*(worker(warm) for _ in range(concurrency)))
        jobs = [True] * requests
        start = time.perf_counter()
        await asyncio.gather(*(worker(jobs) for _ in range(concurrency)))
        wall_s = time.perf_counter() - start
    return {"total_ms": total_ms, "ttfb_ms": ttfb_ms, "wall_s": wall_s, "errors": errors, "stream": stream}


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
        result = asyncio.run(run_point(cmd["url"], cmd["body"].encode(), cmd["concurrency"], cmd["requests"],
                                       cmd.get("warmup", 0), cmd.get("stream", False)))
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
