"""What an epoch costs apart from its rows: small epochs, and wide epochs on a slow remote store.

Small epochs: 1-file micro-batches of ``--small-rows`` rows (5,000), ``--small-epochs`` of
them, through Spark's parquet sink and lakesink (local disk, and moto S3 unless
``--skip-s3``). Spark's sink cannot write to S3 here (no hadoop-aws jars), so it runs on
local disk only.

Wide epochs: an epoch of ``--small-rows`` rows partitioned by ranges of ``id`` into
``--wide-files`` partitions (1,000: one file each), and the same epoch in one partition,
written by lakesink to moto behind a proxy that delays every request by ``--wide-delay`` (50
ms); the commit time of the wide epoch is reported next to the 1-file one. The wide runs use
``--wide-master`` (``local[8]``): their tasks mostly wait on the delayed requests, and with
2 task slots the 1,000 tasks alone would take minutes. Each query first runs a 1-row epoch
(``wide_input``) so that the measured epoch pays no start-up.

Which durations count (Spark's progress event, ``durationMs``, per epoch):

- ``triggerExecution``: the whole micro-batch, from the trigger to the epoch being in Spark's
  commit log -- the epoch latency a consumer of the sink sees;
- ``addBatch``: the sink's part, the *commit* compared between sinks. Both sinks write and
  commit inside it: Spark's writes its ``_spark_metadata`` log entry when its job commits,
  lakesink's tasks publish their files and the driver writes the epoch's record;
- ``walCommit`` / ``commitOffsets``: Spark's own offset and commit logs, the same for every sink.

For lakesink the observer (``commit_times.py``) also times the driver's commit: from the last
task's file being published to the epoch's record written (``driver commit``), and the
record's write alone (``record``). The first epoch (workers start, the table is created) is
left out of the percentiles; "First epoch" in the report covers it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from child import Sink
from commit_times import EpochSteps, read_commit_times
from figures import p50_p95, ratio
from launch import RunFailed, bench_env, count_rows, run_child
from stores import s3_store
from throughput import Stream


def epochs_of(result: dict[str, Any], steps: dict[int, EpochSteps]) -> list[dict[str, Any]]:
    """One row per epoch: Spark's durations (ms) and, for lakesink, the observer's (s)."""
    found = []
    for event in result["progress"]:
        durations = event["durations_ms"]
        step = steps.get(event["epoch"])
        found.append(
            {
                "epoch": event["epoch"],
                "rows": event["rows"],
                "start": event["start"],
                "trigger_ms": durations.get("triggerExecution"),
                "add_batch_ms": durations.get("addBatch"),
                "wal_commit_ms": durations.get("walCommit"),
                "commit_offsets_ms": durations.get("commitOffsets"),
                "files": step.files if step else None,
                "driver_commit_s": step.driver_commit_seconds if step else None,
                "record_s": step.record_seconds if step else None,
            }
        )
    return found


def latency_summary(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 of each duration over the epochs after each run's first, in seconds (a run is a
    turn: its epochs carry ``turn``; without it they are one run)."""
    later = [e for i, e in enumerate(epochs) if i > 0 and e.get("turn") == epochs[i - 1].get("turn")]

    def seconds(key: str, scale: float) -> list[float]:
        return [e[key] * scale for e in later if e.get(key) is not None]

    return {
        "epochs": len(later),
        "trigger": p50_p95(seconds("trigger_ms", 1e-3)),
        "add_batch": p50_p95(seconds("add_batch_ms", 1e-3)),
        "driver_commit": p50_p95(seconds("driver_commit_s", 1.0)),
        "record": p50_p95(seconds("record_s", 1.0)),
    }


