"""``make bench``: lakesink's writers against Spark's own parquet sink, and its reader against pyarrow.

One run, one deterministic input stream (Parquet files read with the ``readStream`` file source,
``maxFilesPerTrigger=4``, ``trigger(availableNow=True)``, Spark ``local[2]``; 20M rows, as in
the baseline the performance issue was measured with) through:

    parquet      Spark's built-in ``writeStream.format("parquet")`` (the baseline, "a")
    epoch        the epoch / Arrow path, ``lakesink.write_stream``, local disk ("c")
    epoch-stock  the same with Spark's stock Python worker setup: workers compile pyspark.zip
                 instead of importing the installed pyspark (see lakesink/localspark.py)
    foreach      ``LakeForeachWriter`` (row-at-a-time foreach, "b")
    epoch-s3     the epoch path into a moto S3 server on 127.0.0.1 that this script starts and stops

parquet and epoch run ``--repeats`` times (3), taking turns, and count by their median run.
Each run is a child process (a fresh JVM), so its peak RSS -- sampled from /proc over the
child's whole process tree: driver Python, JVM, Python workers -- is its own. Rates are given
over the whole query and after the first epoch (the steady state, once workers are started).
Then the reader side: ``read_committed`` vs ``pyarrow.dataset`` over the same committed files,
and the time to open a table of N files and one of N epochs. Then memory: one writer, ONE
partition of 1M and of 10M rows. Prints a table and writes ``bench-results.json``.

    .venv/bin/python bench/run.py                    # the full run
    .venv/bin/python bench/run.py --rows 2000000 --repeats 1 --skip-s3 --memory-rows 1000000,2000000
    .venv/bin/python bench/run.py --sinks parquet,epoch \\
        --spark-conf spark.sql.execution.arrow.maxBytesPerBatch=67108864   # Spark's default cap
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from procmem import TreeSampler, tree_cpu_seconds  # noqa: E402 - bench/ is a folder of scripts, not a package

SINKS = ("parquet", "epoch", "epoch-stock", "foreach", "epoch-s3")
#: Rows per generated input file: 4 files (one trigger) make an epoch of 1M rows at the default.
ROWS_PER_FILE = 250_000
BUCKET = "lakesink-bench"
STORAGE_OPTIONS_ENV = "LAKESINK_BENCH_STORAGE_OPTIONS"
SEED = 20240611


# Input ----------------------------------------------------------------------------------------


def input_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.int64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("label", pa.string()),
            ("amount", pa.float64()),
        ]
    )


def make_chunk(start: int, rows: int) -> Any:
    """Rows ``start .. start+rows-1`` of the stream: the same bytes on every run and machine.

    ``label`` is a unique 20-character string (like ``jobs/stream_to_lake.py``'s rate source),
    so dictionary encoding cannot cheat; ``amount`` is a seeded random double.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = np.arange(start, start + rows, dtype=np.int64)
    ts = pa.array(1_700_000_000_000_000 + ids * 1_000, type=pa.timestamp("us", tz="UTC"))
    digits = pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), width=14, padding="0")
    label = pc.binary_join_element_wise(pa.scalar("event-"), digits, "")
    amount = np.random.default_rng(SEED + start).random(rows) * 1000.0
    return pa.table([pa.array(ids), ts, label, pa.array(amount)], schema=input_schema())


