"""The bench's results as tables: aligned text for the terminal, Markdown for the guide's "Performance".

Each part of the results becomes a :class:`Section` (a title, a table, notes) once, and both
renderers draw the same sections, so the terminal and the guide never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MiB = 1 << 20

#: How the runs are named in the tables: "a" is the baseline most ratios divide by; "b", "c" and
#: "d" those of the runs that are not bench children (launched as a user does, or through Connect);
#: "p" the peer.
NAMES = {
    "parquet": '(a) Spark format("parquet")',
    "delta-peer": "(p) deltalake in foreachBatch",
    "epoch": 'lakesink.write_stream(via="auto")',
    "epoch-source": 'write_stream(via="data_source")',
    "format": 'format("lakesink"), plain session',
    "format-found": 'format("lakesink"), no register',
    "submit": "spark-submit jobs/stream_to_lake.py",
    "submit-source": "spark-submit jobs/stream_to_lake.py --via data_source",
    "submit-parquet": "(b) spark-submit bench/parquet_job.py",
    "python": "python jobs/stream_to_lake.py",
    "python-parquet": "(c) python bench/parquet_job.py",
    "python-parquet-arrow": "python bench/parquet_job.py --through-arrow",
    "parquet-arrow": 'Spark format("parquet") behind an identity mapInArrow',
    "connect": 'Spark Connect client, format("lakesink")',
    "connect-parquet": '(d) Spark Connect client, format("parquet")',
    "epoch-s3": "write_stream into moto S3",
    "epoch-auto": "write_stream, auto_compact=True",
    "epoch-tasks": 'write_stream, driver_write="never"',
    "epoch-stock": "write_stream, Spark's stock workers",
    "foreach": "LakeForeachWriter",
}


@dataclass
class Section:
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# Formatting --------------------------------------------------------------------------------------


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _datanodes(n: int) -> str:
    return "one DataNode, replication 1" if n == 1 else f"{n} DataNodes, replication {n}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MiB:,.0f} MiB"


def compact(rate: float) -> str:
    """A rate in thousands with three significant digits or more: "894k", "8.98k"."""
    return f"{rate / 1e3:,.0f}k" if rate >= 100_000 else f"{rate / 1e3:.3g}k"


def _spread(found: Mapping[str, float] | None) -> str:
    """A spread of rates: "894k-933k (4.2%)"; "-" for one run."""
    if not found or found["min"] == found["max"]:
        return "-"
    return f"{compact(found['min'])}-{compact(found['max'])} ({found['relative']:.1%})"


def _name(key: str) -> str:
    return NAMES.get(key, key)


# The sections ------------------------------------------------------------------------------------


def sections(results: Mapping[str, Any]) -> list[Section]:
    """Every part of the results that has figures, in the order of the report."""
    makers = (
        *(entry_points, launch_to_exit, connect, sinks, s3_tax, first_epoch, small_epochs, wide_epochs),
        *(foreach_profile, source, reader, memory, long_run, hdfs, log_scale, log_scale_latency, failures),
    )
    found: list[Section | None] = []
    for make in makers:
        made = make(results)
        found.extend(made if isinstance(made, list) else [made])
    return [section for section in found if section is not None and section.rows]


def entry_points(results: Mapping[str, Any]) -> Section:
    section = Section(
        "Entry points (medians of the runs; spread: slowest-fastest run and (max-min)/median)",
        ["entry point", "runs", "rows/s", "vs a", "spread", "launch to exit", "vs a", "spread"],
    )
    for name, f in results.get("entry_points", {}).items():
        query = f["rows_per_second"]
        section.rows.append(
            [
                _name(name),
                str(f["runs"]),
                _n(query["median"] if query else None),
                _x(f["vs_parquet"]),
                _spread(query),
                _n(f["rows_per_process_second"]["median"]),
                _x(f["process_vs_parquet"]),
                _spread(f["rows_per_process_second"]),
            ]
        )
    section.notes = [
        "rows/s: from start() to the end of the query; launch to exit: the whole process (JVM start, "
        "session, query, stop) -- the only rate spark-submit of the job can give. Its ratio here is to a "
        "bench child's; 'Launch to exit, like with like' has it against Spark's sink launched the same way.",
        'format("lakesink") runs as a user\'s script would: SparkSession.builder.master(...) and '
        "lakesink.register(spark) only, no SPARK_HOME view, Spark's default Arrow byte cap; 'no "
        "register' leaves out register too (pyspark finds pyspark_lakesink, and no driver-side worker "
        "is started ahead).",
    ]
    if results.get("vs_delta_peer"):
        section.notes.append(_vs_peer(results["vs_delta_peer"]))
    return section


def _vs_peer(found: Mapping[str, Mapping[str, float | None]]) -> str:
    """lakesink's entry points divided by the peer, one "NAME 1.71x rows/s and 1.60x rows/CPU-s" each."""
    measures = (("rows_per_second", "rows/s"), ("rows_per_cpu_second", "rows/CPU-s"))
    each = [
        f"{_name(name)} " + " and ".join(f"{_x(f[key])} {what}" for key, what in measures if key in f)
        for name, f in found.items()
    ]
    return (
        f"lakesink vs {NAMES['delta-peer']}, the table a PySpark 4.3 user would build instead "
        f"(medians): {'; '.join(each)}."
    )


