"""The benchmark's issue-21 parts at trivial size: awecompress as an optional candidate, the
crowded mode, the large-history point, the compaction turn and the goals against the peers.

Their numbers mean nothing here; what is checked is that each runs, measures what it says and
lands in ``results.json`` and the report. awecompress is optional: the test that serves it runs
where ``CONTEXT_PROXY_BENCH_AWECOMPRESS_PYTHON`` names a Python that has it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.benchmarks import TRACES_DIR, candidates, compaction_turn, overhead, peer_goals, peer_table, peers, report
from tests.benchmarks.config import BenchConfig

needs_traces = pytest.mark.skipif(not TRACES_DIR.is_dir(), reason="../shared/traces is absent")


def _absent(monkeypatch: pytest.MonkeyPatch, *kinds: str) -> None:
    """The peers ``kinds`` made absent from this Python too (their modules named as none that
    exists), whatever the test environment has installed."""
    for kind in kinds:
        monkeypatch.setitem(peers.BY_KIND, kind, dataclasses.replace(peers.BY_KIND[kind],
                                                                      modules=("context_proxy_no_such_peer",)))


@pytest.mark.parametrize("kind", peers.PEERS)
def test_a_peer_is_optional(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python without the peer named by its variable: not measured, and the report says how."""
    _absent(monkeypatch, kind)
    peer = peers.BY_KIND[kind]
    monkeypatch.setenv(peer.env, sys.executable)
    assert peers.python_for(kind) is None and peers.version(kind) is None
    assert kind not in peers.optional_kinds()
    status = peers.status(kind)
    assert status is not None and peer.env in status and peer.install in status
    monkeypatch.delenv(peer.env)
    assert peers.python_for(kind) is None


def test_the_peers_variables_and_install_lines() -> None:
    assert [(p.kind, p.env, p.install) for p in peers.PEER_LIST] == [
        ("awecompress", "CONTEXT_PROXY_BENCH_AWECOMPRESS_PYTHON", "pip install awecompress==0.2.0"),
        ("cliffcompaction", "CONTEXT_PROXY_BENCH_CLIFFCOMPACTION_PYTHON", "pip install cliffcompaction==0.1.0"),
        ("context-guardian", "CONTEXT_PROXY_BENCH_CONTEXT_GUARDIAN_PYTHON", "pip install context-guardian==0.12.0"),
        ("headroom", "CONTEXT_PROXY_BENCH_HEADROOM_PYTHON", "pip install 'headroom-ai[proxy]==0.42.0'"),
        ("litellm", "CONTEXT_PROXY_BENCH_LITELLM_PYTHON", "pip install 'litellm[proxy]'")]
    note = peers.install_note()
    assert all(p.env in note and p.install in note for p in peers.PEER_LIST)


def test_awecompress_is_configured_never_to_summarize(tmp_path: Path) -> None:
    cmd, env = peers.command("awecompress", "/py", 4321, "http://127.0.0.1:9", tmp_path)
    assert cmd == ["/py", "-m", "awecompress.cli", "serve", "--port", "4321", "--host", "127.0.0.1",
                   "--config", str(tmp_path / "awecompress.json")]
    assert env == {"AWECOMPRESS_CONFIG_DIR": str(tmp_path)}
    config = orjson.loads((tmp_path / "awecompress.json").read_bytes())
    assert config == {"port": 4321, "host": "127.0.0.1", "upstream": "http://127.0.0.1:9",
                      "thresholdTokens": peers.NEVER_TOKENS, "dbPath": str(tmp_path / "awecompress.db")}


def test_cliffcompaction_is_configured_never_to_compact(tmp_path: Path) -> None:
    cmd, env = peers.command("cliffcompaction", "/py", 4321, "http://127.0.0.1:9", tmp_path)
    assert cmd == ["/py", "-m", "cliffcompaction", "serve", "--host", "127.0.0.1", "--port", "4321",
                   "--openai-upstream", "http://127.0.0.1:9", "--anthropic-upstream", "http://127.0.0.1:9",
                   "--threshold", str(peers.NEVER_TOKENS)]
    assert env == {}


def test_context_guardian_is_configured_never_to_summarize_or_probe(tmp_path: Path) -> None:
    cmd, env = peers.command("context-guardian", "/py", 4321, "http://127.0.0.1:9", tmp_path)
    assert cmd == ["/py", "-c", "from context_guardian import main; main()"]
    assert env == {"GUARDIAN_HOST": "127.0.0.1", "GUARDIAN_PORT": "4321", "GUARDIAN_UPSTREAM_URL": "http://127.0.0.1:9/v1",
                   "GUARDIAN_NUM_CTX": str(peers.NEVER_TOKENS), "GUARDIAN_DETECT_CONTEXT": "0",
                   "GUARDIAN_VERSION_CHECK": "0", "GUARDIAN_DATA_DIR": str(tmp_path / "context-guardian")}


