"""LakeForeachWriter's hooks called the way Spark calls them, without Spark (fast, exact)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from lakesink import LakeForeachWriter, ModeMismatchError, SchemaMismatchError, WriteOptions
from lakesink_reader import Lake, read_committed

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def run_task(writer: LakeForeachWriter, partition: int, epoch: int, rows: Iterable[Any]) -> bool:
    """What pyspark's foreach wrapper does for one task: open, process each row, close."""
    task = pickle.loads(pickle.dumps(writer))  # each task gets its own copy, as in Spark
    if not task.open(partition, epoch):
        return False
    error = None
    try:
        for row in rows:
            task.process(row)
    except Exception as exc:  # noqa: BLE001
        error = exc
    task.close(error)
    if error:
        raise error
    return True


def leftovers(lake: str) -> list[str]:
    return [n for n in os.listdir(lake) if ".uncommitted" in n]


def test_a_replay_leaves_the_committed_file_as_it_is(lake: str) -> None:
    writer = LakeForeachWriter(lake, schema=SCHEMA, batch_rows=7)
    run_task(writer, 0, 5, [(i, f"n{i}") for i in range(100)])
    [name] = [n for n in os.listdir(lake) if n.endswith(".parquet")]
    before = os.stat(os.path.join(lake, name)).st_ino
    run_task(writer, 0, 5, [(i, "replayed") for i in range(100)])  # as many rows: ours is dropped
    run_task(writer, 0, 5, [(i, "replayed") for i in range(40)])  # fewer (a cut-short attempt): too
    assert os.stat(os.path.join(lake, name)).st_ino == before
    table = read_committed(lake)
    assert sorted(table.column("id").to_pylist()) == list(range(100))
    assert set(table.column("name").to_pylist()) == {f"n{i}" for i in range(100)}
    assert leftovers(lake) == []


def test_a_truncated_file_is_replaced_by_the_retry_with_more_rows(lake: str) -> None:
    """pyspark ends a foreach writer's input as if complete when the task fails upstream of it."""
    writer = LakeForeachWriter(lake, schema=SCHEMA, batch_rows=7)
    run_task(writer, 2, 3, [(i, "first") for i in range(30)])  # cut short: 30 of 100 rows
    run_task(writer, 2, 3, [(i, "retry") for i in range(100)])
    table = read_committed(lake)
    assert sorted(table.column("id").to_pylist()) == list(range(100))
    assert set(table.column("name").to_pylist()) == {"retry"}
    assert [n for n in os.listdir(lake) if n.endswith(".parquet")] == [Lake(lake).files()[0].name]
    assert leftovers(lake) == [] and not [n for n in os.listdir(lake) if n.endswith(".lock")]


def test_error_discards_and_propagates(lake: str) -> None:
    writer = LakeForeachWriter(lake, schema=SCHEMA, batch_rows=10)
    run_task(writer, 1, 0, [(1, "a")])

    def rows_then_failure() -> Iterator[tuple[int, str]]:  # upstream fails mid-partition
        yield from [(i, "x") for i in range(50)]
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        run_task(writer, 0, 0, rows_then_failure())
    assert leftovers(lake) == []
    assert [f.partition for f in Lake(lake).files()] == [1]


def test_empty_partition_publishes_nothing(lake: str) -> None:
    writer = LakeForeachWriter(lake, schema=SCHEMA)
    run_task(writer, 0, 0, [])
    assert not os.path.exists(lake) or [n for n in os.listdir(lake) if not n.startswith("_")] == []


def test_rows_are_streamed_in_row_groups(lake: str) -> None:
    import pyarrow.parquet as pq

    writer = LakeForeachWriter(
        lake, schema=SCHEMA, batch_rows=1000, write_options=WriteOptions(row_group_bytes=16 << 10)
    )
    run_task(writer, 0, 0, [(i, "x" * 20) for i in range(50_000)])
    (f,) = Lake(lake).files()
    meta = pq.read_metadata(f.path)
    assert meta.num_rows == 50_000 and meta.num_row_groups >= 10


def test_schema_change_between_epochs_names_columns(lake: str) -> None:
    run_task(LakeForeachWriter(lake, schema=SCHEMA), 0, 0, [(1, "a")])
    other = pa.schema([("id", pa.string()), ("name", pa.string()), ("extra", pa.int8())])
    with pytest.raises(SchemaMismatchError, match=r"'id' changed type from int64 to string.*'extra'"):
        run_task(LakeForeachWriter(lake, schema=other), 0, 1, [("1", "a", 1)])
    assert sorted(read_committed(lake).column("id").to_pylist()) == [1]
    assert leftovers(lake) == []


def test_a_lake_of_the_other_mode_is_named_in_plain_english(lake: str) -> None:
    from lakesink_reader.format.table import ensure_table
    from lakesink_reader.storage import open_storage

    ensure_table(open_storage(lake), SCHEMA, "epoch")
    with pytest.raises(
        ModeMismatchError, match=r"is an epoch-mode lake; refusing to write to it in foreach mode"
    ):
        run_task(LakeForeachWriter(lake, schema=SCHEMA), 0, 0, [(1, "a")])


def test_inferred_schema_and_timestamps(lake: str) -> None:
    from pyspark.sql import Row

    local = datetime(2026, 1, 2, 3, 4, 5)  # pyspark hands naive *local* datetimes to Python
    writer = LakeForeachWriter(lake)
    run_task(writer, 0, 0, [Row(id=1, ts=local, v=1.5)])
    table = read_committed(lake)
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert table.column("ts")[0].as_py() == local.astimezone(UTC)


def test_bad_arguments_fail_on_the_driver(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="batch_rows"):
        LakeForeachWriter(str(tmp_path), batch_rows=0)
    with pytest.raises(ValueError, match="gs://bucket"):
        LakeForeachWriter("gs://bucket/lake")
    with pytest.raises(ValueError, match="hdfs"):
        LakeForeachWriter("hdfs://nn/lake")
    with pytest.raises(TypeError, match="StructType"):
        LakeForeachWriter(str(tmp_path), schema="id long")


def test_unwritable_destination_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        with pytest.raises(PermissionError, match="locked"):
            run_task(LakeForeachWriter(str(locked / "lake"), schema=SCHEMA), 0, 0, [(1, "a")])
    finally:
        locked.chmod(0o700)


def test_destination_under_a_file_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(NotADirectoryError, match="afile"):
        run_task(LakeForeachWriter(str(tmp_path / "afile" / "lake"), schema=SCHEMA), 0, 0, [(1, "a")])
