"""``spark.read.format("lakesink").load(path)``: a batch read of the committed rows, at the latest
version or an older one (``versionAsOf``, ``timestampAsOf``). The partitioned case is in
test_partitions.py; S3 and HDFS lakes are read through the same ``open_storage``."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pytest
from lakes import v3_table
from test_reader_v3 import W1, Writer

import lakesink
from lakesink.commit.versions import VersionedLogWriter
from lakesink_reader import Lake, read_committed


def ids(frame: Any) -> list[int]:
    return sorted(r["id"] for r in frame.select("id").collect())


def committed(lake: str, **selector: Any) -> list[int]:
    return sorted(read_committed(lake, **selector).column("id").to_pylist())


@pytest.mark.spark
def test_a_batch_read_returns_the_committed_rows_at_the_latest_and_an_older_version(
    spark: Any, lake: str
) -> None:
    lakesink.register(spark)
    storage, table_id = v3_table(lake, checkpoint_interval=3)
    writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=3), W1)
    for batch in range(5):
        writer.append(batch * 100)
    # A stray published file no version lists: no log-aware reader reads it.
    with open(
        os.path.join(lake, "w0000000000000000-b000000000009-p00000-ffffffffffffffff.parquet"), "wb"
    ) as f:
        f.write(b"not even parquet")
    read = spark.read.format("lakesink")
    assert ids(read.load(lake)) == committed(lake) and len(committed(lake)) == 100
    assert ids(read.option("versionAsOf", 2).load(lake)) == committed(lake, version=2)
    # timestampAsOf: the newest version committed at or before it (UTC when it names no zone).
    versions = Lake(lake).versions()
    at = dt.datetime.fromtimestamp(versions[3].committed_at, dt.UTC).replace(tzinfo=None).isoformat()
    assert ids(spark.read.format("lakesink").option("timestampAsOf", at).load(lake)) == committed(
        lake, version=3
    )
    frame = spark.read.format("lakesink").load(lake)
    assert frame.schema.names == Lake(lake).schema.names
    assert frame.where("id >= 400").count() == 20  # batch 4: ids 400..419
    # On local disk the read is Spark's own Parquet scan of the pinned files (issue 52); the
    # Python data source reads the same.
    from lakesink.spark.scan import is_spark_scan

    assert is_spark_scan(frame)
    python = spark.read.format("lakesink").option("scan", "python")
    assert not is_spark_scan(python.load(lake))
    assert ids(python.load(lake)) == ids(frame)
    assert ids(python.option("versionAsOf", 2).load(lake)) == committed(lake, version=2)
    with pytest.raises(ValueError, match="scan must be one of 'auto', 'spark', 'python', got 'jvm'"):
        spark.read.format("lakesink").option("scan", "jvm").load(lake)


def test_bad_read_options_are_refused_naming_the_way_out(lake: str) -> None:
    """What the driver decides (``plan_read``, which Spark calls for the schema) without Spark;
    one refusal through Spark below shows how it reaches the user."""
    from lakesink.spark.reading import plan_read

    storage, table_id = v3_table(lake)
    Writer(VersionedLogWriter(storage, table_id), W1).append(0)
    cases = [
        ({"versionAsOf": "7"}, "version=7 is beyond the newest version"),
        ({"versionAsOf": "-1"}, "versionAsOf must be a version number >= 0"),
        ({"timestampAsOf": "yesterday"}, "timestampAsOf must be an ISO 8601 time"),
        ({"timestampAsOf": "2001-01-01"}, "no version committed at or before '2001-01-01'"),
        ({"versionAsOf": "0", "timestampAsOf": "2001-01-01"}, "give one of them"),
        ({"versionasof": "0", "mergeSchema": "true"}, r"unknown option\(s\) \['mergeschema'\]"),
        ({"storage_options": "{not json"}, "storage_options must be a JSON object"),
    ]
    for options, complaint in cases:
        with pytest.raises(Exception, match=complaint):
            plan_read({"path": lake, **options})
    assert plan_read({"path": lake, "versionAsOf": "0"}).version == 0
    with pytest.raises(Exception, match=r"not a lakesink table|no lake at"):
        plan_read({"path": os.path.join(lake, "nowhere")})


def test_a_lake_with_no_commit_yet_reads_empty(lake: str) -> None:
    """A lake whose first writer created table.json and nothing more: no rows, no error (the
    read used to pin version -1 and be refused as below the retained range)."""
    from lakesink.spark.reading import plan_read

    v3_table(lake)
    plan = plan_read({"path": lake})
    assert (plan.version, plan.files) == (-1, ())


@pytest.mark.spark
@pytest.mark.spark
def test_spark_s_scan_refuses_a_committed_file_that_is_a_link(spark: Any, lake: str, tmp_path: Any) -> None:
    """Spark's Parquet scan follows links: a committed name swapped for one, pointing at another
    tenant's file, is refused by name before Spark opens it (docs/FORMAT.md, "Trust")."""
    lakesink.register(spark)
    storage, table_id = v3_table(lake)
    Writer(VersionedLogWriter(storage, table_id), W1).append(0)
    name = Lake(lake).files()[0].path
    outside = tmp_path / "other-tenant.parquet"
    os.replace(os.path.join(lake, name), outside)
    os.symlink(outside, os.path.join(lake, name))
    with pytest.raises(Exception, match=f"{name}.*link"):
        spark.read.format("lakesink").option("scan", "spark").load(lake).collect()


def test_a_refused_read_reaches_the_spark_user_naming_the_option(spark: Any, lake: str) -> None:
    lakesink.register(spark)
    storage, table_id = v3_table(lake)
    Writer(VersionedLogWriter(storage, table_id), W1).append(0)
    with pytest.raises(Exception, match="versionAsOf must be a version number >= 0"):
        spark.read.format("lakesink").option("versionAsOf", "-1").load(lake).collect()


def test_files_are_split_into_tasks_of_even_size_that_fill_every_core() -> None:
    """``task_partitions`` (both read doors): about 128 MiB a task at most (each file counted
    4 MiB more, its cost of opening), tasks in multiples of the cores and of even size, the
    files in order, a file in one task."""
    from lakesink.spark.reading import task_partitions

    mib = 1 << 20
    files = [(f"f{i:02d}", 5 * mib) for i in range(43)]  # the bench's 20M rows: 43 files of ~5 MiB
    even = task_partitions(files, parallelism=2)
    assert [len(t.names) for t in even] == [11, 10, 11, 11]  # 387 MiB counted: 4 tasks, 2 waves
    assert [n for t in even for n in t.names] == [name for name, _ in files]
    assert [len(t.names) for t in task_partitions(files[:20], parallelism=2)] == [10, 10]
    big = [(f"g{i:02d}", 100 * mib) for i in range(6)]
    assert [len(t.names) for t in task_partitions(big, parallelism=2)] == [1] * 6  # 104 MiB each: one a task
    huge = [("h", 300 * mib), ("i", 1 * mib)]
    assert [t.names for t in task_partitions(huge, parallelism=1)] == [
        ("h",),
        ("i",),
    ]  # larger than a task: alone
    tiny = [(f"t{i}", 1_000) for i in range(10)]
    assert [len(t.names) for t in task_partitions(tiny, parallelism=2)] == [5, 5]
    assert [len(t.names) for t in task_partitions(tiny, parallelism=64)] == [1] * 10  # not below one open
    assert task_partitions([], parallelism=2) == []
