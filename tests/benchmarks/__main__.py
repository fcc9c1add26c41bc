"""``python -m tests.benchmarks [--quick] --out DIR [--sections a,b] [--modes quiet,crowded] [--summary-delay-s S] [--readme PATH] [--compare REV | --baseline-tree DIR]``.

Runs the sections in order (overhead, instructions, pipeline, compaction_turn, storage, compression),
then writes ``DIR/results.json`` (keys ``overhead``, ``overhead_crowded``, ``instructions``,
``pipeline``, ``compaction_turn``, ``storage``, ``compression``, ``goals``; a section not run is
``null``), ``DIR/report.md``, the PNG plots and ``DIR/README_perf.md``, and
rewrites the README's text between ``<!-- perf:start -->`` and ``<!-- perf:end -->`` when the
markers exist. Run from the repository root in the test environment.

``--compare REV`` (or ``--baseline-tree DIR``) measures that tree's proxy beside this one in the
same run (``baseline.py``): one more overhead candidate, and the pipeline and storage sections
again on it; ``results.json`` gains ``baseline`` and ``goals.vs_baseline``, the report a side-by-side
table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.benchmarks import REPO_DIR
from tests.benchmarks.config import BenchConfig

if TYPE_CHECKING:
    from tests.benchmarks.baseline import Baseline

SECTIONS = ("overhead", "instructions", "pipeline", "compaction_turn", "storage", "compression")


def run_sections(cfg: BenchConfig, sections: tuple[str, ...], baseline: Baseline | None = None) -> dict[str, Any]:
    """Run ``sections``; the results object without ``goals`` (``report.write`` adds it). With
    ``baseline``, each section it supports is measured on it right after this tree's."""
    from tests.benchmarks import compaction_turn, compression, instructions, overhead, pipeline, report, storage_growth
    from tests.benchmarks.baseline import IN_PROCESS_SECTIONS

    modules = {"pipeline": pipeline, "storage": storage_growth, "compression": compression,
               "compaction_turn": compaction_turn, "instructions": instructions}
    results: dict[str, Any] = {"machine": report.machine(), "config": {"quick": cfg.quick, "sections": list(sections)},
                               "timings_s": {}, "baseline": None}
    if baseline is not None:
        results["baseline"] = {"label": baseline.label, "source": baseline.source}
    for name in SECTIONS:
        results[name] = None
        if name not in sections:
            continue
        print(f"[{name}]", flush=True)
        t0 = time.perf_counter()
        if name == "overhead":
            results["overhead_crowded"] = None
            for mode in cfg.overhead_modes:
                print(f"  [{mode}]", flush=True)
                crowd = overhead.crowd_for(overhead.CANDIDATES) if mode == "crowded" else 0
                results["overhead" if mode == "quiet" else "overhead_crowded"] = overhead.run(cfg, baseline=baseline,
                                                                                           crowd=crowd)
        else:
            results[name] = modules[name].run(cfg)
        if baseline is not None and name in IN_PROCESS_SECTIONS:
            print(f"[{name} @ {baseline.label}]", flush=True)
            measured = baseline.run_sections(cfg, (name,))
            results["baseline"][name] = measured[name]
            results["baseline"]["proxy_file"] = measured["proxy_file"]
        results["timings_s"][name] = round(time.perf_counter() - t0, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__.split("\n\n")[1])
    parser.add_argument("--out", required=True, type=Path, help="Directory for report.md, results.json and the plots.")
    parser.add_argument("--quick", action="store_true", help="Small counts: the whole run in about 12 minutes on 2 cores (both overhead modes).")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"Comma-separated subset of {','.join(SECTIONS)}.")
    parser.add_argument("--modes", default="quiet,crowded",
                        help="Overhead modes, comma-separated: quiet (the candidates alone on their core) and/or "
                             "crowded (idle bystander servers up beside them).")
    parser.add_argument("--summary-delay-s", type=float, default=5.0,
                        help="Seconds the compaction-turn section's summarizer takes (default 5).")
    parser.add_argument("--readme", type=Path, default=REPO_DIR / "README.md", help="README whose perf markers are rewritten.")
    side = parser.add_mutually_exclusive_group()
    side.add_argument("--compare", metavar="REV", help="Measure REV's proxy (git archive) beside this one, same run.")
    side.add_argument("--baseline-tree", type=Path, metavar="DIR", help="Measure the tree at DIR beside this one.")
    args = parser.parse_args(argv)
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {sorted(unknown)}")
    from tests.benchmarks import report
    from tests.benchmarks.baseline import Baseline

    started = time.perf_counter()
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - {"quiet", "crowded"}:
        parser.error(f"--modes: quiet and/or crowded, not {args.modes!r}")
    cfg = BenchConfig.make(args.out.resolve(), args.quick)
    cfg.overhead_modes, cfg.summary_delay_s = modes, args.summary_delay_s
    baseline = None
    try:
        if args.compare:
            baseline = Baseline.from_rev(args.compare)
        elif args.baseline_tree:
            baseline = Baseline.from_tree(args.baseline_tree)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        results = run_sections(cfg, sections, baseline)
    finally:
        if baseline is not None:
            baseline.cleanup()
    from tests.benchmarks.peers import PEER_LIST

    named = "".join(f"{p.env}={os.environ[p.env]} " for p in PEER_LIST if os.environ.get(p.env))
    command = named + "python -m tests.benchmarks" + (" --quick" if args.quick else "") + f" --out {args.out}"
    if sections != SECTIONS:
        command += f" --sections {','.join(sections)}"
    if modes != ("quiet", "crowded") and "overhead" in sections:
        command += f" --modes {','.join(modes)}"
    if args.summary_delay_s != 5.0 and "compaction_turn" in sections:
        command += f" --summary-delay-s {args.summary_delay_s:g}"
    if args.compare:
        command += f" --compare {args.compare}"
    elif args.baseline_tree:
        command += f" --baseline-tree {args.baseline_tree}"
    results["timings_s"]["total"] = round(time.perf_counter() - started, 1)
    report.write(results, cfg.out, args.readme, command)
    print(f"wrote {cfg.out / 'report.md'}, {cfg.out / 'results.json'}"
          + (f"; README section updated in {args.readme}" if results.get("readme_updated") else "")
          + f" ({results['timings_s']['total']:.0f} s)")
    print("goals:", {k: v for k, v in results["goals"].items() if k != "met"}, "met:", results["goals"]["met"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
