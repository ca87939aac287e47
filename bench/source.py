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
            if figures["rows"] != rows:
                failures[f"source-{kind}"] = f"read {figures['rows']:,} rows of {rows:,}"
                continue
            figures["rows_per_second"] = rows / figures["seconds"]
            runs[kind].append(figures)
            note(f"source {kind}: {figures['rows_per_second']:,.0f} rows/s ({figures['seconds']:.1f} s)")
    medians = {
        kind: statistics.median(r["rows_per_second"] for r in found) for kind, found in runs.items() if found
    }
    out: dict[str, Any] = {
        "rows": rows,
        "runs": runs,
        "median_rows_per_second": medians,
        "failures": failures,
    }
    if len(medians) == 2:
        out["lakesink_vs_parquet"] = medians["lakesink"] / medians["parquet"]
    return out
