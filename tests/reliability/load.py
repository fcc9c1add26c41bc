"""The load run (issue 5, point 8): N concurrent streaming sessions for D seconds through a
``context-proxy serve`` process against the fake upstream on loopback.

    report = asyncio.run(run_load(proxy_url, upstream_url, pid, concurrency=200, duration_s=60))

Each worker is one agent: it streams a chat request on its own session, appends the reply and a new
user message, and starts again (a new session every 20 turns, so histories stay agent-sized). An
error is any status but 200, a transport error, or a stream without ``[DONE]``. Added latency is the
proxy's time to the last byte minus the upstream's alone, per percentile, with the same workers
sending straight to the fake upstream for a calibration run first. RSS of the proxy process
(bytes) is sampled every 0.25 s; the report gives start, middle, peak and end, a series of about
ten points, and the growth over the second half (MB per minute: memory that stops growing is
near 0 there).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import psutil

TURNS_PER_SESSION = 20


@dataclass
class Phase:
    """One run's figures: requests, errors, latencies in ms."""

    requests: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    def percentile(self, p: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def _worker(client: httpx.AsyncClient, base: str, worker: int, stop_at: float, phase: Phase, headers: dict[str, str]) -> None:
    session, turn = 0, 0
    history: list[dict[str, Any]] = []
    while time.monotonic() < stop_at:
        if turn % TURNS_PER_SESSION == 0:
            session += 1
            history = [{"role": "system", "content": "You are a load-test agent."}]
        history.append({"role": "user", "content": f"worker {worker} turn {turn}: go on"})
        body = {"model": "gpt-4o", "stream": True, "messages": history}
        t0 = time.perf_counter()
        try:
            async with client.stream("POST", base + "/chat/completions", json=body,
                                     headers=headers | {"x-session-id": f"load-{worker}-{session}"}) as r:
                data = b"".join([c async for c in r.aiter_raw()])
            ok = r.status_code == 200 and data.rstrip().endswith(b"data: [DONE]")
            problem = f"status {r.status_code}: {data[-200:]!r}"
        except httpx.HTTPError as exc:
            ok, problem = False, f"{type(exc).__name__}: {exc}"
        phase.requests += 1
        if not ok:
            phase.errors += 1
            if len(phase.error_samples) < 5:
                phase.error_samples.append(problem)
            continue
        phase.latencies_ms.append((time.perf_counter() - t0) * 1000)
        history.append({"role": "assistant", "content": f"OK: worker {worker} turn {turn}"})
        turn += 1


async def _phase(base: str, concurrency: int, duration_s: float, headers: dict[str, str]) -> Phase:
    phase = Phase()
    limits = httpx.Limits(max_connections=concurrency + 10, max_keepalive_connections=concurrency + 10)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        stop_at = time.monotonic() + duration_s
        await asyncio.gather(*(_worker(client, base, w, stop_at, phase, headers) for w in range(concurrency)))
    return phase


async def _sample_rss(pid: int, samples: list[tuple[float, int]], stop: asyncio.Event) -> None:
    proc = psutil.Process(pid)
    t0 = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - t0, proc.memory_info().rss))
        await asyncio.sleep(0.25)


async def run_load(proxy_url: str, upstream_url: str, proxy_pid: int, *, concurrency: int, duration_s: float,
                   calibration_s: float | None = None, api_key: str = "sk-load-test-key-0000") -> dict[str, Any]:
    """Calibrate against the upstream alone, then load the proxy; the figures as a dict."""
    headers = {"authorization": f"Bearer {api_key}"}
    direct = await _phase(upstream_url, concurrency, calibration_s or min(10.0, duration_s), headers)
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_rss(proxy_pid, samples, stop))
    await asyncio.sleep(0.3)
    through = await _phase(proxy_url + "/v1", concurrency, duration_s, headers)
    await asyncio.sleep(2)  # idle: the log writes drain
    stop.set()
    await sampler
    rss = [r for _, r in samples]
    half = [r for t, r in samples if t <= samples[-1][0] / 2] or rss
    mb = 1024 * 1024
    # RSS over time: one sample per tenth of the run, and the growth over its second half
    step = max(1, len(samples) // 10)
    series = [[round(t, 1), round(r / mb, 1)] for t, r in samples[::step]] + [[round(samples[-1][0], 1), round(rss[-1] / mb, 1)]]
    mid = next((r for t, r in samples if t >= samples[-1][0] / 2), rss[-1])
    half_s = max(1e-9, samples[-1][0] / 2)
    return {
        "concurrency": concurrency,
        "duration_s": duration_s,
        "requests": through.requests,
        "errors": through.errors,
        "error_samples": through.error_samples,
        "requests_per_s": round(through.requests / duration_s, 1),
        "latency_ms": {p: round(through.percentile(p), 1) for p in (50, 90, 99)},
        "upstream_alone_latency_ms": {p: round(direct.percentile(p), 1) for p in (50, 90, 99)},
        "added_latency_ms": {p: round(through.percentile(p) - direct.percentile(p), 1) for p in (50, 90, 99)},
        "calibration_requests": direct.requests,
        "calibration_errors": direct.errors,
        "rss_mb": {"start": round(rss[0] / mb, 1), "peak": round(max(rss) / mb, 1), "end": round(rss[-1] / mb, 1),
                   "peak_first_half": round(max(half) / mb, 1), "middle": round(mid / mb, 1)},
        "rss_growth_second_half_mb_per_min": round((rss[-1] - mid) / mb / half_s * 60, 2),
        "rss_mb_series": series,
        "mean_latency_ms": round(statistics.fmean(through.latencies_ms), 1) if through.latencies_ms else 0.0,
    }


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with keys as strings (percentile keys are ints)."""
    return {k: ({str(p): v for p, v in val.items()} if isinstance(val, dict) else val) for k, val in report.items()}


__all__ = ["Phase", "as_json", "asdict", "run_load"]
