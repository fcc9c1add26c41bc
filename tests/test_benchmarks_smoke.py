"""The benchmark's pieces at trivial size, so ``python -m tests.benchmarks`` cannot rot silently.

Not the benchmark itself (its numbers are meaningless at this size): each section runs on a few
requests and the report is written with the keys issue 7 fixes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.benchmarks import (
    TRACES_DIR,
    compression,
    overhead,
    pipeline,
    report,
    storage_growth,
)
from tests.benchmarks.config import BenchConfig
from tests.benchmarks.stats import percentile, spread

pytestmark = pytest.mark.skipif(not TRACES_DIR.is_dir(), reason="../shared/traces is absent")


def test_order_statistics() -> None:
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([5], 0.99) == 5
    assert spread([3, 1, 2]) == {"median": 2, "min": 1, "max": 3}


def test_prefix_share() -> None:
    assert compression.prefix_share(b"abcd", b"abXY") == 0.5
    assert compression.prefix_share(b"abcd", b"abcdef") == 1.0


def test_history_is_made_of_unique_trace_messages() -> None:
    pool = pipeline.trace_messages()[:7]
    history = pipeline.build_history(20, pool)
    assert len(history) == 20
    assert len({orjson.dumps(m) for m in history if isinstance(m.get("content"), str)}) == sum(
        isinstance(m.get("content"), str) for m in history)


def test_sections_and_report_at_trivial_size(tmp_path: Path) -> None:
    cfg = BenchConfig(out=tmp_path, quick=True, concurrencies=(1, 4), requests={1: 5, 4: 8}, reps=2,
                      pipeline_sizes=(10, 30), pipeline_requests=2, pipeline_compaction_reps=1,
                      compression_traces=1, windows=(8_192,), storage_traces=1,
                      trace_filter="tau-bench__airline-task2")
    results = {
        "machine": report.machine(), "config": {"quick": True},
        "overhead": overhead.run(cfg, kinds=("direct", "floor", "proxy")),
        "pipeline": pipeline.run(cfg),
        "storage": storage_growth.run(cfg),
        "compression": compression.run(cfg),
    }
    point = results["overhead"]["points"][0]
    assert set(point["candidates"]) == {"direct", "floor", "proxy"}
    assert all(c["errors"] == 0 for p in results["overhead"]["points"] for c in p["candidates"].values())
    assert point["candidates"]["proxy"]["cpu_ms_per_request"]["median"] > 0
    messages = results["overhead"]["messages_points"]  # POST /v1/messages: each concurrency, streamed at the first
    assert [(p["concurrency"], p["stream"], p["api"]) for p in messages] == [
        (1, False, "messages"), (4, False, "messages"), (1, True, "messages")]
    assert all(c["errors"] == 0 for p in messages for c in p["candidates"].values())
    assert set(messages[0]["candidates"]) == {"direct", "floor", "proxy"}
    (history,) = results["overhead"]["history_points"]  # the large-history request at the first concurrency
    assert history["concurrency"] == 1 and history["history_bytes"] >= overhead.HISTORY_BYTES
    assert all(c["errors"] == 0 for c in history["candidates"].values())
    assert results["pipeline"]["sizes"][0]["compaction_defenses"].startswith("summary")
    assert results["storage"]["traces"][0]["message_payload_bytes"] > 0
    assert results["compression"]["rows"][0]["turns"] > 0

    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- perf:start -->\nold\n<!-- perf:end -->\ntail\n")
    report.write(results, tmp_path / "out", readme, "python -m tests.benchmarks --quick --out out")
    saved = orjson.loads((tmp_path / "out" / "results.json").read_bytes())
    assert {"overhead", "pipeline", "storage", "compression", "goals"} <= set(saved)
    goals = saved["goals"]
    assert set(goals["added_latency_vs_floor"]) == {"1", "4"} == set(goals["messages_added_latency_vs_floor"])
    assert "Messages (`POST /v1/messages`" in (tmp_path / "out" / "report.md").read_text()
    assert "KB history, concurrency 1" in (tmp_path / "out" / "report.md").read_text()
    assert goals["added_latency_vs_litellm"] is None
    assert goals["pipeline_ms_per_mb"] > 0 and goals["storage_vs_unique_bytes_max"] > 0
    assert {"overhead.png", "pipeline.png", "compression.png"} <= {p.name for p in (tmp_path / "out").iterdir()}
    text = readme.read_text()
    assert "old" not in text and "## Performance" in text and text.endswith("<!-- perf:end -->\ntail\n")


def test_cpu_of_a_process_grows() -> None:
    import os

    before = overhead.cpu_ns(os.getpid())
    asyncio.run(asyncio.sleep(0))
    sum(i * i for i in range(200_000))
    assert overhead.cpu_ns(os.getpid()) > before


def test_load_generator_parses_responses_split_anywhere() -> None:
    """The raw load generator must see where a response ends, however TCP splits it (a response
    taken as complete too early would make every latency too short)."""
    from tests.benchmarks.loadgen import ResponseParser
    from tests.benchmarks.servers import _JSON_HEAD, _SSE_CHUNKS, _SSE_HEAD, COMPLETION

    for whole in (_JSON_HEAD + COMPLETION, _SSE_HEAD + b"".join(_SSE_CHUNKS)):
        for size in (1, 2, 7, 64, len(whole)):
            parser = ResponseParser()
            pieces = [whole[i:i + size] for i in range(0, len(whole), size)]
            ends = [parser.feed(p) for p in pieces]
            assert ends[-1] and not any(ends[:-1]), size
            assert parser.status == 200 and parser.first_body_at is not None


def test_quiet_mode_pauses_every_other_candidate_while_one_is_measured() -> None:
    """``candidates.alone``: the measured server runs, the other candidates are stopped (state
    ``T``), the upstream is never paused, and all run again afterwards (even after an error)."""
    import subprocess

    from tests.benchmarks.candidates import Server, alone, process_state

    procs = {name: subprocess.Popen(["sleep", "60"]) for name in ("upstream", "floor", "proxy", "awecompress")}
    srv: dict[str, Server | None] = {"direct": None}
    for name, proc in procs.items():
        server = Server.__new__(Server)
        server.proc = proc
        srv[name] = server

    def stopped() -> set[str]:
        return {name for name, s in srv.items() if s is not None and process_state(s.pid) == "T"}

    try:
        with alone(srv, "proxy"):
            assert stopped() == {"floor", "awecompress"}
        assert stopped() == set()
        with pytest.raises(RuntimeError), alone(srv, "direct"):
            assert stopped() == {"floor", "proxy", "awecompress"}
            raise RuntimeError("the load generator died")
        assert stopped() == set()
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
