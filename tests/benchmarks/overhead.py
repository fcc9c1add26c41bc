"""Overhead of the pass-through path: the proxy against a direct call and a raw relay (issue 7, item 2).

Processes: the fast fake upstream and the load generator on the first core, the candidate on the
second, each a process of its own: the proxy (and, comparing, the ``baseline`` tree) as its tree's
``python -m proxy.cli serve`` (``SERVED``: what an operator runs), the others
``python -m tests.benchmarks.servers`` processes. The candidate's CPU time is read from
``/proc/<pid>/task/*/schedstat`` (nanoseconds, summed over its threads; ``/proc/<pid>/stat``
utime+stime as a fallback). For every point (concurrency x streaming) each repetition runs every
candidate once, in order (direct, floor, proxy, baseline, proxy-httpx, ...), so the candidates are
interleaved in time and a noisy moment hits all of them. Added latency is a candidate's
percentile minus the direct call's percentile of the same repetition; the ratio to the floor (and,
comparing, the proxy's added p50 and CPU per request to the baseline's) is taken per repetition,
then the median and spread (min..max) over repetitions reported.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tests.benchmarks import REPO_DIR, optional_python
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
MESSAGES_CANDIDATES = ("direct", "floor", "proxy")
"""Candidates of the Messages rows: the proxy's ``POST /v1/messages`` against the same direct call
and raw relay (the baseline tree has no Messages route; LiteLLM's is another product)."""
API_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


def request_body(stream: bool, api: str = "chat") -> bytes:
    """The request every candidate gets (compact JSON, ~1 KB), chat completions or Messages."""
    return orjson.dumps((REQUEST_BODY if api == "chat" else MESSAGES_BODY) | ({"stream": True} if stream else {}))


def cores() -> tuple[int | None, int | None]:
    """(core for load generator + upstream, core for the candidate); ``None`` on one core."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return available[0], available[1]


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


SERVED = ("proxy", "baseline")
"""Candidates run as their tree's ``python -m proxy.cli serve`` (what an operator runs: the HTTP
guard, the garbage-collector tuning and uvicorn's options of that tree), with the same flags and
environment; the others are ``tests.benchmarks.servers`` kinds."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(python: str, port: int, upstream: str, db: Path) -> list[str]:
    """``context-proxy serve`` as the benchmark runs it (every tree compared gets the same flags)."""
    return [python, "-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--upstream-url", upstream,
            "--database-url", f"sqlite:///{db}", "--log-format", "json"]


class Server:
    """A candidate's server process; ``url`` is its base URL (``http://127.0.0.1:P``).

    ``kind`` in ``SERVED``: ``python -m proxy.cli serve`` of ``tree`` (this repository when
    ``None``; ``env`` its environment), pinned to ``cpu``; else a ``tests.benchmarks.servers``
    process of this repository, which prints its port."""

    def __init__(self, kind: str, cpu: int | None, workdir: Path, upstream: str | None = None,
                 ready_path: str = "/healthz", python: str = sys.executable, tree: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.kind = kind
        self.log = open(workdir / f"{kind}.log", "wb")  # noqa: SIM115 (open while the server runs; stop() closes it)
        env = dict(env or os.environ)
        if kind in SERVED:
            assert upstream, f"{kind} needs an upstream"
            port = free_port()
            env.setdefault("CONTEXT_PROXY_TIKTOKEN_CACHE_DIR", env.get("TIKTOKEN_CACHE_DIR", ""))
            # the Messages rows: the same fake upstream, without /v1 (a tree without the setting ignores it)
            env["CONTEXT_PROXY_ANTHROPIC_UPSTREAM_URL"] = upstream.removesuffix("/v1")
            pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
            self.proc = subprocess.Popen(serve_command(python, port, upstream, workdir / f"{kind}.db"),
                                         cwd=tree or REPO_DIR, stdout=self.log, stderr=self.log, env=env,
                                         preexec_fn=pin)
            self.url = f"http://127.0.0.1:{port}"
        else:
            cmd = [python, "-m", "tests.benchmarks.servers", kind, "--workdir", str(workdir)]
            if cpu is not None:
                cmd += ["--cpu", str(cpu)]
            if upstream:
                cmd += ["--upstream", upstream]
            self.proc = subprocess.Popen(cmd, cwd=REPO_DIR, stdout=subprocess.PIPE, stderr=self.log, env=env)
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().decode()
            if not line.startswith("PORT "):
                self.stop()
                raise RuntimeError(f"server {kind} failed to start; see {workdir / (kind + '.log')}")
            self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        self._wait_ready(ready_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self, path: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s  # LiteLLM's proxy takes seconds to import
        while True:
            try:
                data = b"{}" if path.startswith("/v1/") else None  # the upstream answers POSTs only
                with urllib.request.urlopen(urllib.request.Request(self.url + path, data=data), timeout=5) as r:
                    r.read()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"server {self.kind} not ready") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


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


LITELLM_PYTHON_ENV = "CONTEXT_PROXY_BENCH_LITELLM_PYTHON"
"""A Python with ``litellm[proxy]`` installed, when the test environment has none (LiteLLM pins
its own versions of httpx, openai and pydantic: a virtual environment of its own is cleaner)."""


def litellm_python() -> str | None:
    """The interpreter that runs LiteLLM's proxy: this one if it has ``litellm``, else the one
    named by ``CONTEXT_PROXY_BENCH_LITELLM_PYTHON`` if that has it; ``None``: not measured."""
    return optional_python("litellm", LITELLM_PYTHON_ENV)


def litellm_status() -> str | None:
    """``None`` when LiteLLM's proxy is measured, else why not."""
    if litellm_python() is None:
        return (f"not installed (optional: `pip install 'litellm[proxy]'` in the test environment, or set "
                f"{LITELLM_PYTHON_ENV} to a Python that has it)")
    return None


def requests_for(kind: str, concurrency: int, requests: int, quick: bool) -> int:
    """Recorded requests of ``kind`` at one point: LiteLLM's proxy serves about 100 requests/s
    (the issue's anchor: 83), so it gets fewer (still many per worker) to keep the run short."""
    if kind != "litellm":
        return requests
    return min(requests, (2 if quick else 20) * concurrency + (20 if quick else 200))


@contextlib.contextmanager
def servers(workdir: Path, kinds: tuple[str, ...], baseline: Baseline | None = None) -> Iterator[dict[str, Server | None]]:
    """The upstream plus one server per candidate kind (``direct`` has none); ``baseline``: the
    tree served as the ``baseline`` kind."""
    near, far = cores()
    started: list[Server] = []
    try:
        upstream = Server("upstream", near, workdir, ready_path="/v1/chat/completions")
        started.append(upstream)
        out: dict[str, Server | None] = {"upstream": upstream, "direct": None}
        for kind in kinds:
            if kind == "direct":
                continue
            if kind == "litellm":
                python = litellm_python()
                assert python is not None
                server = Server(kind, far, workdir, upstream=upstream.url + "/v1", ready_path="/health/liveliness",
                                python=python)
                started.append(server)
                out[kind] = server
                continue
            if kind == "baseline":
                assert baseline is not None, "the baseline candidate needs a baseline tree"
                server = Server(kind, far, workdir, upstream=upstream.url + "/v1", tree=baseline.tree, env=baseline.env())
            else:
                server = Server(kind, far, workdir, upstream=upstream.url + "/v1")
            started.append(server)
            out[kind] = server
        yield out
    finally:
        for server in reversed(started):
            server.stop()


def measure_point(gen: LoadGenerator, srv: dict[str, Server | None], kinds: tuple[str, ...], concurrency: int,
                  requests: int, stream: bool, reps: int, quick: bool = False, api: str = "chat") -> dict[str, Any]:
    """Every candidate at one point, ``reps`` interleaved repetitions; see the module docstring.
    ``api``: ``chat`` (``POST /v1/chat/completions``) or ``messages`` (``POST /v1/messages``)."""
    upstream = srv["upstream"]
    assert upstream is not None
    body = request_body(stream, api)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for _rep in range(reps):
        for kind in kinds:
            server = srv[kind]
            url = (server.url if server is not None else upstream.url) + API_PATHS[api]
            pid = server.pid if server is not None else upstream.pid
            n = requests_for(kind, concurrency, requests, quick)
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


def run(cfg: BenchConfig, kinds: tuple[str, ...] = CANDIDATES, baseline: Baseline | None = None) -> dict[str, Any]:
    """The overhead section: ``{"points": [...], "litellm": reason|None, "cores": [...], "baseline": label|None}``.
    With ``baseline``, its tree is one more candidate (``baseline``), right after ``proxy``."""
    near, far = cores()
    if "litellm" not in kinds and litellm_python() is not None:
        kinds = (*kinds, "litellm")
    if baseline is not None and "baseline" not in kinds:
        at = kinds.index("proxy") + 1 if "proxy" in kinds else len(kinds)
        kinds = (*kinds[:at], "baseline", *kinds[at:])
    points: list[dict[str, Any]] = []
    messages_points: list[dict[str, Any]] = []  # POST /v1/messages: every concurrency, streamed at the first
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp, servers(Path(tmp), kinds, baseline) as srv:
        gen = LoadGenerator(near)
        try:
            for stream in (False, True):
                for c in cfg.concurrencies:
                    point = measure_point(gen, srv, kinds, c, cfg.requests[c], stream, cfg.reps, cfg.quick)
                    points.append(point)
                    _progress(point)
            messages_kinds = tuple(k for k in MESSAGES_CANDIDATES if k in kinds)
            if "proxy" in messages_kinds:
                for stream, concurrencies in ((False, cfg.concurrencies), (True, cfg.concurrencies[:1])):
                    for c in concurrencies:
                        point = measure_point(gen, srv, messages_kinds, c, cfg.requests[c], stream, cfg.reps, cfg.quick,
                                              api="messages")
                        messages_points.append(point)
                        _progress(point)
        finally:
            gen.stop()
    return {"points": points, "messages_points": messages_points, "litellm": litellm_status(),
            "cores": {"loadgen_upstream": near, "candidate": far},
            "baseline": baseline.label if baseline is not None else None}


def _progress(point: dict[str, Any]) -> None:
    cells = [f"{k} +{v['added_p50_ms']['median']:.2f}ms {v['rps']['median']:.0f}/s" for k, v in point["candidates"].items()]
    api = "" if point.get("api", "chat") == "chat" else f" {point['api']}"
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
