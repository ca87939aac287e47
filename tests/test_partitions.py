"""Partitioned lakes (issue 21, item 3): ``partition_by`` / ``.partitionBy(...)`` in epoch mode.

Files go under Hive-style folders (``day=1/label=FR/``) named as Spark names them; every reader
gets the values back from the path the log lists: lakesink's reader (pruning by filter), Spark's
own reader through the Spark view, and deltalake, polars and DuckDB through the Delta view.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_delta_view import isolated, oracle

import lakesink
from lakesink import SchemaMismatchError
from lakesink.commit.files import WriteOptions
from lakesink.commit.partitioned import PartitionedWriter, split_by_folder
from lakesink.config import SinkConfig
from lakesink.maintenance import status, verify
from lakesink_reader import Lake, read_all, read_committed
from lakesink_reader.errors import CorruptFileError
from lakesink_reader.format.partitions import (
    NULL_TEXT,
    check_partition_columns,
    escape,
    partition_dir,
    partition_texts,
    unescape,
)
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.storage import open_storage

#: Labels that need escaping, a space, unicode, a '%', and null.
LABELS = ["FR", "a/b=c", None, "日本 x", "100%", "q?#*"]


def add_input(folder: Path, index: int, rows: int = 60) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = list(range(index * rows, (index + 1) * rows))
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([LABELS[i % len(LABELS)] for i in ids], pa.string()),
            "day": pa.array([datetime.date(2026, 11, 22 + i % 2) for i in ids], pa.date32()),
        }
    )
    path = folder / f"in-{index:04d}.parquet"
    pq.write_table(table, path)
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # file i is batch i


def stream(spark: Any, folder: Path) -> Any:
    return (
        spark.readStream.schema("id long, label string, day date")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(folder))
        .repartition(2)
    )


def expected_rows(batches: int, rows: int = 60) -> list[tuple[int, str | None, datetime.date]]:
    ids = range(batches * rows)
    return [(i, LABELS[i % len(LABELS)], datetime.date(2026, 11, 22 + i % 2)) for i in ids]


def write(spark: Any, source: Path, lake: str, checkpoint: Path, **options: Any) -> None:
    """One availableNow run of ``write_stream`` over ``source``; it must end without error."""
    query = lakesink.write_stream(
        stream(spark, source), lake, checkpoint_location=str(checkpoint), trigger={"availableNow": True},
        **options,
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(
        zip(*(table.column(c).to_pylist() for c in ("id", "label", "day")), strict=True), key=lambda r: r[0]
    )


# The layout ------------------------------------------------------------------------------------


def test_folder_names_escape_as_spark_does_and_read_back_exactly() -> None:
    assert escape("a/b=c") == "a%2Fb%3Dc"
    assert escape("100%") == "100%25"
    assert escape("日本 x") == "日本 x"  # spaces and unicode stay, as Spark keeps them
    assert escape("x\ny\x7f{[]^'\"") == "x%0Ay%7F%7B%5B%5D%5E%27%22"
    for text in ["a/b=c", "100%", "%2F", "日本 x", "q?#*", "x\ny\x7f{[]^:\\"]:
        assert unescape(escape(text)) == text
    folder = partition_dir(["day", "label"], ["2026-11-22", None])
    assert folder == f"day=2026-11-22/label={NULL_TEXT}"
    assert partition_texts(f"{folder}/f.parquet", ["day", "label"]) == {"day": "2026-11-22", "label": None}
    with pytest.raises(ValueError, match="empty string"):
        partition_dir(["label"], [""])
    with pytest.raises(ValueError, match="use for null"):
        partition_dir(["label"], [NULL_TEXT])
    with pytest.raises(ValueError, match="is not 'label=<value>'"):
        partition_texts("other=x/f.parquet", ["label"])


def test_partition_columns_are_checked_by_name_and_type() -> None:
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us")), ("label", pa.string())])
    assert check_partition_columns(schema, ["label"], "the stream") == ("label",)
    with pytest.raises(ValueError, match=r"names \['nope'\], which the stream does not have"):
        check_partition_columns(schema, ["nope"], "the stream")
    with pytest.raises(ValueError, match=r"'ts' is timestamp\[us\].*to_date\(ts\)"):
        check_partition_columns(schema, ["ts"], "the stream")
    with pytest.raises(ValueError, match="more than once"):
        check_partition_columns(schema, ["label", "label"], "the stream")
    with pytest.raises(ValueError, match="at least one column"):
        check_partition_columns(schema, ["id", "ts", "label"], "the stream")
    with pytest.raises(TypeError, match="list of column names"):
        check_partition_columns(schema, "label", "the stream")
    config = SinkConfig.from_options({"path": "/tmp/x", "partition_by": "day, label"})
    assert config.sink.partition_by == ("day", "label")
    assert SinkConfig.from_options(config.to_options()).sink.partition_by == ("day", "label")
    assert SinkConfig.from_options({"path": "/x", "partition_by": '["a,b"]'}).sink.partition_by == ("a,b",)


def test_a_task_splits_rows_by_folder_within_its_memory_and_open_file_bounds(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("label", pa.string()), ("n", pa.int32())])
    batch = pa.record_batch(
        [pa.array(range(12), pa.int64()), pa.array(["b", "a", None] * 4), pa.array([1, 2] * 6, pa.int32())],
        schema=schema,
    )
    groups = split_by_folder(batch, ["label", "n"], ["id"])
    assert {folder: g.column(0).to_pylist() for folder, g in groups} == {
        "label=a/n=1": [4, 10],
        "label=a/n=2": [1, 7],
        "label=b/n=1": [0, 6],
        "label=b/n=2": [3, 9],
        f"label={NULL_TEXT}/n=1": [2, 8],
        f"label={NULL_TEXT}/n=2": [5, 11],
    }  # each folder's rows, in their order, without the partition columns
    assert all(g.schema.names == ["id"] for _, g in groups)
    storage = open_storage(str(tmp_path / "lake"))
    names = iter(f"f{i}.parquet" for i in range(100))
    writer = PartitionedWriter(
        storage, schema, ["label"], lambda: next(names), WriteOptions(row_group_bytes=1024, max_open_files=2)
    )
    for _ in range(3):
        writer.write(batch)  # three folders, two open at a time: one closes and opens again
        assert sum(w.pending_bytes for w in writer._open.values()) <= 1024
    files = writer.publish()
    folders = [f.folder for f in files]
    assert len(files) > 3 and set(folders) == {"label=a", "label=b", f"label={NULL_TEXT}"}
    assert sum(f.published.rows for f in files) == 36
    for f in files:
        assert pq.read_schema(os.path.join(storage.url, f.published.name)).names == ["id", "n"]


# Spark, end to end -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def day_label_lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One lake the module's readers share (one Spark write, not one per test): three batches
    through ``format("lakesink")`` and ``.partitionBy("day", "label")``. Its Spark view names its
    files by absolute path, so Spark reads it where it was written; the only change made to it
    there is a stray file that no log-aware reader reads. A test that removes files works on a
    copy (``copy_of``), so one test's damage never shows in another's."""
    work = tmp_path_factory.mktemp("day-label")
    lakesink.register(spark)
    source = work / "in"
    for i in range(3):
        add_input(source, i)
    lake = str(work / "lake")
    query = (
        stream(spark, source).writeStream.format("lakesink").partitionBy("day", "label")
        .option("checkpointLocation", str(work / "chk")).trigger(availableNow=True).start(lake)
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    return lake


def copy_of(lake: str, tmp_path: Path) -> str:
    """A copy of ``lake`` for one test. Its own log and reader name files relative to its root;
    its Spark view (absolute paths) still names the original's: read the copy with lakesink."""
    copy = str(tmp_path / "lake")
    shutil.copytree(lake, copy)
    return copy


def test_a_partitioned_lake_reads_the_same_in_every_reader(spark: Any, day_label_lake: str) -> None:
    lake = day_label_lake
    meta = read_table_metadata(open_storage(lake))
    assert meta.partition_columns == ("day", "label")
    table_json = json.loads(Path(lake, "_lakesink/table.json").read_text())
    assert table_json["partition_columns"] == ["day", "label"] and table_json["reader_features"] == [
        "partitions"
    ]
    folders = sorted(str(p.relative_to(lake)) for p in Path(lake).glob("day=*/label=*"))
    expected = expected_rows(3)
    assert folders == sorted({partition_dir(["day", "label"], [r[2].isoformat(), r[1]]) for r in expected})
    assert "day=2026-11-23/label=a%2Fb%3Dc" in folders and "day=2026-11-22/label=100%25" in folders
    assert not list(Path(lake).glob("*.parquet"))  # nothing in the root
    for f in Path(lake).glob("day=*/label=*/*.parquet"):
        assert pq.read_schema(f).names == ["id"]  # the folders hold the partition values

    assert rows_of(read_committed(lake)) == expected
    assert read_committed(lake).schema.names == ["id", "label", "day"]
    # A stray valid Parquet file with a writer's file name in a partition folder: no log-aware
    # reader reads it.
    stray = Path(lake, "day=2026-11-22/label=FR/w0000000000000000-b000000000009-p00000-ffffffff.parquet")
    pq.write_table(pa.table({"id": pa.array([-1, -2], pa.int64())}), stray)
    assert rows_of(read_committed(lake)) == expected
    all_rows = read_all(lake)
    assert len(all_rows) == len(expected) + 2  # read_all sees it, as published and not committed

    # Spark's own reader, through the Spark view: the partition columns from the folders.
    frame = spark.read.parquet(lake)
    assert frame.count() == len(expected)
    spark_rows = sorted((r["id"], r["label"], r["day"]) for r in frame.collect())
    assert spark_rows == expected
    assert frame.where("label = 'a/b=c'").count() == len([r for r in expected if r[1] == "a/b=c"])
    # lakesink's own Spark reader, through the log: the same rows, and at an older version,
    # through Spark's Parquet scan of the pinned files and through the Python data source.
    from lakesink.spark.scan import is_spark_scan

    lakesink.register(spark, warm_up=False)
    for scan in ("spark", "python"):
        ours = spark.read.format("lakesink").option("scan", scan).load(lake)
        assert is_spark_scan(ours) == (scan == "spark")
        assert ours.columns == ["id", "label", "day"]
        assert sorted((r["id"], r["label"], r["day"]) for r in ours.collect()) == expected
        assert ours.where("label = 'a/b=c'").count() == len([r for r in expected if r[1] == "a/b=c"])
        older = spark.read.format("lakesink").option("scan", scan).option("versionAsOf", 0).load(lake)
        assert sorted(r["id"] for r in older.collect()) == sorted(
            read_committed(lake, version=0).column("id").to_pylist()
        )

    # deltalake, polars and DuckDB, through the Delta view: the same ids, at each version.
    seen = oracle(lake, [None, 0, 1])
    assert (
        seen["None"]["deltalake"]
        == seen["None"]["polars"]
        == seen["None"]["duckdb"]
        == [r[0] for r in expected]
    )
    assert seen["0"]["deltalake"] == sorted(read_committed(lake, version=0).column("id").to_pylist())
    assert seen["1"]["polars"] == sorted(read_committed(lake, version=1).column("id").to_pylist())
    values = delta_values(lake)
    assert sorted(values, key=str) == sorted({(r[1], r[2].isoformat()) for r in expected}, key=str)
    assert status(lake).delta_view == "ok" and status(lake).spark_view == "ok"
    assert verify(lake).ok


def delta_values(lake: str) -> list[tuple[str | None, str]]:
    """The (label, day) pairs polars reads through the Delta view, in a subprocess."""
    code = (
        "import json, os, sys, polars as pl\n"
        "f = pl.read_delta(sys.argv[1]).select('label', 'day').unique()\n"
        "sys.stdout.write(json.dumps([[r[0], r[1].isoformat()] for r in f.iter_rows()]))\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    return [tuple(v) for v in isolated(code, lake)]


def test_a_filter_on_partition_columns_opens_only_their_folders(tmp_path: Path, day_label_lake: str) -> None:
    lake = copy_of(day_label_lake, tmp_path)
    wanted = pc.field("label") == "a/b=c"
    expected = [r for r in expected_rows(3) if r[1] == "a/b=c"]
    assert rows_of(read_committed(lake, filter=wanted)) == expected
    fragments = list(Lake(lake).dataset().get_fragments(filter=wanted))
    assert fragments and all("/label=a%2Fb%3Dc/" in f.path for f in fragments)
    # The proof that the other folders are never opened: without them, the filtered read still
    # works, and an unfiltered one fails on the first missing file.
    for folder in Path(lake).glob("day=*/label=*"):
        if folder.name != "label=a%2Fb%3Dc":
            shutil.rmtree(folder)
    assert rows_of(read_committed(lake, filter=wanted)) == expected
    with pytest.raises(CorruptFileError, match="missing"):
        read_committed(lake)


def test_partitioning_is_the_lakes_and_bad_values_fail_the_batch(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    source = tmp_path / "in"
    add_input(source, 0)

    def start(**options: Any) -> Any:
        return lakesink.write_stream(
            stream(spark, source), lake, checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True}, **options,
        )  # fmt: skip

    with pytest.raises(ValueError, match=r"'ts' is|names \['nope'\], which the stream does not have"):
        start(partition_by=["nope"])
    query = start(partition_by=["day"])
    query.awaitTermination(300)
    assert query.exception() is None
    with pytest.raises(SchemaMismatchError, match=r"partitioned by \['day'\].*partition_by \['label'\]"):
        start(partition_by=["label"])
    add_input(source, 1)
    query = start()  # no partition_by: the lake's own
    query.awaitTermination(300)
    assert query.exception() is None
    assert len(read_committed(lake)) == 120 and all(p.name.startswith("day=") for p in Path(lake).glob("*=*"))
    # An empty string cannot be a folder name apart from null: the batch fails, naming the fix.
    other = tmp_path / "lake2"
    bad = tmp_path / "bad"
    bad.mkdir()
    empty = pa.table({"id": pa.array([1], pa.int64()), "label": [""], "day": pa.array([None], pa.date32())})
    pq.write_table(empty, bad / "in.parquet")
    query = lakesink.write_stream(
        stream(spark, bad), str(other), checkpoint_location=str(tmp_path / "chk2"),
        trigger={"availableNow": True}, partition_by=["label"],
    )  # fmt: skip
    with pytest.raises(Exception, match=r"partition column 'label' holds an empty string"):
        query.awaitTermination(300)
    assert len(read_committed(str(other))) == 0
    # Spark does not hand a foreach sink .partitionBy: refused before anything starts, naming
    # the writer's own option.
    from lakesink import LakeForeachWriter

    with pytest.raises(ValueError, match=r"LakeForeachWriter\(path, partition_by=\['label'\]\)"):
        stream(spark, source).writeStream.foreach(LakeForeachWriter(str(tmp_path / "fe"))).partitionBy(
            "label"
        ).option("checkpointLocation", str(tmp_path / "chk3")).start()


def test_compaction_sweeps_and_vacuum_keep_to_the_partition_folders(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    from lakesink.maintenance import compact, sweep
    from lakesink.maintenance.vacuum import vacuum

    source = tmp_path / "in"
    for i in range(3):
        add_input(source, i)
    write(spark, source, lake, tmp_path / "chk", partition_by=["label"])
    expected = expected_rows(3)
    before = sorted(str(p.relative_to(lake)) for p in Path(lake).glob("label=*/*.parquet"))
    report = compact(lake, target_file_size=1 << 30, min_files=2, check_store=False)
    assert report.version == 3 and len(report.outputs) == len(LABELS)  # one bin per folder
    for out in report.outputs:
        inputs = [b for b in report.bins if out.path.startswith(b.inputs[0].path.rpartition("/")[0] + "/")]
        assert len(inputs) == 1 and out.path.rpartition("/")[2].startswith("c")  # in its inputs' folder
        assert pq.read_schema(os.path.join(lake, out.path)).names == ["id", "day"]
    assert rows_of(read_committed(lake)) == expected
    assert sorted((r["id"], r["label"], r["day"]) for r in spark.read.parquet(lake).collect()) == expected
    assert oracle(lake, [None])["None"]["deltalake"] == [r[0] for r in expected]

    # Leftovers of killed tasks: a staged file in a folder no commit names, a published file of a
    # settled batch that its commit does not list. The sweep finds both in their folders.
    live = sorted(str(p.relative_to(lake)) for p in Path(lake).glob("label=*/c*.parquet"))
    writer_file = next(n for n in before if "/w" in n).rpartition("/")[2]
    settled_name = "label=FR/" + writer_file.rsplit("-", 1)[0] + "-0000000a.parquet"
    pq.write_table(pa.table({"id": pa.array([-1], pa.int64())}), Path(lake, settled_name))
    new_folder = Path(lake, "label=new")
    new_folder.mkdir()
    staged = new_folder / f".{writer_file.rsplit('-', 1)[0]}-0000000b.parquet.0000000b.uncommitted"
    staged.write_bytes(b"partial")
    os.utime(staged, (1_000_000_000, 1_000_000_000))
    assert any(f.state == "staged" and f.name.startswith("label=new/") for f in Lake(lake).files("read_all"))
    found = sweep(lake, older_than=3600, check_store=False)
    names = {o.name for o in found.findings}
    assert settled_name in names and "label=new/" + staged.name[1:].rsplit(".", 2)[0] in names, names
    sweep(lake, older_than=3600, delete=True, check_store=False)
    assert not staged.exists() and not Path(lake, settled_name).exists()
    # Vacuum removes the compacted-away inputs from their folders; the outputs stay.
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 4
    left = sorted(str(p.relative_to(lake)) for p in Path(lake).glob("label=*/*.parquet"))
    assert left == live and not set(left) & set(before)
    assert rows_of(read_committed(lake)) == expected and verify(lake).ok


@pytest.mark.parametrize("store", ["s3", "hdfs"])
def test_a_partitioned_lake_on_a_store(spark: Any, tmp_path: Path, store: str, request: Any) -> None:
    from lakesink.maintenance import sweep

    if store == "s3":
        from s3server import BUCKET

        server = request.getfixturevalue("s3")
        lake, options = f"s3://{BUCKET}/partitioned-{tmp_path.name}", dict(server.storage_options)
    else:
        lake, options = request.getfixturevalue("hdfs"), {}
    source = tmp_path / "in"
    for i in range(2):
        add_input(source, i)
    query = lakesink.write_stream(
        stream(spark, source), lake, checkpoint_location=str(tmp_path / "chk"), storage_options=options,
        trigger={"availableNow": True}, partition_by=["day", "label"],
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    expected = expected_rows(2)
    assert rows_of(read_committed(lake, storage_options=options)) == expected
    # Spark's batch read through lakesink, on the store (storage options as one JSON option).
    frame = spark.read.format("lakesink").option("storage_options", json.dumps(options)).load(lake)
    assert sorted((r["id"], r["label"], r["day"]) for r in frame.collect()) == expected
    # And as a stream into a local lake (issue 34): the partition columns from the folders.
    copy = str(tmp_path / "copy")
    source_stream = (
        spark.readStream.format("lakesink").option("storage_options", json.dumps(options))
        .option("maxFilesPerTrigger", 2).load(lake)
    )  # fmt: skip
    followed = lakesink.write_stream(
        source_stream, copy, checkpoint_location=str(tmp_path / "chk-copy"), trigger={"availableNow": True}
    )
    followed.awaitTermination(300)
    assert followed.exception() is None, followed.exception()
    assert rows_of(read_committed(copy)) == expected
    if store == "hdfs":
        # Through Spark's own Parquet scan (issue 52, item 3): Spark's Hadoop client reads HDFS
        # by itself; the partition columns from the folders again.
        scanned = str(tmp_path / "scanned")
        query = lakesink.follow_lake(
            spark, lake, scanned, checkpoint_location=str(tmp_path / "chk-scanned"),
            trigger={"availableNow": True}, source_options={"maxFilesPerTrigger": 2},
        )  # fmt: skip
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        assert rows_of(read_committed(scanned)) == expected
    wanted = (pc.field("day") == datetime.date(2026, 11, 23)) & pc.field("label").is_null()
    assert rows_of(read_committed(lake, storage_options=options, filter=wanted)) == [
        r for r in expected if r[2].day == 23 and r[1] is None
    ]
    # A killed task's staged file in a folder no commit names: read_all reports it, the sweep
    # finds it there (by age) and removes it.
    storage = open_storage(lake, options)
    staged = storage.stage("day=2026-11-24/label=new/w0000000000000000-b000000000009-p00000-0000000c.parquet")
    staged.write(b"PAR1 partial")
    staged.flush()
    assert any(f.state == "staged" and "label=new" in f.name for f in Lake(lake, options).files("read_all"))
    assert not sweep(lake, older_than=3600, storage_options=options, check_store=False).findings
    found = sweep(lake, older_than=0, storage_options=options, delete=True, check_store=False)
    assert [o.name.rpartition("/")[0] for o in found.findings] == ["day=2026-11-24/label=new"]
    assert not [f for f in Lake(lake, options).files("read_all") if f.state != "committed"]
    assert rows_of(read_committed(lake, storage_options=options)) == expected
    assert verify(lake, storage_options=options).ok


# Foreach mode ----------------------------------------------------------------------------------


def test_foreach_writes_a_file_per_folder_under_one_name_and_a_replay_adds_nothing(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    from faults import FailFirstAttempt

    from lakesink import LakeForeachWriter
    from lakesink.maintenance import sweep

    source = tmp_path / "in"
    for i in range(2):
        add_input(source, i)
    df = stream(spark, source)

    def run(writer: LakeForeachWriter, checkpoint: str = "chk") -> None:
        query = (
            df.writeStream.foreach(writer).option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(300)
        assert query.exception() is None

    # A task fails mid-partition on its first attempt: its retry's files stand, once.
    run(FailFirstAttempt(lake, schema=df.schema, partition_by=["label"], after_rows=7))
    expected = expected_rows(2)
    assert rows_of(read_committed(lake)) == expected
    assert Lake(lake).mode == "foreach" and Lake(lake).metadata.partition_columns == ("label",)
    files = [p.relative_to(lake) for p in Path(lake).glob("label=*/*.parquet")]
    assert all(p.name.startswith("part-") and p.name.count("-epoch-") == 1 for p in files)
    # One (partition, epoch) name, in every folder its rows fell into (the retry replaced none:
    # the failed attempt published nothing).
    folders_of = {name: {str(p.parent) for p in files if p.name == name} for name in {p.name for p in files}}
    assert max(len(f) for f in folders_of.values()) == len(LABELS)
    # The same query again from its checkpoint replays nothing new; a replay of a (partition,
    # epoch) finds its files in their folders.
    add_input(source, 2)
    run(LakeForeachWriter(lake, schema=df.schema))  # no partition_by: the lake's
    assert rows_of(read_committed(lake)) == expected_rows(3)
    assert rows_of(read_committed(lake, filter=pc.field("label") == "FR")) == [
        r for r in expected_rows(3) if r[1] == "FR"
    ]
    assert sorted(
        (r["id"], r["label"], r["day"]) for r in spark.read.parquet(lake).collect()
    ) == expected_rows(3)
    assert not sweep(lake, older_than=0, check_store=False).findings and verify(lake).ok
    with pytest.raises(SchemaMismatchError, match=r"partitioned by \['label'\]"):
        LakeForeachWriter(lake, schema=df.schema, partition_by=["day"])
    # More folders than max_open_files in one task: the task fails before publishing anything.
    other = str(tmp_path / "narrow")
    from lakesink import WriteOptions

    narrow = LakeForeachWriter(
        other, schema=df.schema, partition_by=["label"], write_options=WriteOptions(max_open_files=2)
    )
    query = (
        df.writeStream.foreach(narrow).option("checkpointLocation", str(tmp_path / "chk-narrow"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    with pytest.raises(Exception, match="more than max_open_files=2 partition folders"):
        query.awaitTermination(300)
    assert not list(Path(other).glob("label=*/*.parquet"))