def test_headroom_is_configured_with_its_cache_and_rate_limit_off(tmp_path: Path) -> None:
    cmd, env = peers.command("headroom", "/py", 4321, "http://127.0.0.1:9", tmp_path)
    assert cmd == ["/py", "-m", "headroom.cli", "proxy", "--host", "127.0.0.1", "--port", "4321",
                   "--openai-api-url", "http://127.0.0.1:9", "--anthropic-api-url", "http://127.0.0.1:9",
                   "--no-cache", "--no-rate-limit", "--no-telemetry", "--no-subscription-tracking"]
    assert env == {"HOME": str(tmp_path / "headroom-home"), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
    with pytest.raises(ValueError, match="litellm"):
        peers.command("litellm", "/py", 4321, "http://127.0.0.1:9", tmp_path)


def _test_env(kind: str) -> str:
    """The variable naming a Python with peer ``kind`` for the test that serves it (``.ci/run``
    names awecompress's): not the benchmark's, which would add the peer to the smoke tests' runs."""
    return peers.BY_KIND[kind].env.replace("_BENCH_", "_TEST_")


@pytest.mark.parametrize("kind", peers.CLI_PEERS)
def test_a_peer_is_served_in_front_of_the_upstream(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs where a Python with the peer is at hand (the benchmark's variable, or this test's,
    ``CONTEXT_PROXY_TEST_<NAME>_PYTHON``); with this test's set, a missing peer fails the test.
    A chat completion and a streamed one come back from the fake upstream through it, relayed whole."""
    from tests.benchmarks.servers import COMPLETION, SSE_BODY

    named = os.environ.get(_test_env(kind))
    if named:
        monkeypatch.setenv(peers.BY_KIND[kind].env, named)
    if peers.python_for(kind) is None:
        if named:
            pytest.fail(f"{_test_env(kind)} names a Python without {kind}: {named}")
        pytest.skip(f"{kind} is optional: set {_test_env(kind)} to run this test")

    with candidates.servers(tmp_path, ("direct", kind)) as srv:
        server = srv[kind]
        assert server is not None and server.kind == kind
        for stream, expected in ((False, COMPLETION), (True, SSE_BODY)):
            request = urllib.request.Request(server.url + "/v1/chat/completions", data=overhead.request_body(stream),
                                             headers={"content-type": "application/json",
                                                      "authorization": "Bearer sk-bench-client-0123456789"})
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert resp.status == 200
                assert resp.read() == expected  # relayed whole: nothing summarized, compressed or cached
    if kind == "awecompress":
        assert "[awecompress]" not in (tmp_path / "awecompress.log").read_text()  # no outcome line: passthrough


def test_crowded_mode_starts_bystanders_that_stay_up(tmp_path: Path) -> None:
    assert candidates.crowd_kinds(("direct", "floor", "proxy"), 3) == ["floor", "proxy", "floor"]
    assert candidates.crowd_kinds(("direct",), 3) == []
    _near, far = candidates.cores()
    with candidates.servers(tmp_path, ("direct", "floor"), crowd=2) as srv:
        bystanders = [srv["crowd-0"], srv["crowd-1"]]
        for server in bystanders:
            assert server is not None and server.proc.poll() is None and server.kind == "floor"
            if far is not None:
                import os

                assert os.sched_getaffinity(server.pid) == {far}  # on the candidate core
            with urllib.request.urlopen(urllib.request.Request(server.url + "/v1/chat/completions", data=b"{}"),
                                        timeout=10) as resp:
                assert resp.status == 200
    assert all(s is not None and s.proc.poll() is not None for s in bystanders)  # stopped with the others


@needs_traces
def test_the_overhead_section_crowded_with_the_history_point(tmp_path: Path) -> None:
    cfg = BenchConfig(out=tmp_path, quick=True, concurrencies=(1,), requests={1: 5}, reps=1)
    ov = overhead.run(cfg, kinds=("direct", "floor", "proxy"), crowd=2)
    assert ov["crowd"] == ["floor", "proxy"]
    # idle before the points: the proxy's main loop ticks once a second, uvicorn's (the floor's) ten times
    assert {"floor", "proxy"} <= set(ov["idle"])
    assert ov["idle"]["proxy"]["wakeups_per_s"] < ov["idle"]["floor"]["wakeups_per_s"] / 2
    assert ov["servers_on_candidate_core"] == 2 + 2 + len(peers.optional_kinds())
    (point,) = ov["history_points"]
    assert point["history_bytes"] >= overhead.HISTORY_BYTES
    assert point["candidates"]["proxy"]["errors"] == 0 and point["candidates"]["floor"]["errors"] == 0
    assert point["candidates"]["proxy"]["cpu_ms_per_request"]["median"] > 0


def _cand(added: float, ttfb: float, rps: float = 100.0) -> dict[str, Any]:
    return {"added_p50_ms": {"median": added}, "added_ttfb_p50_ms": {"median": ttfb}, "rps": {"median": rps}}


def _overhead(proxy_ms: float, awe_ms: float, rps: float) -> dict[str, Any]:
    def point(c: int, stream: bool) -> dict[str, Any]:
        return {"concurrency": c, "stream": stream, "candidates": {
            "direct": _cand(0, 0), "floor": _cand(0.3, 0.3, rps * 2), "proxy": _cand(proxy_ms * c, proxy_ms, rps),
            "awecompress": _cand(awe_ms * c, awe_ms)}}

    history = {"concurrency": 1, "stream": False, "history_bytes": 400_000, "candidates": {
        "direct": _cand(0, 0), "floor": _cand(0.8, 0.8), "proxy": _cand(2.0, 2.0), "proxy-httpx": _cand(1.5, 1.5),
        "awecompress": _cand(4.6, 4.6)}}
    return {"points": [point(1, False), point(16, False), point(1, True)], "history_points": [history]}


def test_goals_against_awecompress_and_the_history_point() -> None:
    g = peer_goals.goals(_overhead(0.5, 0.4, 1000))
    assert g["vs_awecompress"] == {"1": {"proxy": 0.5, "awecompress": 0.4}, "16": {"proxy": 8.0, "awecompress": 6.4},
                                   "ttfb": {"proxy": 0.5, "awecompress": 0.4}}
    assert g["history"]["fastest_peer"] == "proxy"  # the floor and proxy-httpx are faster, but no peers
    assert peer_goals.verdicts(g) == {"vs_awecompress": False, "history_fastest": True}
    assert peer_goals.verdicts(peer_goals.goals(_overhead(0.4, 0.4, 1000)))["vs_awecompress"] is True
    text = "\n".join(peer_goals.rows(g, "crowded"))
    assert "| crowded: added p50 ≤ awecompress's (concurrency 1 / 16) | 0.50 vs 0.40 ms / 8.00 vs 6.40 ms | **not met** |" in text
    assert "| crowded: 400 KB history (concurrency 1), the proxy's added p50 the lowest of the peers | 2.00 ms " \
           "(floor 0.80, proxy-httpx 1.50, awecompress 4.60) | met |" in text
    assert peer_goals.goals(None) == {"vs_awecompress": None, "history": None}
    assert "not measured (awecompress not installed)" in "\n".join(peer_goals.rows({}, "quiet"))
    ratios = peer_goals.crowded_vs_quiet(_overhead(0.5, 0.4, 1000), _overhead(0.5, 0.4, 500))
    assert ratios == {"1": {"proxy": 0.5, "floor": 0.5}, "16": {"proxy": 0.5, "floor": 0.5}}


def test_both_modes_and_the_compaction_turn_in_the_report(tmp_path: Path) -> None:
    quiet, crowded = _overhead(0.5, 0.6, 1000), _overhead(0.9, 0.6, 500)
    turn = {"normal_ms": 3.0, "compaction_ms": 5003.0, "stall_ms": 5000.0, "summary_delay_s": 5.0}
    results: dict[str, Any] = {"machine": report.machine(), "config": {"quick": True},
                               "overhead": quiet, "overhead_crowded": crowded, "compaction_turn": None}
    g = report.goals(results | {"compaction_turn": turn})
    assert g["met"]["vs_awecompress"] is True and g["met"]["crowded.vs_awecompress"] is False
    assert g["met"]["history_fastest"] is True and g["met"]["crowded.history_fastest"] is True
    assert g["compaction_turn"] == turn
    text = "\n".join(report.goals_table(g))
    assert "| quiet: added p50 ≤ awecompress's" in text and "| crowded: added p50 ≤ awecompress's" in text
    assert "(summarizer answering after 5 s) | 5003 vs 3.0 ms (stall 5000 ms) | – |" in text
    assert "requests/s crowded ÷ quiet (concurrency 1 / 16) | 0.50× (floor 0.50×)" in text


def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    from tests.benchmarks.__main__ import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--modes", "loud"])


@needs_traces
def test_a_compacting_turn_waits_for_the_summarizer(tmp_path: Path) -> None:
    cfg = BenchConfig(out=tmp_path, quick=True, pipeline_compaction_reps=1, summary_delay_s=0.3, compaction_turn_normal=2)
    r = compaction_turn.run(cfg)
    assert r["summary_calls"] >= 1 and r["defenses"].startswith("summary")
    assert r["compaction_ms"] >= 300  # the client waited for the summary (normal turns made none: measure asserts it)
    assert r["stall_ms"] == r["compaction_ms"] - r["normal_ms"]
    assert "| stall (difference) |" in "\n".join(compaction_turn.table(r))


CALLGRIND_OUT = """# callgrind format
version: 1
positions: line
events: Ir
ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) ceval.c
fn=(1) eval
10 100
+2 50
cob=(2) /usr/lib/libsqlite3.so.0
cfi=(2) vdbe.c
cfn=(2) step
calls=3 20
* 999
-1 7
ob=(2)
fl=(2)
fn=(2)
20 40
ob=(1)
fn=(1)
* 3
totals: 200
"""


def test_instructions_are_read_by_shared_object(tmp_path: Path) -> None:
    """Self cost by object: a call's inclusive cost (after ``calls=``) is the callee's, not the
    caller's; an object's name is given once, where first seen (``ob=`` or ``cob=``)."""
    from tests.benchmarks import instructions

    out = tmp_path / "callgrind.proxy.1"
    out.write_text(CALLGRIND_OUT)
    assert instructions.by_object(out) == {"libpython3.11.so.1.0": 160, "libsqlite3.so.0": 40}


def test_instructions_section_without_valgrind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.benchmarks import instructions

    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    r = instructions.run(BenchConfig(out=tmp_path))
    assert r["status"] is not None and "valgrind" in r["status"]
    assert "valgrind is not installed" in "\n".join(instructions.table(r))
    g = report.goals({"instructions": {"status": None, "proxy_vs_floor": 3.1}})
    assert g["met"]["instructions_vs_floor"] is False
    text = "\n".join(report.goals_table(g))
    assert "| instructions per request ≤ 2× the floor's (callgrind, concurrency 16; load-independent) | 3.10× | " \
           "**not met** |" in text
    assert "awecompress" not in text and "LiteLLM" not in text  # the overhead section did not run: no rows of it


def _peer_overhead(installed: tuple[str, ...]) -> dict[str, Any]:
    """An overhead section at issue 21's points: every concurrency streamed and not, the history
    point; the floor, the proxy and the ``installed`` peers measured (each its own numbers)."""
    base = {"floor": 0.25, "proxy": 0.95, "awecompress": 0.43, "cliffcompaction": 1.54, "context-guardian": 1.56,
            "headroom": 6.4, "litellm": 11.7}
    kinds = ("direct", "floor", "proxy", *installed)

    def spread(v: float) -> dict[str, float]:
        return {"median": v, "min": v, "max": v}

    def cand(kind: str, c: int, history: bool) -> dict[str, Any]:
        added = 0.0 if kind == "direct" else base[kind]
        return {"added_p50_ms": spread(added * (4 if history else c)), "added_ttfb_p50_ms": spread(added),
                "added_p99_ms": spread(added * 2), "rps": spread(10_000 / (1 + added * c)),
                "cpu_ms_per_request": spread(added / 2)}

    def point(c: int, stream: bool, history: bool = False) -> dict[str, Any]:
        return {"concurrency": c, "stream": stream, "reps": 5, "requests": 100,
                "candidates": {k: cand(k, c, history) for k in kinds}}

    history = point(1, False, history=True) | {"history_bytes": 402_646}
    return {"points": [point(c, s) for s in (False, True) for c in (1, 16, 64)], "history_points": [history],
            "servers_on_candidate_core": len(kinds) - 1,
            "peer_status": {k: None if k in installed else peers.status(k) for k in peers.PEERS},
            "peer_versions": {k: {"awecompress": "0.2.0", "cliffcompaction": "0.1.0"}[k] for k in installed}}


def test_the_peer_table_has_a_row_each_measured_or_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for peer in peers.PEER_LIST:
        monkeypatch.delenv(peer.env, raising=False)
    _absent(monkeypatch, "context-guardian", "headroom", "litellm")
    ov = _peer_overhead(("awecompress", "cliffcompaction"))
    lines = peer_table.table(ov, "quiet")
    assert lines[0].startswith("Against the peers, quiet (4 servers on the candidate core, all but the one measured paused): ")
    assert lines[2] == ("| candidate | added p50, c=1 | requests/s, c=16 | added p50, c=64 | added time to the first "
                        "streamed byte, c=1 | added p50, 402 KB history, c=1 |")
    rows = lines[4:-1]
    assert [r.split(" | ")[0] for r in rows] == [
        "| the Python floor (raw ASGI relay on aiohttp)", "| awecompress 0.2.0", "| **context-proxy**",
        "| cliffcompaction 0.1.0", "| context-guardian 0.12.0", "| headroom-ai 0.42.0 (cache off)", "| LiteLLM proxy"]
    assert rows[0] == "| the Python floor (raw ASGI relay on aiohttp) | +0.25 ms | 2,000 | +16.0 ms | +0.25 ms | +1.00 ms |"
    assert rows[2] == "| **context-proxy** | +0.95 ms | 617 | +60.8 ms | +0.95 ms | +3.80 ms |"
    assert rows[3] == "| cliffcompaction 0.1.0 | +1.54 ms | 390 | +98.6 ms | +1.54 ms | +6.16 ms |"
    headroom = peers.BY_KIND["headroom"]
    assert rows[5] == (f"| headroom-ai 0.42.0 (cache off) | not installed (optional: `{headroom.install}` in the test "
                       f"environment, or in a venv of its own named by {headroom.env}) | – | – | – | – |")
    assert rows[6].startswith("| LiteLLM proxy | not installed (optional: `pip install 'litellm[proxy]'`")
    assert "awecompress measured (0.2.0); cliffcompaction measured (0.1.0); context-guardian not installed" in \
        peers.status_note(ov)
    # a run without the large-history point or concurrency 64: those cells say so
    partial = ov | {"history_points": [], "points": [p for p in ov["points"] if p["concurrency"] != 64]}
    assert peer_table.table(partial, "quiet")[6] == "| **context-proxy** | +0.95 ms | 617 | – | +0.95 ms | – |"


def test_the_peer_tables_of_both_modes_in_the_readme(tmp_path: Path) -> None:
    quiet, crowded = _peer_overhead(("awecompress",)), _peer_overhead(("awecompress", "cliffcompaction"))
    results: dict[str, Any] = {"machine": report.machine(), "config": {"quick": True}, "overhead": quiet,
                               "overhead_crowded": crowded}
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- perf:start -->\nold\n<!-- perf:end -->\n")
    report.write(results, tmp_path / "out", readme, "python -m tests.benchmarks --quick --out out")
    text = readme.read_text()
    at_quiet, at_crowded = text.index("Against the peers, quiet"), text.index("Against the peers, crowded")
    assert at_quiet < at_crowded
    assert "| cliffcompaction 0.1.0 | not installed" in text[at_quiet:at_crowded]
    assert "| cliffcompaction 0.1.0 | +1.54 ms |" in text[at_crowded:]
    assert f"{results['machine']['date']}" in text and "python -m tests.benchmarks --quick --out out" in text
    assert text.count("Against the peers") == 2 == (tmp_path / "out" / "report.md").read_text().count("Against the peers")


def test_instructions_section_runs_both_modes_and_reports_the_streamed_counts(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    """Each server is measured non-streaming, then streamed; the report names both."""
    from tests.benchmarks import instructions

    calls: list[tuple[str, bool]] = []

    def measured(kind: str, cfg: BenchConfig, workdir: Path, stream: bool = False) -> dict[str, Any]:
        calls.append((kind, stream))
        ir = {"floor": 500_000, "proxy": 1_000_000}[kind] * (2 if stream else 1)
        return {"requests": 500, "errors": 0, "ir_per_request": ir, "by_object": {"libpython3.11.so.1.0": ir}}

    monkeypatch.setattr(instructions, "status", lambda: None)
    monkeypatch.setattr(instructions, "measure", measured)
    r = instructions.run(BenchConfig(out=tmp_path))
    assert calls == [("floor", False), ("proxy", False), ("floor", True), ("proxy", True)]
    assert (r["proxy_vs_floor"], r["streamed"]["proxy_vs_floor"]) == (2.0, 2.0)
    text = "\n".join(instructions.table(r))
    assert "the proxy 1,000,000, the floor 500,000 (2.00×)" in text
    assert "The same request streamed (the reply's SSE events observed and logged): the proxy 2,000,000, " \
           "the floor 1,000,000 (2.00×)." in text
