"""The bench harness runs end to end on a tiny stream and reports every figure (no timing asserted).

Timing targets are checked by ``make bench`` on a quiet machine, never here: this only makes
sure the harness itself keeps working (every sink runs, rows arrive once, the JSON is whole).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _numbers(doc: object, where: str = "") -> list[tuple[str, float]]:
    """Every number in the JSON document, with its path."""
    if isinstance(doc, bool):
        return []
    if isinstance(doc, int | float):
        return [(where, doc)]
    if isinstance(doc, dict):
        return [n for k, v in doc.items() for n in _numbers(v, f"{where}.{k}")]
    if isinstance(doc, list):
        return [n for i, v in enumerate(doc) for n in _numbers(v, f"{where}[{i}]")]
    return []


def _run_bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "bench-results.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "run.py"),
        "--rows", "20000",
        "--rows-per-file", "2500",  # 8 files: 2 epochs of 4 files
        "--workdir", str(tmp_path / "work"),
        "--out", str(out),
        *args,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ}, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results: dict[str, Any] = json.loads(out.read_text())
    for key in ("date", "command", "machine"):
        assert results[key], key
    for sink, figures in results["sinks"].items():
        assert figures["rows"] == figures["rows_read_back"] == 20000, sink
    return results


def _not_positive(results: dict[str, Any]) -> dict[str, float]:
    def zero_ok(key: str) -> bool:
        # The machine's load may be 0; Spark's own sink has no Python workers; the driver's
        # Python mostly sleeps in awaitTermination (its CPU may round to 0 ticks).
        return (
            "load_average" in key
            or "driver_python" in key
            or (key.startswith(".sinks.parquet.") and "python_worker" in key)
        )

    return {k: v for k, v in _numbers(results) if v <= 0 and not zero_ok(k)}


def test_bench_harness_reports_every_figure(tmp_path: Path) -> None:
    """Local sinks (two turns of the repeated ones), reader, open times, memory: 7 child JVMs, no S3."""
    results = _run_bench(
        tmp_path,
        "--skip-s3",
        "--repeats", "2",
        "--memory-rows", "20000",
        "--memory-sinks", "epoch",
        "--reader-files", "200",
        "--reader-epochs", "200",
        "--reader-repeats", "2",
    )  # fmt: skip
    assert set(results["sinks"]) == {"parquet", "epoch", "epoch-stock", "foreach"}
    ratios = {"epoch/parquet", "epoch-stock/parquet", "foreach/parquet"}
    assert set(results["ratios"]) == set(results["ratios_by_cpu"]) == set(results["ratios_steady"]) == ratios
    runs = {sink: len(f["runs_rows_per_second"]) for sink, f in results["sinks"].items()}
    assert runs == {"parquet": 2, "epoch": 2, "epoch-stock": 1, "foreach": 1}
    for figures in results["sinks"].values():
        assert figures["epochs"] == 2 and figures["steady_rows_per_second"] > 0
    assert results["reader"]["rows"] == 20000
    assert results["open_many_files"]["files"] == 200
    assert results["open_many_epochs"]["files"] == 200
    run = results["memory_one_partition"]["epoch"]["20000"]
    assert run["rows"] == run["rows_read_back"] == 20000
    assert not _not_positive(results), f"figures that should be > 0: {_not_positive(results)}"


@pytest.mark.s3
def test_bench_harness_s3_sink(tmp_path: Path) -> None:
    """The epoch sink into the moto server the bench starts, and stops by PID."""
    results = _run_bench(
        tmp_path, "--sinks", "epoch-s3", "--skip-memory", "--skip-reader"
    )  # fmt: skip
    assert set(results["sinks"]) == {"epoch-s3"}
    assert results["sinks"]["epoch-s3"]["output"].startswith("s3://")
    assert not _not_positive(results), f"figures that should be > 0: {_not_positive(results)}"
    try:
        cmdline = Path(f"/proc/{results['moto_pid']}/cmdline").read_bytes()
    except FileNotFoundError:
        cmdline = b""
    assert b"moto" not in cmdline, "the bench left its moto server running"