def sinks(results: Mapping[str, Any]) -> Section:
    section = Section(
        "Sinks (the median run of each)",
        ["sink", "rows/s", "vs a", "after 1st epoch", "vs a", "rows/CPU-s", "vs a", "peak RSS", "output"],
    )
    base = results["sinks"].get("parquet", {})

    def vs(f: Mapping[str, Any], key: str) -> str:
        return _x(f[key] / base[key] if f.get(key) and base.get(key) else None)

    for name, f in results["sinks"].items():
        if f.get("session") in _OWN_SECTIONS:
            continue  # launch to exit only, or the work on a Connect server: their own sections
        section.rows.append(
            [
                _name(name),
                _n(f["rows_per_second"]),
                vs(f, "rows_per_second"),
                _n(f["steady_rows_per_second"]),
                vs(f, "steady_rows_per_second"),
                _n(f["rows_per_cpu_second"]),
                vs(f, "rows_per_cpu_second"),
                _mib(f["peak_rss_bytes"]),
                _mib(f["output_bytes"]),
            ]
        )
    section.notes = [
        "CPU and RSS: the run's whole process tree (driver Python, JVM, Spark's Python workers); a moto "
        "server is not in it. After 1st epoch: once workers are started and the JIT is warm."
    ]
    return section


#: Runs whose figures are not a bench child's (by their session): each kind has a section of its own.
_OWN_SECTIONS = ("spark-submit", "python", "connect")


def launch_to_exit(results: Mapping[str, Any]) -> Section | None:
    found = results.get("launch_to_exit")
    if not found:
        return None
    section = Section(
        "Launch to exit, like with like: the job against its twin with Spark's sink, launched the same way "
        "(medians)",
        ["run", "runs", "launch to exit, s", "rows/s", "vs b/c", "to 1st epoch, s", "vs b/c",
         "stop to exit, s", "vs b/c", "peak RSS"],
    )  # fmt: skip
    for name, f in found.items():
        section.rows.append(
            [
                _name(name),
                str(f["runs"]),
                _s(f["process_seconds"], 1),
                _n(f["rows_per_process_second"]),
                _x(f["rows_per_process_second_vs_baseline"]),
                _s(f["launch_to_first_epoch_seconds"]),
                _x(f["launch_to_first_epoch_seconds_vs_baseline"]),
                _s(f["stop_to_exit_seconds"]),
                _x(f["stop_to_exit_seconds_vs_baseline"]),
                _mib(f["peak_rss_bytes"]),
            ]
        )
    section.notes = [
        "(b), (c): bench/parquet_job.py runs the job's own session, stream and loop with Spark's "
        'format("parquet"): spark-submit --master M, or python with --master M; a user\'s environment. '
        "rows/s vs: higher is faster; seconds vs: higher is slower.",
        "to 1st epoch: launch to the job's log line of its first epoch (it looks every 0.5 s); stop to "
        "exit: its 'stopping Spark' line to the process's exit (spark.stop(), the interpreter's and the "
        "JVM's exit).",
    ]
    return section


