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
#: ``--sinks`` may also name ``arrow-parquet``: Spark's parquet sink behind an identity
#: ``mapInArrow`` -- what Spark's Python workers alone cost a Python sink (the floor).
ALL_SINKS = (*LONG_RUN_SINKS, "arrow-parquet")
_KINDS = ("jvm", "python_workers", "other")


# The child: one query, started as a user starts it ---------------------------------------------


def child(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spec["master"]).appName(f"long-run-{spec['sink']}")
    for key, value in spec.get("conf", {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if spec["sink"] == "format":
        import lakesink

        lakesink.register(spark)
    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", spec["rows"]).load()
    df = df.selectExpr("value AS id", "timestamp AS ts", "CAST(value % 1000 AS STRING) AS label")
    if spec["sink"] == "arrow-parquet":
        df = df.mapInArrow(_identity, df.schema)
    if spec["sink"] == "batch":
        import lakesink

        query = lakesink.write_stream(
            df, spec["output"], checkpoint_location=spec["checkpoint"], via="foreach_batch"
        )
    else:
        fmt = {"format": "lakesink", "arrow-parquet": "parquet"}.get(spec["sink"], spec["sink"])
        query = (
            df.writeStream.format(fmt)
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
    # What the driver's Python loaded while the query ran (pandas: ~27 MiB when it is there).
    loaded = sys.modules.get("lakesink")
    driver = {
        "pandas": "pandas" in sys.modules,
        "modules": len(sys.modules),
        "lakesink": getattr(loaded, "__file__", None),
    }
    query.stop()
    stopping = time.monotonic()
    spark.stop()
    Path(spec["result"]).write_text(
        json.dumps(
            {
                "events": [events[b] for b in sorted(events)],
                "stop_seconds": time.monotonic() - stopping,
                "driver": driver,
            }
        )
    )
    return 0


def _identity(batches: Any) -> Any:
    """The ``arrow-parquet`` sink's ``mapInArrow``: every batch as it came."""
    yield from batches


# The parent: start the child, sample its tree's PSS ---------------------------------------------


def pss_and_kind(pid: int) -> tuple[int, str, str] | None:
    """PSS (bytes) of ``pid``, its kind (``jvm``, ``python_workers``, ``other``) and, for a
    Python worker, the module the daemon that forked it runs (``pyspark.worker`` for tasks,
    ``pyspark.sql.worker.python_streaming_sink_runner`` for a Python sink's commits...)."""
    got = memory_of(pid)
    return None if got is None else (got["pss"], got["kind"], got["module"])


def memory_of(pid: int) -> dict[str, Any] | None:
    """``pid``'s PSS, USS (its private pages), RSS (bytes), parent, kind and module (as
    :func:`pss_and_kind`)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            fields = {
                line.split(b":")[0]: int(line.split()[1]) * 1024
                for line in f
                if line.split(b":")[0] in (b"Rss", b"Pss", b"Private_Clean", b"Private_Dirty")
            }
        with open(f"/proc/{pid}/stat", "rb") as f:
            ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (OSError, IndexError, ValueError):
        return None  # ended meanwhile, or not ours to read
    if b"Pss" not in fields:
        return None
    args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    kind, module = "other", "driver python"
    if args and "java" in args[0]:
        kind, module = "jvm", "jvm"
    elif b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
        kind, module = "python_workers", args[-1]
    uss = fields.get(b"Private_Clean", 0) + fields.get(b"Private_Dirty", 0)
    return {"pid": pid, "ppid": ppid, "kind": kind, "module": module,
            "pss": fields[b"Pss"], "uss": uss, "rss": fields.get(b"Rss", 0)}  # fmt: skip


def sample_tree(root: int, interval: float, stop: threading.Event, samples: list[dict[str, Any]]) -> None:
    while not stop.is_set():
        began = time.monotonic()
        sums = dict.fromkeys(_KINDS, 0)
        by_module: dict[str, list[int]] = {}  # module: [processes, PSS]
        processes = []
        for pid in tree(root):
            got = memory_of(pid)
            if got is not None:
                processes.append(got)
                sums[got["kind"]] += got["pss"]
                entry = by_module.setdefault(got["module"], [0, 0])
                entry[0] += 1
                entry[1] += got["pss"]
        samples.append(
            {"t": began, "total": sum(sums.values()), "by_module": by_module, "processes": processes, **sums}
        )
        stop.wait(max(0.0, interval - (time.monotonic() - began)))


def run_sink(
    sink: str,
    work: Path,
    *,
    batches: int,
    rows: int,
    master: str,
    interval: float,
    conf: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One sink's long run in a child process; its samples and figures. ``env``: variables of
    the child's environment (an allocator's setting, say), Spark's workers inherit them."""
    folder = work / sink
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    spec = {
        "sink": sink, "master": master, "rows": rows, "batches": batches,
        "output": str(folder / "out"), "checkpoint": str(folder / "chk"),
        "marks": str(folder / "marks.jsonl"), "result": str(folder / "result.json"), "conf": conf or {},
    }  # fmt: skip
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    child_env = {key: value for key, value in os.environ.items() if key not in ("SPARK_HOME", "PYTHONPATH")}
    child_env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")  # a user's job, on loopback
    # The lakesink of the tree this script is in, for the driver and Spark's workers alike: an
    # installed lakesink may be another tree's (a shared venv's editable install).
    child_env["PYTHONPATH"] = os.pathsep.join((str(BENCH_DIR.parent), str(BENCH_DIR.parent / "reader")))
    child_env.update(env or {})
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    began = time.monotonic()
    with (folder / "log.txt").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path)],
            stdout=log, stderr=subprocess.STDOUT, env=child_env,
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
        # The last sample's processes, one by one: a daemon and the task workers it forked tell
        # apart by their parent (a worker's is its daemon).
        "processes_end": _processes(tail[-1]["processes"]) if tail else [],
        "driver": result.get("driver"),
        "series": series,
    }


