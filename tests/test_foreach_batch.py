"""``write_stream(..., via="foreach_batch")`` (issue 38): the same lake and guarantees through
``foreachBatch`` + ``mapInArrow``, with one kind of Python worker instead of five."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakesink
from lakesink_reader import Lake, read_committed

pytestmark = pytest.mark.spark


def _inputs(folder: Path, files: int, rows: int) -> None:
    folder.mkdir()
    for i in range(files):
        ids = pa.array(range(i * rows, (i + 1) * rows), pa.int64())
        pq.write_table(pa.table({"id": ids, "label": pa.array([f"r{v}" for v in ids.to_pylist()])}),
                       folder / f"in-{i:04d}.parquet")  # fmt: skip


def _daemon_modules() -> set[str]:
    """The worker modules of the Python daemons this process's JVM started (Spark runs one
    daemon per kind of worker: ``pyspark.daemon <worker module>``)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pyspark.daemon" in args:
            found.add(args[args.index(b"pyspark.daemon") + 1].decode())
    return found


def _stream(spark: Any, folder: Path, lake: str, chk: Path, **options: Any) -> Any:
    df = spark.readStream.schema("id long, label string").option("maxFilesPerTrigger", 2).parquet(str(folder))
    return lakesink.write_stream(
        df.repartition(2),
        lake,
        checkpoint_location=str(chk),
        trigger={"availableNow": True},
        via="foreach_batch",
        **{"driver_write": "never", **options},
    )


def test_foreach_batch_writes_every_row_once_and_a_replayed_batch_is_skipped(
    spark: Any, tmp_path: Path
) -> None:
    folder, lake, chk = tmp_path / "in", str(tmp_path / "lake"), tmp_path / "chk"
    _inputs(folder, 8, 500)
    sink_runners_before = "pyspark.sql.worker.python_streaming_sink_runner" in _daemon_modules()
    query = _stream(spark, folder, lake, chk)
    query.awaitTermination(300)
    assert query.exception() is None
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(4_000))
    history = Lake(lake).history()
    assert [v.batch for v in reversed(history) if v.operation == "append"] == [0, 1, 2, 3]
    assert {v.writer for v in history if v.writer} == {str(query.id)}  # the query id is the writer
    assert {len(Lake(lake, version=v.version).files()) for v in history[-1:]} == {2}  # two tasks, two files
    # No Python Data Source worker of its own: the commits ran in this process.
    if not sink_runners_before:
        assert "pyspark.sql.worker.python_streaming_sink_runner" not in _daemon_modules()

    # Spark runs the last batch again (its commit record lost, as after a crash between the
    # lake's commit and Spark's): the log knows the batch, nothing is written twice.
    last = max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
    (chk / "commits" / str(last)).unlink()
    (chk / "commits" / f".{last}.crc").unlink(missing_ok=True)  # else Spark takes it for another query's
    versions_before = Lake(lake).version
    replay = _stream(spark, folder, lake, chk)
    replay.awaitTermination(300)
    assert replay.exception() is None
    assert last in {p["batchId"] for p in replay.recentProgress}, "Spark did not run the batch again"
    assert Lake(lake).version == versions_before  # a replay commits nothing
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(4_000))
    # The Delta view followed, as on the data source door.
    delta = json.loads(
        (Path(lake) / "_delta_log" / f"{versions_before:020d}.json").read_text().splitlines()[0]
    )
    assert delta["commitInfo"]["operation"] == "STREAMING UPDATE"


def test_small_batches_are_written_on_the_driver_and_large_ones_in_tasks(spark: Any, tmp_path: Path) -> None:
    """``driver_write="auto"`` (the default): a batch within ``driver_write_max_rows`` is one file
    written on the driver; a larger one goes to the tasks (one file each), and the batch after it
    too; the rows are the same, once, either way."""
    folder, lake, chk = tmp_path / "in", str(tmp_path / "lake"), tmp_path / "chk"
    folder.mkdir()
    sizes = [100, 100, 900, 900, 100, 100, 100, 100]  # two files a batch: 200, 1000, 1000, 200 rows...
    start = 0
    for i, rows in enumerate(sizes):
        ids = pa.array(range(start, start + rows), pa.int64())
        pq.write_table(pa.table({"id": ids, "label": pa.array([f"r{v}" for v in ids.to_pylist()])}),
                       folder / f"in-{i:04d}.parquet")  # fmt: skip
        start += rows
    query = _stream(spark, folder, lake, chk, driver_write="auto", driver_write_max_rows=500)
    query.awaitTermination(300)
    assert query.exception() is None
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(start))
    appends = [v for v in reversed(Lake(lake).history()) if v.operation == "append"]
    assert [v.batch for v in appends] == [0, 1, 2, 3]
    # Batch 0 (200 rows): the driver. 1 (1,000): too many, tasks. 2 (300): after a large one,
    # tasks. 3 (200): the driver again.
    assert [v.add_files for v in appends] == [1, 2, 2, 1]


