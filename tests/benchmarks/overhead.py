"""Overhead of the pass-through path: the proxy against a direct call and a raw relay (issue 7, item 2).

Processes (``candidates``): the fast fake upstream and the load generator on the first core, the
candidate on the second, each a process of its own: the proxy (and, comparing, the ``baseline``
tree) as its tree's ``python -m proxy.cli serve`` (what an operator runs), the optional peers
(``peers``) as their own command lines, the others ``python -m tests.benchmarks.servers`` processes.
Quiet mode: every other candidate's server is paused (SIGSTOP) while one is measured, so it has the
candidate core to itself however many peers are installed (``candidates.alone``); crowded mode:
all of them up and idle beside the one measured, plus bystander servers, on the candidate core. The candidate's CPU time
is read from ``/proc/<pid>/task/*/schedstat`` (nanoseconds, summed over its threads;
``/proc/<pid>/stat`` utime+stime as a fallback). For every point (concurrency x streaming) each
repetition runs every candidate once, in order (direct, floor, proxy, baseline, proxy-httpx, then
the peers in ``peers.PEERS`` order), so the candidates are interleaved in time and a noisy moment
hits all of them. Added latency is a candidate's
percentile minus the direct call's percentile of the same repetition; the ratio to the floor (and,
comparing, the proxy's added p50 and CPU per request to the baseline's) is taken per repetition,
then the median and spread (min..max) over repetitions reported. Points: every concurrency
streamed and not, the large-history request (``HISTORY_BYTES``) at the first concurrency, and the
Messages rows.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tests.benchmarks import REPO_DIR, TRACES_DIR, peers
from tests.benchmarks.candidates import CROWD_SIZE, Server, alone, cores, crowd_kinds, servers
from tests.benchmarks.config import BenchConfig
from tests.benchmarks.stats import percentile, spread

if TYPE_CHECKING:
    from tests.benchmarks.baseline import Baseline

CANDIDATES = ("direct", "floor", "proxy", "proxy-httpx")
REQUEST_BODY = {
    "model": "bench-model",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. " * 10},
        {"role": "user", "content": "Summarize the plot of Hamlet in three sentences. " * 8},
    ],
    "max_tokens": 256,
}


MESSAGES_BODY = {
    "model": "bench-model",
    "system": "You are a helpful assistant. " * 10,
    "messages": [{"role": "user", "content": "Summarize the plot of Hamlet in three sentences. " * 8}],
    "max_tokens": 256,
}
"""The same conversation as an Anthropic Messages request (the Messages rows)."""
MESSAGES_CANDIDATES = ("direct", "floor", "proxy", "awecompress")
"""Candidates of the Messages rows: the proxy's ``POST /v1/messages`` against the same direct call,
raw relay and awecompress when measured (the baseline tree has no Messages route; LiteLLM's is
another product)."""
HISTORY_BYTES = 400_000
"""The large-history point: one request of about this many bytes of real trace messages, at
concurrency 1, non-streaming (issue 21's "400 KB history" column)."""
API_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


def request_body(stream: bool, api: str = "chat") -> bytes:
    """The request every candidate gets (compact JSON, ~1 KB), chat completions or Messages."""
    return orjson.dumps((REQUEST_BODY if api == "chat" else MESSAGES_BODY) | ({"stream": True} if stream else {}))


def history_body() -> bytes | None:
    """The large-history request: trace messages (``pipeline.trace_messages``) until the body
    reaches ``HISTORY_BYTES``, then a user question; ``None`` without the shared traces."""
    if not TRACES_DIR.is_dir():
        return None
    from tests.benchmarks.pipeline import build_history, trace_messages

    pool = trace_messages()
    n = 8
    while True:
        messages = [*build_history(n, pool), {"role": "user", "content": "Go on."}]
        body = orjson.dumps({"model": "bench-model", "messages": messages, "max_tokens": 256})
        if len(body) >= HISTORY_BYTES:
            return body
        n = max(n + 1, int(n * HISTORY_BYTES / len(body)))


def switches(pid: int) -> int:
    """Context switches (voluntary and not) of process ``pid`` so far, over its live threads: a
    sleeping server's wake-ups."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/status") as f:
            total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    return total


IDLE_S = 3.0
"""Seconds every server is watched while idle, before the points (``idle``)."""


def idle(srv: dict[str, Server | None], kinds: tuple[str, ...], seconds: float = IDLE_S) -> dict[str, dict[str, float]]:
    """Each candidate server's CPU (ms a second) and wake-ups (context switches a second) while
    nothing is sent to it: what it costs the others on its core (crowded mode)."""
    watched = {k: srv[k] for k in kinds if srv.get(k) is not None}
    before = {k: (cpu_ns(s.pid), switches(s.pid)) for k, s in watched.items() if s is not None}
    time.sleep(seconds)
    out = {}
    for k, s in watched.items():
        assert s is not None
        cpu, sw = before[k]
        out[k] = {"cpu_ms_per_s": (cpu_ns(s.pid) - cpu) / 1e6 / seconds, "wakeups_per_s": (switches(s.pid) - sw) / seconds}
    return out


def cpu_ns(pid: int) -> int:
    """CPU time (user + system) of process ``pid`` in nanoseconds, over its live threads."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total
    except (OSError, ValueError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


class LoadGenerator:
    """The ``tests.benchmarks.loadgen`` process, driven one point at a time over a pipe."""

    def __init__(self, cpu: int | None) -> None:
        cmd = [sys.executable, "-m", "tests.benchmarks.loadgen"] + (["--cpu", str(cpu)] if cpu is not None else [])
        self.proc = subprocess.Popen(cmd, cwd=REPO_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, url: str, body: bytes, concurrency: int, requests: int, stream: bool) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        cmd = {"url": url, "body": body.decode(), "concurrency": concurrency, "requests": requests,
               "warmup": max(10, concurrency), "stream": stream}
        self.proc.stdin.write(orjson.dumps(cmd) + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("load generator died")
        return orjson.loads(line)

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


SLOW_PEERS = ("cliffcompaction", "context-guardian", "headroom", "litellm")
"""Peers that served 100-340 requests/s at concurrency 16 in issue 21's run (the proxy: 1,611)."""


def requests_for(kind: str, concurrency: int, requests: int, quick: bool) -> int:
    """Recorded requests of ``kind`` at one point: the slow peers (``SLOW_PEERS``) get fewer above
    concurrency 1 (still many per worker) to keep the run short; at concurrency 1 all of them."""
    if kind not in SLOW_PEERS or concurrency == 1:
        return requests
    return min(requests, (2 if quick else 20) * concurrency + (20 if quick else 200))


def measure_point(gen: LoadGenerator, srv: dict[str, Server | None], kinds: tuple[str, ...], concurrency: int,
                  requests: int, stream: bool, reps: int, quick: bool = False, api: str = "chat",
                  body: bytes | None = None, quiet: bool = False) -> dict[str, Any]:
    """Every candidate at one point, ``reps`` interleaved repetitions; see the module docstring.
    ``api``: ``chat`` (``POST /v1/chat/completions``) or ``messages`` (``POST /v1/messages``);
    ``body``: the request (default ``request_body(stream, api)``); ``quiet``: the other candidates'
    servers paused while one is measured (``candidates.alone``)."""
    upstream = srv["upstream"]
    assert upstream is not None
    body = body if body is not None else request_body(stream, api)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for _rep in range(reps):
        for kind in kinds:
            server = srv[kind]
            url = (server.url if server is not None else upstream.url) + API_PATHS[api]
            pid = server.pid if server is not None else upstream.pid
            n = requests_for(kind, concurrency, requests, quick)
            with alone(srv, kind) if quiet else contextlib.nullcontext():
                cpu0 = cpu_ns(pid)
                res = gen.run(url, body, concurrency, n, stream)
                cpu1 = cpu_ns(pid)
            runs[kind].append({
                "rps": n / res["wall_s"], "requests": n,
                "p50_ms": percentile(res["total_ms"], 0.5), "p99_ms": percentile(res["total_ms"], 0.99),
                "ttfb_p50_ms": percentile(res["ttfb_ms"], 0.5), "ttfb_p99_ms": percentile(res["ttfb_ms"], 0.99),
                "cpu_ms_per_request": (cpu1 - cpu0) / 1e6 / n, "errors": res["errors"],
            })
    out: dict[str, Any] = {"concurrency": concurrency, "stream": stream, "requests": requests, "reps": reps, "api": api,
                           "candidates": {}}
    direct = runs["direct"]
    for kind in kinds:
        rows = runs[kind]
        entry: dict[str, Any] = {key: spread([r[key] for r in rows]) for key in rows[0] if key not in ("errors", "requests")}
        entry["requests"] = rows[0]["requests"]
        entry["errors"] = sum(int(r["errors"]) for r in rows)
        for key in ("p50_ms", "p99_ms", "ttfb_p50_ms", "ttfb_p99_ms"):
            entry["added_" + key] = spread([r[key] - d[key] for r, d in zip(rows, direct, strict=True)])
        if kind not in ("direct", "floor") and "floor" in runs:
            entry["added_p50_vs_floor"] = spread([
                (r["p50_ms"] - d["p50_ms"]) / max(f["p50_ms"] - d["p50_ms"], 1e-3)
                for r, d, f in zip(rows, direct, runs["floor"], strict=True)
            ])
        if kind == "proxy" and "baseline" in runs:  # per repetition, then the spread (as for the floor)
            base = runs["baseline"]
            entry["added_p50_vs_baseline"] = spread([
                (r["p50_ms"] - d["p50_ms"]) / max(b["p50_ms"] - d["p50_ms"], 1e-3)
                for r, d, b in zip(rows, direct, base, strict=True)])
            entry["cpu_vs_baseline"] = spread([r["cpu_ms_per_request"] / max(b["cpu_ms_per_request"], 1e-9)
                                               for r, b in zip(rows, base, strict=True)])
        if kind == "direct":
            entry["cpu_note"] = "CPU of the upstream process (direct has no proxy)"
        out["candidates"][kind] = entry
    return out


def run(cfg: BenchConfig, kinds: tuple[str, ...] = CANDIDATES, baseline: Baseline | None = None,
        crowd: int = 0) -> dict[str, Any]:
    """The overhead section: ``{"points", "messages_points", "history_points", "peer_status" (by peer:
    why not measured and how to install it | None), "peer_versions" (by peer measured: its version),
    "cores", "baseline" (label | None), "crowd" (the bystanders' kinds)}``. The optional peers
    installed (``peers.PEERS``) are added after ``kinds``; with ``baseline``, its tree is one more
    candidate (``baseline``), right after ``proxy``; ``crowd``: bystander servers up on the
    candidate core (``candidates.servers``)."""
    near, _far = cores()
    kinds = (*kinds, *(k for k in peers.optional_kinds() if k not in kinds))
    if baseline is not None and "baseline" not in kinds:
        at = kinds.index("proxy") + 1 if "proxy" in kinds else len(kinds)
        kinds = (*kinds[:at], "baseline", *kinds[at:])
    points: list[dict[str, Any]] = []
    messages_points: list[dict[str, Any]] = []  # POST /v1/messages: every concurrency, streamed at the first
    history_points: list[dict[str, Any]] = []
    quiet = crowd == 0
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp, \
            servers(Path(tmp), kinds, baseline, crowd) as srv:
        gen = LoadGenerator(near)
        try:
            idle_cost = idle(srv, kinds)
            for stream in (False, True):
                for c in cfg.concurrencies:
                    point = measure_point(gen, srv, kinds, c, cfg.requests[c], stream, cfg.reps, cfg.quick, quiet=quiet)
                    points.append(point)
                    _progress(point)
            history = history_body()
            if history is not None:
                c = cfg.concurrencies[0]
                point = measure_point(gen, srv, kinds, c, max(10, cfg.requests[c] // 2), False, cfg.reps, cfg.quick,
                                      body=history, quiet=quiet)
                point["history_bytes"] = len(history)
                history_points.append(point)
                _progress(point)
            messages_kinds = tuple(k for k in MESSAGES_CANDIDATES if k in kinds)
            if "proxy" in messages_kinds:
                for stream, concurrencies in ((False, cfg.concurrencies), (True, cfg.concurrencies[:1])):
                    for c in concurrencies:
                        point = measure_point(gen, srv, messages_kinds, c, cfg.requests[c], stream, cfg.reps, cfg.quick,
                                              api="messages", quiet=quiet)
                        messages_points.append(point)
                        _progress(point)
        finally:
            gen.stop()
    return {"points": points, "messages_points": messages_points, "history_points": history_points, "idle": idle_cost,
            "peer_status": {kind: peers.status(kind) for kind in peers.PEERS},
            "peer_versions": {kind: peers.version(kind) for kind in peers.PEERS if kind in kinds},
            "cores": {"loadgen_upstream": near, "candidate": _far}, "crowd": crowd_kinds(kinds, crowd),
            "servers_on_candidate_core": len([k for k in kinds if k != "direct"]) + crowd,
            "baseline": baseline.label if baseline is not None else None}


def crowd_for(kinds: tuple[str, ...]) -> int:
    """Bystanders that bring the candidate core to ``CROWD_SIZE`` servers in crowded mode."""
    return max(1, CROWD_SIZE - len([k for k in (*kinds, *peers.optional_kinds()) if k != "direct"]))


def _progress(point: dict[str, Any]) -> None:
    cells = [f"{k} +{v['added_p50_ms']['median']:.2f}ms {v['rps']['median']:.0f}/s" for k, v in point["candidates"].items()]
    api = "" if point.get("api", "chat") == "chat" else f" {point['api']}"
    api += f" history {point['history_bytes'] // 1000} KB" if "history_bytes" in point else ""
    print(f"  overhead{api} c={point['concurrency']} stream={point['stream']}: " + ", ".join(cells), flush=True)


FLOOR_NOISE_MS = 0.25
"""Below this added p50 (ms), the floor's added latency is within this machine's noise: a ratio
over it is undefined, not huge. It happened while the load generator (then aiohttp's client)
and the upstream (then an ASGI app) saturated their shared core before the floor saturated its
own; with the raw-protocol generator and upstream the floor is the slower side at 16 and 64."""


def goals(result: dict[str, Any]) -> dict[str, Any]:
    """Added non-streaming p50 of the proxy ÷ the floor's, by concurrency (the goal; ``None`` where
    the floor's added p50 is under ``FLOOR_NOISE_MS``), the same for p99 (shown: a tail the p50
    hides), CPU per request ÷ the floor's (shown), the floor's own added p50 (ms), and the added
    time to the first streamed event at concurrency 1; with LiteLLM measured, the proxy's added p50
    ÷ LiteLLM's by concurrency (``added_latency_vs_litellm``; under 1: the proxy adds less); the
    Messages rows' added p50 ÷ the floor's (``messages_added_latency_vs_floor``, same goal)."""
    ratios: dict[str, float | None] = {}
    p99_ratios: dict[str, float] = {}
    cpu_ratios: dict[str, float] = {}
    vs_litellm: dict[str, float] = {}
    floor_added: dict[str, float] = {}
    ttfb_added: float | None = None
    for point in result["points"]:
        proxy = point["candidates"].get("proxy")
        if proxy is None:
            continue
        if not point["stream"] and "added_p50_vs_floor" in proxy:
            c = str(point["concurrency"])
            floor = point["candidates"]["floor"]
            floor_added[c] = floor["added_p50_ms"]["median"]
            ratios[c] = proxy["added_p50_vs_floor"]["median"] if floor_added[c] >= FLOOR_NOISE_MS else None
            p99_ratios[c] = proxy["added_p99_ms"]["median"] / max(floor["added_p99_ms"]["median"], 1e-3)
            cpu_ratios[c] = proxy["cpu_ms_per_request"]["median"] / max(floor["cpu_ms_per_request"]["median"], 1e-6)
            litellm = point["candidates"].get("litellm")
            if litellm is not None:
                vs_litellm[c] = proxy["added_p50_ms"]["median"] / max(litellm["added_p50_ms"]["median"], 1e-3)
        if point["stream"] and point["concurrency"] == 1:
            ttfb_added = proxy["added_ttfb_p50_ms"]["median"]
    messages: dict[str, float | None] = {}
    for point in result.get("messages_points") or []:
        proxy, floor = point["candidates"].get("proxy"), point["candidates"].get("floor")
        if proxy is not None and floor is not None and not point["stream"] and "added_p50_vs_floor" in proxy:
            noisy = floor["added_p50_ms"]["median"] < FLOOR_NOISE_MS
            messages[str(point["concurrency"])] = None if noisy else proxy["added_p50_vs_floor"]["median"]
    return {"added_latency_vs_floor": ratios, "added_latency_vs_litellm": vs_litellm, "added_p99_vs_floor": p99_ratios,
            "cpu_vs_floor": cpu_ratios,
            "floor_added_p50_ms": floor_added, "added_ttfb_ms_at_1": ttfb_added,
            "messages_added_latency_vs_floor": messages}
