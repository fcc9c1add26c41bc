"""The benchmark's side-by-side mode (``python -m tests.benchmarks --compare REV``) at trivial size.

Its numbers mean nothing here; what is checked: a revision unpacks into a tree whose ``proxy`` is
what the baseline's processes import (the child reports its ``proxy/__init__.py``), the tree is
served as a candidate of the overhead section and answers, and the comparison and its table are
computed from the results.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.benchmarks import REPO_DIR, TRACES_DIR, side_by_side
from tests.benchmarks.baseline import Baseline, config_from_json, config_json
from tests.benchmarks.config import BenchConfig


def _in_git() -> bool:
    probe = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--verify", "HEAD"], capture_output=True, check=False)
    return probe.returncode == 0


needs_git = pytest.mark.skipif(not _in_git(), reason="not a git checkout (a public archive): no revision to compare")


def test_config_survives_the_trip_to_the_child(tmp_path: Path) -> None:
    import orjson

    cfg = BenchConfig(out=tmp_path, quick=True, requests={1: 5, 4: 8}, pipeline_sizes=(10, 30), trace_filter="x")
    back = config_from_json(orjson.loads(orjson.dumps(config_json(cfg), option=orjson.OPT_NON_STR_KEYS)))
    assert back == cfg


def test_an_unknown_revision_is_refused() -> None:
    with pytest.raises(ValueError, match="not a commit"):
        Baseline.from_rev("no-such-revision-0000")


@needs_git
def test_a_revision_unpacks_with_this_harness_laid_over_it() -> None:
    baseline = Baseline.from_rev("HEAD")
    try:
        assert (baseline.tree / "proxy" / "__init__.py").is_file()
        here = (REPO_DIR / "tests" / "benchmarks" / "baseline.py").read_text()
        assert (baseline.tree / "tests" / "benchmarks" / "baseline.py").read_text() == here
        assert baseline.env()["PYTHONPATH"] == str(baseline.tree)
    finally:
        tree = baseline.tree
        baseline.cleanup()
    assert not tree.exists()


@needs_git
@pytest.mark.skipif(not TRACES_DIR.is_dir(), reason="../shared/traces is absent")
def test_the_baseline_is_served_and_measured_in_process(tmp_path: Path) -> None:
    from tests.benchmarks import overhead

    cfg = BenchConfig(out=tmp_path, quick=True, concurrencies=(1,), requests={1: 5}, reps=1,
                      pipeline_sizes=(10,), pipeline_requests=1, pipeline_compaction_reps=1)
    baseline = Baseline.from_rev("HEAD")
    try:
        measured = baseline.run_sections(cfg, ("pipeline",))
        assert measured["proxy_file"] == str((baseline.tree / "proxy" / "__init__.py").resolve())
        assert measured["pipeline"]["sizes"][0]["messages"] == 10
        ov = overhead.run(BenchConfig(out=tmp_path, quick=True, concurrencies=(1,), requests={1: 5}, reps=1),
                          kinds=("direct", "proxy"), baseline=baseline)
    finally:
        baseline.cleanup()
    assert ov["baseline"] == baseline.label
    for point in ov["points"]:
        assert list(point["candidates"]) == ["direct", "proxy", "baseline"]
        assert all(c["errors"] == 0 for c in point["candidates"].values())
        assert point["candidates"]["baseline"]["cpu_ms_per_request"]["median"] > 0
        assert point["candidates"]["proxy"]["cpu_vs_baseline"]["median"] > 0


def _point(stream: bool, proxy_ms: float, base_ms: float, proxy_cpu: float, base_cpu: float) -> dict[str, object]:
    def cand(added: float, cpu: float, **extra: object) -> dict[str, object]:
        return {"added_p50_ms": {"median": added}, "added_ttfb_p50_ms": {"median": added / 2},
                "cpu_ms_per_request": {"median": cpu}, **extra}

    return {"concurrency": 1, "stream": stream, "candidates": {
        "proxy": cand(proxy_ms, proxy_cpu, added_p50_vs_baseline={"median": proxy_ms / base_ms},
                      cpu_vs_baseline={"median": proxy_cpu / base_cpu}),
        "baseline": cand(base_ms, base_cpu)}}


def test_the_comparison_and_its_verdict() -> None:
    results = {
        "baseline": {"label": "abc1234", "source": "abc1234", "pipeline": {"ms_per_mb": 2.0},
                     "storage": {"vs_unique_max": 1.1}},
        "overhead": {"points": [_point(False, 0.5, 0.4, 0.21, 0.20), _point(True, 0.6, 0.6, 0.3, 0.3)]},
        "pipeline": {"ms_per_mb": 1.5}, "storage": {"vs_unique_max": 1.0},
    }
    g = side_by_side.goals(results)
    assert g is not None
    assert g["added_p50_ms"] == {"1": {"proxy": 0.5, "baseline": 0.4}}
    assert g["cpu_vs_baseline"] == {"1": pytest.approx(1.05), "1 stream": pytest.approx(1.0)}
    assert g["cpu_within_goal"] is True  # 5% more CPU is the edge of the goal
    assert g["added_ttfb_ms_at_1"] == {"proxy": 0.3, "baseline": 0.3}
    assert g["pipeline_ms_per_mb"] == {"proxy": 1.5, "baseline": 2.0}
    text = "\n".join(side_by_side.table(g))
    assert "| CPU per request, concurrency 1 (goal ≤ 1.05×) | 0.210 ms | 0.200 ms | 1.050× |" in text
    assert "| CPU per request, concurrency 1, streaming (goal ≤ 1.05×) | 0.300 ms | 0.300 ms | 1.000× |" in text
    assert "| storage ÷ unique message bytes (worst trace) | 1.00× | 1.10× | 0.91× |" in text
    results["overhead"]["points"][0] = _point(False, 0.5, 0.4, 0.22, 0.20)
    assert side_by_side.goals(results)["cpu_within_goal"] is False
    assert side_by_side.goals({"overhead": results["overhead"]}) is None