def _processes(processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    mib = 1 << 20
    pids = {p["pid"]: p for p in processes}
    out = []
    for p in processes:
        role = p["module"]
        if p["kind"] == "python_workers":
            parent = pids.get(p["ppid"])
            role = "worker" if parent is not None and parent["kind"] == "python_workers" else "daemon"
            role = f"{role} ({p['module']})"
        out.append({"pid": p["pid"], "role": role, "pss_mib": round(p["pss"] / mib, 1),
                    "uss_mib": round(p["uss"] / mib, 1), "rss_mib": round(p["rss"] / mib, 1)})  # fmt: skip
    return sorted(out, key=lambda p: (p["role"], p["pid"]))


def long_run_phase(
    work: Path,
    *,
    batches: int,
    rows: int,
    master: str,
    interval: float,
    note: Any = print,
    sinks: tuple[str, ...] = LONG_RUN_SINKS,
    conf: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    turns: int = 1,
) -> dict[str, Any]:
    """Each of ``sinks`` in turn (``parquet`` first), ``turns`` times over, the sinks taking turns;
    the ratios of the others' medians to Spark's. ``conf``: Spark settings every sink's session
    gets; ``env``: variables of every sink's environment.

    Why turns: the JVM's share of a tree is a heap its collector grows as it pleases, and moved
    by 150+ MiB between two runs of the same sink (session 13), more than the difference being
    measured. Each sink's figures are therefore the run whose PSS at the end is the median of its
    turns (of an even count, the upper one); ``by_turn`` keeps every run's headline figures."""
    found: dict[str, Any] = {"batches": batches, "rows_per_batch": rows, "master": master, "turns": turns}
    found["runs"] = {}
    if conf:
        found["conf"] = conf
    if env:
        found["env"] = env
    every: dict[str, list[dict[str, Any]]] = {sink: [] for sink in sinks}
    for turn in range(turns):
        for sink in sinks:
            run = run_sink(
                sink, work / "long-run", batches=batches, rows=rows, master=master, interval=interval,
                conf=conf, env=env,
            )  # fmt: skip
            run["turn"] = turn
            every[sink].append(run)
            note(f"{sink}{f' (turn {turn + 1} of {turns})' if turns > 1 else ''}: PSS at the end "
                 f"{run['pss_end_mib']['total']:.0f} MiB (JVM {run['pss_end_mib']['jvm']:.0f}, peak "
                 f"{run['pss_peak_mib']:.0f}), growth {run['pss_growth_mib_per_100_batches']} "
                 f"MiB/100 batches, addBatch p50/p95 {run['add_batch_ms_p50_p95']} ms")  # fmt: skip
    found["by_turn"] = {sink: [_headline(run) for run in runs] for sink, runs in every.items()}
    for sink, runs in every.items():
        ranked = sorted(runs, key=lambda r: r["pss_end_mib"]["total"])
        found["runs"][sink] = ranked[len(ranked) // 2]
    spark = found["runs"].get("parquet")
    floor = found["runs"].get("arrow-parquet")
    for sink in [s for s in sinks if s != "parquet" and spark is not None]:
        ours = found["runs"][sink]
        found.setdefault("pss_end_ratio", {})[sink] = round(
            ours["pss_end_mib"]["total"] / spark["pss_end_mib"]["total"], 2
        )
        found.setdefault("trigger_p50_ratio", {})[sink] = round(
            spark["trigger_ms_p50_p95"][0] / max(ours["trigger_ms_p50_p95"][0], 1), 2
        )
        if floor is not None and sink != "arrow-parquet":
            # What a sink holds over the floor of any Python step: Spark's sink behind mapInArrow.
            found.setdefault("pss_end_ratio_to_floor", {})[sink] = round(
                ours["pss_end_mib"]["total"] / floor["pss_end_mib"]["total"], 2
            )
    return found


def _headline(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures a turn's line needs (its series stays with the median run only)."""
    keys = ("pss_end_mib", "pss_peak_mib", "pss_growth_mib_per_100_batches", "trigger_ms_p50_p95", "seconds")
    return {key: run[key] for key in keys}


def chart(found: dict[str, Any], path: Path) -> None:
    """PSS of each sink's process tree over its batches (total, and lakesink's by kind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for sink, run in found["runs"].items():
        xs = [p["batch"] for p in run["series"]]
        ax.plot(xs, [p["total"] for p in run["series"]], label=f"{sink}: whole tree")
        if sink not in ("parquet", "arrow-parquet"):  # lakesink's own, by kind
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
        "--sinks", default=",".join(LONG_RUN_SINKS), help=f"comma-separated, of {', '.join(ALL_SINKS)}"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of every sink's session",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable of every sink's environment (MIMALLOC_ARENA_EAGER_COMMIT=0, say)",
    )
    parser.add_argument("--turns", type=int, default=1, help="runs of each sink, the sinks taking turns")
    parser.add_argument(
        "--out", type=Path, default=Path("long-run.json"), help="JSON; the PNG goes beside it"
    )
    args = parser.parse_args(argv)
    if args.child is not None:
        return child(args.child)
    sinks = tuple(s.strip() for s in args.sinks.split(",") if s.strip())
    unknown = sorted(set(sinks) - set(ALL_SINKS))
    if unknown:
        parser.error(f"unknown sink(s) {unknown}: the sinks are {list(ALL_SINKS)}")
    if args.turns < 1:
        parser.error(f"--turns must be at least 1, not {args.turns}")
    conf = dict(item.split("=", 1) for item in args.conf)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="lakesink-long-run-") as tmp:
        found = long_run_phase(
            Path(tmp), batches=args.batches, rows=args.rows, master=args.master, interval=args.interval,
            sinks=sinks, conf=conf, env=env, turns=args.turns,
        )  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    chart(found, args.out.with_suffix(".png"))
    print(f"PSS at the end, lakesink/Spark: {found.get('pss_end_ratio')}, over the floor: "
          f"{found.get('pss_end_ratio_to_floor')}; trigger p50, Spark/lakesink: "
          f"{found.get('trigger_p50_ratio')} -> {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
