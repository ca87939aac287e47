"""Epoch mode end to end: ``format("lakesink")`` / ``write_stream`` on local Spark, and recovery."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink import SchemaMismatchError
from lakesink_reader import Lake, read_committed

pytestmark = pytest.mark.spark


def staged_leftovers(lake: str) -> list[str]:
    return [n for n in os.listdir(lake) if ".uncommitted" in n] if os.path.isdir(lake) else []


def make_input(folder: Path, files: int, rows_per_file: int) -> None:
    """Flat Parquet files with unique ids, written with pyarrow (no Spark job needed)."""
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        ids = pa.array(range(i * rows_per_file, (i + 1) * rows_per_file), pa.int64())
        table = pa.table({"id": ids, "label": pa.array([f"row-{v}" for v in ids.to_pylist()])})
        pq.write_table(table, folder / f"input-{i:03d}.parquet")
        # Distinct modification times: the file source takes files in that order, and the
        # tests below expect input file i to be epoch i (equal mtimes made that a coin toss).
        os.utime(folder / f"input-{i:03d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))


def source(spark, folder: Path, max_files: int = 1):  # type: ignore[no-untyped-def]
    schema = "id long, label string"
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", max_files).parquet(str(folder))


def fail_first_attempt(df, after_rows: int):  # type: ignore[no-untyped-def]
    """Pass batches through; on a task's first attempt raise after ``after_rows`` rows."""

    def fn(batches):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        ctx = TaskContext.get()
        armed = ctx is not None and ctx.attemptNumber() == 0 and ctx.partitionId() == 0
        seen = 0
        for batch in batches:
            seen += batch.num_rows
            if armed and seen > after_rows:
                raise RuntimeError(f"injected failure after {after_rows} rows")
            yield batch

    return df.mapInArrow(fn, df.schema)


def run(query) -> None:  # type: ignore[no-untyped-def]
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def test_format_lakesink_with_a_failing_task_commits_every_row_once(spark, tmp_path: Path, lake: str) -> None:
    from lakesink import register

    make_input(tmp_path / "in", files=3, rows_per_file=1_000)
    register(spark)
    df = fail_first_attempt(source(spark, tmp_path / "in").repartition(3), after_rows=100)
    query = (
        df.writeStream.format("lakesink")
        .option("path", lake)
        .option("row_group_bytes", str(64 << 10))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    run(query)
    assert ids(read_committed(lake)) == list(range(3_000))
    assert staged_leftovers(lake) == []
    table = Lake(lake)
    assert table.mode == "epoch"
    epochs = table.epochs()
    assert [e.epoch for e in epochs] == [0, 1, 2]
    assert [e.rows for e in epochs] == [1_000, 1_000, 1_000]
    # Source offsets come from Spark's offset log: the file source's logOffset per epoch.
    assert [e.source_offsets for e in epochs] == [[{"logOffset": i}] for i in range(3)]
    assert ids(Lake(lake).since(epoch=0).at(epoch=1).to_table()) == list(range(1_000, 2_000))
    assert ids(read_committed(lake, epoch=1)) == list(range(2_000))
    # Every file of the lake is listed by a record: nothing published outside the log.
    on_disk = {n for n in os.listdir(lake) if n.endswith(".parquet")}
    assert on_disk == {f.name for f in table.files()}


def test_write_stream_replay_is_skipped_whole_even_with_other_partitioning(
    spark, tmp_path: Path, lake: str
) -> None:
    from lakesink import write_stream

    make_input(tmp_path / "in", files=2, rows_per_file=500)
    chk = tmp_path / "chk"
    run(
        write_stream(
            source(spark, tmp_path / "in").repartition(2),
            lake,
            checkpoint_location=str(chk),
            trigger={"availableNow": True},
        )
    )
    first = {f.name for f in Lake(lake).files()}
    records = sorted(os.listdir(Path(lake, "_lakesink", "log")))
    # Forget on Spark's side that epoch 1 was committed: Spark replays it, now as 5 partitions.
    commits = chk / "commits"
    (commits / "1").unlink()
    (commits / ".1.crc").unlink(missing_ok=True)
    run(
        write_stream(
            source(spark, tmp_path / "in").repartition(5),
            lake,
            checkpoint_location=str(chk),
            trigger={"availableNow": True},
        )
    )
    assert ids(read_committed(lake)) == list(range(1_000))
    assert {f.name for f in Lake(lake).files()} == first
    assert sorted(os.listdir(Path(lake, "_lakesink", "log"))) == records
    assert staged_leftovers(lake) == []
    assert {n for n in os.listdir(lake) if n.endswith(".parquet")} == first


def test_schema_mismatch_is_refused_naming_the_column(spark, tmp_path: Path, lake: str, monkeypatch) -> None:
    from lakesink import register, write_stream
    from lakesink.config import SinkConfig

    make_input(tmp_path / "in", files=1, rows_per_file=10)
    run(
        write_stream(
            source(spark, tmp_path / "in"),
            lake,
            checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True},
        )
    )
    other = source(spark, tmp_path / "in").selectExpr("id", "cast(id as int) as label")
    with monkeypatch.context() as patched:
        # write_stream parses its keywords once: start()'s check judges that config, handed on,
        # rather than parsing the option strings made from it again.
        patched.setattr(SinkConfig, "from_options", _parsed_again)
        with pytest.raises(SchemaMismatchError, match="label"):
            write_stream(other, lake, checkpoint_location=str(tmp_path / "chk2"))
    # The same through format("lakesink"): refused before it starts, naming the column.
    register(spark)
    with pytest.raises(SchemaMismatchError, match="label"):
        (
            other.writeStream.format("lakesink")
            .option("path", lake)
            .option("checkpointLocation", str(tmp_path / "chk3"))
            .trigger(availableNow=True)
            .start()
        )
    assert ids(read_committed(lake)) == list(range(10))
    assert staged_leftovers(lake) == []