def test_driver_write_always_is_refused_on_the_data_source_door(spark: Any, tmp_path: Path) -> None:
    lakesink.register(spark, warm_up=False)  # the start's checks, as the guide has users do
    df = spark.readStream.format("rate").load()
    writer = df.writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "c"))
    with pytest.raises(ValueError, match="driver_write='always' needs the foreachBatch door"):
        writer.option("driver_write", "always").start(str(tmp_path / "lake"))
    with pytest.raises(ValueError, match="driver_write='always' needs the foreachBatch door"):
        lakesink.write_stream(df, str(tmp_path / "lake"), checkpoint_location=str(tmp_path / "c"),
                              via="data_source", driver_write="always")  # fmt: skip
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    "driver_write",
    ["auto", "never"],
)
@pytest.mark.chaos
@pytest.mark.long  # make chaos: ~30 s each, and timing-bound on a loaded machine
def test_a_query_stopped_mid_batch_stops_quietly_and_keeps_whole_batches(
    tmp_path: Path, driver_write: str
) -> None:
    """``query.stop()`` while a batch runs (on the driver or in tasks): no ``StackOverflowError``
    and no page of regex frames in the log (issue 53, item 1), and the lake holds whole batches."""
    lake = str(tmp_path / "lake")
    script = Path(__file__).with_name("stopped_query.py")
    done = subprocess.run(
        [sys.executable, str(script), lake, str(tmp_path / "chk"), driver_write],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "STOPPED" in done.stdout, done.stderr[-3000:]
    assert "INTERRUPTED" in done.stdout, "the stop did not land inside a batch"
    assert "StackOverflowError" not in done.stderr and "Pattern$Loop" not in done.stderr, done.stderr[-3000:]
    values = read_committed(lake).column("value").to_pylist()
    assert values and len(values) == len(set(values))  # whole batches, each once
    assert sorted(values) == list(range(len(values)))  # the rate source's rows, from 0, no gap


def test_a_bad_door_is_refused_before_anything_starts(spark: Any, tmp_path: Path) -> None:
    df = spark.readStream.format("rate").load()
    refusal = "via must be one of 'auto', 'foreach_batch', 'data_source', got 'batch'"
    with pytest.raises(ValueError, match=refusal):
        lakesink.write_stream(
            df, str(tmp_path / "lake"), checkpoint_location=str(tmp_path / "c"), via="batch"
        )
    assert not (tmp_path / "lake").exists()


def test_a_refusal_inside_the_function_reaches_await_termination_as_lakesink_s_own_error(
    spark: Any, tmp_path: Path
) -> None:
    """A second query past the start's check (two starts racing): the log refuses its commit in
    foreachBatch's function, in this process; the wait raises that refusal itself, as the data
    source door's does (``lakesink.spark.failures``), not Spark's wrapping of a Python error."""
    from lakesink.config import SinkConfig
    from lakesink.spark.batches import LakeBatchWrite
    from lakesink.spark.guard import _start_checked
    from lakesink_reader.errors import CommitRefusedError, OtherQueryError

    first_in, second_in, lake = tmp_path / "a", tmp_path / "b", str(tmp_path / "lake")
    _inputs(first_in, 2, 100)
    first = _stream(spark, first_in, lake, tmp_path / "chk-a")
    first.awaitTermination(300)
    assert first.exception() is None
    with pytest.raises(OtherQueryError, match="allow_other_queries=True"):  # the start's check
        _stream(spark, first_in, lake, tmp_path / "chk-b")
    _inputs(second_in, 1, 100)
    config = SinkConfig.from_keywords(lake, checkpoint_location=str(tmp_path / "chk-b"))
    df = spark.readStream.schema("id long, label string").parquet(str(second_in))
    writer = (
        df.writeStream.foreachBatch(LakeBatchWrite(config))
        .option("checkpointLocation", config.checkpoint_location)
        .trigger(availableNow=True)
    )
    second = _start_checked(spark, writer.start, config)  # the door's start, without its check
    with pytest.raises(CommitRefusedError, match="allow_other_queries") as refused:
        second.awaitTermination(300)
    assert "Traceback" not in str(refused.value) and "\n" not in str(refused.value).split("\n\n")[0]
    assert "CommitRefusedError" in str(second.exception())  # Spark's whole story stays there
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(200))  # nothing of b
    assert len(Lake(lake).history()) == 1
    # Its tasks' files went with the refusal, as the data source door's abort deletes them.
    assert len([n for n in os.listdir(lake) if n.endswith(".parquet")]) == len(Lake(lake).files())
