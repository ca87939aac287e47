"""What a long-running small-trigger query holds in memory, and what each of its batches costs:
the bench's ``long-run`` phase (issue 38, target 3).

A streaming job runs for months beside others on the same executors, and what a platform team
sees first is the memory its process tree holds. Each sink runs in a fresh process as a user
would start it -- a plain ``SparkSession.builder`` session (``lakesink.register`` for
lakesink) on ``--master`` -- and streams Spark's ``rate-micro-batch`` source (``--rows`` rows a
micro-batch, as fast as the sink takes them; the same rows in every run) for ``--batches``
micro-batches into Spark's ``format("parquet")`` or ``format("lakesink")``.

Sampled every ``--interval`` seconds from /proc: the **PSS** of the query's process tree (the
driver's Python, the JVM, Spark's Python workers; ``/proc/<pid>/smaps_rollup``) -- the memory
the tree costs the machine, pages shared between forked workers counted once -- by kind. The
figures: the PSS at the end (the median of the last tenth of the samples), its peak, its growth
over the second half (MiB per 100 batches: flat is ~0), and each batch's ``addBatch`` and
``triggerExecution`` p50/p95 from Spark's progress.

    .venv/bin/python bench/long_run.py --batches 600 --out bench/results/long-run.json
    .venv/bin/python bench/long_run.py --child SPEC.json      (what the phase starts per sink)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[1:1] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from procmem import tree  # noqa: E402 - bench/ is a folder of scripts, not a package

#: The sinks a long run compares: Spark's own; lakesink's data source from a plain session
#: (``format``); ``write_stream(..., via="foreach_batch")`` (``batch``).
LONG_RUN_SINKS = ("parquet", "format", "batch")
_KINDS = ("jvm", "python_workers", "other")


# The child: one query, started as a user starts it ---------------------------------------------


def child(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(spec["master"]).appName(f"long-run-{spec['sink']}").getOrCreate()
    if spec["sink"] == "format":
        import lakesink

        lakesink.register(spark)
    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", spec["rows"]).load()
    df = df.selectExpr("value AS id", "timestamp AS ts", "CAST(value % 1000 AS STRING) AS label")
    if spec["sink"] == "batch":
        import lakesink

        query = lakesink.write_stream(
            df, spec["output"], checkpoint_location=spec["checkpoint"], via="foreach_batch"
        )
    else:
        query = (
            df.writeStream.format("lakesink" if spec["sink"] == "format" else spec["sink"])
            .option("path", spec["output"])
            .option("checkpointLocation", spec["checkpoint"])
            .start()
        )
    events: dict[int, dict[str, Any]] = {}
    marks = Path(spec["marks"])
    with marks.open("w") as out:
        last = -1
        while True:
            for event in query.recentProgress:
                batch = int(event["batchId"])
                if batch not in events:
                    events[batch] = {"batch": batch, "durations_ms": dict(event["durationMs"])}
            newest = max(events, default=-1)
            if newest > last:
                out.write(json.dumps({"batch": newest, "t": time.monotonic()}) + "\n")
                out.flush()
                last = newest
            if newest >= spec["batches"] - 1:
                break
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            time.sleep(0.2)
    query.stop()
    stopping = time.monotonic()
    spark.stop()
    Path(spec["result"]).write_text(
        json.dumps(
            {"events": [events[b] for b in sorted(events)], "stop_seconds": time.monotonic() - stopping}
        )
    )
    return 0


# The parent: start the child, sample its tree's PSS ---------------------------------------------


def pss_and_kind(pid: int) -> tuple[int, str, str] | None:
    """PSS (bytes) of ``pid``, its kind (``jvm``, ``python_workers``, ``other``) and, for a
    Python worker, the module the daemon that forked it runs (``pyspark.worker`` for tasks,
    ``pyspark.sql.worker.python_streaming_sink_runner`` for a Python sink's commits...)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            pss = next(int(line.split()[1]) * 1024 for line in f if line.startswith(b"Pss:"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, StopIteration):
        return None  # ended meanwhile, or not ours to read
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    if args and "java" in args[0]:
        return pss, "jvm", "jvm"
    if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
        return pss, "python_workers", args[-1]
    return pss, "other", "driver python"


def sample_tree(root: int, interval: float, stop: threading.Event, samples: list[dict[str, Any]]) -> None:
    while not stop.is_set():
        began = time.monotonic()
        sums = dict.fromkeys(_KINDS, 0)
        by_module: dict[str, list[int]] = {}  # module: [processes, PSS]
        for pid in tree(root):
            got = pss_and_kind(pid)
            if got is not None:
                sums[got[1]] += got[0]
                entry = by_module.setdefault(got[2], [0, 0])
                entry[0] += 1
                entry[1] += got[0]
        samples.append({"t": began, "total": sum(sums.values()), "by_module": by_module, **sums})
        stop.wait(max(0.0, interval - (time.monotonic() - began)))


def run_sink(
    sink: str, work: Path, *, batches: int, rows: int, master: str, interval: float
) -> dict[str, Any]:
    """One sink's long run in a child process; its samples and figures."""
    folder = work / sink
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    spec = {
        "sink": sink, "master": master, "rows": rows, "batches": batches,
        "output": str(folder / "out"), "checkpoint": str(folder / "chk"),
        "marks": str(folder / "marks.jsonl"), "result": str(folder / "result.json"),
    }  # fmt: skip
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_HOME", "PYTHONPATH")}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")  # a user's job, on loopback
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    began = time.monotonic()
    with (folder / "log.txt").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        sampler = threading.Thread(
            target=sample_tree, args=(process.pid, interval, stop, samples), daemon=True
        )
        sampler.start()
        try:
            code = process.wait()
        finally:
            stop.set()
            sampler.join()
            if process.poll() is None:
                process.kill()
    if code != 0:
        tail = (folder / "log.txt").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"long run of {sink} exited with {code}:\n{tail}")
    result = json.loads(Path(spec["result"]).read_text())
    marks = [json.loads(line) for line in Path(spec["marks"]).read_text().splitlines()]
    return figures(sink, samples, marks, result, time.monotonic() - began)