def _parsed_again(*args: object, **kwargs: object) -> None:
    raise AssertionError("write_stream's options were parsed again")


def test_write_stream_lifts_the_arrow_byte_check_for_its_query_only(spark, tmp_path: Path, lake: str) -> None:
    """maxBytesPerBatch=INT_MAX in the query's own session; the user's session keeps its value."""
    from lakesink import write_stream
    from lakesink.spark.guard import STREAM_CONF

    key = "spark.sql.execution.arrow.maxBytesPerBatch"
    make_input(tmp_path / "in", files=1, rows_per_file=10)

    def query_value(query) -> str:  # type: ignore[no-untyped-def]
        # The streaming query runs on a clone of the session made at start(); py4j reaches it.
        return str(query._jsq.streamingQuery().sparkSessionForStream().conf().get(key))

    assert spark.conf.get(key, None) is None
    query = write_stream(
        source(spark, tmp_path / "in"),
        lake,
        checkpoint_location=str(tmp_path / "chk1"),
        trigger={"availableNow": True},
    )
    assert STREAM_CONF[key] == str(2**31 - 1)  # INT_MAX: the only value that skips the check
    assert query_value(query) == str(2**31 - 1)
    run(query)
    assert spark.conf.get(key, None) is None  # restored: other queries keep Spark's default

    spark.conf.set(key, "1m")  # a session that sets the cap itself (wide rows) keeps it
    try:
        query = write_stream(
            source(spark, tmp_path / "in"),
            str(tmp_path / "lake2"),
            checkpoint_location=str(tmp_path / "chk2"),
            trigger={"availableNow": True},
        )
        assert query_value(query) == "1m"
        run(query)
        assert spark.conf.get(key) == "1m"
    finally:
        spark.conf.unset(key)
    assert ids(read_committed(lake)) == ids(read_committed(str(tmp_path / "lake2"))) == list(range(10))


def test_empty_epochs_are_recorded_with_no_files(spark, tmp_path: Path, lake: str) -> None:
    from lakesink import write_stream

    folder = tmp_path / "in"
    make_input(folder, files=1, rows_per_file=20)
    df = source(spark, folder).where("id < 0")  # every epoch is empty
    run(
        write_stream(
            df,
            lake,
            checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True},
        )
    )
    table = Lake(lake)
    assert [(e.epoch, e.files, e.rows) for e in table.epochs()] == [(0, 0, 0)]
    assert read_committed(lake).num_rows == 0
    assert [n for n in os.listdir(lake) if not n.startswith("_")] == []