def connect(results: Mapping[str, Any]) -> Section | None:
    found = results.get("connect")
    if not found:
        return None
    section = Section(
        "Spark Connect: a client's writeStream through one server on 127.0.0.1, from start() to the end",
        ["run", "rows/s", "vs d", "1st epoch, s", "vs d", "server CPU-s", "rows/CPU-s", "vs d",
         "server peak RSS", "vs d"],
    )  # fmt: skip
    for name, f in found.items():
        section.rows.append(
            [
                _name(name),
                _n(f["rows_per_second"]),
                _x(f["rows_per_second_vs_baseline"]),
                _s(f["first_epoch_seconds"]),
                _x(f["first_epoch_seconds_vs_baseline"]),
                _s(f["server_cpu_seconds"], 1),
                _n(f["rows_per_cpu_second"]),
                _x(f["rows_per_cpu_second_vs_baseline"]),
                _mib(f["server_peak_rss_bytes"]),
                _x(f["server_peak_rss_bytes_vs_baseline"]),
            ]
        )
    section.notes = [
        "One server (devtools.connect, the stream's master) for both; the clients build their session with "
        "SparkSession.builder.remote(url) alone (no lakesink.register). Each sink runs one epoch's files "
        "unmeasured right before its run: a long-lived server is warm.",
        "CPU: the server's process tree over the client's life, plus the client's own over the query; "
        "server peak RSS: over the client's life, lakesink's Python workers included.",
    ]
    return section


def s3_tax(results: Mapping[str, Any]) -> Section | None:
    tax = results.get("s3_tax")
    if not tax:
        return None
    section = Section(
        "S3 without a tax: the epoch path into moto vs local disk (medians)",
        ["measure", "moto S3", "local disk", "S3 / local"],
    )
    for key, what in (
        ("rows_per_cpu_second", "rows per CPU-second of the job"),
        ("rows_per_second", "rows/s"),
    ):
        section.rows.append(
            [what, _n(tax[key]["s3"]["median"]), _n(tax[key]["local"]["median"]), _x(tax[key]["ratio"])]
        )
    section.notes = [
        f"moto itself used {tax['moto_cpu_seconds']['median']:.1f} CPU-s a run "
        f"({tax['moto_cpu_share']:.0%} of the job's own CPU), counted nowhere above: it stands in for a "
        "remote service."
    ]
    return section


def first_epoch(results: Mapping[str, Any]) -> Section | None:
    found = results.get("first_epoch")
    if not found:
        return None
    section = Section(
        "First epoch: seconds from start() to the first committed epoch",
        ["run", "median", "fastest", "slowest", "vs a"],
    )
    for name, f in found.items():
        section.rows.append([_name(name), _s(f["median"]), _s(f["min"]), _s(f["max"]), _x(f["vs_parquet"])])
    section.notes = [
        "The end of the epoch is Spark's progress event: the trigger's start plus triggerExecution."
    ]
    return section


def source(results: Mapping[str, Any]) -> Section | None:
    found = results.get("source")
    if not found:
        return None
    section = Section(
        "The lake as a streaming source: rows/s from start() to the end (medians), into noop",
        [
            "read",
            "readStream.format('lakesink')",
            "readStream.parquet (Spark's file source)",
            "lakesink vs parquet",
        ],
    )
    medians = found["median_rows_per_second"]
    labels = {"cold": "a fresh JVM's first read", "warm": "the same session's second read"}
    for run, label in labels.items():
        m = medians.get(run, {})
        section.rows.append(
            [label, _n(m.get("lakesink")), _n(m.get("parquet")), _x(found.get(f"lakesink_vs_parquet_{run}"))]
        )
    section.notes = [
        f"{found['rows']:,} rows, the lake the epoch run wrote against the folder the parquet run wrote; "
        "each source in a fresh JVM per run, alternating. The gap is Spark's Python data source read path "
        "(docs/design/streaming-source.md, 'Speed')."
    ]
    return section


