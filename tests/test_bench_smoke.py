"""The bench harness runs end to end on tiny streams and reports every figure (no timing asserted).

Timing targets are checked by ``make bench`` on a quiet machine, never here: these only make
sure the harness keeps working -- every run ends, rows arrive once, the JSON is whole, the
report and the PNG are written, and no moto server is left running.

- ``test_bench_minimal``: 2 child JVMs (Spark's sink and ``write_stream``), the reader, the
  report. Marked ``bench`` since 2026-11-27 (``make test`` was over its 20 minutes): ``make
  bench`` runs it with the full harness before measuring.
- The full harness (every sink and entry point -- the job launched as a user does against its
  parquet twin, Spark Connect clients through one server --, small and wide epochs, the
  profile, memory, S3) is marked ``bench``: ``make bench`` runs it before the bench itself.
- The format-3 log-scale phase alone, at 1,000 commits / 10,000 files (no Spark), is marked
  ``bench`` too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROWS = 20_000

pytestmark = [pytest.mark.spark]


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


def _not_positive(results: dict[str, Any]) -> dict[str, float]:
    """Figures that are 0 or less although they should not be."""

    def zero_ok(key: str) -> bool:
        # The machine's load may be 0; Spark's own sink and the peer (deltalake in foreachBatch,
        # in the driver) have no Python workers; the driver's Python mostly sleeps (its CPU may
        # round to 0 ticks); spreads of equal runs are 0; a query's first epoch may spend 0 ms
        # in a phase.
        return (
            "load_average" in key
            or "driver_python" in key
            # Spark's sink, in every kind of run, local and HDFS; a Connect client (the server works).
            or (re.search(r"\.sinks\.[\w-]*parquet\.", key) is not None and "python_worker" in key)
            or (".sinks.connect" in key and ("jvm" in key or "python_worker" in key))
            or (".sinks.delta-peer." in key and "python_worker" in key)
            or (".runs.parquet." in key and "python_workers" in key)  # the long run's
            or "growth" in key  # the long run's PSS may shrink a little once warm
            or key.endswith((".relative", ".count", ".epoch", ".batch", ".turn"))  # series: batch 0, turn 0
            or "_ms" in key
            or "shares" in key
            or key.startswith(".foreach_profile.top")
            or ".progress" in key
        )

    return {k: v for k, v in _numbers(results) if v <= 0 and not zero_ok(k)}


def _run_bench(tmp_path: Path, *args: str, timeout: float) -> dict[str, Any]:
    out = tmp_path / "bench-results.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "run.py"),
        "--rows", str(ROWS),
        "--rows-per-file", "2500",  # 8 files: 2 epochs of 4 files
        "--workdir", str(tmp_path / "work"),
        "--out", str(out),
        "--reader-files", "50",
        "--reader-epochs", "50",
        "--reader-repeats", "1",
        "--skip-log-scale",  # its own test below
        *args,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ}, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results: dict[str, Any] = json.loads(out.read_text())
    for key in ("date", "command", "machine"):
        assert results[key], key
    assert results["failures"] == {}
    # The hdfs phase has no sinks when it was skipped: its cluster is not built here (make hdfs-jars).
    for sinks in (results["sinks"], (results.get("hdfs") or {}).get("sinks", {})):
        for sink, figures in sinks.items():
            assert figures["rows"] == figures["rows_read_back"] == ROWS, sink
    assert "Entry points" in done.stdout and "| entry point |" in done.stdout  # text and Markdown
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert not _not_positive(results), f"figures that should be > 0: {_not_positive(results)}"
    for pids, what in ((results["moto_pids"], b"moto"), (results["connect_pids"], b"SparkConnectServer")):
        for pid in pids:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                cmdline = b""
            assert what not in cmdline, f"the bench left its {what.decode()} server {pid} running"
    return results


@pytest.mark.bench
@pytest.mark.timeout(180)
def test_bench_minimal(tmp_path: Path) -> None:
    """Spark's sink and write_stream (2 child JVMs), the ratios, the reader, the report and the PNG."""
    results = _run_bench(
        tmp_path,
        "--sinks", "parquet,epoch",
        "--repeats", "1",
        "--skip-small", "--skip-wide", "--skip-profile", "--skip-memory", "--skip-long-run",
        timeout=170,
    )  # fmt: skip
    assert set(results["sinks"]) == {"parquet", "epoch"}
    assert set(results["entry_points"]) == {"parquet", "epoch"}
    assert results["entry_points"]["epoch"]["vs_parquet"] > 0
    assert set(results["first_epoch"]) == {"parquet", "epoch"}
    for figures in results["sinks"].values():
        assert figures["epochs"] == 2 and figures["steady_rows_per_second"] > 0
    assert results["reader"]["rows"] == ROWS
    assert results["open_many_files"]["files"] == results["open_many_epochs"]["files"] == 50