def test_options_are_checked_by_name_and_never_show_secrets() -> None:
    from lakesink.config import KNOWN_OPTIONS, SinkConfig
    from lakesink.spark.datasource import LakeSinkDataSource

    options = {"path": "s3://bucket/x", "storage_options": json.dumps({"secret": "s3cr3t"})}
    source_ = LakeSinkDataSource(options)
    assert "s3cr3t" not in repr(source_) and "s3cr3t" not in repr(source_.config)
    with pytest.raises(ValueError, match="storage_options") as info:
        SinkConfig.from_options({"path": "/tmp/x", "storage_options": "s3cr3t-not-json"})
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(
        ValueError, match=r"storage_options \['secret'\] do not apply to the local path"
    ) as info:
        SinkConfig.from_options({"path": "/tmp/x", "storage_options": json.dumps({"secret": "s3cr3t"})})
    assert "s3cr3t" not in str(info.value)
    with pytest.raises(ValueError, match=r"row_group_bytes.*'many'"):
        SinkConfig.from_options({"path": "/tmp/x", "row_group_bytes": "many"})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['compresion'\].*'compression'"):
        SinkConfig.from_options({"path": "/tmp/x", "compresion": "zstd"})
    # Every WriteOptions field is an option, dictionary_page_bytes included (write_stream refused it).
    config = SinkConfig.from_options(
        {"path": "/tmp/x", "dictionary_page_bytes": "4096", "Compression": "snappy"}
    )
    assert config.write.dictionary_page_bytes == 4096 and config.write.compression == "snappy"
    assert {"dictionary_page_bytes", "checkpoint_interval", "staged_cleanup_age"} <= set(KNOWN_OPTIONS)
    assert SinkConfig.from_options(config.to_options()) == config


# What a user meets first: checks before the query starts --------------------------------------


def test_format_lakesink_is_checked_before_it_starts(spark, tmp_path: Path, lake: str) -> None:
    from lakesink import register

    register(spark)
    make_input(tmp_path / "in", files=1, rows_per_file=10)
    df = source(spark, tmp_path / "in")

    def writer():  # type: ignore[no-untyped-def]
        return df.writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "chk"))

    with pytest.raises(ValueError, match=r"unknown option\(s\) \['compresion'\]"):
        writer().option("compresion", "zstd").start(lake)
    with pytest.raises(ValueError, match=r"partition_by names \['nope'\], which the stream does not have"):
        writer().partitionBy("nope").start(lake)
    with pytest.raises(ValueError, match="output mode 'complete'"):
        writer().outputMode("complete").start(lake)
    with pytest.raises(ValueError, match=r"storage_options \['key'\] do not apply to the local path"):
        writer().option("storage_options", json.dumps({"key": "k"})).start(lake)
    assert not os.path.exists(lake)  # nothing was started, nothing written
    assert spark.streams.active == []
    with pytest.raises(NotImplementedError, match="streaming writes only"):
        df.sparkSession.range(3).write.format("lakesink").save(lake)
    with pytest.raises(NotImplementedError, match="streaming writes only"):
        df.sparkSession.range(3).write.format("LakeSink").mode("append").save(lake)
    # Other formats pass through the same start() untouched.
    noop = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "chk-noop"))
    run(noop.trigger(availableNow=True).start())


def test_a_bad_trigger_is_refused_before_anything_is_written(spark, tmp_path: Path, lake: str) -> None:
    from lakesink import write_stream

    make_input(tmp_path / "in", files=1, rows_per_file=10)
    with pytest.raises(TypeError, match=r"trigger must be a dict .* got '5 seconds'"):
        write_stream(source(spark, tmp_path / "in"), lake, checkpoint_location=str(tmp_path / "chk"),
                     trigger="5 seconds")  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(TypeError, match=r"unknown lakesink option\(s\) \['row_group_size'\]"):
        write_stream(source(spark, tmp_path / "in"), lake, checkpoint_location=str(tmp_path / "chk"),
                     row_group_size=5)  # fmt: skip
    with pytest.raises(
        TypeError, match=r"storage_options for s3://bucket/x must be a dict .* got str"
    ) as info:
        write_stream(source(spark, tmp_path / "in"), "s3://bucket/x",
                     checkpoint_location=str(tmp_path / "chk"),
                     storage_options="endpoint_url=secret-ish")  # type: ignore[arg-type]  # fmt: skip
    assert "secret-ish" not in str(info.value)
    assert not os.path.exists(lake)  # no table.json fixing schema and mode of an empty lake


def test_a_lake_deleted_and_written_again_in_the_same_session_is_readable(
    spark, tmp_path: Path, lake: str
) -> None:
    """Notebook users ``rm -rf`` a lake and start a fresh query on the same path.

    Spark reuses its Python workers, and a worker that had already checked the table for one run
    of a query skipped creating ``table.json`` for the next: every epoch committed, and the
    lake read as "not a lakesink table". (CI caught it through tests that share an S3 prefix.)
    """
    import shutil

    from lakesink import write_stream

    folder = tmp_path / "in"
    make_input(folder, files=2, rows_per_file=10)
    for attempt in range(3):
        shutil.rmtree(lake, ignore_errors=True)
        run(
            write_stream(
                source(spark, folder),
                lake,
                checkpoint_location=str(tmp_path / f"chk{attempt}"),
                trigger={"availableNow": True},
            )
        )
        assert ids(read_committed(lake)) == list(range(20)), f"run {attempt}"
