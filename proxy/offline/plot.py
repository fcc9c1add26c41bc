"""``--plot FILE.png`` of ``context-proxy replay``: prompt tokens per turn, without and with the proxy.

Uses matplotlib's object API on a ``Figure`` (the Agg canvas, no pyplot and no global backend),
so it works headless and never touches another figure. matplotlib is the optional ``plot`` extra,
imported with this module: importing it raises ``ImportError`` without matplotlib (what
``context-proxy replay --plot`` checks before it replays).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from proxy.offline.replay import OFFLINE_LABEL, ReplayReport


def plot_replay(report: ReplayReport, path: str | Path, title: str | None = None) -> Path:
    """Draw ``report`` to ``path`` (PNG by its extension); returns the path.

    Lines: tokens per request without the proxy and with it; a dashed line at the context
    window; a dotted vertical line at each turn where a compaction happened.
    """
    turns = [t.turn for t in report.turns]
    fig = Figure(figsize=(10, 5), dpi=100)
    ax = fig.subplots()
    ax.plot(turns, [t.tokens_without for t in report.turns], label="without the proxy", color="#c0392b")
    ax.plot(turns, [t.tokens_with for t in report.turns], label="with the proxy", color="#2471a3")
    if report.window_tokens:
        ax.axhline(report.window_tokens, linestyle="--", color="gray",
                   label=f"context window ({report.window_tokens:,})")
    labelled = False
    for t in report.turns:
        if t.compactions:
            ax.axvline(t.turn, linestyle=":", color="#27ae60", alpha=0.7, label=None if labelled else "compaction")
            labelled = True
    ax.set_xlabel("request (turn)")
    ax.set_ylabel("prompt tokens")
    label = OFFLINE_LABEL.split(":")[0]
    ax.set_title(title or f"{report.model}: {report.saved_fraction:.0%} fewer prompt tokens ({label})")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    return out