@pytest.mark.bench
@pytest.mark.timeout(1200)
def test_bench_harness_local(tmp_path: Path) -> None:
    """Every local sink and entry point and the peer (two turns of the repeated ones), the job
    against its parquet twin, Connect, small epochs, profile, memory."""
    results = _run_bench(
        tmp_path,
        "--skip-s3",
        "--repeats", "2",
        "--small-epochs", "3",
        "--small-turns", "2",
        "--profile-rows", str(ROWS),
        "--memory-rows", str(ROWS),
        "--memory-sinks", "epoch",
        "--long-run-batches", "6",
        "--long-run-turns", "2",
        timeout=1180,
    )  # fmt: skip
    repeated = {"parquet", "delta-peer", "epoch", "epoch-source", "format", "submit"}
    once = {"epoch-stock", "foreach", "submit-source", "submit-parquet", "python", "python-parquet"}
    once |= {"connect", "connect-parquet", "format-found", "python-parquet-arrow"}
    assert set(results["sinks"]) == repeated | once
    runs = {sink: f["runs"] for sink, f in results["sinks"].items()}
    assert runs == {**dict.fromkeys(repeated, 2), **dict.fromkeys(once, 1)}
    assert set(results["entry_points"]) == repeated | {"format-found"}
    # lakesink's entry points over the peer's medians; spark-submit has no rate from start() to compare
    assert set(results["vs_delta_peer"]) == {"epoch", "epoch-source", "format", "format-found"}
    assert results["entry_points"]["submit"]["rows_per_second"] is None  # spark-submit: launch to exit only
    # The job and its parquet twin, launched the same ways: every figure from their logs, and a ratio.
    launched = results["launch_to_exit"]
    assert list(launched) == [
        *("submit-parquet", "submit", "submit-source"),
        *("python-parquet", "python-parquet-arrow", "python"),
    ]
    for name, f in launched.items():
        assert results["sinks"][name]["epochs"] == 2, name
        assert f["launch_to_first_epoch_seconds"] < f["process_seconds"], name
        assert 0 < f["stop_to_exit_seconds"] < f["process_seconds"], name
        if not name.endswith("-parquet"):
            assert f["rows_per_process_second_vs_baseline"] > 0, name
    assert results["sinks"]["submit-source"]["via"] == "data_source"
    assert list(results["connect"]) == ["connect-parquet", "connect"]
    assert results["connect"]["connect"]["rows_per_second_vs_baseline"] > 0
    assert len(results["connect_pids"]) == 1  # one server for both Connect runs
    small = results["small_epochs"]["runs"]
    assert set(small) == {"parquet", "parquet-arrow", "epoch", "epoch-tasks", "epoch-source", "epoch-auto"}
    assert [len(run["epochs"]) for run in small.values()] == [6] * 5  # two turns of 3
    assert small["epoch"]["summary"]["driver_commit"]["count"] == 4  # the epochs after each turn's first
    assert all(len(run["turn_trigger_p50"]) == 2 for run in small.values())
    assert sum(results["foreach_profile"]["shares"].values()) > 0
    one = results["memory_one_partition"]["epoch"][str(ROWS)]
    assert one["rows"] == one["rows_read_back"] == ROWS
    long = results["long_run"]
    assert set(long["runs"]) == {"parquet", "arrow-parquet", "format", "batch"}
    assert all(run["batches"] >= 6 and run["pss_end_mib"]["jvm"] > 0 for run in long["runs"].values())
    # Two turns of each sink; the row is one of them, the ratio over the floor beside Spark's.
    assert {sink: len(turns) for sink, turns in long["by_turn"].items()} == dict.fromkeys(long["runs"], 2)
    assert all(run["turn"] in (0, 1) for run in long["runs"].values())
    assert set(long["pss_end_ratio_to_floor"]) == {"format", "batch"}
    assert "pyspark.sql.worker.python_streaming_sink_runner" not in long["runs"]["batch"]["by_module_end"]
    assert (tmp_path / "bench-results-long-run.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.bench
@pytest.mark.s3
@pytest.mark.timeout(600)
def test_bench_harness_s3(tmp_path: Path) -> None:
    """The S3 runs: write_stream into moto, S3 small epochs, wide epochs behind the delaying proxy."""
    results = _run_bench(
        tmp_path,
        "--sinks", "epoch,epoch-s3",
        "--repeats", "1",
        "--small-epochs", "3",
        "--small-turns", "1",
        "--wide-files", "4",
        "--wide-master", "local[2]",
        "--skip-profile", "--skip-memory", "--skip-reader", "--skip-long-run",
        timeout=580,
    )  # fmt: skip
    assert results["sinks"]["epoch-s3"]["output"].startswith("s3://")
    tax = results["s3_tax"]
    assert tax["rows_per_cpu_second"]["ratio"] > 0 and tax["moto_cpu_seconds"]["median"] > 0
    assert "epoch-s3" in results["small_epochs"]["runs"]
    wide = results["wide_epochs"]["runs"]
    assert {run["commit"]["files"] for run in wide.values()} == {1, 4}
    assert wide["wide-4"]["requests_per_extra_file"] > 0
    # One moto server per S3 run: the stream, the small epochs and both wide queries.
    assert len(results["moto_pids"]) == 4


@pytest.mark.bench
@pytest.mark.timeout(300)
def test_bench_log_scale_tiny(tmp_path: Path) -> None:
    """The log-scale phase alone at 1,000 commits and 10,000 live files: every measurement runs,
    in its own process, the lake is back to its 1,000 commits after each commit, and the report
    has both tables (text and Markdown)."""
    out = tmp_path / "bench-results.json"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "run.py"),
        "--sinks", "",
        "--skip-small", "--skip-wide", "--skip-profile", "--skip-reader", "--skip-memory", "--skip-long-run",
        "--log-scale-commits", "1000",
        "--log-scale-repeats", "2",
        "--log-scale-latency-commits", "20",
        "--skip-s3",  # no moto here: test_bench_harness_s3 covers the S3 runs
        "--workdir", str(tmp_path / "work"),
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ}, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results: dict[str, Any] = json.loads(out.read_text())
    assert results["failures"] == {}
    found = results["log_scale"]
    assert found["lake"]["live_files"] == 10_000 and found["lake"]["measured_checkpoint"] == 900
    assert found["checkpoint"]["list_rows"] == 9_010 and found["checkpoint"]["files"] == 9_010
    assert found["open"]["version"] == 999 and found["open"]["open_seconds"]["runs"] == 2
    assert found["open"]["pyarrow_parquet_imported"] is False  # the open reads no file list
    for key in ("first_commit_continuing", "first_commit_new_writer"):
        first = found[key]
        assert first["status"] == "committed" and first["version"] == 1000, key
        assert first["checkpoint"]["list_rows"] == 10_010, key  # version 1000 is a checkpoint's
    # (format 2's baseline went, a6a9cb1; the Iceberg view's series came with issue 54)
    assert set(found["latency"]) == {"v3-local", "v3-local-iceberg", "v3-local-big"}
    assert all(series["count"] == 20 for series in found["latency"].values())
    assert set(found["baselines"]) == {"interpreter", "import_reader", "import_parquet"}
    assert not _not_positive(found), f"figures that should be > 0: {_not_positive(found)}"
    assert "Log scale (format 3)" in done.stdout and "| committer |" in done.stdout
    assert not list((tmp_path / "work").glob("run-*"))  # the lakes are removed
