"""Per-pod queue plots from runner result JSON files (matplotlib, Agg backend).

    python -m bench.harness.plots bench/out/seed001-small/*.json --out bench/plots/seed001-small.png

One column per result file (target), sharing both axes so the targets compare at a glance:
the top row is each pod's queue (vllm:num_requests_waiting) over time, the bottom row its
running requests. A dotted vertical line marks when the last request completed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness import cli

ROWS = (("waiting", "queue (waiting requests)"), ("running", "running requests"))


def _series(pod: Mapping[str, Any], key: str) -> tuple[list[float], list[float]]:
    ts, vs = [], []
    for t, v in zip(pod.get("t", ()), pod.get(key, ()), strict=False):
        if v is not None:
            ts.append(t)
            vs.append(v)
    return ts, vs


def plot_queues(
    runs: Sequence[tuple[str, Mapping[str, Any]]],
    out: str | Path,
    title: str = "",
) -> Path:
    """Write one PNG with a column per (label, result JSON) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ncols = max(1, len(runs))
    fig, axes = plt.subplots(
        len(ROWS),
        ncols,
        figsize=(4.2 * ncols + 0.8, 5.6),
        sharex=True,
        sharey="row",
        squeeze=False,
    )
    cmap = plt.get_cmap("tab10")
    colors = [cmap(i) for i in range(10)]
    for col, (label, run) in enumerate(runs):
        summary = run.get("summary", {})
        wall = summary.get("wall_clock")
        for row, (key, ylabel) in enumerate(ROWS):
            ax = axes[row][col]
            for i, pod in enumerate(run.get("pods", ())):
                ts, vs = _series(pod, key)
                if ts:
                    ax.plot(ts, vs, lw=1.1, color=colors[i % len(colors)], label=pod.get("name"))
            if wall is not None:
                ax.axvline(wall, color="0.4", ls=":", lw=1)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel(ylabel)
            if row == len(ROWS) - 1:
                ax.set_xlabel("time since start (s)")
        head = label if wall is None else f"{label}\nall done at {wall:.1f} s"
        axes[0][col].set_title(head, fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper right", fontsize=8, ncol=1, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1 - 0.7 / (4.2 * ncols + 0.8), 1))
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser("Plot per-pod queues from runner JSON files.")
    parser.add_argument("results", nargs="+", help="runner JSON files, one per target")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    runs = []
    for path in args.results:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        runs.append((run.get("meta", {}).get("label") or Path(path).stem, run))
    print(plot_queues(runs, args.out, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