def ensure_input(folder: Path, rows: int, rows_per_file: int) -> list[Path]:
    """Generate the input files once (kept between runs: same parameters, same bytes)."""
    import pyarrow.parquet as pq

    marker = folder / f"_complete-{rows}-{rows_per_file}"
    files = [folder / f"in-{i:05d}.parquet" for i in range((rows + rows_per_file - 1) // rows_per_file)]
    if marker.exists():
        return files
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i, path in enumerate(files):
        start = i * rows_per_file
        pq.write_table(make_chunk(start, min(rows_per_file, rows - start)), path, compression="snappy")
    marker.touch()
    return files


def link_subset(files: list[Path], rows: int, rows_per_file: int, folder: Path) -> Path:
    """A folder holding (hard links to) the first files that make up ``rows`` rows."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for path in files[: (rows + rows_per_file - 1) // rows_per_file]:
        os.link(path, folder / path.name)
    return folder


# Child: one sink in a fresh JVM ---------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """Run one sink over the input and write its timing to ``args.result``."""
    import pyarrow.parquet as pq

    from lakesink.localspark import local_session

    conf = {
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(args.arrow_batch_rows),
        # Rows are counted from the query's progress reports: keep all of them, not the last 100.
        "spark.sql.streaming.numRecentProgressUpdates": "1000000",
    }
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    conf.update(spark_conf(args.spark_conf))
    if args.one_partition:
        # One task reads all of an epoch's files: a Parquet split never exceeds this.
        conf["spark.sql.files.maxPartitionBytes"] = str(8 << 30)
    started = time.monotonic()
    spark = local_session(f"lakesink-bench-{args.sink}", master=args.master, **conf)
    schema = pq.read_schema(next(Path(args.input).glob("*.parquet")))
    from pyspark.sql.pandas.types import from_arrow_schema

    df = (
        spark.readStream.schema(from_arrow_schema(schema))
        .option("maxFilesPerTrigger", args.max_files_per_trigger)
        .parquet(args.input)
    )
    if args.one_partition:
        df = df.coalesce(1)
    jvm_ready = time.monotonic()
    cpu_ready = tree_cpu_seconds(os.getpid())
    query = start_sink(df, args)
    query.awaitTermination()
    finished = time.monotonic()
    cpu_done = tree_cpu_seconds(os.getpid())
    cpu_used = {kind: cpu_done[kind] - cpu_ready[kind] for kind in cpu_done}
    if query.exception() is not None:
        raise SystemExit(f"{args.sink}: the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    # After the first epoch: the rate once every worker, daemon and JIT-compiled path is warm.
    steady = progress[1:]
    steady_seconds = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    result = {
        "sink": args.sink,
        "rows": sum(p["numInputRows"] for p in progress),
        "epochs": len(progress),
        "first_epoch_seconds": progress[0]["durationMs"]["triggerExecution"] / 1000 if progress else None,
        "steady_rows_per_second": (
            sum(p["numInputRows"] for p in steady) / steady_seconds if steady_seconds else None
        ),
        "query_seconds": finished - jvm_ready,
        "query_cpu_seconds": cpu_used["total"],
        "query_cpu_seconds_jvm": cpu_used["jvm"],
        "query_cpu_seconds_python_workers": cpu_used["python_workers"],
        "query_cpu_seconds_driver_python": cpu_used["other"],
        "child_seconds": finished - started,
    }
    spark.stop()
    Path(args.result).write_text(json.dumps(result))


def start_sink(df: Any, args: argparse.Namespace) -> Any:
    chk, out = args.checkpoint, args.output
    raw_options = os.environ.get(STORAGE_OPTIONS_ENV)
    options = json.loads(raw_options) if raw_options else None
    write_options = json.loads(args.write_options) if args.write_options else {}
    if args.sink == "parquet":
        writer = df.writeStream.format("parquet").option("path", out)
        return writer.option("checkpointLocation", chk).trigger(availableNow=True).start()
    if args.sink == "foreach":
        from lakesink import LakeForeachWriter, WriteOptions

        sink = LakeForeachWriter(
            out, schema=df.schema, storage_options=options, write_options=WriteOptions(**write_options)
        )
        writer = df.writeStream.foreach(sink).option("checkpointLocation", chk)
        return writer.trigger(availableNow=True).start()
    import lakesink

    return lakesink.write_stream(
        df,
        out,
        checkpoint_location=chk,
        storage_options=options,
        trigger={"availableNow": True},
        **write_options,
    )


# Parent ---------------------------------------------------------------------------------------


def run_sink(
    sink: str,
    input_dir: Path,
    work: Path,
    args: argparse.Namespace,
    *,
    output: str | None = None,
    storage_options: dict[str, Any] | None = None,
    one_partition: bool = False,
    stock_spark_home: bool = False,
    tag: str = "",
) -> dict[str, Any]:
    """Run ``sink`` in a child process; its timing plus the peak RSS of its process tree."""
    name = f"{sink}{tag}"
    out = output or str(work / "out" / name)
    result = work / f"result-{name}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        sink,
        "--input",
        str(input_dir),
        "--output",
        out,
        "--checkpoint",
        str(work / "chk" / name),
        "--result",
        str(result),
        "--master",
        args.master,
        "--max-files-per-trigger",
        str(args.max_files_per_trigger if not one_partition else 1 << 20),
        "--arrow-batch-rows",
        str(args.arrow_batch_rows),
        "--write-options",
        args.write_options or "{}",
    ]
    if args.driver_memory:
        cmd += ["--driver-memory", args.driver_memory]
    for setting in args.spark_conf:
        cmd += ["--spark-conf", setting]
    env = dict(os.environ)
    if storage_options:
        # Storage options may hold credentials: through the environment, not the command line (ps).
        env[STORAGE_OPTIONS_ENV] = json.dumps(storage_options)
    if stock_spark_home:
        # Spark's own Python worker setup: workers compile pyspark.zip (lakesink.localspark).
        from lakesink.localspark import installed_spark_home

        env["SPARK_HOME"] = str(installed_spark_home())
    if one_partition:
        cmd.append("--one-partition")
    log = work / f"log-{name}.txt"
    print(f"  running {name} ...", end="", flush=True)
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        try:
            with TreeSampler(proc.pid, args.rss_interval) as sampler:
                code = proc.wait()
        except BaseException:
            proc.kill()  # by PID: our own child; its JVM exits with it (py4j gateway closes)
            proc.wait()
            raise
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"sink {name} failed (exit {code}); end of {log}:\n{tail}")
    figures = json.loads(result.read_text())
    figures.update(sampler.peak.to_dict())
    figures["rows_per_second"] = figures["rows"] / figures["query_seconds"]
    figures["rows_per_cpu_second"] = figures["rows"] / figures["query_cpu_seconds"]
    print(
        f" {figures['rows_per_second']:,.0f} rows/s, {figures['query_seconds']:.1f} s, "
        f"{figures['rows_per_cpu_second']:,.0f} rows/cpu-s"
    )
    return figures


def output_bytes_local(root: str) -> tuple[int, int]:
    """(bytes, files) of the visible Parquet files under ``root`` (what plain readers see)."""
    total = files = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in names:
            if name.endswith(".parquet") and not name.startswith(("_", ".")):
                total += os.path.getsize(os.path.join(folder, name))
                files += 1
    return total, files


def output_bytes_s3(endpoint: str, bucket: str, prefix: str) -> tuple[int, int]:
    from lakesink.devserver import dev_client

    client = dev_client(endpoint)
    total = files = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            base = obj["Key"].rsplit("/", 1)[-1]
            rel = obj["Key"][len(prefix) :]
            if base.endswith(".parquet") and not base.startswith((".", "_")) and not rel.startswith("_"):
                total += obj["Size"]
                files += 1
    return total, files


def count_rows(sink: str, out: str, storage_options: dict[str, Any] | None) -> int:
    """Rows a reader sees in the sink's output (a check that the run wrote everything once)."""
    if sink == "parquet":
        import pyarrow.dataset as ds

        return int(ds.dataset(out, format="parquet").count_rows())
    from reader import Lake

    return int(Lake(out, storage_options).dataset().count_rows())


def bench_reader(root: str, repeats: int) -> dict[str, Any]:
    """``read_committed`` vs ``pyarrow.dataset(root).to_table()`` over the same committed files.

    One untimed read each first (the files are then in the page cache, so both measure the
    reading, not the disk); then ``repeats`` timed rounds, the order alternating between
    rounds, and the medians count.
    """
    import pyarrow.dataset as ds

    from reader import read_committed

    def timed(read: Any) -> tuple[float, int]:
        t = time.perf_counter()
        rows = read().num_rows
        return time.perf_counter() - t, rows

    def ours_read() -> Any:
        return read_committed(root)

    def plain_read() -> Any:
        return ds.dataset(root, format="parquet").to_table()

    ours: list[float] = []
    theirs: list[float] = []
    timed(ours_read), timed(plain_read)
    for i in range(repeats):
        for which in (ours_read, plain_read) if i % 2 == 0 else (plain_read, ours_read):
            seconds, n = timed(which)
            (ours if which is ours_read else theirs).append(seconds)
            if which is ours_read:
                rows = n
            else:
                plain = n
        if plain != rows:
            raise RuntimeError(f"read_committed saw {rows} rows, pyarrow.dataset {plain}: {root}")
    return {
        "rows": rows,
        "read_committed_seconds": statistics.median(ours),
        "pyarrow_dataset_seconds": statistics.median(theirs),
        "ratio": statistics.median(ours) / statistics.median(theirs),
        "repeats": repeats,
    }


def tiny_parquet() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(make_chunk(0, 10), sink)
    return bytes(sink.getvalue().to_pybytes())


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Switch off fsync while building the open-time tables, in this process only.

    Built through the commit protocol with its fsyncs (two per file), 10,000 files take
    minutes on a plain disk; what is measured afterwards is opening the table, which reads
    names and metadata, so durability does not matter for the build.
    """
    from lakesink.storage import local

    saved = local.os.fsync, local.fsync_dir
    local.os.fsync, local.fsync_dir = (lambda fd: None), (lambda path: None)  # type: ignore[assignment]
    try:
        yield
    finally:
        local.os.fsync, local.fsync_dir = saved  # type: ignore[assignment]


def build_many_files(root: Path, count: int) -> None:
    """A foreach-mode table of ``count`` tiny committed files, published by the commit protocol.

    Every file holds the same 10 rows (one Parquet file's bytes, staged and published under
    each name): opening the table reads names and metadata, so the content does not matter.
    """
    from lakesink.layout import committed_name
    from lakesink.metadata import ensure_table
    from lakesink.storage.local import LocalStorage

    storage = LocalStorage(str(root))
    root.mkdir(parents=True)
    ensure_table(storage, input_schema(), "foreach")
    data = tiny_parquet()
    with no_fsync():
        for i in range(count):
            storage.put_if_absent(committed_name(i % 8, i // 8, "b0b0b0b0b0b0b0b0"), data)


def build_many_epochs(root: Path, count: int) -> None:
    """An epoch-mode table of ``count`` epochs of one tiny file each, logged by ``EpochLog``.

    Every epoch's file is the same tiny Parquet file copied under its own name: the data file
    path is irrelevant to opening the table, the log (records and checkpoints) is what counts.
    """
    from lakesink.epochlog import CommittedFile, EpochLog
    from lakesink.layout import committed_name
    from lakesink.metadata import ensure_table
    from lakesink.storage.local import LocalStorage

    storage = LocalStorage(str(root))
    root.mkdir(parents=True)
    ensure_table(storage, input_schema(), "epoch")
    data = tiny_parquet()
    log = EpochLog(storage)
    with no_fsync():
        for epoch in range(count):
            name = committed_name(0, epoch, "c0c0c0c0c0c0c0c0")
            storage.put_if_absent(name, data)
            log.commit(epoch, [CommittedFile(name, 0, epoch, 10, len(data))])


def cached_table(base: Path, kind: str, count: int, build: Any) -> Path:
    """The table of ``count`` files / epochs, built once and kept beside the input files.

    Creating 20,000-30,000 small files takes ~30 s on a loaded machine; the tables depend only
    on the count and the lake format version, so later runs reuse them.
    """
    from lakesink.layout import FORMAT_VERSION

    root = base / f"open-{kind}-{count}-v{FORMAT_VERSION}"
    marker = base / f"{root.name}.complete"
    if not marker.exists():
        print(f"  building a table of {count:,} {kind} (kept for later runs) ...")
        shutil.rmtree(root, ignore_errors=True)
        build(root, count)
        marker.touch()
    return root


def time_open(root: str, repeats: int) -> dict[str, Any]:
    """Seconds to open the table and list what ``read_committed`` would read (no data read)."""
    import pyarrow.dataset as ds

    from reader import Lake

    ours, theirs = [], []
    files = 0
    for _ in range(repeats):
        t = time.perf_counter()
        files = len(Lake(root).dataset().files)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        ds.dataset(root, format="parquet")
        theirs.append(time.perf_counter() - t)
    return {
        "files": files,
        "open_seconds": statistics.median(ours),
        "pyarrow_dataset_open_seconds": statistics.median(theirs),
    }


def machine() -> dict[str, Any]:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import pyarrow
    import pyspark

    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem / (1 << 30), 1),
        "cpu": cpu,
        "os": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pyarrow": pyarrow.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def parent(args: argparse.Namespace) -> dict[str, Any]:
    sinks = [s for s in args.sinks.split(",") if s]
    unknown = set(sinks) - set(SINKS)
    if unknown:
        raise SystemExit(f"unknown sink(s) {sorted(unknown)}; choose from {SINKS}")
    if args.skip_s3:
        sinks = [s for s in sinks if s != "epoch-s3"]
    memory_rows = [int(r) for r in args.memory_rows.split(",") if r] if not args.skip_memory else []
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([os.path.relpath(sys.executable), *sys.argv]),
        "machine": machine(),
        "parameters": {
            "rows": args.rows,
            "rows_per_input_file": args.rows_per_file,
            "max_files_per_trigger": args.max_files_per_trigger,
            "master": args.master,
            "arrow_max_records_per_batch": args.arrow_batch_rows,
            "repeats": args.repeats,
            "spark_conf": spark_conf(args.spark_conf),
            "write_options": effective_write_options(args.write_options),
            "trigger": "availableNow",
        },
        "sinks": {},
    }
    base = (
        Path(args.workdir) if args.workdir else Path(tempfile.gettempdir()) / f"lakesink-bench-{os.getuid()}"
    )
    work = base / f"run-{os.getpid()}"
    work.mkdir(parents=True)
    total_input = max([args.rows, *memory_rows])
    print(f"input: {total_input:,} rows in {base / 'input'}")
    files = ensure_input(base / "input", total_input, args.rows_per_file)
    stream_input = link_subset(files, args.rows, args.rows_per_file, work / "input-stream")
    moto = None
    try:
        print(
            f"writers ({args.rows:,} rows, {args.master}, maxFilesPerTrigger={args.max_files_per_trigger}):"
        )
        runs: dict[str, list[dict[str, Any]]] = {}
        for sink, attempt in schedule(sinks, args.repeats):
            options = None
            out = None
            endpoint = ""
            if sink == "epoch-s3":
                from lakesink.devserver import create_bucket, dev_storage_options, start_moto

                moto, endpoint = start_moto()
                results["moto_pid"] = moto.pid
                create_bucket(endpoint, BUCKET)
                options = dev_storage_options(endpoint)
                out = f"s3://{BUCKET}/epoch"
            kind = sink if sink in ("parquet", "foreach") else "epoch"  # what the child runs
            tag = sink.removeprefix(kind) + (f"-{attempt}" if attempt else "")
            figures = run_sink(
                kind,
                stream_input,
                work,
                args,
                output=out,
                storage_options=options,
                stock_spark_home=sink == "epoch-stock",
                tag=tag,
            )
            figures["sink"] = sink
            out = out or str(work / "out" / f"{kind}{tag}")
            if sink == "epoch-s3":
                figures["output_bytes"], figures["output_files"] = output_bytes_s3(endpoint, BUCKET, "epoch/")
            else:
                figures["output_bytes"], figures["output_files"] = output_bytes_local(out)
            figures["rows_read_back"] = count_rows(sink, out, options)
            if figures["rows_read_back"] != args.rows:
                raise RuntimeError(f"{sink}: wrote {figures['rows_read_back']} rows, expected {args.rows}")
            figures["output"] = out
            runs.setdefault(sink, []).append(figures)
            if moto is not None:
                from lakesink.devserver import stop_moto

                stop_moto(moto)
                moto = None
    finally:
        if moto is not None:
            from lakesink.devserver import stop_moto

            stop_moto(moto)
    for sink, sink_runs in runs.items():
        results["sinks"][sink] = median_run(sink_runs)
    add_ratios(results)

    committed = next((str(work / "out" / s) for s in ("epoch", "foreach") if s in results["sinks"]), None)
    if committed is not None and not args.skip_reader:
        print(f"reader: read_committed vs pyarrow.dataset over {committed}")
        results["reader"] = bench_reader(committed, args.reader_repeats)
        results["reader"]["table"] = os.path.basename(committed)
        many_files = cached_table(base, "files", args.reader_files, build_many_files)
        many_epochs = cached_table(base, "epochs", args.reader_epochs, build_many_epochs)
        results["open_many_files"] = time_open(str(many_files), args.reader_repeats)
        results["open_many_epochs"] = time_open(str(many_epochs), args.reader_repeats)

    if memory_rows:
        results["memory_one_partition"] = {}
        for sink in [s for s in args.memory_sinks.split(",") if s]:
            runs = {}
            for rows in memory_rows:
                folder = link_subset(files, rows, args.rows_per_file, work / f"input-{rows}")
                print(f"memory: {sink}, {rows:,} rows in one partition")
                figures = run_sink(sink, folder, work, args, one_partition=True, tag=f"-one-{rows}")
                figures["rows_read_back"] = count_rows(sink, str(work / "out" / f"{sink}-one-{rows}"), None)
                if figures["rows_read_back"] != rows:
                    raise RuntimeError(
                        f"{sink}, one partition: wrote {figures['rows_read_back']} of {rows} rows"
                    )
                runs[str(rows)] = figures
            results["memory_one_partition"][sink] = runs
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        results["workdir"] = str(work)
    return results


#: The sinks whose ratio is the target (c/a) run ``--repeats`` times, interleaved, and count by
#: their median run: on this 2-core machine one run of a sink varies by about 5%.
REPEATED = ("parquet", "epoch")


def schedule(sinks: list[str], repeats: int) -> list[tuple[str, int]]:
    """(sink, attempt) in run order: the repeated sinks take turns, then the others once each."""
    repeated = [s for s in sinks if s in REPEATED]
    order = [(sink, i) for i in range(repeats) for sink in repeated]
    return order + [(sink, 0) for sink in sinks if sink not in REPEATED]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rows/s (the lower middle one for an even count), plus all rates."""
    ordered = sorted(runs, key=lambda f: f["rows_per_second"])
    figures = dict(ordered[(len(ordered) - 1) // 2])
    figures["runs_rows_per_second"] = [f["rows_per_second"] for f in runs]
    return figures


def spark_conf(settings: list[str]) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` settings as a dict (for every sink's session)."""
    conf = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--spark-conf wants KEY=VALUE, got {setting!r}")
        conf[key] = value
    return conf


def effective_write_options(raw: str | None) -> dict[str, Any]:
    """The WriteOptions the lakesink writers run with (defaults plus ``--write-options``)."""
    import dataclasses

    from lakesink import WriteOptions

    return dataclasses.asdict(WriteOptions(**json.loads(raw or "{}")))


def add_ratios(results: dict[str, Any]) -> None:
    sinks = results["sinks"]
    if "parquet" not in sinks:
        return

    def vs_parquet(key: str) -> dict[str, float]:
        base = sinks["parquet"][key]
        return {f"{s}/parquet": (sinks[s][key] or 0) / base for s in sinks if s != "parquet"}

    results["ratios"] = vs_parquet("rows_per_second")
    if sinks["parquet"]["steady_rows_per_second"]:  # None when the stream had a single epoch
        results["ratios_steady"] = vs_parquet("steady_rows_per_second")
    results["ratios_by_cpu"] = vs_parquet("rows_per_cpu_second")


# Report ---------------------------------------------------------------------------------------

MiB = 1 << 20


def report(results: dict[str, Any]) -> str:
    lines = []
    m = results["machine"]
    lines.append(f"lakesink bench  {results['date']}  {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu']}")
    lines.append(f"command: {results['command']}")
    p = results["parameters"]
    lines.append(
        f"stream: {p['rows']:,} rows (long, timestamp, 20-char string, double), {p['master']}, "
        f"file source maxFilesPerTrigger={p['max_files_per_trigger']}, availableNow, "
        f"arrow maxRecordsPerBatch={p['arrow_max_records_per_batch']}"
    )
    lines.append("")
    head = (
        f"{'sink':<11} {'rows/s':>9} {'vs a':>5} {'steady':>9} {'vs a':>5} {'1st ep':>6} {'seconds':>7} "
        f"{'rows/cpu-s':>10} {'vs a':>5} {'peak RSS':>8} {'JVM':>7} {'py wrk':>7} {'output':>8} {'files':>5}"
    )
    lines.append(head)
    lines.append("-" * len(head))
    a = results["sinks"].get("parquet")
    for sink, f in results["sinks"].items():
        lines.append(
            f"{sink:<11} {f['rows_per_second']:>9,.0f} {_vs(f, a, 'rows_per_second'):>5} "
            f"{f['steady_rows_per_second'] or 0:>9,.0f} {_vs(f, a, 'steady_rows_per_second'):>5} "
            f"{f['first_epoch_seconds'] or 0:>6.1f} {f['query_seconds']:>7.1f} "
            f"{f['rows_per_cpu_second']:>10,.0f} {_vs(f, a, 'rows_per_cpu_second'):>5} "
            f"{f['peak_rss_bytes'] / MiB:>6.0f}Mi {f['peak_rss_jvm_bytes'] / MiB:>5.0f}Mi "
            f"{f['peak_rss_python_workers_bytes'] / MiB:>5.0f}Mi {f['output_bytes'] / MiB:>6.1f}Mi "
            f"{f['output_files']:>5}"
        )
    lines.append(
        "rows/s: over the whole query, from start() to the end; steady: after the first epoch "
        "(workers and JIT warm); 1st ep: seconds of the first epoch."
    )
    for sink, f in results["sinks"].items():
        if len(f["runs_rows_per_second"]) > 1:
            rates = ", ".join(f"{r:,.0f}" for r in f["runs_rows_per_second"])
            lines.append(f"{sink}: median of {len(f['runs_rows_per_second'])} runs ({rates} rows/s)")
    if "reader" in results:
        r = results["reader"]
        lines.append("")
        lines.append(
            f"reader ({r['rows']:,} rows, {r['table']} table, median of {r['repeats']}): read_committed "
            f"{r['read_committed_seconds']:.3f} s, pyarrow.dataset {r['pyarrow_dataset_seconds']:.3f} s, "
            f"ratio {r['ratio']:.2f}"
        )
        for key, what in (("open_many_files", "files (foreach)"), ("open_many_epochs", "epochs (epoch)")):
            o = results[key]
            lines.append(
                f"open a table of {o['files']:,} {what}: {o['open_seconds']:.3f} s "
                f"(pyarrow.dataset listing the folder: {o['pyarrow_dataset_open_seconds']:.3f} s)"
            )
    if "memory_one_partition" in results:
        lines.append("")
        lines.append(
            "memory, one partition (peak RSS, MiB: whole tree / all Python workers / largest Python "
            "worker process / JVM):"
        )
        keys = ("peak_rss_bytes", "peak_rss_python_workers_bytes", "peak_rss_largest_python_worker_bytes")
        for sink, runs in results["memory_one_partition"].items():
            for rows, f in runs.items():
                total, py, one = (f[k] / MiB for k in keys)
                lines.append(
                    f"  {sink:<8} {int(rows):>12,} rows: {total:6.0f} / {py:5.0f} / {one:5.0f} / "
                    f"{f['peak_rss_jvm_bytes'] / MiB:5.0f}  ({f['rows_per_second']:,.0f} rows/s)"
                )
    return "\n".join(lines)


def _vs(f: dict[str, Any], a: dict[str, Any] | None, key: str) -> str:
    """``f[key]`` as a ratio to the baseline's (two decimals), or "-"."""
    return f"{f[key] / a[key]:.2f}" if a and f.get(key) and a.get(key) else "-"


def report_markdown(results: dict[str, Any]) -> str:
    """The same figures as a Markdown table, for README's "Performance" section."""
    m, p = results["machine"], results["parameters"]
    lines = [
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB ({m['cpu']}); Python {m['python']}, "
        f"pyspark {m['pyspark']}, pyarrow {m['pyarrow']}; load average at start "
        f"{m['load_average_at_start'][0]:.1f}. Date: {results['date']}. Command: `{results['command']}`. "
        f"Stream: {p['rows']:,} rows, `{p['master']}`, maxFilesPerTrigger={p['max_files_per_trigger']}, "
        "availableNow.",
        "",
        "| sink | rows/s | vs Spark parquet | after the first epoch | vs Spark parquet "
        "| rows per CPU-second | vs Spark parquet | peak RSS (tree) | output |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    a = results["sinks"].get("parquet")
    names = {
        "parquet": '(a) Spark `format("parquet")`',
        "foreach": "(b) `LakeForeachWriter`",
        "epoch": "(c) epoch / Arrow, local disk",
        "epoch-stock": "(c) the same, Spark's stock worker setup (compiles pyspark.zip)",
        "epoch-s3": "(c) epoch / Arrow, moto S3",
    }
    for sink, f in results["sinks"].items():
        runs = f["runs_rows_per_second"]
        median = f" (median of {len(runs)})" if len(runs) > 1 else ""
        lines.append(
            f"| {names.get(sink, sink)}{median} | {f['rows_per_second']:,.0f} | "
            f"{_vs(f, a, 'rows_per_second')}x | {f['steady_rows_per_second'] or 0:,.0f} | "
            f"{_vs(f, a, 'steady_rows_per_second')}x | {f['rows_per_cpu_second']:,.0f} | "
            f"{_vs(f, a, 'rows_per_cpu_second')}x | {f['peak_rss_bytes'] / MiB:,.0f} MiB | "
            f"{f['output_bytes'] / MiB:,.1f} MiB |"
        )
    if "reader" in results:
        r, files, epochs = results["reader"], results["open_many_files"], results["open_many_epochs"]
        lines += [
            "",
            f"- `read_committed` vs `pyarrow.dataset` over the same {r['rows']:,} committed rows: "
            f"{r['read_committed_seconds']:.3f} s vs {r['pyarrow_dataset_seconds']:.3f} s "
            f"(ratio {r['ratio']:.2f}).",
            f"- Opening a table of {files['files']:,} files: {files['open_seconds']:.3f} s; "
            f"of {epochs['files']:,} epochs: {epochs['open_seconds']:.3f} s.",
        ]
    for sink, runs in results.get("memory_one_partition", {}).items():
        figures = ", ".join(
            f"{int(rows):,} rows: {f['peak_rss_largest_python_worker_bytes'] / MiB:,.0f} MiB "
            f"(tree {f['peak_rss_bytes'] / MiB:,.0f} MiB)"
            for rows, f in runs.items()
        )
        lines.append(f"- One partition, {sink} writer, peak RSS of the largest Python worker: {figures}.")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rows", type=int, default=20_000_000, help="rows in the stream (default 20M, as in the issue)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help=f"runs of each of {REPEATED}, interleaved; the median counts"
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for every sink's session (repeatable)",
    )
    p.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE, help="rows per input file")
    p.add_argument("--max-files-per-trigger", type=int, default=4)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--sinks", default=",".join(SINKS), help=f"comma-separated, from {SINKS}")
    p.add_argument("--skip-s3", action="store_true", help="leave out epoch-s3 (no moto server)")
    p.add_argument(
        "--arrow-batch-rows",
        type=int,
        default=10_000,
        help="spark.sql.execution.arrow.maxRecordsPerBatch for every sink",
    )
    p.add_argument(
        "--write-options",
        default=None,
        help="JSON of lakesink.WriteOptions fields for both lakesink writers, e.g. "
        '\'{"compression": "snappy"}\'',
    )
    p.add_argument("--driver-memory", default=None, help="spark.driver.memory (Spark's default: 1g)")
    p.add_argument("--memory-rows", default="1000000,10000000", help="one-partition runs, comma-separated")
    p.add_argument("--memory-sinks", default="epoch,foreach", help="writers for the one-partition runs")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-reader", action="store_true")
    p.add_argument("--reader-files", type=int, default=10_000)
    p.add_argument("--reader-epochs", type=int, default=10_000)
    p.add_argument("--reader-repeats", type=int, default=7)
    p.add_argument("--rss-interval", type=float, default=0.2, help="seconds between RSS samples")
    p.add_argument("--workdir", default=None, help="input cache and scratch (default: $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the outputs of this run")
    p.add_argument("--out", default="bench-results.json", help="where the JSON results go")
    # The child side (one sink in a fresh JVM); not for direct use.
    p.add_argument("--child", choices=("parquet", "foreach", "epoch"), help=argparse.SUPPRESS)
    for hidden in ("--input", "--output", "--checkpoint", "--result"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--one-partition", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rows < 1:
        p.error("--rows must be >= 1")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        args.sink = args.child
        child(args)
        return 0
    from lakesink.localspark import prepare_environment

    prepare_environment()  # children and their Python workers run this interpreter
    results = parent(args)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(report(results))
    print("\nMarkdown (README 'Performance'):\n")
    print(report_markdown(results))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
