"""The adversarial harness (issue 16): attack a ``context-proxy serve`` built from any source tree.

    python -m tests.reliability.adversarial --tree DIR --db sqlite|postgresql --json OUT [--only 1,6,9]

Starts, all on loopback free ports: the upstream process (``adversarial_upstream``: the strict fake
provider behind behaviours chosen per request, and an "other" server that must never be reached),
PostgreSQL of its own (``probes.PgCluster``) or a SQLite file, and ``python -m proxy.cli serve``
from ``DIR`` (cwd and PYTHONPATH ``DIR``) in four configurations: the default mode (client keys
passed through, admin key set, offload threshold 300 tokens), shared-key mode, a pool of 10 upstream
connections, and an upstream URL without a path (SSRF). Then runs each attempt of issue 16's items
1-15 and variations, and writes one JSON record per attempt: item, attempt, what was sent, outcome
(``held`` / ``defect`` / ``n/a``), detail, figures (proxy RSS and peak, VmHWM, file descriptors,
``/metrics`` size and scrape time, what a healthy client waited meanwhile: max and p99).

A proxy that dies or hangs is a result (``defect: proxy died``), then restarted for what follows.
Every process is its own process group, killed at the end, on errors and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.reliability import adversarial_logic as logic
from tests.reliability import adversarial_readapi as readapi
from tests.reliability import adversarial_resources as res
from tests.reliability.adversarial_env import (
    Cleanup,
    Ctx,
    Healthy,
    Proxy,
    UpstreamProcess,
)

MAIN_ENV = {"CONTEXT_PROXY_ADMIN_API_KEYS": readapi.ADMIN_KEY, "CONTEXT_PROXY_OFFLOAD_TOOL_TOKENS": "300"}

Attack = tuple[int, str, Callable[[Ctx, Proxy, Healthy], None]]
FRESH = {"big header", "big bodies", "endless stream", "no blank line", "archives"}
"""Attempts measured on a freshly started proxy (memory figures not blurred by earlier floods)."""
MAIN_ATTACKS: list[Attack] = [
    (0, "held before", lambda c, p, h: readapi.held_before(c, p)),
    (1, "metrics", res.metrics_flood),
    (2, "big header", res.big_header),
    (2, "many headers", res.many_headers),
    (2, "slow clients", res.slow_clients),
    (3, "big bodies", res.big_bodies),
    (3, "endless stream", res.endless_stream),
    (3, "no blank line", res.no_blank_line),
    (3, "archives", res.archives),
    (5, "unauthorized", lambda c, p, h: res.unauthorized_bodies(c, p)),
    (6, "ssrf (upstream .../v1)", lambda c, p, h: logic.ssrf(c, p, "upstream URL with /v1")),
    (7, "hop-by-hop", lambda c, p, h: logic.hop_by_hop(c, p)),
    (8, "chat paths", lambda c, p, h: logic.chat_path_variants(c, p)),
    (9, "forged archive", lambda c, p, h: logic.forged_archive(c, p)),
    (10, "read-tool scope", lambda c, p, h: logic.read_tool_scope(c, p)),
    (11, "odd values", lambda c, p, h: logic.odd_values(c, p)),
    (12, "bad shapes", lambda c, p, h: logic.bad_shapes(c, p)),
    (13, "session ids", lambda c, p, h: readapi.session_ids(c, p)),
    (14, "cursors and admins", lambda c, p, h: readapi.cursors_and_admins(c, p)),
    (15, "unknown leaf", lambda c, p, h: readapi.unknown_leaf(c, p)),
    (11, "retention", lambda c, p, h: logic.retention_active(c, p)),
]


def _run(ctx: Ctx, item: int, name: str, fn: Callable[[], None], proxy: Proxy) -> None:
    before = len(ctx.results)
    t0 = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - an attack that fails is a result; the run goes on
        died = not proxy.alive()
        ctx.record(item, name, "", "defect" if died else "n/a",
                   ("proxy died" if died else "harness error") + f": {type(exc).__name__}: {str(exc)[:200]}")
        if not died:
            traceback.print_exc()
    if proxy.proc is not None and not proxy.alive():
        ctx.record(item, name, "", "defect", f"proxy died (exit {proxy.proc.returncode}): {proxy.log_text()[-300:]!r}")
    for r in ctx.results[before:]:
        r.setdefault("group_seconds", round(time.monotonic() - t0, 1))


def _restart(ctx: Ctx, proxy: Proxy, env: dict[str, str], upstream_url: str | None = None) -> Proxy:
    if proxy.alive():
        return proxy
    fresh = ctx.proxy(upstream_url, **env)
    if not fresh.start():
        raise RuntimeError(f"the proxy does not start again: {fresh.start_error}")
    return fresh


def run(tree: Path, db: str, only: set[int] | None, keep_tmp: bool = False) -> dict[str, Any]:
    cleanup = Cleanup()
    tmp = Path(tempfile.mkdtemp(prefix="context-proxy-adversarial-"))
    t_start = time.monotonic()
    try:
        if db == "postgresql":
            from tests.reliability.probes import PgCluster

            cluster = PgCluster().start()
            cleanup.callbacks.append(cluster.remove)
            database_url = cluster.url
        else:
            database_url = f"sqlite:///{tmp / 'adversarial.db'}"
        ctx = Ctx(tree=tree, tmp=tmp, db=db, database_url=database_url, upstream=UpstreamProcess(cleanup), cleanup=cleanup)
        wanted = (lambda i: True) if only is None else (lambda i: i in only)
        main = ctx.proxy(**MAIN_ENV)
        if not main.start():
            raise RuntimeError(f"the proxy does not start: {main.start_error}")
        healthy = Healthy(main).start()
        for item, name, attack in MAIN_ATTACKS:
            if not wanted(item):
                continue
            print(f"[{item}] {name}", flush=True)
            if name in FRESH:
                healthy.stop()
                main.stop()
                main = _restart(ctx, main, MAIN_ENV)
                healthy = Healthy(main).start()
                time.sleep(1)
            _run(ctx, item, name, lambda a=attack, p=main, h=healthy: a(ctx, p, h), main)
            if not main.alive():
                healthy.stop()
                main = _restart(ctx, main, MAIN_ENV)
                healthy = Healthy(main).start()
        healthy.stop()
        for item, name, env, upstream_url, fn in (
            (7, "shared-key mode", {"CONTEXT_PROXY_UPSTREAM_API_KEY": "sk-operator-adv-secret",
                                    "CONTEXT_PROXY_CLIENT_API_KEYS": "ck-tenant-a,ck-tenant-b"}, None, logic.shared_key_headers),
            (4, "pool share", {"CONTEXT_PROXY_UPSTREAM_POOL_SIZE": "10", "CONTEXT_PROXY_UPSTREAM_CONNECT_TIMEOUT_S": "3"}, None, res.pool_share),
            (6, "ssrf (upstream without path)", {}, ctx.upstream.url, lambda c, p: logic.ssrf(c, p, "upstream URL without a path")),
        ):
            if not wanted(item):
                continue
            print(f"[{item}] {name}", flush=True)
            proxy = ctx.proxy(upstream_url, **env)
            if not proxy.start():
                ctx.record(item, name, f"proxy started with {env or upstream_url}", "n/a",
                           f"the proxy refused the configuration: {proxy.start_error[:200] if proxy.start_error else ''}")
                continue
            _run(ctx, item, name, lambda f=fn, p=proxy: f(ctx, p), proxy)
            proxy.stop()
        if only is None or 0 in only or 11 in only:
            readapi.secrets_and_logs(ctx)
        return {"tree": str(tree), "db": db, "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "seconds": round(time.monotonic() - t_start, 1), "cpus": os.cpu_count(), "attempts": ctx.results}
    finally:
        cleanup.close()
        if keep_tmp:
            print(f"kept {tmp} (proxy logs, SQLite file)", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, required=True, help="Source tree to run the proxy from.")
    parser.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--json", type=Path, required=True, help="Where to write the attempts (JSON).")
    parser.add_argument("--only", default=None, help="Comma-separated item numbers (0: what held before).")
    parser.add_argument("--keep-tmp", action="store_true", help="Keep the run's directory (proxy logs, SQLite file).")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    only = {int(x) for x in args.only.split(",")} if args.only else None
    report = run(args.tree.resolve(), args.db, only, args.keep_tmp)
    args.json.write_text(json.dumps(report, indent=1))
    defects = sum(1 for a in report["attempts"] if a["outcome"] == "defect")
    print(f"wrote {args.json}: {len(report['attempts'])} attempts, {defects} defects, {report['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
