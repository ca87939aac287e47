"""The bench's picture: a PNG next to its JSON, drawn with matplotlib (the ``bench`` extra).

Left: rows/s of each run kind (the median as a bar, every run as a dot, so the spread of the
repetitions shows). Middle: the entry points from launch to exit (spark-submit has no other
rate). Right: the commit latency of each small epoch over time, one line per sink.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from figures import middle
from report import NAMES, compact

COLORS = {
    "parquet": "#7f7f7f",
    "parquet-arrow": "#c7c7c7",
    "delta-peer": "#e377c2",
    "epoch": "#1f77b4",
    "epoch-source": "#bcbd22",
    "format": "#2ca02c",
    "submit": "#9467bd",
    "submit-source": "#c5b0d5",
    "python": "#e377c2",
    "connect": "#98df8a",
    "epoch-s3": "#ff7f0e",
    "epoch-auto": "#8c564b",
    "epoch-stock": "#17becf",
    "foreach": "#d62728",
}


def draw(results: Mapping[str, Any], path: Path) -> Path | None:
    """Write the PNG; None (and nothing written) when matplotlib is missing or nothing ran."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    # The job runs have launch to exit only; the Connect runs a rate from start() like the others.
    sinks = {k: v for k, v in results["sinks"].items() if v.get("rows_per_second") is not None}
    if not sinks and not results.get("small_epochs", {}).get("runs"):
        return None
    fig, (rates, launch, latency) = plt.subplots(
        1, 3, figsize=(18, 5.5), gridspec_kw={"width_ratios": [3, 2, 3]}
    )
    _bars(rates, {k: v["runs_rows_per_second"] for k, v in sinks.items()}, "rows/s, start() to the end")
    launched = {**results.get("entry_points", {}), **results.get("launch_to_exit", {})}
    entry = {k: v for k, v in results["sinks"].items() if k in launched}
    _bars(launch, {k: v["runs_rows_per_process_second"] for k, v in entry.items()}, "rows/s, launch to exit")
    _latency(latency, results.get("small_epochs", {}).get("runs", {}))
    thousands = FuncFormatter(lambda value, _: f"{value:,.0f}")
    # On the log scale, label the minor ticks at 2 and 5 of each decade only: all of them overlap.
    two_five = FuncFormatter(lambda value, _: f"{value:,.0f}" if f"{value:.0f}"[0] in "25" else "")
    for ax in (rates, launch, latency):
        ax.yaxis.set_major_formatter(thousands)
    latency.yaxis.set_minor_formatter(two_five)
    latency.xaxis.set_major_locator(MaxNLocator(integer=True))
    m = results["machine"]
    fig.suptitle(
        f"lakesink bench {results['date'][:10]}: {results['parameters']['rows']:,} rows, "
        f"{results['parameters']['master']}, {m['cores']} cores ({m['cpu']})",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax: Any, runs: Mapping[str, list[float]], title: str) -> None:
    names = list(runs)
    for i, name in enumerate(names):
        values = runs[name]
        median = middle(values)
        ax.bar(i, median, color=COLORS.get(name, "#bcbd22"), alpha=0.75)
        ax.scatter([i] * len(values), values, color="black", s=12, zorder=3)
        ax.text(i, median, compact(median), ha="center", va="bottom", fontsize=8)
    if "parquet" in runs:
        base = middle(runs["parquet"])
        ax.axhline(base, color="#7f7f7f", linestyle=":", linewidth=1)
    labels = [NAMES.get(n, n).replace(", ", ",\n") for n in names]
    ax.set_xticks(range(len(names)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_title(f"{title} (bar: median, dots: runs)", fontsize=10)


def _latency(ax: Any, runs: Mapping[str, Any]) -> None:
    for name, run in runs.items():
        epochs = [e for e in run["epochs"] if e.get("turn", 0) == 0]  # one turn: one line per sink
        xs = [e["epoch"] for e in epochs]
        ax.plot(
            xs,
            [e["trigger_ms"] for e in epochs],
            marker=".",
            color=COLORS.get(name),
            label=f"{NAMES.get(name, name)}: epoch",
        )
        ax.plot(
            xs,
            [e["add_batch_ms"] for e in epochs],
            linestyle="--",
            color=COLORS.get(name),
            label=f"{NAMES.get(name, name)}: commit (addBatch)",
        )
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("ms")
    ax.set_title("small epochs: latency per epoch (log scale)", fontsize=10)
    if runs:
        ax.legend(fontsize=7)
