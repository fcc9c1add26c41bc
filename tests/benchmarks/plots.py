"""The PNG plots of a run (matplotlib, no display): overhead, pipeline, compression."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plots(results: dict[str, Any], out: Path, pipeline_goal_ms_per_mb: float) -> list[str]:
    """Write the PNG plots of ``results`` into ``out`` (the pipeline's goal line at
    ``pipeline_goal_ms_per_mb``); returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []
    ov = results.get("overhead")
    if ov:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        for ax, stream in zip(axes, (False, True), strict=True):
            pts = [p for p in ov["points"] if p["stream"] is stream]
            kinds = [k for k in pts[0]["candidates"] if k != "direct"]
            width = 0.8 / max(1, len(kinds))
            for j, kind in enumerate(kinds):
                key = "added_ttfb_p50_ms" if stream else "added_p50_ms"
                med = [max(p["candidates"][kind][key]["median"], 1e-2) for p in pts]
                lo = [m - max(p["candidates"][kind][key]["min"], 1e-2) for m, p in zip(med, pts, strict=True)]
                hi = [max(p["candidates"][kind][key]["max"], 1e-2) - m for m, p in zip(med, pts, strict=True)]
                xs = [i + j * width for i in range(len(pts))]
                ax.bar(xs, med, width, yerr=[[max(v, 0) for v in lo], [max(v, 0) for v in hi]], label=kind, capsize=2)
            ax.set_xticks([i + width * (len(kinds) - 1) / 2 for i in range(len(pts))], [str(p["concurrency"]) for p in pts])
            ax.set_yscale("log")
            ax.set_xlabel("concurrency")
            ax.set_title("added TTFB p50 (streaming)" if stream else "added p50 (non-streaming)")
        axes[0].set_ylabel("ms over direct")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / "overhead.png", dpi=110)
        plt.close(fig)
        names.append("overhead.png")
    pipe = results.get("pipeline")
    if pipe:
        fig, ax = plt.subplots(figsize=(6, 4))
        mb = [r["history_bytes"] / 1e6 for r in pipe["sizes"]]
        ax.loglog(mb, [max(r["warm_ms"], 1e-2) for r in pipe["sizes"]], "o-", label="warm request")
        ax.loglog(mb, [max(r["compaction_ms"], 1e-2) for r in pipe["sizes"]], "s-", label="compaction turn")
        ax.loglog(mb, [max(r["cold_ms"], 1e-2) for r in pipe["sizes"]], "^--", label="first request (cold)")
        ax.loglog(mb, [pipeline_goal_ms_per_mb * m for m in mb], "k:", label=f"goal {pipeline_goal_ms_per_mb:g} ms/MB")
        for r, m in zip(pipe["sizes"], mb, strict=True):
            ax.annotate(f"{r['messages']} msgs", (m, max(r["warm_ms"], 1e-2)), fontsize=7)
        ax.set_xlabel("history (MB)")
        ax.set_ylabel("proxy CPU ms per request")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "pipeline.png", dpi=110)
        plt.close(fig)
        names.append("pipeline.png")
    cp = results.get("compression")
    if cp and cp.get("plot"):
        p = cp["plot"]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(p["client"], label="without the proxy (client prompt)")
        ax.plot(p["forwarded"], label="forwarded by the proxy")
        if p.get("deepagents"):
            ax.plot(p["deepagents"], label="Deep Agents' summarization middleware", ls="--")
        ax.axhline(p["window"], color="k", ls=":", label=f"window {p['window'] // 1024}k")
        ax.set_xlabel("turn")
        ax.set_ylabel("prompt tokens")
        ax.set_title(p["trace"], fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "compression.png", dpi=110)
        plt.close(fig)
        names.append("compression.png")
    return names
