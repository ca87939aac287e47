"""``lakesink.follow_lake`` (issue 52, item 3): a lake streamed into the next one through Spark's
own Parquet scan -- the lake source's offsets and files (``filesOnly``), read in ``foreachBatch``
with ``spark.read.parquet`` and written through the foreachBatch door. Exactly once: Spark runs a
batch again, the upstream compacts and adds a column meanwhile, and the downstream holds every
upstream row once (``jobs/stream_to_lake.py --source lake`` runs this route: test_job.py)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_lake_source import lake_a
from test_partitions import LABELS, add_input

import lakesink
from lakesink.maintenance import compact
from lakesink_reader import CorruptFileError, Lake, read_committed

COLUMNS = ("id", "label", "day", "note")


def rows(lake: str) -> list[tuple[Any, ...]]:
    """The lake's rows as (id, label, day, note) tuples, by id (note: None before it existed)."""
    table = read_committed(lake)
    columns = [
        table.column(c).to_pylist() if c in table.column_names else [None] * len(table) for c in COLUMNS
    ]
    return sorted(zip(*columns, strict=True), key=lambda r: r[0])


def write_upstream(spark: Any, folder: Path, lake: str, checkpoint: Path, ddl: str, **options: Any) -> None:
    """Lake A's writer: one availableNow run over ``folder``, partitioned by day and label."""
    stream = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(str(folder)).repartition(2)
    query = lakesink.write_stream(
        stream, lake, checkpoint_location=str(checkpoint), trigger={"availableNow": True},
        partition_by=["day", "label"], **options,
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def follow(spark: Any, a: str, b: str, checkpoint: Path, **options: Any) -> Any:
    from pyspark.sql import functions as F

    query = lakesink.follow_lake(
        spark, a, b, checkpoint_location=str(checkpoint), trigger={"availableNow": True},
        source_options={"maxFilesPerTrigger": 10},
        transform=lambda df: df.withColumn("twice", F.col("id") * 2),
        **options,
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


@pytest.mark.spark
def test_every_row_once_through_a_replayed_batch_a_compaction_and_a_new_column(
    spark: Any, tmp_path: Path
) -> None:
    src, a, b, chk = tmp_path / "in", str(tmp_path / "a"), str(tmp_path / "b"), tmp_path / "chk-b"
    for i in range(2):
        add_input(src, i)
    write_upstream(spark, src, a, tmp_path / "chk-a", "id long, label string, day date")
    first = follow(spark, a, b, chk)
    assert rows(b) == rows(a) and len(rows(a)) == 120
    assert read_committed(b).column("twice").to_pylist() == [
        2 * i for i in read_committed(b).column("id").to_pylist()
    ]
    # The stream's rows were A's files (one each), read by Spark's scan: escaped folders and null
    # labels (Spark's __HIVE_DEFAULT_PARTITION__) came back as the partition values.
    assert sum(p["numInputRows"] for p in first.recentProgress) == len(Lake(a).files())
    assert {r[1] for r in rows(b)} == set(LABELS)
    # The batches' listing setting stayed in the query's own session.
    assert spark.conf.get("spark.sql.sources.parallelPartitionDiscovery.threshold") == "32"

    # Spark runs B's last batch again (its commit record lost, as after a crash between B's
    # commit and Spark's), and meanwhile A compacts (new files, no new data) and takes a column.
    last = max(int(p.name) for p in (chk / "commits").iterdir() if p.name.isdigit())
    (chk / "commits" / str(last)).unlink()
    (chk / "commits" / f".{last}.crc").unlink(missing_ok=True)  # else Spark takes it for another query's
    done = compact(a, target_file_size=1 << 30, min_files=2, check_store=False)
    assert done.version is not None
    ids = pa.array(range(120, 180), pa.int64())
    pq.write_table(
        pa.table({
            "id": ids,
            "label": pa.array([LABELS[i % len(LABELS)] for i in ids.to_pylist()]),
            "day": pa.array([datetime.date(2026, 11, 22 + i % 2) for i in ids.to_pylist()], pa.date32()),
            "note": pa.array([f"n{i}" for i in ids.to_pylist()]),
        }),
        src / "in-0002.parquet",
    )  # fmt: skip
    write_upstream(spark, src, a, tmp_path / "chk-a", "id long, label string, day date, note string",
                   merge_schema=True)  # fmt: skip
    b_versions = Lake(b).version
    again = follow(spark, a, b, chk, merge_schema=True)
    ran = {p["batchId"]: p["numInputRows"] for p in again.recentProgress}
    assert last in ran, "Spark did not run the batch again"
    # The replay read its files' list again and committed nothing; the compaction's outputs were
    # not read; the new append's files were, with the lake's new column (null in older rows).
    appended = len(Lake(a).since(version=done.version).files())
    assert sum(ran.values()) == ran[last] + appended
    writer = Lake(b).writers()[0]
    assert [v.batch for v in Lake(b).versions() if v.version > b_versions] == list(
        range(last + 1, writer.last_batch + 1)
    )
    assert rows(b) == rows(a) and len(rows(a)) == 180
    assert {r[3] for r in rows(b) if r[0] < 120} == {None} and rows(b)[-1][3] == "n179"

    # Spark's scan follows links: a committed name that is one is refused, never read through.
    name = Lake(a).since(version=done.version).files()[0].name  # the newest append's: C reads it
    moved = tmp_path / "elsewhere.parquet"
    (Path(a) / name).rename(moved)
    (Path(a) / name).symlink_to(moved)
    c = str(tmp_path / "c")
    query = lakesink.follow_lake(spark, a, c, checkpoint_location=str(tmp_path / "chk-c"),
                                 trigger={"availableNow": True})  # fmt: skip
    with pytest.raises(CorruptFileError, match=f"{re.escape(name)} is a symbolic link"):
        query.awaitTermination(300)


def test_files_only_offsets_and_files_are_the_lake_streams_without_spark(tmp_path: Path) -> None:
    """``filesOnly``: the same offsets and files per micro-batch as the rows' stream, a compaction
    skipped; each micro-batch's files in one task, as (name, version, size) rows."""
    from lakesink.spark.streaming import FILES_SCHEMA, LakeStreamReader, parse_stream_options

    a = str(tmp_path / "a")
    writer = lake_a(a, 2)
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 2
    lake_a(a, 1, first=500, writer=writer)
    lake = Lake(a)
    options = {"path": a, "maxFilesPerTrigger": "3", "startingVersion": "0"}
    data = LakeStreamReader(parse_stream_options(options), lake.schema, ())
    files = LakeStreamReader(parse_stream_options({**options, "filesOnly": "true"}), lake.schema, ())
    assert files.options.files_only and FILES_SCHEMA.startswith("name string")
    start = data.initialOffset()
    assert files.initialOffset() == start
    batches = []
    while True:
        end = data.latestOffset(start, data.getDefaultReadLimit())
        assert files.latestOffset(start, files.getDefaultReadLimit()) == end
        if end == start:
            break
        names = [n for p in data.partitions(start, end) for n in p.names]
        [task] = files.partitions(start, end)
        listed = list(task.files)
        assert [n for n, _, _, _ in listed] == names
        table = pa.Table.from_batches(list(files.read(task)))
        assert table.column_names == ["name", "version", "size", "rows"]
        assert table.column("name").to_pylist() == names and set(table.column("rows").to_pylist()) == {10}
        batches.append(listed)
        start = end
    # Six appended files (versions 0, 1, 3), three a micro-batch; the compaction (version 2) not read.
    assert [[v for _, v, _, _ in b] for b in batches] == [[0, 0, 1], [1, 3, 3]]
    assert all(size > 0 for b in batches for _, _, size, _ in b)
    with pytest.raises(ValueError, match="filesOnly must be true or false, got 'yes'"):
        parse_stream_options({"path": a, "filesOnly": "yes"})


def test_a_files_only_stream_pins_the_lakes_schema_at_load_as_the_rows_stream_does(tmp_path: Path) -> None:
    """``follow_lake`` reads the lake's schema right after ``load()``: the source's, taken at
    ``load()`` and carried in the instance Spark pickles to its planner, is never newer, so a
    batch's files are never read with fewer columns than they hold."""
    import pickle

    from lakes import SCHEMA

    from lakesink.spark.datasource import LakeSinkDataSource
    from lakesink_reader.format.schemas import encode_schema

    a = str(tmp_path / "a")
    writer = lake_a(a, 1)
    source = LakeSinkDataSource({"path": a, "filesOnly": "true"})
    assert str(source.schema()).startswith("name string")  # Spark's load()
    writer.options["schema"] = encode_schema(pa.schema([*SCHEMA, pa.field("note", pa.string())]))
    writer.append(100)  # a writer adds a column before the query starts
    planner = pickle.loads(pickle.dumps(source)).streamReader(None)  # the query's start
    assert planner.schema.equals(SCHEMA) and "note" in Lake(a).schema.names
    with pytest.raises(ValueError, match=r"column\(s\) \['note'\] are new or changed"):
        planner.latestOffset(planner.initialOffset(), planner.getDefaultReadLimit())
