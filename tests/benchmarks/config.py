"""``BenchConfig``: what one run measures and how much (quick or full)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BenchConfig:
    """Sizes of one run. ``quick`` keeps the whole run to about 12 minutes on 2 cores (both
    overhead modes; the overhead section is most of it).

    ``requests``: recorded requests per overhead point, by concurrency; ``reps``: repetitions of
    every overhead point (candidates interleaved within each repetition); ``pipeline_sizes``:
    history lengths in messages; ``pipeline_requests``: timed warm requests per size (10 in quick
    mode too: the whole pipeline section takes ~6 s, and a median of 4 moved by ~6% between runs);
    ``compression_traces``: how many shared traces (``None``: all, quick mode too: issue 7 checks that
    the table covers every trace; 21 s for the 12 traces at three windows); ``windows``: windows in
    tokens. Quick mode records 100 / 1,000 / 2,000 requests at concurrency 1 / 16 / 64 (fewer, and a
    point at 2,000 requests/s lasted 80 ms, mostly ramp-up).
    """

    out: Path
    quick: bool = False
    concurrencies: tuple[int, ...] = (1, 16, 64)
    requests: dict[int, int] = field(default_factory=lambda: {1: 1000, 16: 4000, 64: 8000})
    reps: int = 5
    pipeline_sizes: tuple[int, ...] = (10, 100, 1000, 5000)
    pipeline_requests: int = 10
    pipeline_compaction_reps: int = 3
    compression_traces: int | None = None
    windows: tuple[int, ...] = (16_384, 32_768, 131_072)
    storage_traces: int | None = None
    trace_filter: str | None = None
    """Only traces whose file name contains this (storage and compression; smoke test)."""
    summary_delay_s: float = 5.0
    """Seconds the compaction-turn section's upstream takes to answer a summary request."""
    compaction_turn_normal: int = 10
    """Normal turns timed by the compaction-turn section (their median is the reference)."""
    instruction_requests: int = 500
    """Requests counted by the instructions section (under callgrind: ~50x slower)."""
    overhead_modes: tuple[str, ...] = ("quiet",)
    """Modes of the overhead section: ``quiet`` (the candidates alone on their core) and/or
    ``crowded`` (bystander servers beside them, ``candidates.CROWD_SIZE``); the command line
    runs both unless told otherwise."""
    serve_gc_tuning: bool = False
    """Tune the garbage collector in-process as ``context-proxy serve`` tunes its process
    (``inproc.InProcessProxy``): what production runs with. The command line sets it; the tests
    keep Python's defaults."""

    @classmethod
    def make(cls, out: Path, quick: bool) -> BenchConfig:
        modes = ("quiet", "crowded")
        if not quick:
            return cls(out=out, serve_gc_tuning=True, overhead_modes=modes)
        return cls(out=out, quick=True, requests={1: 100, 16: 1000, 64: 2000}, reps=3, pipeline_requests=10,
                   pipeline_compaction_reps=1, serve_gc_tuning=True, overhead_modes=modes)
