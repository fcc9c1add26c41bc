"""Memory of ``GET /sessions/{id}/archive`` for a large session (issue 16 item 3).

    python -m tests.benchmarks.archive_memory [--messages 5000] [--chars 20000] [--concurrent 4]

Writes a session of ``--messages`` messages of ``--chars`` characters to a fresh SQLite file (in
a child process, so its memory does not count), then serves the proxy app under uvicorn in this
process and reads the archive ``--concurrent`` times at once with httpx, each client discarding
the bytes as they arrive. Prints the traced peak (tracemalloc, every thread) and the growth of
the peak RSS (VmHWM) during the reads. Runs against whichever tree it is started in.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

ADMIN_KEY = "sk-archive-memory-admin-0123456789"


def _vm(field: str) -> int:
    """A field of /proc/self/status in bytes (e.g. VmHWM, the peak RSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


async def _write(url: str, messages: int, chars: int) -> None:
    from proxy.conversation.canonical import digests_and_chain
    from storage.migrate import upgrade
    from storage.records import NewMessage
    from storage.store import Store

    await upgrade(url)
    store = await Store.open(url, pool_size=2)
    try:
        session = await store.get_or_create_session("t_benchmark", "big", datetime.now(UTC))
        body = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "y" * chars} for i in range(messages)]
        _, chain = digests_and_chain(body)
        rows = [NewMessage(chain[i], chain[i - 1] if i else None, i, body[i]["role"], body[i]) for i in range(messages)]
        for i in range(0, messages, 200):
            await store.append_messages(session.pk, rows[i : i + 200], datetime.now(UTC))
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--no-trace", action="store_true", help="Time only (tracemalloc slows Python down).")
    parser.add_argument("--write", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        asyncio.run(_write(args.write, args.messages, args.chars))
        return

    import httpx

    from proxy.app import create_app
    from proxy.settings import Settings
    from tests.fakes.server import UvicornServer

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/archive.db"
        subprocess.run([sys.executable, "-m", "tests.benchmarks.archive_memory", "--write", url,
                        "--messages", str(args.messages), "--chars", str(args.chars)], check=True)
        settings = Settings(upstream_url="http://127.0.0.1:9/v1", database_url=url, admin_api_keys=ADMIN_KEY)
        sizes: list[int] = []
        with UvicornServer(create_app(settings)) as server:

            def fetch() -> None:
                auth = {"authorization": f"Bearer {ADMIN_KEY}"}
                with httpx.Client(base_url=server.url, headers=auth, timeout=600) as http, \
                        http.stream("GET", "/sessions/big/archive") as resp:
                    resp.raise_for_status()
                    sizes.append(sum(len(chunk) for chunk in resp.iter_bytes()))

            fetch()  # warm: imports, pools, caches
            sizes.clear()
            rss_before, hwm_before = _vm("VmRSS"), _vm("VmHWM")
            if not args.no_trace:
                tracemalloc.start()
            started = time.perf_counter()
            threads = [threading.Thread(target=fetch) for _ in range(args.concurrent)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        print(f"{args.concurrent} concurrent archives of {sizes[0] / 1e6:.1f} MB ({args.messages} messages x "
              f"{args.chars} chars): {elapsed:.1f} s; traced peak {peak / 1e6:.1f} MB; "
              f"peak RSS grew {(max(_vm('VmHWM'), hwm_before) - max(hwm_before, rss_before)) / 1e6:.1f} MB "
              f"(RSS before {rss_before / 1e6:.0f} MB, peak before {hwm_before / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
