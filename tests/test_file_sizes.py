"""``max_records_per_file``: an epoch-mode task rolls its rows into files of at most that many
rows, commits them in its batch's one commit, and leaves nothing published when it fails; the
foreach writer refuses the option (a published foreach file is committed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # pa.compute in the 10M-row test
import pyarrow.parquet as pq
import pytest

import lakesink
from lakesink import LakeForeachWriter, WriteOptions
from lakesink.commit.files import fill_slices
from lakesink.commit.partitioned import PartitionedWriter
from lakesink.commit.tasks import write_task
from lakesink.config import SinkConfig
from lakesink_reader import Lake, read_committed
from lakesink_reader.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])
TAG = "0123456789abcdef"


def batches(rows: int, size: int) -> Iterator[pa.RecordBatch]:
    for start in range(0, rows, size):
        ids = list(range(start, min(rows, start + size)))
        yield pa.record_batch(
            [pa.array(ids, pa.int64()), pa.array([f"l{i % 3}" for i in ids])], schema=SCHEMA
        )


def test_fill_slices_fills_each_file_to_the_limit() -> None:
    batch = next(batches(25, 25))
    assert [(s.num_rows, full) for s, full in fill_slices(batch, 0, 10)] == [
        (10, True),
        (10, True),
        (5, False),
    ]
    assert [(s.num_rows, full) for s, full in fill_slices(batch, 7, 10)] == [
        (3, True),
        (10, True),
        (10, True),
        (2, False),
    ]
    assert [(s.num_rows, full) for s, full in fill_slices(batch, 0, None)] == [(25, False)]
    assert list(fill_slices(batch.slice(0, 0), 0, 10)) == []


def test_a_task_rolls_its_rows_into_files_of_at_most_the_limit(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "lake"))
    options = WriteOptions(row_group_bytes=1 << 10, max_records_per_file=1_000)
    files = write_task(storage, SCHEMA, batches(2_500, 700), tag=TAG, batch=4, partition=1, options=options)
    assert [f.rows for f in files] == [1_000, 1_000, 500]
    assert len({f.name for f in files}) == 3 and all(
        f.name.startswith(f"w{TAG}-b000000000004-p00001-") for f in files
    )
    ids = [
        i for f in files for i in pq.read_table(os.path.join(storage.url, f.name)).column("id").to_pylist()
    ]
    assert ids == list(range(2_500))  # in order, each once
    # Exactly the limit: no empty file after the last full one.
    exact = write_task(storage, SCHEMA, batches(2_000, 500), tag=TAG, batch=5, partition=0, options=options)
    assert [f.rows for f in exact] == [1_000, 1_000]


def test_a_task_that_fails_after_rolling_leaves_nothing_published(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "lake"))

    def failing() -> Iterator[pa.RecordBatch]:
        yield from batches(2_500, 500)  # two files published, a third staged
        raise RuntimeError("the task dies")

    options = WriteOptions(max_records_per_file=1_000)
    with pytest.raises(RuntimeError, match="the task dies"):
        write_task(storage, SCHEMA, failing(), tag=TAG, batch=0, partition=0, options=options)
    assert [e.name for e in storage.list("")] == [] and list(storage.staged("")) == []


def test_a_partitioned_task_rolls_each_folders_file(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "lake"))
    names = iter(f"f{i}.parquet" for i in range(100))
    writer = PartitionedWriter(
        storage, SCHEMA, ["label"], lambda: next(names), WriteOptions(max_records_per_file=40)
    )
    for batch in batches(300, 70):  # 100 rows a folder
        writer.write(batch)
    files = writer.publish()
    per_folder: dict[str, list[int]] = {}
    for f in files:
        per_folder.setdefault(f.folder, []).append(f.published.rows)
    assert {folder: sorted(rows) for folder, rows in per_folder.items()} == {
        f"label=l{i}": [20, 40, 40] for i in range(3)
    }


def test_the_option_is_parsed_and_the_foreach_writer_refuses_it(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    given = SinkConfig.from_options({"path": lake, "max_records_per_file": "1000000"})
    assert given.write.max_records_per_file == 1_000_000
    assert SinkConfig.from_options({"path": lake}).write.max_records_per_file is None
    with pytest.raises(ValueError, match="max_records_per_file must be at least 1"):
        SinkConfig.from_options({"path": lake, "max_records_per_file": "0"})
    with pytest.raises(ValueError, match="option 'max_records_per_file' must be int"):
        SinkConfig.from_options({"path": lake, "max_records_per_file": "a million"})
    with pytest.raises(ValueError, match=r"foreach writer cannot.*Write in epoch mode"):
        LakeForeachWriter(lake, schema=SCHEMA, write_options=WriteOptions(max_records_per_file=10))


def backfill(
    spark: Any, tmp_path: Path, inputs: list[pa.Table], *, max_records_per_file: int, timeout: float
) -> str:
    """``inputs`` as Parquet files, streamed into a new lake in one ``availableNow`` micro-batch
    of two tasks with ``max_records_per_file``; the lake's path."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i, table in enumerate(inputs):
        pq.write_table(table, folder / f"in-{i:02d}.parquet")
    lake = str(tmp_path / "lake")
    query = lakesink.write_stream(
        spark.readStream.schema("id long, label string").parquet(str(folder)).repartition(2),
        lake, checkpoint_location=str(tmp_path / "chk"), trigger={"availableNow": True},
        max_records_per_file=max_records_per_file,
    )  # fmt: skip
    query.awaitTermination(timeout)
    return lake


@pytest.mark.spark
def test_an_available_now_backfill_writes_files_of_at_most_max_records_per_file(
    spark: Any, tmp_path: Path
) -> None:
    """One micro-batch of 50,000 rows in 2 tasks, 7,000 rows a file at most: every row once, and
    the batch's files (8: 25,000 a task = 3 full and one of 4,000) in its one commit."""
    ids = pa.array(range(50_000), pa.int64())
    inputs = [pa.table({"id": ids, "label": pa.array([f"r{i}" for i in ids.to_pylist()])})]
    lake = backfill(spark, tmp_path, inputs, max_records_per_file=7_000, timeout=300)
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(50_000))
    files = Lake(lake).files()
    assert all(f.rows is not None and f.rows <= 7_000 for f in files), [f.rows for f in files]
    assert sorted(f.rows for f in files) == [4_000, 4_000, *[7_000] * 6] and {f.version for f in files} == {0}
    [version] = Lake(lake).history()
    assert (version.operation, version.add_files, version.add_rows) == ("append", 8, 50_000)


@pytest.mark.spark
@pytest.mark.long
def test_an_available_now_backfill_of_10m_rows_writes_files_of_at_most_1m_rows(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 36's Done-when: 10M rows, ``max_records_per_file=1_000_000``; one micro-batch in two
    tasks (5M rows each: five files of 1M), every row once (by count and by the ids' sum)."""
    inputs = [
        pa.table(
            {
                "id": pa.array(range(i * 1_000_000, (i + 1) * 1_000_000), pa.int64()),
                "label": ["x"] * 1_000_000,
            }
        )
        for i in range(10)
    ]
    lake = backfill(spark, tmp_path, inputs, max_records_per_file=1_000_000, timeout=1200)
    files = Lake(lake).files()
    assert sum(f.rows or 0 for f in files) == 10_000_000
    assert all(f.rows is not None and f.rows <= 1_000_000 for f in files), sorted(f.rows or 0 for f in files)
    assert len(files) == 10
    ids = read_committed(lake, columns=["id"]).column("id")
    assert len(ids) == 10_000_000 and pa.compute.sum(ids).as_py() == sum(range(10_000_000))
