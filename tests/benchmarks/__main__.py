"""``python -m tests.benchmarks [--quick] --out DIR [--sections a,b] [--readme PATH]``.

Runs the sections in order (overhead, pipeline, storage, compression), then writes
``DIR/results.json`` (keys ``overhead``, ``pipeline``, ``storage``, ``compression``, ``goals``;
a section not run is ``null``), ``DIR/report.md``, the PNG plots and ``DIR/README_perf.md``, and
rewrites the README's text between ``<!-- perf:start -->`` and ``<!-- perf:end -->`` when the
markers exist. Run from the repository root in the test environment.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tests.benchmarks import REPO_DIR
from tests.benchmarks.config import BenchConfig

SECTIONS = ("overhead", "pipeline", "storage", "compression")


def run_sections(cfg: BenchConfig, sections: tuple[str, ...]) -> dict[str, Any]:
    """Run ``sections``; the results object without ``goals`` (``report.write`` adds it)."""
    from tests.benchmarks import compression, overhead, pipeline, report, storage_growth

    modules = {"overhead": overhead, "pipeline": pipeline, "storage": storage_growth, "compression": compression}
    results: dict[str, Any] = {"machine": report.machine(), "config": {"quick": cfg.quick, "sections": list(sections)},
                               "timings_s": {}}
    for name in SECTIONS:
        results[name] = None
        if name not in sections:
            continue
        print(f"[{name}]", flush=True)
        t0 = time.perf_counter()
        results[name] = modules[name].run(cfg)
        results["timings_s"][name] = round(time.perf_counter() - t0, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__.split("\n\n")[1])
    parser.add_argument("--out", required=True, type=Path, help="Directory for report.md, results.json and the plots.")
    parser.add_argument("--quick", action="store_true", help="Small counts: the whole run in under 3 minutes.")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"Comma-separated subset of {','.join(SECTIONS)}.")
    parser.add_argument("--readme", type=Path, default=REPO_DIR / "README.md", help="README whose perf markers are rewritten.")
    args = parser.parse_args(argv)
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {sorted(unknown)}")
    from tests.benchmarks import report

    started = time.perf_counter()
    cfg = BenchConfig.make(args.out.resolve(), args.quick)
    results = run_sections(cfg, sections)
    command = "python -m tests.benchmarks" + (" --quick" if args.quick else "") + f" --out {args.out}"
    results["timings_s"]["total"] = round(time.perf_counter() - started, 1)
    report.write(results, cfg.out, args.readme, command)
    print(f"wrote {cfg.out / 'report.md'}, {cfg.out / 'results.json'}"
          + (f"; README section updated in {args.readme}" if results.get("readme_updated") else "")
          + f" ({results['timings_s']['total']:.0f} s)")
    print("goals:", {k: v for k, v in results["goals"].items() if k != "met"}, "met:", results["goals"]["met"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
