"""Load, scaled down for the default run (issue 5, point 8): 50 concurrent streaming sessions for
5 s through a ``context-proxy serve`` process: zero errors, every request logged, RSS reported.
The full run (200 x 60 s) is ``python -m tests.reliability``."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tests.e2e.conftest import Upstream
from tests.reliability.load import as_json, run_load
from tests.reliability.probes import TALLY, ServeProcess, log_consistency, query

CONCURRENCY = int(os.environ.get("CONTEXT_PROXY_LOAD_CONCURRENCY", "50"))
DURATION_S = float(os.environ.get("CONTEXT_PROXY_LOAD_DURATION_S", "5"))


def test_load_streams_without_errors(upstream: Upstream, database_url: str, tmp_path: Path) -> None:
    proxy = ServeProcess(tmp_path, upstream.url, database_url, CONTEXT_PROXY_LOG_LEVEL="warning").start()
    try:
        assert proxy.proc is not None
        report = asyncio.run(run_load(proxy.url, upstream.url, proxy.proc.pid, concurrency=CONCURRENCY,
                                      duration_s=DURATION_S, calibration_s=2))
        deadline = time.monotonic() + 30
        while query(database_url, "SELECT COUNT(*) FROM requests")[0][0] < report["requests"]:
            assert time.monotonic() < deadline, "not every request was logged"
            time.sleep(0.1)
    finally:
        proxy.stop()
    print(f"\nload {database_url.split(':')[0]}: {as_json(report)}")
    assert report["errors"] == 0, report["error_samples"]
    assert report["requests"] >= CONCURRENCY
    assert query(database_url, "SELECT COUNT(*) FROM requests WHERE status <> 200")[0][0] == 0
    log_consistency(database_url)
    TALLY.add("requests", report["requests"])
    TALLY.note(f"load_small_{database_url.split(':')[0]}", as_json(report))
