"""Lake to lake, the two routes of ``jobs/stream_to_lake.py --source lake`` and Spark's file source.

    PYTHONPATH=.:reader .venv/bin/python bench/lake_to_lake.py --rows 4000000 --turns 3 \\
        --work /tmp/l2l-bench --out bench/results/2026-11-29-s17-lake-to-lake.json

Lake A (``--rows`` rows of the bench's input stream, written once by the job's files source in
epoch mode and kept in ``--work``) is streamed into a new lake by the job, a fresh process per run
(``--available-now``, epoch mode, the foreachBatch door):

- ``python``: ``--lake-read python``, ``readStream.format("lakesink")`` (the Python source);
- ``spark``: ``--lake-read spark``, ``lakesink.follow_lake`` (the files, read by Spark's scan);
- ``files``: ``--source files --input A``, Spark's own file source over A's ``_spark_metadata``
  view (the issue's yardstick: "the same job over Spark's file source"; a lake that was never
  compacted, where that view reads each row once).

The runs alternate within each turn (the order turns around every turn: a loaded machine's
drift falls on every route alike). Rows/s count from the job's "query ... started" line to its
"stopping Spark" line (the stream, not the JVM's start or stop); every run's output must hold
exactly A's rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[1:1] = [str(BENCH_DIR), str(ROOT), str(ROOT / "reader")]
JOB = ROOT / "jobs" / "stream_to_lake.py"
ROUTES = {
    "python": ["--source", "lake", "--lake-read", "python"],
    "spark": ["--source", "lake", "--lake-read", "spark"],
    "files": ["--source", "files", "--input-format", "parquet"],
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def job(args: list[str], log: Path) -> tuple[float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "reader"), env.get("PYTHONPATH")) if p
    )
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(JOB), *args], capture_output=True, text=True, env=env, check=False
    )
    seconds = time.monotonic() - began
    log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"the job failed ({out.returncode}), its log: {log}")
    return seconds, out.stdout


def stream_seconds(stdout: str) -> float:
    """From the "query ... started" line to "stopping Spark", by the lines' own times."""

    def at(needle: str) -> float:
        line = next(line for line in stdout.splitlines() if needle in line)
        match = STAMP.match(line)
        assert match, line
        return dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()

    return at("stopping Spark") - at(" started; its first epoch")


def rows_of(lake: Path) -> int:
    from lakesink_reader import Lake

    return sum(v.add_rows for v in Lake(str(lake)).versions() if v.operation == "append")


def upstream(work: Path, rows: int, files_per_epoch: int) -> Path:
    """Lake A, written once (a marker names its parameters)."""
    from inputs import ROWS_PER_FILE, ensure_input

    lake = work / f"a-{rows}"
    marker = work / f"_a-{rows}-{files_per_epoch}-complete"
    if marker.exists():
        return lake
    shutil.rmtree(lake, ignore_errors=True)
    shutil.rmtree(work / "chk-a", ignore_errors=True)
    ensure_input(work / "in", rows, ROWS_PER_FILE)
    job(["--source", "files", "--input", str(work / "in"), "--input-format", "parquet", "--available-now",
         "--mode", "epoch", "--max-files-per-trigger", str(files_per_epoch), "--lake", str(lake),
         "--checkpoint", str(work / "chk-a")], work / "log-a.txt")  # fmt: skip
    assert rows_of(lake) == rows, f"lake A holds {rows_of(lake)} rows, not {rows}"
    marker.touch()
    return lake


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-files-per-trigger", type=int, default=4, help="lake A's files a micro-batch")
    p.add_argument("--routes", default=",".join(ROUTES))
    p.add_argument("--work", type=Path, default=Path("/tmp/lakesink-l2l-bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    routes = args.routes.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    a = upstream(args.work, args.rows, 4)
    from lakesink_reader import Lake

    results: dict[str, list[dict[str, Any]]] = {r: [] for r in routes}
    for turn in range(args.turns):
        for route in routes if turn % 2 == 0 else list(reversed(routes)):
            out, chk = args.work / f"out-{route}-{turn}", args.work / f"chk-{route}-{turn}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(chk, ignore_errors=True)
            load = os.getloadavg()[0]
            command = [*ROUTES[route], "--input", str(a), "--available-now", "--mode", "epoch"]
            command += ["--max-files-per-trigger", str(args.max_files_per_trigger)]
            command += ["--lake", str(out), "--checkpoint", str(chk)]
            wall, stdout = job(command, args.work / f"log-{route}-{turn}.txt")
            got = rows_of(out)
            if got != args.rows:
                raise RuntimeError(f"{route} turn {turn}: {got} rows, not {args.rows}")
            seconds = stream_seconds(stdout)
            epochs = sum(1 for v in Lake(str(out)).versions() if v.operation == "append")
            # Each epoch's seconds as the job logs them (Spark's triggerExecution): the first pays
            # the Python workers' start, the rest are the steady state.
            each = [float(x) for x in re.findall(r"epoch \d+: rows=.* seconds=([\d.]+)", stdout)]
            run = {
                "turn": turn,
                "stream_seconds": seconds,
                "wall_seconds": wall,
                "load_before": load,
                "rows_per_second": args.rows / seconds,
                "epochs": epochs,
                "epoch_seconds": each,
            }
            results[route].append(run)
            print(
                f"turn {turn} {route:6s}: {run['rows_per_second']:>12,.0f} rows/s  stream {seconds:6.1f} s  "
                f"wall {wall:6.1f} s  load {load:.1f}  epochs {epochs}",
                flush=True,
            )
            shutil.rmtree(out, ignore_errors=True)
    medians = {
        r: statistics.median(x["rows_per_second"] for x in runs) for r, runs in results.items() if runs
    }
    summary: dict[str, Any] = {
        "rows": args.rows,
        "upstream_files": len(Lake(str(a)).files()),
        "max_files_per_trigger": args.max_files_per_trigger,
        "turns": args.turns,
        "cpus": os.cpu_count(),
        "runs": results,
        "median_rows_per_second": medians,
    }
    for r in routes:
        if r != "files" and "files" in medians and r in medians:
            summary[f"{r}_vs_files"] = medians[r] / medians["files"]
    if "spark" in medians and "python" in medians:
        summary["spark_vs_python"] = medians["spark"] / medians["python"]
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
