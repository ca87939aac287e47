"""End to end: LakeForeachWriter under a real local-mode Spark with task retries."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.compute as pc
import pytest
from faults import FailFirstAttempt, start_unchecked

from lakesink import LakeForeachWriter, SchemaMismatchError
from lakesink_reader import Lake, read_all, read_committed

pytestmark = pytest.mark.spark


def staged_leftovers(lake: str) -> list[str]:
    return [n for n in os.listdir(lake) if ".uncommitted" in n] if os.path.isdir(lake) else []


def make_input(spark, folder: Path, files: int, rows_per_file: int) -> None:  # type: ignore[no-untyped-def]
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        start = i * rows_per_file
        df = spark.range(start, start + rows_per_file).selectExpr(
            "id", "cast(id % 7 as int) as bucket", "concat('row-', cast(id as string)) as label"
        )
        df.coalesce(1).write.mode("overwrite").parquet(str(folder / f"batch-{i:03d}"))
        # move the single part file up so the stream sees flat files
        for part in (folder / f"batch-{i:03d}").glob("part-*.parquet"):
            part.rename(folder / f"input-{i:03d}.parquet")


def stream(spark, source: Path, lake: str, checkpoint: Path, writer, max_files: int = 1):  # type: ignore[no-untyped-def]
    schema = spark.read.parquet(str(source)).schema
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", max_files).parquet(str(source))
    df = df.repartition(3)
    query = (
        df.writeStream.foreach(writer(df.schema))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return df.schema


def test_failed_attempt_mid_partition_leaves_every_row_once(spark, tmp_path: Path, lake: str) -> None:
    source = tmp_path / "in"
    make_input(spark, source, files=3, rows_per_file=2_000)
    stream(
        spark,
        source,
        lake,
        tmp_path / "chk",
        lambda schema: FailFirstAttempt(lake, schema=schema, after_rows=100, batch_rows=64),
    )
    table = read_committed(lake)
    ids = table.column("id").to_pylist()
    assert sorted(ids) == list(range(6_000))
    assert staged_leftovers(lake) == []
    files = Lake(lake).files()
    assert {f.epoch for f in files} == {0, 1, 2}
    assert all(f.state == "committed" for f in files)


def test_a_task_that_fails_upstream_mid_partition_loses_no_rows(spark, tmp_path: Path, lake: str) -> None:
    """The first attempt of each partition fails after its first Arrow batch, upstream of the sink.

    pyspark's foreach bridge then ends the writer's input as if the partition were complete
    (``PythonForeachWriter.close`` ignores the error), so the writer publishes a truncated
    file before Spark retries the task. Before the fix the retry skipped the (partition, epoch)
    as committed, and every row after the first batch was lost.
    """
    source = tmp_path / "in"
    make_input(spark, source, files=2, rows_per_file=600)

    def fail_after_first_batch(batches):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, batch in enumerate(batches):
            if ctx is not None and ctx.attemptNumber() == 0 and i == 1:
                raise RuntimeError("upstream failure after the first batch")
            yield batch

    schema = spark.read.parquet(str(source)).schema
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source)).repartition(3)
    df = df.mapInArrow(fail_after_first_batch, df.schema)
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        query = (
            df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema, batch_rows=50))
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start()
        )
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    ids = read_committed(lake).column("id").to_pylist()
    assert sorted(ids) == list(range(1_200))
    assert staged_leftovers(lake) == []


def test_restart_from_checkpoint_replays_without_duplicates(spark, tmp_path: Path, lake: str) -> None:
    source = tmp_path / "in"
    make_input(spark, source, files=2, rows_per_file=1_000)
    writer = lambda schema: LakeForeachWriter(lake, schema=schema)  # noqa: E731
    stream(spark, source, lake, tmp_path / "chk", writer)
    first = sorted(read_committed(lake).column("id").to_pylist())
    # Forget that the last batch was committed on Spark's side: Spark replays it on restart.
    commits = tmp_path / "chk" / "commits"
    last = max(commits.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last.unlink()
    (commits / f".{last.name}.crc").unlink(missing_ok=True)
    stream(spark, source, lake, tmp_path / "chk", writer)
    assert sorted(read_committed(lake).column("id").to_pylist()) == first == list(range(2_000))
    assert staged_leftovers(lake) == []


def test_a_second_checkpoint_over_the_same_lake_is_refused(spark, tmp_path: Path, lake: str) -> None:
    """A new checkpoint is a new query that reads its input from the start: duplicates.

    Refused in the tasks here (``lakesink.register``'s start() refuses it before, in test_first_hour).
    """
    source = tmp_path / "in"
    make_input(spark, source, files=1, rows_per_file=100)
    first = lambda schema: LakeForeachWriter(lake, schema=schema)  # noqa: E731
    stream(spark, source, lake, tmp_path / "chk", first)
    schema = spark.read.parquet(str(source)).schema
    df = spark.readStream.schema(schema).parquet(str(source))
    query = start_unchecked(
        df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema))
        .option("checkpointLocation", str(tmp_path / "chk-new"))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="allow_other_queries=True") as info:
        query.awaitTermination(300)
    assert "belongs to streaming query" in str(info.value)
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(100))  # no duplicate
    # A query that writes other rows may say so.
    other = (
        spark.readStream.schema(schema).parquet(str(source)).selectExpr("id + 1000 as id", "bucket", "label")
    )
    stream_other = (
        other.writeStream.foreach(LakeForeachWriter(lake, schema=other.schema, allow_other_queries=True))
        .option("checkpointLocation", str(tmp_path / "chk-other"))
        .trigger(availableNow=True)
        .start()
    )
    stream_other.awaitTermination(300)
    assert stream_other.exception() is None
    assert len(read_committed(lake)) == 200


def test_schema_change_between_runs_names_the_columns(spark, tmp_path: Path, lake: str) -> None:
    source = tmp_path / "in"
    make_input(spark, source, files=1, rows_per_file=100)
    stream(spark, source, lake, tmp_path / "chk", lambda schema: LakeForeachWriter(lake, schema=schema))
    other = tmp_path / "other"
    other.mkdir()
    spark.range(10).selectExpr("id", "cast(id as string) as bucket").coalesce(1).write.parquet(
        str(other / "x")
    )
    schema = spark.read.parquet(str(other / "x")).schema
    df = spark.readStream.schema(schema).parquet(str(other / "x"))
    query = start_unchecked(  # the tasks' own check (register's start() refuses it before)
        df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema))
        .option("checkpointLocation", str(tmp_path / "chk2"))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="bucket") as info:
        query.awaitTermination(300)
    assert "SchemaMismatchError" in str(info.value) or isinstance(info.value, SchemaMismatchError)
    assert "label" in str(info.value)
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(100))
    assert staged_leftovers(lake) == []


def test_inferred_schema_and_filter_pushdown(spark, tmp_path: Path, lake: str) -> None:
    source = tmp_path / "in"
    make_input(spark, source, files=1, rows_per_file=500)
    stream(spark, source, lake, tmp_path / "chk", lambda schema: LakeForeachWriter(lake))
    table = read_committed(lake, columns=["id"], filter=pc.field("bucket") == 3)
    assert table.column_names == ["id"]
    assert sorted(table.column("id").to_pylist()) == [i for i in range(500) if i % 7 == 3]
    assert read_all(lake).num_rows == 500


def test_a_lake_deleted_while_its_query_was_stopped_is_readable_after_it_resumes(
    spark, tmp_path: Path, lake: str
) -> None:
    """Spark reuses its Python workers; one that had checked the table before must check again.

    Before the fix a worker remembered the table for the life of the process, so the resumed
    query published into a lake with no ``table.json``, which no reader accepts.
    """
    import shutil

    source = tmp_path / "in"
    make_input(spark, source, files=1, rows_per_file=300)
    schema = stream(
        spark, source, lake, tmp_path / "chk", lambda schema: LakeForeachWriter(lake, schema=schema)
    )
    assert read_committed(lake).num_rows == 300
    shutil.rmtree(lake)  # the user's choice: those 300 rows are gone
    df = spark.range(300, 600).selectExpr(
        "id", "cast(id % 7 as int) as bucket", "concat('row-', cast(id as string)) as label"
    )
    df.coalesce(1).write.mode("overwrite").parquet(str(source / "batch-001"))
    for part in (source / "batch-001").glob("part-*.parquet"):
        part.rename(source / "input-001.parquet")
    stream(spark, source, lake, tmp_path / "chk", lambda s: LakeForeachWriter(lake, schema=schema))
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(300, 600))
