"""Regenerate RELIABILITY.md: run the reliability tests and the full-size load run, write the figures.

    python -m tests.reliability --out RELIABILITY.md [--concurrency 200] [--duration-s 180] [--skip-load] [--skip-adversarial]

1. ``pytest tests/reliability tests/storage/test_retention.py`` with larger fuzz budgets
   (``CONTEXT_PROXY_FUZZ_EXAMPLES``, ``CONTEXT_PROXY_SCHEMA_EXAMPLES``); the tests add their figures
   to a tally file (``CONTEXT_PROXY_RELIABILITY_TALLY``), outcomes come from a JUnit XML report.
2. The load run: a PostgreSQL cluster of its own, the fake upstream in a process of its own, one
   ``context-proxy serve`` process, ``--concurrency`` streaming sessions for ``--duration-s``.
3. The adversarial run (``tests.reliability.adversarial``, issue 16) against this tree on SQLite and
   PostgreSQL, shown next to the before figures kept in ``adversarial_before_<db>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import REPO_DIR, SHARED_DIR
from tests.reliability.adversarial_report import before_path, render_section
from tests.reliability.load import as_json, run_load
from tests.reliability.probes import PgCluster, ServeProcess, log_consistency, query
from tests.support.ports import free_port

FAKE_SERVER = (
    "import sys, uvicorn; from tests.fakes.upstream import create_fake_upstream; "
    "app, _ = create_fake_upstream(); uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[1]), log_level='warning', ws='none')"
)


def run_tests(tmp: Path, fuzz_examples: int, schema_examples: int) -> dict[str, Any]:
    tally, junit = tmp / "tally.json", tmp / "junit.xml"
    env = os.environ | {"CONTEXT_PROXY_RELIABILITY_TALLY": str(tally), "CONTEXT_PROXY_FUZZ_EXAMPLES": str(fuzz_examples),
                        "CONTEXT_PROXY_SCHEMA_EXAMPLES": str(schema_examples), "TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken")}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "pytest", "tests/reliability", "tests/storage/test_retention.py", "-q",
                    f"--junitxml={junit}"], cwd=REPO_DIR, env=env, check=False)
    cases = ET.parse(junit).getroot().iter("testcase")
    outcomes: dict[str, str] = {}
    for case in cases:
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcomes[name] = "failed" if case.find("failure") is not None or case.find("error") is not None else (
            "skipped" if case.find("skipped") is not None else "passed")
    data = json.loads(tally.read_text()) if tally.exists() else {"counts": {}, "notes": {}}
    return {"outcomes": outcomes, "tally": data, "duration_s": round(time.monotonic() - t0, 1)}


def run_full_load(tmp: Path, concurrency: int, duration_s: float) -> dict[str, Any]:
    cluster = PgCluster().start()
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(port)], cwd=REPO_DIR,
                            env=os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken"), "PYTHONPATH": str(REPO_DIR)})
    proxy = None
    try:
        upstream_url = f"http://127.0.0.1:{port}/v1"
        for _ in range(100):
            try:
                httpx.get(upstream_url + "/models", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        proxy = ServeProcess(tmp, upstream_url, cluster.url, CONTEXT_PROXY_LOG_LEVEL="warning").start()
        assert proxy.proc is not None
        report = as_json(asyncio.run(run_load(proxy.url, upstream_url, proxy.proc.pid, concurrency=concurrency,
                                              duration_s=duration_s, calibration_s=10)))
        deadline = time.monotonic() + 60
        while query(cluster.url, "SELECT COUNT(*) FROM requests")[0][0] < report["requests"] and time.monotonic() < deadline:
            time.sleep(0.2)
        report["requests_logged"] = query(cluster.url, "SELECT COUNT(*) FROM requests")[0][0]
        report["log_rows_checked"] = log_consistency(cluster.url)
        return report
    finally:
        if proxy is not None:
            proxy.stop()
        fake.terminate()
        fake.wait(10)
        cluster.remove()


def run_adversarial(tmp: Path) -> dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """database -> (before, after) reports; after: this tree, each database in a process of its own."""
    runs: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
    for db in ("sqlite", "postgresql"):
        out = tmp / f"adversarial-{db}.json"
        subprocess.run([sys.executable, "-m", "tests.reliability.adversarial", "--tree", str(REPO_DIR), "--db", db,
                        "--json", str(out)], cwd=REPO_DIR, env=os.environ | {"TIKTOKEN_CACHE_DIR": str(SHARED_DIR / "tiktoken")},
                       check=False)
        before = before_path(db)
        runs[db] = (json.loads(before.read_text()) if before.exists() else None,
                    json.loads(out.read_text()) if out.exists() else None)
    return runs


SECTIONS = [
    ("1. Isolation", "test_isolation", ["isolation_probes"]),
    ("2. Secrets", "test_secrets", ["secret_keys_searched", "secrets_searched_chars"]),
    ("3. Bad input", "test_bad_input", ["bad_input_cases", "fuzz_chat_cases", "fuzz_chat_failures", "fuzz_chat_upstream_5xx_relayed"]),
    ("3. Read API fuzzing (schemathesis)", "test_read_api_fuzz", ["schemathesis_cases", "schemathesis_failures"]),
    ("4. Upstream faults", "test_upstream_faults", []),
    ("5. Client faults", "test_client_faults", []),
    ("6. Database faults", "test_database_faults", ["kill9_restarts"]),
    ("7. Concurrency", "test_concurrency", ["concurrent_requests"]),
    ("8. Load (scaled down)", "test_load", []),
    ("9. Retention", "test_retention", []),
]


def render(tests: dict[str, Any], load: dict[str, Any] | None, args: argparse.Namespace,
           adversarial: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] | None = None) -> str:
    outcomes, counts, notes = tests["outcomes"], tests["tally"]["counts"], tests["tally"]["notes"]
    passed = sum(1 for o in outcomes.values() if o == "passed")
    failed = sorted(n for n, o in outcomes.items() if o == "failed")
    lines = [
        "# Reliability report",
        "",
        ("Generated by `python -m tests.reliability --out RELIABILITY.md` "
        f"on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} ({os.cpu_count()} CPUs). Do not edit by hand: rerun the command."),
        ("It runs `tests/reliability/` and `tests/storage/test_retention.py` on SQLite and PostgreSQL with larger fuzz "
        f"budgets ({args.fuzz_examples} chat bodies, {args.schema_examples} schemathesis examples per operation and mode), "
        f"then the full load run ({args.concurrency} streaming sessions for {args.duration_s:g} s)."),
        "",
        "## Summary",
        "",
        f"- Tests: **{passed} passed, {len(failed)} failed** of {len(outcomes)} ({tests['duration_s']} s).",
        f"- Requests served by the proxy during the tests: {counts.get('requests', 0):,}"
        + (f"; during the load run: {load['requests']:,}" if load else "") + ".",
        f"- Faults injected (upstream, client, database, kill -9): {counts.get('faults_injected', 0):,}.",
        (f"- Fuzz cases: {counts.get('fuzz_chat_cases', 0):,} chat bodies (hypothesis), "
        f"{counts.get('schemathesis_cases', 0):,} read-API requests (schemathesis); failures: "
        f"{counts.get('fuzz_chat_failures', 0) + counts.get('schemathesis_failures', 0)}."),
        (f"- Log rows checked for consistency (no duplicate, no missing parent, no half-written message, no dangling "
        f"event anchor): {counts.get('rows_checked', 0) + (sum(load['log_rows_checked'].values()) if load else 0):,}."),
        "- Lost: " + ("nothing (every request of the load run logged; every consistency check held)."
                      if load and load["requests_logged"] >= load["requests"] and not failed else
                      "see the failures below."),
        "",
    ]
    if failed:
        lines += ["### Failing tests (open problems)", ""] + [f"- `{n}`" for n in failed] + [""]
    lines += ["## By property", ""]
    for title, module, keys in SECTIONS:
        mine = {n: o for n, o in outcomes.items() if n.startswith(module + "::")}
        ok = sum(1 for o in mine.values() if o == "passed")
        figures = ", ".join(f"{k.replace('_', ' ')}: {counts[k]:,}" for k in keys if k in counts)
        lines.append(f"- **{title}** (`{module}`): {ok}/{len(mine)} tests passed" + (f"; {figures}" if figures else "") + ".")
    lines += ["", "## Notes recorded by the tests", ""]
    for key, value in sorted(notes.items()):
        lines.append(f"- `{key}`: `{json.dumps(value)}`")
    if load:
        lines += [
            "",
            f"## Load: {load['concurrency']} concurrent streaming sessions for {load['duration_s']:g} s",
            "",
            ("One `context-proxy serve` process on PostgreSQL; the fake upstream in a process of its own on loopback; "
            "the clients in a third. Latency is the time to the last byte of a streamed reply."),
            "",
            "| figure | value |",
            "|---|---|",
            f"| requests | {load['requests']:,} ({load['requests_per_s']} per s) |",
            f"| errors | {load['errors']} |",
            f"| requests logged | {load['requests_logged']:,} |",
            f"| latency p50 / p90 / p99 (ms) | {load['latency_ms']['50']} / {load['latency_ms']['90']} / {load['latency_ms']['99']} |",
            f"| upstream alone p50 / p90 / p99 (ms) | {load['upstream_alone_latency_ms']['50']} / {load['upstream_alone_latency_ms']['90']} / {load['upstream_alone_latency_ms']['99']} |",
            f"| added latency p50 / p90 / p99 (ms) | {load['added_latency_ms']['50']} / {load['added_latency_ms']['90']} / {load['added_latency_ms']['99']} |",
            f"| proxy RSS start / peak / end (MB) | {load['rss_mb']['start']} / {load['rss_mb']['peak']} / {load['rss_mb']['end']} |",
            f"| proxy RSS peak in the first half / at the middle (MB) | {load['rss_mb']['peak_first_half']} / {load['rss_mb']['middle']} |",
            f"| proxy RSS growth over the second half (MB per minute) | {load['rss_growth_second_half_mb_per_min']} |",
            "| proxy RSS over time (s: MB) | " + ", ".join(f"{t:g}: {m}" for t, m in load["rss_mb_series"]) + " |",
            "",
            ("Memory is bounded by the memos' sizes and by their idle expiry (`proxy.cache.MEMO_IDLE_S`: an entry "
             "unused for that long leaves), so it follows the sessions active lately; the run is longer than that "
             "window plus a session's life (20 turns) so that the plateau shows."),
            "",
        ]
        if load["error_samples"]:
            lines += ["Error samples:", ""] + [f"- `{e}`" for e in load["error_samples"]] + [""]
    if adversarial:
        lines += ["", *render_section(adversarial)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_DIR / "RELIABILITY.md")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--duration-s", type=float, default=180.0,
                        help="Seconds of load (issue 5 asks 60; longer shows where memory levels off).")
    parser.add_argument("--fuzz-examples", type=int, default=1000)
    parser.add_argument("--schema-examples", type=int, default=100)
    parser.add_argument("--skip-load", action="store_true", help="Only the tests (no full-size load run).")
    parser.add_argument("--skip-adversarial", action="store_true", help="No adversarial run (issue 16's attacks).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="context-proxy-reliability-") as tmp:
        tests = run_tests(Path(tmp), args.fuzz_examples, args.schema_examples)
        load = None if args.skip_load else run_full_load(Path(tmp), args.concurrency, args.duration_s)
        adversarial = None if args.skip_adversarial else run_adversarial(Path(tmp))
    args.out.write_text(render(tests, load, args, adversarial))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