def small_epochs(results: Mapping[str, Any]) -> Section | None:
    small = results.get("small_epochs")
    if not small or not small["runs"]:
        return None
    p = results["parameters"]
    turns = small.get("turns", 1)
    section = Section(
        f"Small epochs: 1-file epochs of {p['small_rows']:,} rows; p50 / p95 over the epochs after the "
        "first" + (f" of each of {turns} runs, the sinks taking turns" if turns > 1 else "") + ", ms",
        [
            *("run", "epochs", "epoch p50", "p95", "vs a", "commit p50", "p95", "vs a"),
            *("driver commit p50", "p95", "record p50", "p95"),
        ],
    )
    for name, run in small["runs"].items():
        s = run["summary"]
        section.rows.append(
            [
                _name(name),
                str(s["epochs"]),
                *_p(s["trigger"]),
                _x(s["trigger"]["p50_vs_parquet"]),
                *_p(s["add_batch"]),
                _x(s["add_batch"]["p50_vs_parquet"]),
                *_p(s["driver_commit"]),
                *_p(s["record"]),
            ]
        )
    section.notes = [
        "epoch: triggerExecution, the micro-batch from its trigger to Spark's commit log. commit: addBatch, "
        "where both sinks write and commit (Spark's _spark_metadata entry; lakesink's tasks publish, the "
        "driver records the epoch).",
        "driver commit (lakesink): last file published -> epoch record written, from its observer; record: "
        "the record's create-if-absent write alone.",
    ]
    if turns > 1:
        spread = (
            _name(name) + " " + "/".join(_n(t * 1000) for t in run["turn_trigger_p50"] if t is not None)
            for name, run in small["runs"].items()
        )
        section.notes.append("epoch p50 of each turn: " + "; ".join(spread))
    return section


def _p(found: Mapping[str, Any]) -> list[str]:
    return [
        _n(None if found["p50"] is None else found["p50"] * 1000),
        _n(None if found["p95"] is None else found["p95"] * 1000),
    ]


def wide_epochs(results: Mapping[str, Any]) -> Section | None:
    wide = results.get("wide_epochs")
    if not wide or not wide["runs"]:
        return None
    section = Section(
        f"Wide epochs: lakesink into moto behind {wide['delay_seconds'] * 1000:.0f} ms per request "
        f"({results['parameters']['wide_master']}), the second epoch of each query, ms",
        ["files in the epoch", "epoch", "commit (addBatch)", "driver commit", "record", "S3 requests"],
    )
    for run in wide["runs"].values():
        c = run["commit"]
        section.rows.append(
            [
                _n(c["files"]),
                _n(c["trigger_ms"]),
                _n(c["add_batch_ms"]),
                _n(None if c["driver_commit_s"] is None else c["driver_commit_s"] * 1000),
                _n(None if c["record_s"] is None else c["record_s"] * 1000),
                _n(sum(run["requests"].values())),
            ]
        )
    section.notes = [
        "The first epoch of each query (1 row, 1 task) starts the workers, creates the table and runs the "
        "sweep; the measured one follows. S3 requests: the whole query's, both epochs."
    ]
    per_file = [
        run["requests_per_extra_file"] for run in wide["runs"].values() if run["requests_per_extra_file"]
    ]
    if per_file:
        section.notes.append(
            f"Each file more costs {per_file[-1]:.1f} S3 requests (from the difference of the two)."
        )
    return section


def foreach_profile(results: Mapping[str, Any]) -> Section | None:
    prof = results.get("foreach_profile")
    if not prof:
        return None
    total = prof["profiled_seconds"]
    section = Section(
        f"The foreach writer: where one partition's time goes ({prof['rows']:,} rows, "
        f"{total:.1f} s under cProfile)",
        ["share", "of the time", "seconds"],
    )
    for share, seconds in sorted(prof["shares"].items(), key=lambda item: -item[1]):
        section.rows.append([share, f"{seconds / total:.0%}", _s(seconds)])
    section.notes = ["cProfile slows Python code more than C code: read the shares, not the seconds."]
    return section


