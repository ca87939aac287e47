"""``make bench``: lakesink's writers against Spark's own parquet sink, and its reader against pyarrow.

One deterministic input stream (Parquet files read with the ``readStream`` file source,
``maxFilesPerTrigger=4``, ``trigger(availableNow=True)``, Spark ``local[2]``; 20M rows, as in
the baseline the performance target was set with), in phases, each with a progress line:

1. stream:  every sink and entry point over the stream, each run in a fresh JVM, with the
            ratio to Spark's ``format("parquet")`` measured in the same run (throughput.py):
            bench children (``parquet``, the baseline; ``epoch``, ``epoch-source``, ``format``,
            ``epoch-s3``, ``epoch-stock``, ``foreach``); the peer ``delta-peer``, the Delta
            table a PySpark 4.3 user would build instead (deltalake's append in
            ``foreachBatch``: delta_peer.py), which lakesink's entry points are compared with
            too; the job launched as a user does,
            launch to exit (``submit``, ``submit-source`` with ``--via data_source``,
            ``python``), each against the job's twin with Spark's sink launched the same way
            (``submit-parquet``, ``python-parquet``: parquet_job.py); and Spark Connect
            clients through one server on 127.0.0.1 (``connect``, against ``connect-parquet``:
            connect_runs.py). ``--sinks`` picks runs by these names;
2. small:   1-file epochs of 5,000 rows: p50/p95 latency and commit time per epoch (commit_latency.py);
3. wide:    an epoch of 1,000 files into moto behind 50 ms a request, next to a 1-file epoch;
4. profile: where the foreach writer's time goes (profile_writer.py);
5. reader:  ``read_committed`` vs ``pyarrow.dataset``, and opening tables of 10,000 files / epochs;
6. memory:  one writer, ONE partition of 1M and of 10M rows;
7. hdfs:    ``format("lakesink")`` against Spark's ``format("parquet")``, both into one
            MiniDFSCluster on 127.0.0.1 with their checkpoints there too, taking turns
            (``--sinks`` names it ``hdfs``; ``make hdfs-jars`` builds the cluster, else it is skipped;
            with two DataNodes (replication 2), then one (``--hdfs-datanodes 2,1``, the default));
8. log scale: a synthetic format-3 lake of 100,000 commits and 1M live files: ``Lake(...)``'s
            open, a writer's first commit, the checkpoint, per-commit latency
            (log_scale.py; ~1.5 min, 30 s of it on moto S3; ``--skip-log-scale`` leaves it out);
9. long run: 600 micro-batches of 2,000 rows (``rate-micro-batch``) from a plain session into
            Spark's sink, the floor of any Python step (Spark's sink behind an identity
            ``mapInArrow``), ``write_stream(via="foreach_batch")`` and ``format("lakesink")``,
            taking turns (``--long-run-turns``, 3): the process tree's PSS over the run, by worker
            module, and each batch's latency (long_run.py; ~26 min; a PNG of its own;
            ``--skip-long-run`` leaves it out).

It prints the tables (text, then Markdown for the guide's Performance) and writes ``bench-results.json`` and a
PNG beside it. Runs that fail are reported and the others go on; the exit status is then 1.

    .venv/bin/python bench/run.py                                       # the full run (~55 min, 2 cores)
    .venv/bin/python bench/run.py --rows 2000000 --repeats 1 --skip-s3   # a quick one
    .venv/bin/python bench/run.py --sinks parquet,epoch --skip-small --skip-wide --skip-profile \\
        --spark-conf spark.sql.execution.arrow.maxBytesPerBatch=67108864   # Spark's default byte cap
    .venv/bin/python bench/run.py --sinks '' --skip-small --skip-wide --skip-profile --skip-reader \\
        --skip-memory                                                   # the log-scale phase alone

bench/ is a folder of scripts, not a package; each module says in its first line what it owns:
inputs (the stream), child (one run in a fresh JVM), delta_peer (the peer's sink and its count),
launch (starting runs, checking their output), parquet_job (the job with Spark's sink),
connect_runs (the Connect server and its clients), procmem (CPU and RSS from /proc),
commit_times (the commit observer), stores (moto and the delaying proxy), throughput,
commit_latency, profile_writer, readers, log_scale (the phases), figures (medians, spreads,
percentiles), report (tables) and charts (the PNG).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
# bench/ is a folder of scripts: its modules import each other by name. devtools/ is not
# installed: it is imported from the checkout.
sys.path[1:1] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

import charts  # noqa: E402 - after the path set-up above
import commit_latency  # noqa: E402
import connect_runs  # noqa: E402
import log_scale  # noqa: E402
import long_run  # noqa: E402
import readers  # noqa: E402
import report  # noqa: E402
import source  # noqa: E402
import stores  # noqa: E402
import throughput  # noqa: E402
from inputs import ROWS_PER_FILE, ensure_input, link_subset  # noqa: E402
from launch import RunFailed, bench_env, run_profile  # noqa: E402


class Progress:
    """One line per phase, and one per step inside it, with the time since the bench started."""

    def __init__(self, phases: list[str]) -> None:
        self.phases = phases
        self.started = time.monotonic()

    def _clock(self) -> str:
        seconds = int(time.monotonic() - self.started)
        return f"[{seconds // 60:3d}m{seconds % 60:02d}s]"

    def phase(self, name: str, what: str) -> None:
        print(
            f"{self._clock()} phase {self.phases.index(name) + 1}/{len(self.phases)}: {name} -- {what}",
            flush=True,
        )

    def note(self, text: str) -> None:
        print(f"{self._clock()}     {text}", flush=True)


def plan(args: argparse.Namespace) -> list[str]:
    """The phases this run has, in order."""
    wanted = {
        "stream": bool(sinks(args)),
        "small": not args.skip_small and args.small_epochs > 1,
        "wide": not args.skip_wide and not args.skip_s3 and args.wide_files > 0,
        "profile": not args.skip_profile and args.profile_rows > 0,
        "source": not args.skip_source and {"epoch", "parquet"} <= set(sinks(args)),
        "reader": not args.skip_reader,
        "memory": not args.skip_memory and bool(args.memory_rows),
        "hdfs": "hdfs" in args.sinks.split(","),
        "log-scale": not args.skip_log_scale,
        "long-run": not args.skip_long_run and args.long_run_batches > 0,
    }
    return [name for name, on in wanted.items() if on]


def run(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Every planned phase, in order; their figures go into ``results``."""
    phases = plan(args)
    progress = Progress(phases)
    base = (
        Path(args.workdir) if args.workdir else Path(tempfile.gettempdir()) / f"lakesink-bench-{os.getuid()}"
    )
    work = base / f"run-{os.getpid()}"
    work.mkdir(parents=True)
    results["workdir"] = str(work)
    memory_rows = [int(r) for r in args.memory_rows.split(",") if r] if "memory" in phases else []
    files: list[Path] = []
    stream_input = work / "input-stream"
    if "stream" in phases or "memory" in phases or "hdfs" in phases:
        total_rows = max([args.rows, *memory_rows])
        print(f"input: {total_rows:,} rows in {base / 'input'} (generated once, then reused)", flush=True)
        files = ensure_input(base / "input", total_rows, args.rows_per_file)
        link_subset(files, args.rows, args.rows_per_file, stream_input)
    stream = throughput.Stream(
        input=stream_input,
        work=work,
        rows=args.rows,
        master=args.master,
        files_per_trigger=args.max_files_per_trigger,
        spark_conf=spark_conf(args),
        write_options=json.loads(args.write_options or "{}"),
        rss_interval=args.rss_interval,
    )
    failures: dict[str, str] = {}
    if "stream" in phases:
        progress.phase("stream", f"{args.rows:,} rows through {args.sinks}, {args.repeats} turn(s)")
        found = throughput.stream_phase(stream, sinks(args), args.repeats, progress.note)
        failures.update(found.pop("failures"))
        results.update(found)
    if "small" in phases:
        small = commit_latency.small_input(base, args.small_rows, args.small_epochs)
        rows = args.small_rows * args.small_epochs
        progress.phase("small", f"{args.small_epochs} epochs of one {args.small_rows:,}-row file")
        found = commit_latency.small_epochs_phase(
            dataclasses.replace(stream, input=small, rows=rows),
            not args.skip_s3,
            progress.note,
            args.small_turns,
        )
        failures.update({f"small-{k}": v for k, v in found.pop("failures").items()})
        results["small_epochs"] = found
    if "wide" in phases:
        progress.phase(
            "wide",
            f"an epoch of {args.wide_files:,} files into moto, {args.wide_delay * 1000:.0f} ms/request",
        )
        wide = dataclasses.replace(
            stream,
            input=commit_latency.wide_input(base, args.small_rows),
            rows=args.small_rows,
            master=args.wide_master,
        )
        found = commit_latency.wide_epochs_phase(wide, args.wide_files, args.wide_delay, progress.note)
        failures.update(found.pop("failures"))
        results["wide_epochs"] = found
    if "profile" in phases:
        progress.phase(
            "profile", f"the foreach writer under cProfile, one partition of {args.profile_rows:,} rows"
        )
        try:
            results["foreach_profile"] = run_profile(args.profile_rows, work, bench_env(), args.rss_interval)
        except RunFailed as exc:
            failures["profile"] = str(exc)
    if "source" in phases and (work / "out" / "epoch").exists() and (work / "out" / "parquet").exists():
        progress.phase("source", "readStream.format('lakesink') vs readStream.parquet, into noop")
        found = source.source_phase(
            work / "out" / "epoch", work / "out" / "parquet", args.rows, args.repeats, work, progress.note
        )
        failures.update(found.pop("failures"))
        results["source"] = found
    committed = next((work / "out" / s for s in ("epoch", "foreach") if (work / "out" / s).exists()), None)
    if "reader" in phases and committed is not None:
        progress.phase("reader", f"read_committed vs pyarrow.dataset over {committed.name}'s table")
        results["reader"] = readers.bench_reader(str(committed), args.reader_repeats)
        for key, kind, count, build in (
            ("open_many_files", "files", args.reader_files, readers.build_many_files),
            ("open_many_epochs", "epochs", args.reader_epochs, readers.build_many_epochs),
        ):
            progress.note(f"opening a table of {count:,} {kind} (built once and kept)")
            results[key] = readers.time_open(
                str(readers.cached_table(base, kind, count, build)), args.reader_repeats
            )
    if "memory" in phases:
        progress.phase("memory", f"{args.memory_sinks}: one partition of {args.memory_rows} rows")
        writers = [throughput.SINK_OF[s] for s in args.memory_sinks.split(",") if s]
        found = throughput.memory_phase(
            stream, files, args.rows_per_file, writers, memory_rows, progress.note
        )
        failures.update(found.pop("failures", {}))
        results["memory_one_partition"] = found
    for i, datanodes in enumerate(args.hdfs_datanodes if "hdfs" in phases else []):
        progress.phase(
            "hdfs",
            f"{args.rows:,} rows, format('lakesink') vs format('parquet') on one MiniDFSCluster of "
            f"{datanodes} DataNode(s)",
        )
        found = throughput.hdfs_phase(
            stream,
            args.repeats,
            progress.note,
            datanodes=datanodes,
            runs_of=tuple(args.hdfs_runs.split(",")),
        )
        more = "" if i == 0 else f"-{datanodes}dn"
        failures.update({f"{k}{more}": v for k, v in found.pop("failures").items()})
        if i == 0:
            results["hdfs"] = found
        else:  # the first count's phase stays "hdfs" (the smoke tests, older result files)
            results.setdefault("hdfs_more", []).append(found)
    if "log-scale" in phases:
        progress.phase(
            "log-scale",
            f"a format-3 log of {args.log_scale_commits:,} commits, "
            f"{args.log_scale_commits * args.log_scale_files_per_commit:,} live files",
        )
        found = log_scale.log_scale_phase(
            work,
            commits=args.log_scale_commits,
            files_per_commit=args.log_scale_files_per_commit,
            interval=args.log_scale_interval,
            repeats=args.log_scale_repeats,
            latency_commits=args.log_scale_latency_commits,
            with_s3=not args.skip_s3,
            note=progress.note,
        )
        failures.update(found.pop("failures"))
        results["log_scale"] = found
    if "long-run" in phases:
        progress.phase(
            "long-run", f"{args.long_run_batches} micro-batches of 2,000 rows: the process tree's PSS"
        )
        try:
            results["long_run"] = long_run.long_run_phase(
                work, batches=args.long_run_batches, rows=2_000, master=args.master, interval=1.0,
                note=progress.note, sinks=tuple(filter(None, args.long_run_sinks.split(","))),
                turns=args.long_run_turns,
            )  # fmt: skip
        except RuntimeError as exc:
            failures["long-run"] = str(exc)
    results["failures"] = failures
    results["moto_pids"] = stores.MOTO_PIDS
    results["connect_pids"] = connect_runs.SERVER_PIDS
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        del results["workdir"]