def measured_run(
    stream: Stream, label: str, sink: Sink, output: str, env: dict[str, str], **changes: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one child with the observer on (for lakesink); its figures and its epochs."""
    observer = stream.work / f"commits-{label}.jsonl"
    spec = stream.spec(label, sink, output, **changes)
    if sink != "parquet":
        spec = replace(spec, observer_file=str(observer))
    result = run_child(spec, stream.work, env, stream.rss_interval)
    return result, epochs_of(result, read_commit_times(observer))


def small_epochs_phase(
    stream: Stream, with_s3: bool, note: Callable[[str], None], turns: int = 1
) -> dict[str, Any]:
    """1-file epochs through Spark's sink and lakesink: per-epoch latencies and their p50/p95;
    ``epoch-auto`` is ``write_stream`` with ``auto_compact=True`` (issue 36: its cost to the
    stream is the difference of its p50/p95 to ``epoch``'s); ``epoch-source`` is
    ``write_stream(via="data_source")``, the door ``format("lakesink")`` takes (issue 38);
    ``parquet-arrow`` is Spark's sink behind an identity ``mapInArrow``: what a Python step in
    the stream costs Spark per epoch, the floor for lakesink's Python doors; ``epoch`` writes
    these small batches on the driver (``driver_write="auto"``, issue 52), ``epoch-tasks`` in
    Spark's tasks as before (``driver_write="never"``).

    Each sink runs ``turns`` times, the sinks taking turns (parquet, epoch, ..., parquet,
    epoch, ...), and the percentiles pool every turn's epochs: a slow minute of the machine
    then lands on every sink instead of deciding one sink's figure (session 12 saw Spark's own
    p50 swing 257-332 ms between single runs)."""
    found: dict[str, Any] = {"runs": {}, "failures": {}, "turns": turns}
    kinds: list[tuple[str, Sink, bool]] = [
        ("parquet", "parquet", False), ("parquet-arrow", "parquet", False), ("epoch", "epoch", False),
        ("epoch-tasks", "epoch", False), ("epoch-source", "epoch", False), ("epoch-auto", "epoch", False),
    ]  # fmt: skip
    if with_s3:
        kinds.append(("epoch-s3", "epoch", True))
    pooled: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, list[float]] = {}
    turn_p50: dict[str, list[float | None]] = {}
    for turn, (label, sink, remote) in ((t, k) for t in range(turns) for k in kinds):
        if label in found["failures"]:
            continue
        extra = {"auto_compact": True} if label == "epoch-auto" else {}
        if label == "epoch-source":
            extra = {"via": "data_source"}  # the Python Data Source door (issue 38)
        if label == "epoch-tasks":
            extra = {"driver_write": "never"}  # the foreachBatch door's tasks, not the driver (issue 52)
        # Spark's sink behind an identity mapInArrow: the floor of any stream with a Python step.
        changes = {"through_arrow": True} if label == "parquet-arrow" else {}
        of_turns = f", turn {turn + 1}/{turns}" if turns > 1 else ""
        note(f"{label}: {stream.rows:,} rows in 1-file epochs{of_turns}")
        name = f"small-{label}-{turn}"
        try:
            with s3_store() if remote else contextlib.nullcontext() as store:
                options = store.storage_options() if store else None
                out = store.url(name) if store else str(stream.work / "out" / name)
                result, epochs = measured_run(
                    stream, name, sink, out, bench_env(options), max_files_per_trigger=1,
                    write_options={**stream.write_options, **extra}, **changes,
                )  # fmt: skip
                result["rows_read_back"] = count_rows(sink, out, options)
        except RunFailed as exc:
            found["failures"][label] = str(exc)
            note(f"{label} FAILED: {str(exc).splitlines()[0]}")
            continue
        if result["rows_read_back"] != stream.rows:
            found["failures"][label] = (
                f"a reader sees {result['rows_read_back']:,} rows, expected {stream.rows:,}"
            )
            continue
        turn_epochs = [{**e, "turn": turn} for e in epochs]
        pooled.setdefault(label, []).extend(turn_epochs)
        seconds.setdefault(label, []).append(result["query_seconds"])
        summary = latency_summary(turn_epochs)
        turn_p50.setdefault(label, []).append(summary["trigger"]["p50"])
        p50 = summary["trigger"]["p50"], summary["add_batch"]["p50"]
        note(f"{label}: epoch p50 {_ms(p50[0])}, addBatch p50 {_ms(p50[1])}")
    for label, epochs in pooled.items():
        if label in found["failures"]:
            continue
        found["runs"][label] = {
            "summary": latency_summary(epochs),
            "turn_trigger_p50": turn_p50[label],
            "epochs": epochs,
            "query_seconds": seconds[label],
        }
    base = found["runs"].get("parquet")
    for run in found["runs"].values():
        for key in ("trigger", "add_batch"):
            run["summary"][key]["p50_vs_parquet"] = (
                ratio(run["summary"][key]["p50"], base["summary"][key]["p50"]) if base else None
            )
    return found


def wide_epochs_phase(
    stream: Stream, wide_files: int, delay: float, note: Callable[[str], None]
) -> dict[str, Any]:
    """An epoch of 1 file and one of ``wide_files`` files, into moto behind a ``delay`` per request.

    Each query runs two epochs (``wide_input``): a 1-row one that starts the workers, creates
    the table and runs the once-per-run sweep, then the measured one of ``stream.rows`` rows.
    The wide query partitions by ranges of ``id``, so its first epoch is one task and its
    second ``wide_files`` tasks, one file each.
    """
    found: dict[str, Any] = {"delay_seconds": delay, "runs": {}, "failures": {}}
    for files in sorted({1, wide_files}):
        label = f"wide-{files}"
        note(f"an epoch of {files:,} file(s) into S3 with {delay * 1000:.0f} ms a request")
        try:
            with s3_store(delay) as store:
                options = store.storage_options()
                url = store.url(label)
                result, epochs = measured_run(
                    stream,
                    label,
                    "epoch",
                    url,
                    bench_env(options),
                    max_files_per_trigger=1,
                    partitions=files,
                    range_column="id" if files > 1 else None,
                )
                requests = store.requests()
                read_back = count_rows("epoch", url, options)
        except RunFailed as exc:
            found["failures"][label] = str(exc)
            note(f"{label} FAILED: {str(exc).splitlines()[0]}")
            continue
        if read_back != stream.rows + 1:
            found["failures"][label] = f"a reader sees {read_back:,} rows, expected {stream.rows + 1:,}"
            continue
        measured = epochs[-1]
        found["runs"][label] = {
            "files": files,
            "epochs": epochs,
            "commit": {
                key: measured[key]
                for key in ("files", "trigger_ms", "add_batch_ms", "driver_commit_s", "record_s")
            },
            "requests": requests,
            "requests_per_extra_file": None,
            "query_seconds": result["query_seconds"],
            "query_cpu_seconds": result["query_cpu_seconds"],
        }
        narrow = found["runs"].get("wide-1")
        if files > 1 and narrow:
            # Both queries run the same two epochs but for the width: the difference is the files'.
            extra = sum(requests.values()) - sum(narrow["requests"].values())
            found["runs"][label]["requests_per_extra_file"] = extra / (files - 1)
        note(
            f"{label}: {measured['files']} files, epoch {_ms(measured['trigger_ms'] / 1000)}, driver commit "
            f"{_ms(measured['driver_commit_s'])}, record {_ms(measured['record_s'])}"
        )
    return found


def wide_input(base: Path, rows: int) -> Path:
    """Two files: 1 row (the warm-up epoch), then ``rows`` rows (the measured epoch); generated once."""
    import pyarrow.parquet as pq
    from inputs import make_chunk

    folder = base / f"input-wide-{rows}"
    marker = folder / "_complete"
    if not marker.exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for i, (start, count) in enumerate(((0, 1), (1, rows))):
            path = folder / f"in-{i:05d}.parquet"
            pq.write_table(make_chunk(start, count), path)
            # The file source takes files oldest first: make the order explicit.
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        marker.touch()
    return folder


def small_input(base: Path, rows_per_file: int, count: int) -> Path:
    """The folder of ``count`` files of ``rows_per_file`` rows each (generated once, like the main input)."""
    from inputs import ensure_input

    folder = base / "input-small"
    return ensure_input(folder, rows_per_file * count, rows_per_file)[0].parent


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"