def reader(results: Mapping[str, Any]) -> Section | None:
    if "reader" not in results:
        return None
    r = results["reader"]
    section = Section(
        f"Reader (median of {r['repeats']})", ["what", "lakesink_reader", "pyarrow.dataset", "ratio"]
    )
    ours, theirs = r["read_committed_seconds"], r["pyarrow_dataset_seconds"]
    section.rows.append([f"read {r['rows']:,} committed rows", _s(ours, 3), _s(theirs, 3), _x(r["ratio"])])
    opened = (("open_many_files", "files (foreach)"), ("open_many_epochs", "epochs (format-2 epoch mode)"))
    for key, what in opened:
        o = results[key]
        ours, theirs = o["open_seconds"], o["pyarrow_dataset_open_seconds"]
        section.rows.append(
            [f"open a table of {o['files']:,} {what}", _s(ours, 3), _s(theirs, 3), _x(ours / theirs)]
        )
    section.notes = [
        "Seconds. Opening lists what read_committed would read; pyarrow.dataset lists the folder."
    ]
    return section


def memory(results: Mapping[str, Any]) -> Section | None:
    runs = {k: v for k, v in results.get("memory_one_partition", {}).items() if k != "failures"}
    if not runs:
        return None
    section = Section(
        "Memory: one writer, ONE partition (peak RSS)",
        ["writer", "rows", "largest Python worker", "all Python workers", "JVM", "whole tree", "rows/s"],
    )
    for sink, by_rows in runs.items():
        for rows, f in by_rows.items():
            peaks = ("largest_python_worker", "python_workers", "jvm")
            section.rows.append(
                [_name(sink), _n(int(rows))]
                + [_mib(f[f"peak_rss_{kind}_bytes"]) for kind in peaks]
                + [_mib(f["peak_rss_bytes"]), _n(f["rows_per_second"])]
            )
    return section


#: The long run's sinks, as the tables name them.
_LONG_RUN_NAMES = {
    "parquet": NAMES["parquet"],
    "format": NAMES["format"],
    "batch": 'write_stream(via="foreach_batch")',
    "arrow-parquet": "floor: Spark's sink behind mapInArrow",
}


def long_run(results: Mapping[str, Any]) -> Section | None:
    found = results.get("long_run")
    if not found:
        return None
    section = Section(
        f"Long run: {found['batches']} micro-batches of {found['rows_per_batch']:,} rows, process-tree PSS",
        ["sink", "PSS at the end", "vs Spark", "vs floor", "JVM", "Python workers", "peak",
         "MiB/100 batches", "batch p50/p95 ms", "Python daemons"],
    )  # fmt: skip
    to_floor = found.get("pss_end_ratio_to_floor", {})
    for sink, run in found["runs"].items():
        end = run["pss_end_mib"]
        daemons = sum(1 for m in run["by_module_end"] if m.startswith("pyspark."))
        section.rows.append(
            [
                _LONG_RUN_NAMES.get(sink, sink),
                f"{end['total']:,.0f} MiB",
                "1.00x" if sink == "parquet" else _x(found["pss_end_ratio"][sink]),
                _x(to_floor[sink]) if sink in to_floor else "",
                f"{end['jvm']:,.0f}",
                f"{end['python_workers']:,.0f}",
                f"{run['pss_peak_mib']:,.0f}",
                _s(run["pss_growth_mib_per_100_batches"], 1),
                "/".join(f"{v:.0f}" for v in run["trigger_ms_p50_p95"]),
                str(daemons),
            ]
        )
    section.notes.append(
        "PSS: pages shared between processes counted once; the end is the median of the last tenth"
    )
    if found.get("turns", 1) > 1:

        def turn(t: Mapping[str, Any]) -> str:
            return f"{t['pss_end_mib']['total']:,.0f} (JVM {t['pss_end_mib']['jvm']:,.0f})"

        ends = "; ".join(
            f"{_LONG_RUN_NAMES.get(sink, sink)} " + ", ".join(map(turn, turns))
            for sink, turns in found["by_turn"].items()
        )
        section.notes.append(
            f"{found['turns']} turns, the sinks taking turns; each row is the run whose PSS at the end "
            f"is the median of its turns (of an even count, the upper one). Every turn's PSS at the end, "
            f"MiB: {ends}"
        )
    return section


