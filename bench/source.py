"""The source phase: a lake as a streaming source against Spark's own file source, same rows.

``readStream.format("lakesink")`` over the lake the stream phase's ``epoch`` run wrote, and
``readStream.parquet`` over the folder its ``parquet`` run wrote (Spark's file source follows
that sink's ``_spark_metadata/``), each into Spark's ``noop`` sink with ``availableNow``, in a
fresh JVM (``source_child.py``); the runs alternate, and the medians count.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launch import BENCH_DIR, RunFailed, _run, bench_env

SOURCES = ("lakesink", "parquet")
#: A fresh JVM's first read, and a second one in the same session (source_child.py).
RUNS = ("cold", "warm")


def source_phase(
    lake: Path, parquet: Path, rows: int, repeats: int, work: Path, note: Callable[[str], None]
) -> dict[str, Any]:
    """Both sources ``repeats`` times each, alternating; rows/s from ``start()`` to the end."""
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SOURCES}
    failures: dict[str, str] = {}
    for attempt in range(repeats):
        for kind in SOURCES if attempt % 2 == 0 else reversed(SOURCES):
            result = work / f"source-{kind}-{attempt}.json"
            path = lake if kind == "lakesink" else parquet
            cmd = [sys.executable, str(BENCH_DIR / "source_child.py"), kind, str(path), str(result)]
            try:
                _run(cmd, bench_env(), work / f"log-source-{kind}-{attempt}.txt", 1.0)
            except RunFailed as exc:
                failures[f"source-{kind}"] = str(exc)
                continue
            figures = json.loads(result.read_text())
            wrong = [
                f"{run}: read {figures[run]['rows']:,} rows of {rows:,}"
                for run in RUNS
                if figures[run]["rows"] != rows
            ]
            if wrong:
                failures[f"source-{kind}"] = "; ".join(wrong)
                continue
            for run in RUNS:
                figures[run]["rows_per_second"] = rows / figures[run]["seconds"]
            runs[kind].append(figures)
            note(
                f"source {kind}: "
                + ", ".join(
                    f"{run} {figures[run]['rows_per_second']:,.0f} rows/s ({figures[run]['seconds']:.1f} s)"
                    for run in RUNS
                )
            )
    medians = {
        run: {
            kind: statistics.median(r[run]["rows_per_second"] for r in found)
            for kind, found in runs.items()
            if found
        }
        for run in RUNS
    }
    out: dict[str, Any] = {
        "rows": rows,
        "runs": runs,
        "median_rows_per_second": medians,
        "failures": failures,
    }
    for run in RUNS:
        if len(medians[run]) == 2:
            out[f"lakesink_vs_parquet_{run}"] = medians[run]["lakesink"] / medians[run]["parquet"]
    return out