def sinks(args: argparse.Namespace) -> list[str]:
    chosen = [s for s in args.sinks.split(",") if s]
    unknown = set(chosen) - set(throughput.RUNS)
    if unknown:
        raise SystemExit(f"unknown sink(s) {sorted(unknown)}; choose from {list(throughput.RUNS)}")
    # "hdfs" is a phase of its own (two runs on one MiniDFSCluster), not a run of the stream.
    return [s for s in chosen if not (args.skip_s3 and s == "epoch-s3") and s != "hdfs"]


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """The bench's Spark settings for every run in a bench session (a plain session gets none)."""
    conf = {"spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch_rows)}
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    for setting in args.spark_conf:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--spark-conf wants KEY=VALUE, got {setting!r}")
        conf[key] = value
    return conf


def describe(args: argparse.Namespace) -> dict[str, Any]:
    """When, where and how: the date, the machine, the command and every parameter."""
    import pyarrow
    import pyspark

    import lakesink

    with open("/proc/meminfo") as f:
        memory = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    with open("/proc/cpuinfo") as f:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
            platform.processor(),
        )
    write_options = dataclasses.asdict(lakesink.WriteOptions(**json.loads(args.write_options or "{}")))
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([os.path.relpath(sys.executable), *sys.argv]),
        "machine": {
            "cores": os.cpu_count(),
            "memory_gib": round(memory / (1 << 30), 1),
            "cpu": cpu,
            "os": platform.platform(),
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "pyarrow": pyarrow.__version__,
            "lakesink": lakesink.__version__,
            "load_average_at_start": os.getloadavg(),
        },
        "parameters": {
            "rows": args.rows,
            "rows_per_input_file": args.rows_per_file,
            "max_files_per_trigger": args.max_files_per_trigger,
            "master": args.master,
            "arrow_max_records_per_batch": args.arrow_batch_rows,
            "repeats": args.repeats,
            "spark_conf": spark_conf(args),
            "write_options": write_options,
            "trigger": "availableNow",
            "small_rows": args.small_rows,
            "small_epochs": args.small_epochs,
            "small_turns": args.small_turns,
            "wide_files": args.wide_files,
            "wide_delay_seconds": args.wide_delay,
            "wide_master": args.wide_master,
            "profile_rows": args.profile_rows,
        },
        "sinks": {},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--rows", type=int, default=20_000_000, help="rows in the main stream (default 20M)")
    add("--repeats", type=int, default=3, help=f"turns of {throughput.REPEATED}; the median counts")
    add("--sinks", default=",".join(throughput.RUNS), help=f"comma-separated, from {list(throughput.RUNS)}")
    add(
        "--skip-s3",
        action="store_true",
        help="no moto server: no epoch-s3, no S3 small epochs, no wide epochs, no log-scale S3 latency",
    )
    add(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for every bench session (repeatable)",
    )
    add("--rows-per-file", type=int, default=ROWS_PER_FILE, help="rows per input file")
    add("--max-files-per-trigger", type=int, default=4)
    add("--master", default="local[2]")
    add("--arrow-batch-rows", type=int, default=10_000, help="spark.sql.execution.arrow.maxRecordsPerBatch")
    add(
        "--write-options",
        default=None,
        help='JSON of lakesink.WriteOptions fields, e.g. \'{"compression": "snappy"}\'',
    )
    add("--driver-memory", default=None, help="spark.driver.memory (Spark's default: 1g)")
    add("--small-epochs", type=int, default=40, help="1-file epochs in the small-epoch runs")
    add("--small-rows", type=int, default=5_000, help="rows per small (and wide) epoch")
    add("--small-turns", type=int, default=3, help="runs of each small-epoch sink, taking turns")
    add("--skip-small", action="store_true")
    add("--wide-files", type=int, default=1_000, help="files in the wide epoch")
    add("--wide-delay", type=float, default=0.05, help="seconds the proxy adds to every S3 request")
    add("--wide-master", default="local[8]", help="the wide runs' master: their tasks wait on the network")
    add("--skip-wide", action="store_true")
    add("--profile-rows", type=int, default=500_000, help="rows of the profiled foreach partition")
    add("--skip-profile", action="store_true")
    add("--memory-rows", default="1000000,10000000", help="one-partition runs, comma-separated")
    add("--memory-sinks", default="epoch,foreach", help="writers of the one-partition runs")
    add("--skip-memory", action="store_true")
    add("--skip-reader", action="store_true")
    add(
        "--skip-source",
        action="store_true",
        help="no readStream.format('lakesink') vs readStream.parquet phase",
    )
    add("--reader-files", type=int, default=10_000)
    add("--reader-epochs", type=int, default=10_000)
    add("--reader-repeats", type=int, default=7)
    add("--skip-log-scale", action="store_true", help="no format-3 log-scale phase")
    add("--log-scale-commits", type=int, default=100_000, help="commits of the synthetic format-3 lake")
    add("--log-scale-files-per-commit", type=int, default=10, help="files each of its commits adds")
    add("--log-scale-interval", type=int, default=100, help="its checkpoint interval")
    add("--log-scale-repeats", type=int, default=5, help="fresh processes opening it (the median counts)")
    add("--log-scale-latency-commits", type=int, default=200, help="commits in a row per latency series")
    add("--skip-long-run", action="store_true", help="no long-run (PSS over many micro-batches) phase")
    add("--long-run-batches", type=int, default=600, help="micro-batches of the long-run phase")
    add("--long-run-turns", type=int, default=3, help="runs of each long-run sink, taking turns")
    add(
        "--long-run-sinks",
        default="parquet,arrow-parquet,batch,format",
        help=f"the long run's sinks, of {', '.join(long_run.ALL_SINKS)}",
    )
    add(
        "--hdfs-datanodes",
        default="2,1",
        help=(
            "DataNodes of the hdfs phase's MiniDFSCluster, and its dfs.replication, comma-separated: the "
            "phase runs once per count, each on a cluster of its own (default 2,1: with 2, closes behave "
            "as on a real cluster's replication 3; with 1, most closes wait 0.5 s: guide, Storage)"
        ),
    )
    add(
        "--hdfs-runs",
        default=",".join(throughput.HDFS_RUNS),
        help=(
            "runs of the hdfs phase, parquet first: parquet, format (the data source door), epoch "
            "(write_stream(via='auto'), the foreachBatch door)"
        ),
    )
    add("--rss-interval", type=float, default=0.2, help="seconds between RSS samples")
    add("--workdir", default=None, help="input cache and scratch (default: $TMPDIR/lakesink-bench-UID)")
    add("--keep", action="store_true", help="keep this run's outputs and logs")
    add("--out", default="bench-results.json", help="the JSON results; the PNG goes beside it")
    args = p.parse_args(argv)
    if args.rows < 1 or args.repeats < 1:
        p.error("--rows and --repeats must be >= 1")
    if not args.skip_log_scale and args.log_scale_commits < 3 * args.log_scale_interval:
        p.error("--log-scale-commits must be at least 3 times --log-scale-interval")
    if min(args.log_scale_files_per_commit, args.log_scale_repeats, args.log_scale_latency_commits) < 1:
        p.error(
            "--log-scale-files-per-commit, --log-scale-repeats and --log-scale-latency-commits must be >= 1"
        )
    try:
        args.hdfs_datanodes = [int(n) for n in args.hdfs_datanodes.split(",")]
    except ValueError:
        p.error(f"--hdfs-datanodes takes counts like 2 or 2,1, not {args.hdfs_datanodes!r}")
    if not args.hdfs_datanodes or min(args.hdfs_datanodes) < 1:
        p.error("--hdfs-datanodes counts must be >= 1")
    hdfs_runs = args.hdfs_runs.split(",")
    if hdfs_runs[:1] != ["parquet"] or not set(hdfs_runs) <= set(throughput.HDFS_RUNS):
        p.error(f"--hdfs-runs starts with parquet and takes runs from {list(throughput.HDFS_RUNS)}")
    if not set(filter(None, args.long_run_sinks.split(","))) <= set(long_run.ALL_SINKS):
        p.error(f"--long-run-sinks takes sinks from {list(long_run.ALL_SINKS)}")
    if args.long_run_turns < 1:
        p.error(f"--long-run-turns must be at least 1, not {args.long_run_turns}")
    if not set(filter(None, args.memory_sinks.split(","))) <= set(throughput.SINK_OF):
        p.error(f"--memory-sinks takes sinks from {list(throughput.SINK_OF)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from devtools.spark import prepare_environment

    prepare_environment()  # children and their Python workers run this interpreter
    results = describe(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        run(args, results)
    except BaseException:
        # An hour of phases is not thrown away for a crash in the next one: what ran is written.
        results.setdefault("failures", {})["bench"] = "crashed: see the traceback"
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote what ran to {out}", file=sys.stderr)
        raise
    out.write_text(json.dumps(results, indent=2) + "\n")
    picture = charts.draw(results, out.with_suffix(".png"))
    if "long_run" in results:
        long_run.chart(results["long_run"], out.with_name(out.stem + "-long-run.png"))
    print()
    print(report.render_text(results))
    print("\nMarkdown (docs/guide/performance.md):\n")
    print(report.render_markdown(results))
    print(
        f"wrote {out}"
        + (f" and {picture}" if picture else " (no PNG: pip install matplotlib, the bench extra)")
    )
    if results["failures"]:
        print(f"FAILED: {', '.join(results['failures'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