def hdfs(results: Mapping[str, Any]) -> list[Section | None]:
    """A section per DataNode count the hdfs phase ran with (``--hdfs-datanodes 2,1``)."""
    return [_hdfs(found) for found in [results.get("hdfs"), *results.get("hdfs_more", [])]]


def _hdfs(found: Mapping[str, Any] | None) -> Section | None:
    if not found or not found.get("sinks"):
        return None
    section = Section(
        f"HDFS, {_datanodes(found['cluster'].get('datanodes', 1))}: both sinks into one MiniDFSCluster "
        "on 127.0.0.1, checkpoints there too (medians)",
        ["sink", "rows/s", "vs a", "rows/CPU-s", "vs a", "launch to exit", "vs a", "peak RSS", "output"],
    )
    for name, f in found["sinks"].items():
        ours = name != "parquet"
        vs = found.get("epoch_vs_parquet" if name == "epoch" else "vs_parquet") or {}
        section.rows.append(
            [
                _name(name) + " -> hdfs://",
                _n(f["rows_per_second"]),
                _x(vs.get("rows_per_second")) if ours else "",
                _n(f["rows_per_cpu_second"]),
                _x(vs.get("rows_per_cpu_second")) if ours else "",
                _n(f["rows_per_process_second"]),
                _x(vs.get("rows_per_process_second")) if ours else "",
                _mib(f["peak_rss_bytes"]),
                _mib(f["output_bytes"]),
            ]
        )
    cluster = found["cluster"]
    section.notes = [
        f"The MiniDFSCluster (one NameNode, {_datanodes(cluster.get('datanodes', 1))}, one JVM) was ready in "
        f"{cluster['started_in_seconds']:.1f} s and held {_mib(cluster['rss_bytes_after'])} at the end; "
        "its CPU is in no job's figures (it stands in for a remote cluster)."
    ]
    return section


def log_scale(results: Mapping[str, Any]) -> Section | None:
    found = results.get("log_scale")
    if not found or "lake" not in found:
        return None
    lake = found["lake"]
    section = Section(
        f"Log scale (format 3): {lake['commits']:,} commits, {lake['live_files']:,} live files, "
        f"{lake['files_per_commit']} files a commit, checkpoint interval {lake['checkpoint_interval']}",
        ["what", "seconds", "peak RSS", "notes"],
    )
    rows = section.rows
    base = found.get("baselines", {})
    if "open" in found:
        o = found["open"]
        rows.append(
            [
                "Lake(path): open",
                _s(o["open_seconds"]["median"], 3),
                _mib(o["peak_rss_bytes"]["median"]),
                f"median of {o['open_seconds']['runs']} processes (fastest "
                f"{o['open_seconds']['min']:.3f} s); "
                f"{_mib(o['peak_rss_after_import_bytes']['median'])} after its import "
                f"({o['import_seconds']['median']:.2f} s); budget 0.3 s, 100 MiB",
            ]
        )
    for key, what in (
        ("interpreter", "baseline: the interpreter alone"),
        ("import_reader", "baseline: import lakesink_reader"),
        ("import_parquet", "baseline: import pyarrow.parquet"),
    ):
        if key in base:
            b = base[key]
            rows.append([what, _s(b.get("import_seconds"), 3), _mib(b["peak_rss_bytes"]), ""])
    for key, who in (
        ("first_commit_continuing", "continuing writer"),
        ("first_commit_new_writer", "new writer"),
    ):
        if key in found:
            c = found[key]
            rows.append(
                [
                    f"first commit, {who}",
                    _s(c["to_commit_point_seconds"], 3),
                    _mib(c["peak_rss_at_commit_point_bytes"]),
                    f"to its commit point (version {c['version']:,}); then its checkpoint "
                    f"{c['checkpoint_seconds']:.2f} s, {_mib(c['peak_rss_bytes'])} peak in all",
                ]
            )
    if "checkpoint" in found:
        c = found["checkpoint"]
        rows.append(
            [
                f"checkpoint of {c['list_rows']:,} live files",
                _s(c["checkpoint_seconds"]),
                _mib(c["peak_rss_bytes"]),
                f"list {c['list_bytes'] / MiB:.1f} MiB + small part {c['small_part_bytes']:,} bytes; "
                f"{_mib(c['peak_rss_after_import_bytes'])} after its imports",
            ]
        )
    section.notes = [
        "Each line is a fresh process; peak RSS is its VmHWM (the interpreter and its imports included). "
        "The lake is synthetic: its commits and a checkpoint encoded by the library, no data files.",
        "A first commit at a multiple of the interval writes that checkpoint too, inline, after its "
        "commit point.",
    ]
    return section


