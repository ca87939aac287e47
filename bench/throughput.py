"""The main stream through every sink and entry point, against Spark's own parquet sink; the memory runs.

One deterministic stream (``inputs.py``; ``maxFilesPerTrigger`` files an epoch,
``trigger(availableNow=True)``, ``local[2]``) through each of :data:`RUNS`. The ones in
:data:`REPEATED` run ``--repeats`` times, taking turns so that a slow minute of the machine
hits them alike, and count by their median run; the spread of their runs is reported beside
it. Every run's output is read back and must hold every row once.

Most runs are compared with ``parquet``, Spark's sink in a bench child. Those that are not
that kind of process have a baseline of their own kind (:data:`BASELINE_OF`): the job runs
(:data:`JOB_RUNS`, launch to exit) the job's parquet twin launched the same way, and the
Connect runs (``connect_runs.py``, one server for them all, run last) Spark's sink through
the same server.

Beside the baseline runs the peer (``delta_peer.py``): the Delta table a PySpark 4.3 user
would build instead of lakesink, in the bench's session as the ``epoch`` run; lakesink's
entry points are compared with it too.

Then the memory runs: one writer, ONE partition of 1M and of 10M rows (``--memory-rows``),
to show that a writer's memory does not grow with its partition.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from child import ChildSpec, Sink
from connect_runs import CONNECT_RUNS, run_connect, start_server
from figures import median_run, middle, ratio, spread
from inputs import link_subset
from launch import (
    JobSink,
    Launcher,
    RunFailed,
    bench_env,
    count_rows,
    output_bytes_local,
    output_bytes_s3,
    run_child,
    run_job,
    user_env,
)
from stores import BUCKET, s3_store

if TYPE_CHECKING:
    from devtools.connect import ConnectServer

#: The runs of the main stream, by the names ``--sinks`` takes.
RUNS = {
    "parquet": "Spark's own writeStream.format('parquet'): the baseline",
    "delta-peer": "deltalake.write_deltalake in foreachBatch, idempotent by app transactions: the peer",
    "epoch": "lakesink.write_stream(via='auto'): foreachBatch + mapInArrow, local disk",
    "epoch-source": "lakesink.write_stream(via='data_source'): the Python Data Source door, local disk",
    "format": "df.writeStream.format('lakesink') on a plain session, in a user's environment",
    "format-found": "the same without lakesink.register: pyspark finds pyspark_lakesink itself",
    "submit": "spark-submit jobs/stream_to_lake.py --mode epoch, in a user's environment",
    "submit-source": "the same with --via data_source (the Python Data Source door)",
    "submit-parquet": "spark-submit bench/parquet_job.py (the job, Spark's parquet sink): submit's baseline",
    "python": "python jobs/stream_to_lake.py --mode epoch --master M, in a user's environment",
    "python-parquet": "python bench/parquet_job.py --master M: python's baseline",
    "python-parquet-arrow": "the same behind an identity mapInArrow: what any Python step costs",
    "connect-parquet": "a Spark Connect client's format('parquet'), through one server on 127.0.0.1",
    "connect": "a Connect client's format('lakesink') through the same server, after connect-parquet",
    "epoch-s3": "lakesink.write_stream into a moto S3 server on 127.0.0.1 (a fresh one per run)",
    "epoch-stock": "write_stream with Spark's stock Python worker setup (workers compile pyspark.zip)",
    "foreach": "LakeForeachWriter (row at a time)",
    "hdfs": "format('lakesink') and Spark's format('parquet') into one MiniDFSCluster, checkpoints too",
}
#: The runs of the hdfs phase, in turn on one MiniDFSCluster: the baseline, then lakesink's two
#: doors: ``format`` (the data source door, plain session) and ``epoch``
#: (``write_stream(via="auto")``, the foreachBatch door, in the bench's session, as the ``epoch``
#: run of the stream phase).
HDFS_RUNS = ("parquet", "format", "epoch")
#: What each run kind writes with (the child's ``sink``); epoch-s3, format and submit say so themselves.
SINK_OF: dict[str, Sink] = {
    "parquet": "parquet",
    "epoch": "epoch",
    "epoch-stock": "epoch",
    "epoch-source": "epoch",
    "foreach": "foreach",
}
#: The runs compared with the baseline run ``--repeats`` times; the others once.
REPEATED = ("parquet", "delta-peer", "epoch", "epoch-source", "format", "submit", "epoch-s3")
#: The ways to start the epoch mode and the peer's, each compared with the baseline.
ENTRY_POINTS = ("parquet", "delta-peer", "epoch", "epoch-source", "format", "format-found", "submit")
#: The job runs, measured from launch to exit: how each is launched, what the job writes with,
#: and lakesink's door (None: write_stream's default).
JOB_RUNS: dict[str, tuple[Launcher, JobSink, str | None]] = {
    "submit": ("spark-submit", "lakesink", "auto"),
    "submit-source": ("spark-submit", "lakesink", "data_source"),
    "submit-parquet": ("spark-submit", "parquet", None),
    "python": ("python", "lakesink", "auto"),
    "python-parquet": ("python", "parquet", None),
    "python-parquet-arrow": ("python", "parquet-arrow", None),
}
#: Runs compared with a baseline of their own kind, not with the ``parquet`` child: launched the
#: same way, or through the same Connect server. Each baseline comes first, then what it measures.
BASELINE_OF = {
    "submit-parquet": "submit-parquet",
    "submit": "submit-parquet",
    "submit-source": "submit-parquet",
    "python-parquet": "python-parquet",
    "python-parquet-arrow": "python-parquet",
    "python": "python-parquet",
    "connect-parquet": "connect-parquet",
    "connect": "connect-parquet",
}


@dataclass(frozen=True)
class Stream:
    """What every run of the stream shares."""

    input: Path
    work: Path
    rows: int
    master: str
    files_per_trigger: int
    spark_conf: dict[str, str]  # the bench's settings; a plain session gets none of them
    write_options: dict[str, Any]
    rss_interval: float

    def spec(self, name: str, sink: Sink, output: str, **changes: Any) -> ChildSpec:
        """A child running ``sink`` over this stream; ``changes`` replace any other field."""
        spec = ChildSpec(
            name=name,
            sink=sink,
            input=str(self.input),
            output=output,
            checkpoint=str(self.work / "chk" / name),
            result=str(self.work / f"result-{name}.json"),
            master=self.master,
            max_files_per_trigger=self.files_per_trigger,
            spark_conf=self.spark_conf,
            write_options=self.write_options,
        )
        return replace(spec, **changes)


def schedule(sinks: list[str], repeats: int) -> list[tuple[str, int]]:
    """(run, attempt) in run order: the repeated runs take turns, then the others once each; the
    Connect runs last (their server runs from the first of them to the end of the phase), Spark's
    sink first (it must not find lakesink's Python workers on the server)."""
    repeated = [s for s in sinks if s in REPEATED]
    order = [(sink, i) for i in range(repeats) for sink in repeated]
    order += [(sink, 0) for sink in sinks if sink not in REPEATED]
    connect = list(CONNECT_RUNS)
    # sorted is stable: the order of the other runs is kept.
    return sorted(order, key=lambda run: connect.index(run[0]) + 1 if run[0] in connect else 0)


def stream_phase(
    stream: Stream, sinks: list[str], repeats: int, note: Callable[[str], None]
) -> dict[str, Any]:
    """Every run of ``sinks``; their median runs, the entry points, the S3 tax and the first epochs."""
    runs: dict[str, list[dict[str, Any]]] = {}
    failures: dict[str, str] = {}
    order = schedule(sinks, repeats)
    server: ConnectServer | None = None
    try:
        for i, (name, attempt) in enumerate(order, 1):
            if name in failures:
                continue  # a run that failed once fails again: do not spend minutes on it
            note(f"{name} run {attempt + 1} ({i}/{len(order)})")
            try:
                if name in CONNECT_RUNS and server is None:
                    server, seconds = start_server(stream)
                    note(f"Spark Connect server {server.url} ready in {seconds:.1f} s")
                figures = run_one(stream, name, f"-{attempt}" if attempt else "", server)
            except RunFailed as exc:
                # A Connect server that did not start fails every Connect run: it is not tried again.
                for failed in CONNECT_RUNS if name in CONNECT_RUNS and server is None else (name,):
                    failures[failed] = str(exc)
                note(f"{name} FAILED: {str(exc).splitlines()[0]}")
                continue
            note(f"{name}: {_rate_line(figures)}")
            runs.setdefault(name, []).append(figures)
    finally:
        if server is not None:
            server.stop()  # by its PID (its process group): the server and its Python workers
    return {
        "sinks": {name: summary(name, rs) for name, rs in runs.items()},
        "entry_points": entry_points(runs),
        "launch_to_exit": versus(runs, JOB_RUNS, _LAUNCH_FIGURES),
        "connect": versus(runs, CONNECT_RUNS, _CONNECT_FIGURES),
        "vs_delta_peer": vs_delta_peer(runs),
        "s3_tax": s3_tax(runs),
        "first_epoch": first_epoch(runs),
        "failures": failures,
    }


def summary(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run of ``name``, with the rates of all its runs."""
    figures = median_run(runs, rate_key(name))
    for key in ("rows_per_second", "rows_per_process_second"):
        figures[f"runs_{key}"] = [run.get(key) for run in runs]
    return figures


def rate_key(name: str) -> str:
    """The rate a run counts by: from ``start()`` to the end, or launch to exit for the job runs."""
    return "rows_per_process_second" if name in JOB_RUNS else "rows_per_second"


def run_one(stream: Stream, name: str, tag: str, server: ConnectServer | None = None) -> dict[str, Any]:
    """One run of ``name``, its output counted and read back (``server``: the Connect runs')."""
    label = f"{name}{tag}"
    out = str(stream.work / "out" / label)
    if name == "epoch-s3":
        with s3_store() as store:
            options = store.storage_options()
            url = store.url(label)
            moto_cpu = store.moto_cpu_seconds()
            figures = run_child(
                stream.spec(label, "epoch", url), stream.work, bench_env(options), stream.rss_interval
            )
            figures["moto_cpu_seconds"] = store.moto_cpu_seconds() - moto_cpu
            figures["moto_pid"] = store.moto_pid
            figures["output_bytes"], figures["output_files"] = output_bytes_s3(
                store.moto_endpoint, BUCKET, f"{label}/"
            )
            return checked(figures, stream.rows, count_rows("epoch", url, options), url)
    if name in JOB_RUNS:
        launcher, sink, via = JOB_RUNS[name]
        figures = run_job(
            label,
            stream.input,
            out,
            stream.work,
            launcher=launcher,
            sink=sink,
            via=via,
            master=stream.master,
            files_per_trigger=stream.files_per_trigger,
            rss_interval=stream.rss_interval,
        )
    elif name in CONNECT_RUNS:
        assert server is not None  # stream_phase starts it for the first Connect run
        figures = run_connect(stream, server, name, label, out)
    elif name == "delta-peer":
        # The epoch run's session and environment; lakesink's write options are not the peer's.
        spec = stream.spec(label, "delta-peer", out, write_options={})
        figures = run_child(spec, stream.work, bench_env(), stream.rss_interval)
    elif name in ("format", "format-found"):
        spec = stream.spec(label, "format", out, session="plain", spark_conf={}, register=name == "format")
        figures = run_child(spec, stream.work, user_env(), stream.rss_interval)
    else:
        env = bench_env(stock_spark_home=name == "epoch-stock")
        # write_stream takes the door as a keyword, as it takes the write options.
        door = {"via": "data_source"} if name == "epoch-source" else {}
        spec = stream.spec(label, SINK_OF[name], out, write_options={**stream.write_options, **door})
        figures = run_child(spec, stream.work, env, stream.rss_interval)
    figures["output_bytes"], figures["output_files"] = output_bytes_local(out)
    return checked(figures, stream.rows, count_rows(figures["sink"], out, None), out)


def checked(figures: dict[str, Any], expected: int, read_back: int, output: str) -> dict[str, Any]:
    """The figures with what a reader saw; RunFailed unless it is every row, once."""
    if read_back != expected:
        raise RunFailed(
            f"{figures['name']}: a reader sees {read_back:,} rows in {output}, expected {expected:,}"
        )
    figures.pop("progress", None)  # 20 epochs of a throughput run say nothing the rates do not
    return {**figures, "rows_read_back": read_back, "output": output}


def _rate_line(f: dict[str, Any]) -> str:
    if f.get("rows_per_second"):
        return (
            f"{f['rows_per_second']:,.0f} rows/s over {f['query_seconds']:.1f} s, "
            f"{f['rows_per_cpu_second']:,.0f} rows/cpu-s"
        )
    return f"{f['rows_per_process_second']:,.0f} rows/s from launch to exit ({f['process_seconds']:.1f} s)"


# Summaries ------------------------------------------------------------------------------------


def entry_points(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each entry point's rates (from ``start()``, and from launch to exit) with spreads and ratios."""
    base = runs.get("parquet", [])
    base_query = middle([r["rows_per_second"] for r in base]) if base else None
    base_process = middle([r["rows_per_process_second"] for r in base]) if base else None
    found = {}
    for name in ENTRY_POINTS:
        if name not in runs:
            continue
        query = [r["rows_per_second"] for r in runs[name] if r.get("rows_per_second")]
        process = [r["rows_per_process_second"] for r in runs[name]]
        found[name] = {
            "runs": len(runs[name]),
            "rows_per_second": spread(query) if query else None,
            "vs_parquet": ratio(middle(query), base_query) if query else None,
            "rows_per_process_second": spread(process),
            "process_vs_parquet": ratio(middle(process), base_process),
        }
    return found


def vs_delta_peer(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """Each of lakesink's entry points against the peer: ratios of the medians of rows/s and rows/CPU-s."""
    if "delta-peer" not in runs:
        return None
    peer = runs["delta-peer"]
    found: dict[str, Any] = {}
    for name in ENTRY_POINTS:
        if name in ("parquet", "delta-peer") or name not in runs:
            continue
        figures = {}
        for key in ("rows_per_second", "rows_per_cpu_second"):
            ours = [r[key] for r in runs[name] if r.get(key)]
            if ours:  # spark-submit's runs have neither (launch to exit only)
                figures[key] = ratio(middle(ours), middle([r[key] for r in peer]))
        if figures:
            found[name] = figures
    return found


def s3_tax(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The S3 epoch path against the local one: rows per CPU-second (moto excluded) and rows/s."""
    if "epoch-s3" not in runs or "epoch" not in runs:
        return None
    s3, local = runs["epoch-s3"], runs["epoch"]
    found: dict[str, Any] = {}
    for key in ("rows_per_cpu_second", "rows_per_second"):
        s3_values, local_values = [r[key] for r in s3], [r[key] for r in local]
        found[key] = {
            "s3": spread(s3_values),
            "local": spread(local_values),
            "ratio": ratio(middle(s3_values), middle(local_values)),
        }
    moto = [r["moto_cpu_seconds"] for r in s3]
    found["moto_cpu_seconds"] = spread(moto)
    found["moto_cpu_share"] = middle([r["moto_cpu_seconds"] / r["query_cpu_seconds"] for r in s3])
    return found


def first_epoch(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Seconds from ``start()`` to the first committed epoch, per run kind, and against the baseline."""
    found: dict[str, Any] = {}
    for name, rs in runs.items():
        if name in CONNECT_RUNS:
            continue  # against Spark's sink through the same server: see versus
        values = [r["first_epoch_seconds"] for r in rs if r.get("first_epoch_seconds") is not None]
        if values:
            found[name] = spread(values)
    base = found.get("parquet")
    for figures in found.values():
        figures["vs_parquet"] = ratio(figures["median"], base["median"]) if base else None
    return found


#: What the job runs are compared by: from launch to exit, and what their log lines tell.
_LAUNCH_FIGURES = (
    "process_seconds",
    "rows_per_process_second",
    "launch_to_first_epoch_seconds",
    "stop_to_exit_seconds",
    "peak_rss_bytes",
)
#: What the Connect runs are compared by: from ``start()`` to the end, and the server's share.
_CONNECT_FIGURES = (
    "rows_per_second",
    "first_epoch_seconds",
    "server_cpu_seconds",
    "rows_per_cpu_second",
    "server_peak_rss_bytes",
)


def versus(
    runs: dict[str, list[dict[str, Any]]], names: Mapping[str, Any], keys: tuple[str, ...]
) -> dict[str, Any]:
    """The runs of ``names`` that ran, each with the medians of ``keys`` and each median's ratio to
    that of its baseline (:data:`BASELINE_OF`), in the order of BASELINE_OF."""
    found: dict[str, Any] = {}
    for name, base in BASELINE_OF.items():
        if name not in names or name not in runs:
            continue
        figures: dict[str, Any] = {"baseline": base, "runs": len(runs[name])}
        for key in keys:
            figures[key] = _median(runs[name], key)
            theirs = _median(runs[base], key) if base != name and base in runs else None
            figures[f"{key}_vs_baseline"] = ratio(figures[key], theirs)
        found[name] = figures
    return found


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return middle(values) if values else None


# Memory -----------------------------------------------------------------------------------------


def memory_phase(
    stream: Stream,
    files: list[Path],
    rows_per_file: int,
    sinks: list[Sink],
    memory_rows: list[int],
    note: Callable[[str], None],
) -> dict[str, Any]:
    """One writer, one partition of each of ``memory_rows``: peak RSS of its Python worker."""
    found: dict[str, Any] = {}
    for sink in sinks:
        for rows in memory_rows:
            note(f"{sink}, {rows:,} rows in one partition")
            folder = link_subset(files, rows, rows_per_file, stream.work / f"input-{rows}")
            label = f"{sink}-one-{rows}"
            out = str(stream.work / "out" / label)
            # One task reads all of an epoch's files: a Parquet split never exceeds this.
            conf = {**stream.spark_conf, "spark.sql.files.maxPartitionBytes": str(8 << 30)}
            spec = stream.spec(
                label,
                sink,
                out,
                one_partition=True,
                spark_conf=conf,
                input=str(folder),
                max_files_per_trigger=1 << 20,
            )
            with _tolerant(found, label, note):
                figures = run_child(spec, stream.work, bench_env(), stream.rss_interval)
                found.setdefault(sink, {})[str(rows)] = checked(
                    figures, rows, count_rows(sink, out, None), out
                )
    return found


@contextlib.contextmanager
def _tolerant(found: dict[str, Any], label: str, note: Callable[[str], None]) -> Iterator[None]:
    """Record a failed run under ``found["failures"]`` and go on with the next one."""
    try:
        yield
    except RunFailed as exc:
        found.setdefault("failures", {})[label] = str(exc)
        note(f"{label} FAILED: {str(exc).splitlines()[0]}")


# HDFS -------------------------------------------------------------------------------------------


def hdfs_phase(
    stream: Stream,
    repeats: int,
    note: Callable[[str], None],
    *,
    datanodes: int = 1,
    runs_of: tuple[str, ...] = HDFS_RUNS,
) -> dict[str, Any]:
    """Spark's parquet sink and ``format("lakesink")``, taking turns on one MiniDFSCluster.

    Both write ``hdfs://`` with their checkpoints there too, as :func:`run_one` runs them on
    local disk (the baseline in the bench's session, lakesink in a user's plain one). The
    cluster (``devtools.hdfs``; ``make hdfs-jars`` builds it) runs beside the children, like
    moto, so its CPU is not the sinks'. Without its jars the phase says so and is skipped.
    ``datanodes`` (``--hdfs-datanodes``): its DataNodes and replication. With one, the close of
    every small file races that DataNode's block report to the NameNode (docs/guide/storage.md, HDFS).
    ``runs_of`` (``--hdfs-runs``): the runs, ``parquet`` first (:data:`HDFS_RUNS`: all three).
    """
    from devtools.hdfs import HdfsJarsMissing, start_hdfs, stop_hdfs

    try:
        server = start_hdfs(heap="1g", datanodes=datanodes)
    except HdfsJarsMissing as exc:
        note(f"hdfs: skipped: {exc}")
        return {"skipped": str(exc), "failures": {}}
    from procmem import tree_cpu_seconds

    note(f"MiniDFSCluster {server.url} ready in {server.started_in:.1f} s")
    runs: dict[str, list[dict[str, Any]]] = {}
    failures: dict[str, str] = {}
    try:
        for attempt in range(repeats):
            for name in runs_of:
                if f"hdfs-{name}" in failures:
                    continue
                label = f"hdfs-{name}{f'-{attempt}' if attempt else ''}"
                note(f"{label} ({attempt + 1}/{repeats})")
                cpu = tree_cpu_seconds(server.pid)["total"]
                try:
                    figures = _hdfs_run(stream, server.url, name, label)
                except RunFailed as exc:
                    failures[f"hdfs-{name}"] = str(exc)
                    note(f"{label} FAILED: {str(exc).splitlines()[0]}")
                    continue
                figures["hdfs_cpu_seconds"] = tree_cpu_seconds(server.pid)["total"] - cpu
                note(f"{label}: {_rate_line(figures)}")
                runs.setdefault(name, []).append(figures)
        rss = server.rss_bytes()
    finally:
        stop_hdfs(server)
    found: dict[str, Any] = {
        "cluster": {"started_in_seconds": server.started_in, "rss_bytes_after": rss, "datanodes": datanodes},
        "sinks": {name: summary(name, rs) for name, rs in runs.items()},
        "failures": failures,
    }
    keys = ("rows_per_second", "rows_per_cpu_second", "rows_per_process_second")
    if "parquet" in runs and "format" in runs:
        base, ours = runs["parquet"], runs["format"]
        found["vs_parquet"] = {
            key: ratio(middle([r[key] for r in ours]), middle([r[key] for r in base])) for key in keys
        }
    if "parquet" in runs and "epoch" in runs:
        base, ours = runs["parquet"], runs["epoch"]
        found["epoch_vs_parquet"] = {
            key: ratio(middle([r[key] for r in ours]), middle([r[key] for r in base])) for key in keys
        }
    return found


def _hdfs_run(stream: Stream, namenode: str, name: str, label: str) -> dict[str, Any]:
    out, chk = f"{namenode}/bench/{label}", f"{namenode}/bench/checkpoints/{label}"
    if name == "format":
        spec = stream.spec(label, "format", out, checkpoint=chk, session="plain", spark_conf={})
        figures = run_child(spec, stream.work, user_env(), stream.rss_interval)
    elif name == "epoch":
        spec = stream.spec(label, "epoch", out, checkpoint=chk)  # write_stream(via="auto"): child.py
        figures = run_child(spec, stream.work, bench_env(), stream.rss_interval)
    else:
        figures = run_child(stream.spec(label, "parquet", out, checkpoint=chk), stream.work, bench_env(),
                            stream.rss_interval)  # fmt: skip
    figures["output_bytes"], figures["output_files"] = output_bytes_hdfs(out)
    return checked(figures, stream.rows, count_rows_hdfs(name, out), out)


def output_bytes_hdfs(root: str) -> tuple[int, int]:
    """(bytes, files) of the visible Parquet files under ``root`` on HDFS (what plain readers see)."""
    from lakesink_reader.storage.hdfs import HdfsStorage

    storage = HdfsStorage(root)
    total = files = 0
    for status in storage.client.list_status(storage.root, True):
        parts = status.path[len(storage.root) :].strip("/").split("/")
        if status.isdir or any(p.startswith(("_", ".")) for p in parts) or not parts[-1].endswith(".parquet"):
            continue
        total += status.length
        files += 1
    return total, files


def count_rows_hdfs(name: str, out: str) -> int:
    """Rows a reader sees in an HDFS run's output: pyarrow (Spark's sink) or lakesink's reader, no JVM."""
    if name == "parquet":
        import pyarrow.dataset as ds

        from lakesink_reader.storage.hdfs import HdfsStorage

        fs, root = HdfsStorage(out).arrow_filesystem()
        return int(ds.dataset(root, filesystem=fs, format="parquet").count_rows())
    from lakesink_reader import Lake

    return int(Lake(out).dataset().count_rows())