def batch_at(marks: list[dict[str, Any]], t: float) -> int:
    """The newest batch known to have ended by time ``t`` (-1 before the first)."""
    done = -1
    for mark in marks:
        if mark["t"] <= t:
            done = mark["batch"]
    return done


def figures(
    sink: str,
    samples: list[dict[str, Any]],
    marks: list[dict[str, Any]],
    result: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    mib = 1 << 20
    # While the query ran: from its first batch's end to its last's (not the stop, nor start-up).
    running = [s for s in samples if marks[0]["t"] <= s["t"] <= marks[-1]["t"]] if marks else samples
    tail = running[-max(1, len(running) // 10) :]
    end = {kind: statistics.median(s[kind] for s in tail) / mib for kind in ("total", *_KINDS)}
    series = [{"batch": batch_at(marks, s["t"]), **{k: round(s[k] / mib, 1) for k in ("total", *_KINDS)}}
              for s in running]  # fmt: skip
    last = max((p["batch"] for p in series), default=0)
    half = [p for p in series if p["batch"] >= last / 2]
    slope = None
    if len(half) >= 2 and half[-1]["batch"] > half[0]["batch"]:
        xs, ys = [p["batch"] for p in half], [p["total"] for p in half]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = (
            sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var * 100 if var else None
        )
    events = result["events"][1:]  # the first batch starts the workers: left out of the percentiles

    def p50_p95(key: str) -> list[float]:
        values = sorted(e["durations_ms"].get(key, 0) for e in events)
        return [statistics.median(values), values[int(0.95 * (len(values) - 1))]] if values else [0.0, 0.0]

    return {
        "sink": sink,
        "batches": len(result["events"]),
        "seconds": round(seconds, 1),
        "pss_end_mib": {k: round(v, 1) for k, v in end.items()},
        "pss_peak_mib": round(max(s["total"] for s in running) / mib, 1),
        "pss_growth_mib_per_100_batches": None if slope is None else round(slope, 2),
        "add_batch_ms_p50_p95": p50_p95("addBatch"),
        "trigger_ms_p50_p95": p50_p95("triggerExecution"),
        "stop_seconds": round(result["stop_seconds"], 2),
        # The last sample while the query ran: processes and PSS (MiB) per worker module.
        "by_module_end": {
            module: {"processes": n, "pss_mib": round(pss / mib, 1)}
            for module, (n, pss) in sorted(tail[-1]["by_module"].items())
        }
        if tail
        else {},
        "series": series,
    }


def long_run_phase(
    work: Path, *, batches: int, rows: int, master: str, interval: float, note: Any = print
) -> dict[str, Any]:
    """Every sink of ``LONG_RUN_SINKS`` in turn; the ratios of lakesink's to Spark's."""
    found: dict[str, Any] = {"batches": batches, "rows_per_batch": rows, "master": master, "runs": {}}
    for sink in LONG_RUN_SINKS:
        run = run_sink(sink, work / "long-run", batches=batches, rows=rows, master=master, interval=interval)
        found["runs"][sink] = run
        note(f"{sink}: PSS at the end {run['pss_end_mib']['total']:.0f} MiB "
             f"(peak {run['pss_peak_mib']:.0f}), growth {run['pss_growth_mib_per_100_batches']} "
             f"MiB/100 batches, addBatch p50/p95 {run['add_batch_ms_p50_p95']} ms")  # fmt: skip
    spark = found["runs"]["parquet"]
    for sink in LONG_RUN_SINKS[1:]:
        ours = found["runs"][sink]
        found.setdefault("pss_end_ratio", {})[sink] = round(
            ours["pss_end_mib"]["total"] / spark["pss_end_mib"]["total"], 2
        )
        found.setdefault("trigger_p50_ratio", {})[sink] = round(
            spark["trigger_ms_p50_p95"][0] / max(ours["trigger_ms_p50_p95"][0], 1), 2
        )
    return found


def chart(found: dict[str, Any], path: Path) -> None:
    """PSS of each sink's process tree over its batches (total, and lakesink's by kind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for sink, run in found["runs"].items():
        xs = [p["batch"] for p in run["series"]]
        ax.plot(xs, [p["total"] for p in run["series"]], label=f"{sink}: whole tree")
        if sink != "parquet":
            for kind in ("jvm", "python_workers"):
                ax.plot(xs, [p[kind] for p in run["series"]], linestyle=":", label=f"{sink}: {kind}")
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("PSS (MiB)")
    ax.set_title(f"Process-tree PSS, {found['rows_per_batch']:,} rows a batch, {found['master']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--rows", type=int, default=2000, help="rows a micro-batch")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument(
        "--out", type=Path, default=Path("long-run.json"), help="JSON; the PNG goes beside it"
    )
    args = parser.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    with tempfile.TemporaryDirectory(prefix="lakesink-long-run-") as tmp:
        found = long_run_phase(
            Path(tmp), batches=args.batches, rows=args.rows, master=args.master, interval=args.interval
        )
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    chart(found, args.out.with_suffix(".png"))
    print(f"PSS at the end, lakesink/Spark: {found['pss_end_ratio']}; trigger p50, Spark/lakesink: "
          f"{found['trigger_p50_ratio']} -> {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