def log_scale_latency(results: Mapping[str, Any]) -> Section | None:
    found = results.get("log_scale", {}).get("latency")
    if not found:
        return None
    names = {
        "v3-local": "format 3 BatchCommitter, fresh local lake",
        "v3-local-iceberg": "the same, with the Iceberg view too (all three views)",
        "v3-local-big": "format 3 BatchCommitter, the log-scale lake",
        "v3-s3": "format 3 BatchCommitter, fresh moto S3 lake",
    }
    section = Section(
        "Per-commit latency: one commit after the other, ms",
        ["committer", "commits", "p50", "p95", "max"],
    )
    for key, f in found.items():
        section.rows.append(
            [
                names.get(key, key),
                str(f["count"]),
                _s(f["p50"] * 1000, 1),
                _s(f["p95"] * 1000, 1),
                _n(f["max"] * 1000),
            ]
        )
    section.notes = [
        "The driver's commit alone (no Spark, no data files written): open or read the log, check, create "
        "the entry, derived work (checkpoints every 100 versions)."
    ]
    return section


def failures(results: Mapping[str, Any]) -> Section | None:
    failed = results.get("failures", {})
    if not failed:
        return None
    section = Section("FAILED runs (their logs are in the work folder)", ["run", "error"])
    for name, error in failed.items():
        lines = [line for line in error.splitlines() if line.strip()]
        section.rows.append([name, lines[0][:150] + (f" ... {lines[-1][:150]}" if len(lines) > 1 else "")])
    return section


# Renderers ------------------------------------------------------------------------------------------


def header(results: Mapping[str, Any]) -> list[str]:
    m, p = results["machine"], results["parameters"]
    return [
        f"lakesink bench  {results['date']}  {m['cores']} cores, {m['memory_gib']} GiB ({m['cpu']}); Python "
        f"{m['python']}, pyspark {m['pyspark']}, pyarrow {m['pyarrow']}; load average at start "
        f"{m['load_average_at_start'][0]:.1f}",
        f"command: {results['command']}",
        f"stream: {p['rows']:,} rows of (long, timestamp, 20-character string, double), {p['master']}, file "
        f"source, maxFilesPerTrigger={p['max_files_per_trigger']}, availableNow",
    ]


def render_text(results: Mapping[str, Any]) -> str:
    lines = header(results)
    for section in sections(results):
        lines += ["", section.title]
        table = [section.columns, *section.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(section.columns))]
        for n, row in enumerate(table):
            cells = [
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  " + "  ".join(cells))
            if n == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        lines += [f"  {note}" for note in section.notes]
    return "\n".join(lines)


def render_markdown(results: Mapping[str, Any]) -> str:
    lines = [line.replace("lakesink bench  ", "Date: ") + "  " for line in header(results)] + [""]
    for section in sections(results):
        lines += [f"**{section.title}**", ""]
        lines.append("| " + " | ".join(section.columns) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(section.columns))) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in section.rows]
        lines += [""] + [f"- {note}" for note in section.notes] + [""]
    return "\n".join(lines)
