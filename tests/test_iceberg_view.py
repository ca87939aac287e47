"""The Iceberg view of format-3 epoch lakes (issue 54): ``metadata/`` derived from the lake's log,
read by pyiceberg's ``StaticTable`` and polars ``scan_iceberg`` (the oracles), fenced like the
Delta view (docs/design/iceberg-view.md).

No Spark: the lakes are written through the log's writer with the view's hook, as the Delta
view's tests write theirs. polars plans through pyiceberg (``POLARS_ICEBERG_PLANNER``: its own
planner is a separate package, not installed).
"""

from __future__ import annotations

import json
import os
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from lakes import SCHEMA, rows, v3_name, v3_table
from test_reader_v3 import W1, W2, Writer, ids
from test_trust import measured

from lakesink.cli import main as cli_main
from lakesink.commit.files import WriteOptions
from lakesink.commit.partitioned import PartitionedWriter
from lakesink.commit.versions import VersionedLogWriter
from lakesink.config import SinkConfig
from lakesink.maintenance import compact, status, verify
from lakesink.maintenance.lake_defaults import set_lake_defaults
from lakesink.maintenance.vacuum import vacuum
from lakesink.views import iceberg_avro, iceberg_layout
from lakesink.views.derived import derived_views, maintenance_views
from lakesink.views.iceberg import IcebergViewUnsupported, iceberg_schema
from lakesink.views.iceberg_view import STOP_FILE, IcebergView, forget, iceberg_sync
from lakesink_reader import read_committed
from lakesink_reader.format.schemas import encode_schema
from lakesink_reader.format.table import TableMetadata, read_table_metadata
from lakesink_reader.format.v3.commits import AddFile, PendingCommit
from lakesink_reader.names import TABLE_FILE
from lakesink_reader.storage import Storage, open_storage
from tests.fuzz.mutate import avro_container, avro_file, avro_long, deflated_zeros_after

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")


def static(lake: str, number: int | None = None) -> Any:
    """pyiceberg's table of the view: found from the lake's path (the hint), or metadata ``number``."""
    from pyiceberg.table import StaticTable

    where = lake if number is None else os.path.join(lake, iceberg_layout.metadata_name(number))
    return StaticTable.from_metadata(where)


def iceberg_ids(lake: str, *, snapshot: int | None = None) -> list[int]:
    """The ids pyiceberg reads at the view's newest version (or snapshot ``snapshot``), checked
    against what polars reads of the same snapshot."""
    import polars as pl

    table = static(lake)
    got = sorted(table.scan(snapshot_id=snapshot).to_arrow().column("id").to_pylist())
    frame = pl.scan_iceberg(table, snapshot_id=snapshot).collect()
    assert sorted(frame["id"].to_list()) == got, "polars and pyiceberg read other rows"
    return got


def viewed_log(
    storage: Storage, table_id: str, *, create: bool = True, interval: int = 5
) -> VersionedLogWriter:
    forget(storage, table_id)
    return VersionedLogWriter(
        storage,
        table_id,
        checkpoint_interval=interval,
        after_commit=IcebergView(storage, table_id, create=create),
    )


def hint(storage: Storage) -> int | None:
    return iceberg_layout.read_hint(storage)


def test_pyiceberg_and_polars_read_exactly_the_committed_rows_through_compaction_and_vacuum(
    lake: str,
) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    log = viewed_log(storage, table_id)
    a, b = Writer(log, W1), Writer(log, W2, allow_other_queries=True)
    a.append(0)  # v0
    b.append(1000)  # v1
    a.append(20)  # v2
    assert hint(storage) == 3 and storage.exists("metadata/v3.metadata.json")
    assert iceberg_ids(lake) == ids(read_committed(lake))
    # An older retained version by snapshot id (lake version v = snapshot v + 1).
    assert iceberg_ids(lake, snapshot=2) == ids(read_committed(lake, version=1))
    # ... and by time: each snapshot's time is its lake commit's.
    table = static(lake)
    for v in range(3):
        header = log.read_header(v)
        assert header is not None
        at = table.snapshot_as_of_timestamp(round(header.committed_at * 1000))
        assert at is not None and at.snapshot_id == v + 1
    snap = table.current_snapshot()
    assert snap.snapshot_id == 3 and snap.sequence_number == 3
    assert snap.summary["lakesink.version"] == "2" and snap.summary["operation"].value == "append"
    assert snap.summary["added-data-files"] == "2" and snap.summary["total-records"] == "60"

    # Compaction (the maintenance hook): a `replace` snapshot of the same rows, one file.
    forget(storage, table_id)
    report = compact(lake, target_file_size=1 << 30, min_files=2, check_store=False)
    assert report.version == 3 and hint(storage) == 4
    table = static(lake)
    assert table.current_snapshot().summary["operation"].value == "replace"
    tasks = list(table.scan().plan_files())
    assert len(tasks) == 1 and os.path.basename(tasks[0].file.file_path).startswith("c")
    assert iceberg_ids(lake) == ids(read_committed(lake)) == iceberg_ids(lake, snapshot=3)

    # Vacuum: its own snapshot drops those of the versions below the floor (expiry follows the
    # lake's retention), and what is left reads exactly the lake.
    a.append(40)  # v4
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 5
    floor = log.open().retained_from
    assert floor == 4  # retain=0: the latest version when vacuum started, and its own
    metadata = static(lake).metadata
    assert [s.snapshot_id for s in metadata.snapshots] == [5, 6]  # snapshots of versions 4, 5
    assert [e.snapshot_id for e in metadata.snapshot_log] == [5, 6]
    assert iceberg_ids(lake) == ids(read_committed(lake)) == iceberg_ids(lake, snapshot=5)
    assert iceberg_sync(storage, write=False).state == "ok"
    assert verify(lake).ok and status(lake).iceberg_view == "ok"


def appended_ids(lake: str, after: int, upto: int) -> list[int]:
    """What an incremental append read between snapshots ``after`` and ``upto`` returns (as
    Iceberg's ``IncrementalAppendScan`` plans it): the rows of the files whose manifest entries
    are ``ADDED`` by an ``append`` snapshot in ``(after, upto]``."""
    import pyarrow.parquet as pq

    table = static(lake)
    paths = set()
    for snap in table.metadata.snapshots:
        if after < snap.snapshot_id <= upto and snap.summary["operation"].value == "append":
            entries = table.inspect.entries(snapshot_id=snap.snapshot_id).to_pylist()
            paths |= {
                e["data_file"]["file_path"]
                for e in entries
                if e["status"] == 1 and e["snapshot_id"] == snap.snapshot_id
            }
    return sorted(i for p in paths for i in pq.read_table(p).column("id").to_pylist())


def test_appends_keep_their_parents_manifests_and_incremental_reads_find_exactly_the_appends(
    lake: str,
) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=4)
    log = viewed_log(storage, table_id, interval=4)
    a = Writer(log, W1)
    for i in range(3):
        a.append(i * 100)  # v0..v2
    table = static(lake)
    # Each append adds a manifest of its own files to its parent's: the list grows by one.
    assert [len(table.inspect.manifests().to_pylist())] == [3]
    assert iceberg_ids(lake) == ids(read_committed(lake))
    a.append(300)  # v3: the parent has 3 manifests, under the bound (4): kept
    a.append(400)  # v4: the parent has 4: one manifest of every live file instead
    table = static(lake)
    assert len(table.inspect.manifests().to_pylist()) == 1
    assert iceberg_ids(lake) == ids(read_committed(lake)) and iceberg_ids(lake, snapshot=4) == list(
        i for s in range(0, 400, 100) for i in range(s, s + 20)
    )
    # Incremental reads: exactly the rows appended between two lake versions, also across the
    # rolled-up snapshot (its EXISTING entries are not appends) and a compaction (a `replace`).
    forget(storage, table_id)
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    a.append(500)  # v6
    committed = {v: set(ids(read_committed(lake, version=v))) for v in range(7)}
    for after, upto in ((1, 3), (2, 5), (3, 7), (5, 7), (6, 7)):
        expected = sorted(committed[upto - 1] - committed[after - 1])
        assert appended_ids(lake, after, upto) == expected, (after, upto)
    assert iceberg_sync(storage, write=False).state == "ok"


def test_schema_changes_keep_field_ids_and_partitions_are_identity(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    storage = open_storage(lake)
    table_id = uuid.uuid4().hex
    meta = TableMetadata(3, "epoch", SCHEMA, time.time(), table_id, partition_columns=("bucket",))
    assert storage.put_if_absent(TABLE_FILE, meta.to_json())
    log = viewed_log(storage, table_id)
    names = iter(f"w{i:04d}.parquet" for i in range(1000))

    def append(
        batch: int, start: int, count: int, schema: pa.Schema = SCHEMA, change: str | None = None
    ) -> None:
        writer = PartitionedWriter(storage, schema, ["bucket"], lambda: next(names), WriteOptions())
        data = rows(start, count)
        if schema != SCHEMA:  # the new column: a double derived from the id
            data = data.append_column("score", pa.array([i / 2 for i in range(start, start + count)]))
        writer.write(data)
        adds = [AddFile(f.published.name, f.published.rows, f.published.size, 0, batch, f.published.stats)
                for f in writer.publish()]  # fmt: skip
        pending = PendingCommit.append(writer_id=W1, batch=batch, run="run-0000000000000001", adds=adds,
                                       schema=change)  # fmt: skip
        assert log.commit(pending).status == "committed"

    append(0, 0, 30)
    first = static(lake)
    ids_before = {f.name: f.field_id for f in first.schema().fields}
    spec = first.spec()
    assert [(p.name, p.source_id, str(p.transform)) for p in spec.fields] == [
        ("bucket", ids_before["bucket"], "identity")
    ]
    # One data file per folder, each with its identity partition value; the folders' column is
    # not in the files and Iceberg readers fill it in.
    entries = list(first.scan().plan_files())
    assert sorted(t.file.partition[0] for t in entries) == list(range(7))
    got = first.scan().to_arrow().sort_by("id")
    assert got.column("bucket").to_pylist() == [i % 7 for i in range(30)]
    assert got.column("label").to_pylist() == [f"r{i}" for i in range(30)]
    # A filter on the partition column prunes to its folder's file.
    assert len(list(first.scan(row_filter="bucket == 3").plan_files())) == 1

    wider = SCHEMA.append(pa.field("score", pa.float64()))
    append(1, 100, 14, wider, encode_schema(wider))  # merge_schema: a column added
    table = static(lake)
    assert {f.name: f.field_id for f in table.schema().fields} == {**ids_before, "score": 4}
    assert [s.schema_id for s in table.metadata.schemas] == [0, 1]
    assert table.current_snapshot().schema_id == 1
    got = table.scan().to_arrow().sort_by("id")
    lake_rows = read_committed(lake).sort_by("id")
    assert got.column("id").to_pylist() == lake_rows.column("id").to_pylist()
    assert got.column("score").to_pylist() == lake_rows.column("score").to_pylist()  # nulls, then halves
    assert got.column("bucket").to_pylist() == lake_rows.column("bucket").to_pylist()
    assert iceberg_ids(lake) == ids(lake_rows) and iceberg_ids(lake, snapshot=1) == list(range(30))
    # Statistics prune: no file of the first batch holds an id above 99.
    assert {t.file.record_count for t in table.scan(row_filter="id >= 100").plan_files()} <= {1, 2, 3}


def test_icebergs_java_library_reads_the_view_exactly(tmp_path: Path) -> None:
    """Iceberg's reference implementation (iceberg-core/iceberg-data 1.12, devtools/iceberg_java)
    given the lake's path: a partitioned lake with a schema change, a compaction and two vacuums
    (the second deletes expired snapshots' Avro files) -- the rows at the latest snapshot and at
    an older retained one, the partition column filled
    from the partition values, the new column null in older files, and an incremental append
    scan planning exactly the appended files."""
    from devtools import iceberg_java

    lake = str(tmp_path / "lake")
    storage = open_storage(lake)
    table_id = uuid.uuid4().hex
    meta = TableMetadata(3, "epoch", SCHEMA, time.time(), table_id, partition_columns=("bucket",))
    assert storage.put_if_absent(TABLE_FILE, meta.to_json())
    log = viewed_log(storage, table_id, interval=4)
    names = iter(f"w{i:04d}.parquet" for i in range(1000))
    wider = SCHEMA.append(pa.field("score", pa.float64()))

    def append(batch: int, start: int, change: bool = False) -> None:
        schema = wider if change or batch > 2 else SCHEMA
        writer = PartitionedWriter(storage, schema, ["bucket"], lambda: next(names), WriteOptions())
        data = rows(start, 14)
        if schema == wider:
            data = data.append_column("score", pa.array([i / 2 for i in range(start, start + 14)]))
        writer.write(data)
        adds = [AddFile(f.published.name, f.published.rows, f.published.size, 0, batch, f.published.stats)
                for f in writer.publish()]  # fmt: skip
        pending = PendingCommit.append(writer_id=W1, batch=batch, run="run-0000000000000001", adds=adds,
                                       schema=encode_schema(wider) if change else None)  # fmt: skip
        assert log.commit(pending).status == "committed"

    append(0, 0)  # v0
    append(1, 100)  # v1
    append(2, 200, change=True)  # v2: a column added
    forget(storage, table_id)
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    append(3, 300)  # v4
    forget(storage, table_id)
    assert vacuum(lake, retain=0, delete=True, force=True, check_store=False).version == 5
    append(4, 400)  # v6
    append(5, 500)  # v7
    forget(storage, table_id)
    # The second vacuum deletes Avro files too (the first only metadata files: the oldest it
    # kept still held the older snapshots).
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 8 and any(o.kind == "view_file" and o.name.endswith(".avro") for o in done.files)
    append(6, 600)  # v9
    latest = read_committed(lake).sort_by("id")
    seen = iceberg_java.read(lake, "rows", "rows:9", "column:bucket", "column:score", "appended:8:10")
    assert seen["rows"] == (10, [str(i) for i in latest.column("id").to_pylist()])
    assert seen["rows:9"][1] == [str(i) for i in ids(read_committed(lake, version=8))]
    pairs = zip(latest.column("id").to_pylist(), latest.column("bucket").to_pylist(), strict=True)
    assert seen["column:bucket"][1] == [f"{i}={b}" for i, b in pairs]
    scores = [s.split("=")[1] for s in seen["column:score"][1]]
    assert scores == ["null" if v is None else str(v) for v in latest.column("score").to_pylist()]
    assert "null" in scores and "150.0" in scores  # files from before the change, and after it
    appended = seen["appended:8:10"][1]
    expected = {f.path for f in log.read_commit(9).adds}  # type: ignore[union-attr]
    assert {p.removeprefix(lake + "/") for p in appended} == expected


def test_field_ids_and_types_map_strictly() -> None:
    nested = pa.schema(
        [
            ("s", pa.struct([("x", pa.int32()), ("y", pa.list_(pa.string()))])),
            ("m", pa.map_(pa.string(), pa.int64())),
            ("ts", pa.timestamp("us", tz="UTC")),
        ]
    )
    schema, last = iceberg_schema(nested, {}, 0, 0)
    assert [f.field_id for f in schema.fields] == [1, 2, 3] and last == 8  # s.x s.y s.y.element m.key m.value
    # A column added in front of the nested ones keeps the old ids and takes the next one.
    from lakesink.views.iceberg import field_paths

    grown = pa.schema([*nested, ("n", pa.int64())])
    again, last2 = iceberg_schema(grown, field_paths(schema), last, 1)
    assert field_paths(again) == {**field_paths(schema), "n": 9} and last2 == 9
    for bad in (pa.uint32(), pa.timestamp("ns"), pa.time64("us"), pa.timestamp("ms", tz="UTC")):
        with pytest.raises(IcebergViewUnsupported, match="column 'c'"):
            iceberg_schema(pa.schema([("c", bad)]), {}, 0, 0)


def test_a_schema_iceberg_cannot_take_has_no_view_and_the_lake_commits(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    storage = open_storage(lake)
    table_id = uuid.uuid4().hex
    odd = pa.schema([("id", pa.int64()), ("at", pa.time64("us"))])
    assert storage.put_if_absent(TABLE_FILE, TableMetadata(3, "epoch", odd, time.time(), table_id).to_json())
    log = viewed_log(storage, table_id)
    pending = PendingCommit.append(writer_id=W1, batch=0, run="run-0000000000000001")
    assert log.commit(pending).status == "committed"  # the view is derived: never fails a commit
    assert not iceberg_layout.has_view(storage)
    report = iceberg_sync(storage, create=True)
    assert report.state == "unsupported" and "column 'at'" in report.detail


def test_the_fence_a_late_hook_never_moves_the_view_back_and_a_foreign_file_stops_it(lake: str) -> None:
    storage, table_id = v3_table(lake)
    plain = VersionedLogWriter(storage, table_id, checkpoint_interval=100)
    writer = Writer(plain, W1)
    writer.append(0)  # v0: no view yet
    hook = IcebergView(storage, table_id, create=True)
    forget(storage, table_id)
    late = plain.read_commit(0)
    writer.append(10)  # v1
    state1 = plain.open()
    hook(plain.read_commit(1), state1)  # the view starts at version 1 (snapshot 2)
    assert hint(storage) == 2 and not storage.exists("metadata/v1.metadata.json")
    # The writer of version 0, killed before its view update, comes back: nothing is written
    # behind the newer version, and the hint stays.
    assert late is not None
    forget(storage, table_id)
    hook(late, plain.snapshot(at_most=0).state)
    assert hint(storage) == 2 and not storage.exists("metadata/v1.metadata.json")
    assert iceberg_ids(lake) == ids(read_committed(lake))

    # A foreign writer (an Iceberg catalog's commit) takes the next number: the view stops, the
    # lake is unaffected, verify says so; sync-views resumes once the view is whole again.
    # (It keeps the view's properties, as Iceberg's writers do: only the snapshot tells.)
    foreign = json.loads(storage.read_bytes("metadata/v2.metadata.json"))
    foreign["current-snapshot-id"] = foreign["snapshots"][0]["snapshot-id"] = 7093
    assert storage.put_if_absent("metadata/v3.metadata.json", json.dumps(foreign).encode())
    writer2 = Writer(viewed_log(storage, table_id, interval=100), W1)
    writer2.batch = 2
    writer2.append(20)  # v2: its snapshot would be 3
    assert storage.exists(STOP_FILE)
    assert "snapshot 7093" in json.loads(storage.read_bytes(STOP_FILE))["reason"]
    assert hint(storage) == 2
    assert len(ids(read_committed(lake))) == 60  # the lake took the commit
    report = verify(lake)
    assert not report.ok and report.iceberg_view is not None and "foreign" in report.iceberg_view
    assert (status(lake).iceberg_view or "").startswith("foreign")
    storage.delete("metadata/v3.metadata.json")
    synced = iceberg_sync(storage)
    assert synced.state == "ok" and synced.written == [2] and not storage.exists(STOP_FILE)
    assert iceberg_ids(lake) == ids(read_committed(lake))


def test_a_writer_fills_a_short_gap_so_time_travel_finds_every_retained_version(lake: str) -> None:
    storage, table_id = v3_table(lake)
    writer = Writer(viewed_log(storage, table_id, interval=100), W1)
    writer.append(0)  # v0, with the view
    writer.log = VersionedLogWriter(storage, table_id, checkpoint_interval=100)  # killed before its view
    writer.append(100)  # v1
    writer.append(200)  # v2
    assert hint(storage) == 1
    writer.log = viewed_log(storage, table_id, interval=100)
    writer.append(300)  # v3: versions 1 and 2 are written first, in order
    assert hint(storage) == 4
    assert [s.snapshot_id for s in static(lake).metadata.snapshots] == [1, 2, 3, 4]
    for v in range(4):
        assert iceberg_ids(lake, snapshot=v + 1) == ids(read_committed(lake, version=v)), v
    assert appended_ids(lake, 1, 4) == list(range(100, 120)) + list(range(200, 220)) + list(range(300, 320))


def test_the_option_is_remembered_in_table_json_and_sync_views_starts_the_view(
    lake: str, capsys: Any
) -> None:
    assert SinkConfig.from_options({"path": lake, "iceberg_view": "true"}).sink.iceberg_view is True
    assert SinkConfig.from_options({"path": lake}).sink.iceberg_view is None
    storage, table_id = v3_table(lake)
    plain = VersionedLogWriter(
        storage, table_id, checkpoint_interval=100, after_commit=derived_views(storage, table_id)
    )
    Writer(plain, W1).append(0)  # the default views: no Iceberg view
    assert not iceberg_layout.has_view(storage) and status(lake).iceberg_view is None
    assert all(type(h).__name__ != "IcebergView" for h in maintenance_views(storage, table_id).hooks)
    assert cli_main(["sync-views", lake]) == 0 and not iceberg_layout.has_view(storage)  # not asked for
    # Remembered in table.json (what a writer with the option on does at its start).
    set_lake_defaults(lake, {"iceberg_view": True})
    assert read_table_metadata(storage).iceberg_view is True
    assert json.loads(storage.read_bytes(TABLE_FILE))["iceberg_view"] is True
    capsys.readouterr()
    assert cli_main(["sync-views", lake]) == 0
    assert "Iceberg view (metadata/) ok" in capsys.readouterr().out
    assert hint(storage) == 1 and iceberg_ids(lake) == list(range(20))
    assert any(type(h).__name__ == "IcebergView" for h in maintenance_views(storage, table_id).hooks)


@pytest.mark.spark
def test_a_spark_writer_with_the_option_keeps_the_view_and_the_lake_remembers_it(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    from test_epoch_v3 import add_input, run

    for i in range(2):
        add_input(tmp_path / "in", i, rows=50)
    query = run(spark, tmp_path / "in", lake, tmp_path / "chk", iceberg_view=True)
    assert query.exception() is None
    assert read_table_metadata(open_storage(lake)).iceberg_view is True  # remembered
    assert iceberg_ids(lake) == ids(read_committed(lake)) == list(range(100))
    # A later query that does not set the option keeps the view: the lake says so.
    add_input(tmp_path / "in", 2, rows=50)
    query = run(spark, tmp_path / "in", lake, tmp_path / "chk")
    assert query.exception() is None
    latest = open_storage(lake)
    assert iceberg_ids(lake) == ids(read_committed(lake)) == list(range(150))
    assert static(lake).current_snapshot().snapshot_id == iceberg_layout.snapshot_id(2)
    assert iceberg_sync(latest, write=False).state == "ok" and verify(lake).ok


def test_vacuum_keeps_what_the_view_it_cannot_bring_up_still_lists(lake: str, capsys: Any) -> None:
    """A writer killed after its lake commit, then maintenance that cannot write the view: the
    snapshot every reader finds (the hint's) keeps its files through vacuum, verify fails
    naming sync-views, sync-views repairs it, and a later vacuum deletes what was kept."""
    from test_view_lag import ViewsRefused

    class IcebergRefused(ViewsRefused):
        refused = ("metadata/",)

    storage, table_id = v3_table(lake, checkpoint_interval=4)
    writer = Writer(viewed_log(storage, table_id, interval=4), W1)
    for i in range(4):
        writer.append(i * 100)  # v0..v3, with the view
    writer.log = VersionedLogWriter(storage, table_id, checkpoint_interval=4)  # killed before its view
    assert writer.append(400) == 4 and hint(storage) == 4
    at_three = ids(read_committed(lake, version=3))
    inputs = {f.file.file_path.rsplit("/", 1)[-1] for f in static(lake).scan().plan_files()}
    refused = IcebergRefused(lake)
    forget(storage, table_id)
    assert compact(refused, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    writer.append(1000)  # v6, no view update
    forget(storage, table_id)
    done = vacuum(refused, retain=0, delete=True, force=True, check_store=False)
    assert done.ok and {o.name for o in done.kept if "Iceberg view" in o.reason} == inputs
    assert iceberg_ids(lake) == at_three  # every file of the snapshot readers find is there
    from devtools import iceberg_java

    assert iceberg_java.read(lake, "rows")["rows"] == (4, [str(i) for i in at_three])  # Java's too
    report = verify(lake)
    assert not report.ok and "sync-views" in (report.iceberg_view or "")
    capsys.readouterr()
    assert cli_main(["sync-views", lake, "--only", "iceberg"]) == 0
    assert iceberg_ids(lake) == ids(read_committed(lake)) and verify(lake).ok
    forget(storage, table_id)
    again = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert inputs <= {n for n in again.removed if n.endswith(".parquet")} and again.ok
    assert iceberg_ids(lake) == ids(read_committed(lake))


def view_files(storage: Storage) -> tuple[set[int], set[str]]:
    """The metadata versions in ``metadata/`` and its Avro files."""
    names = {f.name for f in storage.list("metadata")}
    numbers = {iceberg_layout.metadata_number(n) for n in names}
    return {n for n in numbers if n is not None}, {n for n in names if n.endswith(".avro")}


def named_by_metadata(lake: str, numbers: set[int]) -> set[str]:
    """The Avro files that the snapshots of metadata files ``numbers`` name -- their manifest
    lists and the manifests those list -- as pyiceberg reads them (not lakesink's code)."""
    named = set()
    for number in numbers:
        table = static(lake, number)
        for snap in table.metadata.snapshots:
            named.add(snap.manifest_list)
            named |= {m.manifest_path for m in snap.manifests(table.io)}
    return {p.removeprefix(lake + "/") for p in named}


def test_vacuum_deletes_the_view_files_of_expired_snapshots_only_when_no_kept_metadata_names_them(
    lake: str,
) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=3)
    log = viewed_log(storage, table_id, interval=3)
    a = Writer(log, W1)
    for i in range(6):
        a.append(i * 100)  # v0..v5: manifests kept by their children, rolled up every 3
    forget(storage, table_id)
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 6
    a.append(600)  # v7
    # Not lakesink's names: never deleted, whatever they are.
    odd_avro = {"metadata/notes.avro", "metadata/00000000000000000001-x.avro"}
    for odd in (*odd_avro, "metadata/v1.metadata.json.bak"):
        storage.put(odd, b"x")
    first_avro = view_files(storage)[1]
    forget(storage, table_id)
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 8 and log.open().retained_from == 7
    # The view holds snapshots 8 and 9 (lake versions 7, 8): the metadata files of 1..7 went.
    # v8.metadata.json stays (lake version 7's commit point) and still holds snapshots 1..8,
    # written before the floor rose: their Avro files stay until it goes.
    numbers, avro = view_files(storage)
    assert numbers == {8, 9} and first_avro <= avro
    assert {iceberg_layout.avro_snapshot(n) for n in avro - first_avro} == {9}  # the vacuum's own
    gone = {o.name for o in done.files if o.kind == "view_file"}
    assert gone == {f"metadata/v{n}.metadata.json" for n in range(1, 8)} and gone <= set(done.removed)
    a.append(900)  # v9
    a.append(1000)  # v10
    forget(storage, table_id)
    again = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert again.version == 11 and again.ok
    numbers, avro = view_files(storage)
    assert numbers == {11, 12}  # (v11 holds snapshots 8..11, v12 holds 11 and 12)
    # Exactly what a remaining metadata file names is left (and the files lakesink did not name).
    assert avro == named_by_metadata(lake, numbers) | odd_avro
    went = first_avro - avro
    assert went and all(iceberg_layout.avro_snapshot(n) < 8 for n in went)  # type: ignore[operator]
    assert storage.exists("metadata/v1.metadata.json.bak")
    # Readers given the lake's path read the latest and every retained version; each metadata
    # file left reads its own snapshot.
    assert iceberg_ids(lake) == ids(read_committed(lake))
    for v in (10, 11):
        assert iceberg_ids(lake, snapshot=v + 1) == ids(read_committed(lake, version=v))
    for n in numbers:
        assert sorted(static(lake, n).scan().to_arrow().column("id").to_pylist()) == ids(
            read_committed(lake, version=n - 1)
        )
    assert iceberg_sync(storage, write=False).state == "ok" and verify(lake).ok


def test_a_metadata_file_keeps_the_newest_snapshots_beyond_the_floor_and_vacuum_deletes_the_rest(
    lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lakesink.views import iceberg_view

    monkeypatch.setattr(iceberg_view, "SNAPSHOT_MAX", 3)  # (1,000 in production: cheap here)
    storage, table_id = v3_table(lake)
    a = Writer(viewed_log(storage, table_id, interval=100), W1)
    a.append(0)  # v0
    a.append(100)  # v1
    time.sleep(0.02)
    cutoff = time.time()  # vacuum's floor: version 1, the newest committed before it
    time.sleep(0.02)
    for i in range(2, 6):
        a.append(i * 100)  # v2..v5
    metadata = static(lake).metadata
    assert [s.snapshot_id for s in metadata.snapshots] == [4, 5, 6]
    assert [e.snapshot_id for e in metadata.snapshot_log] == [4, 5, 6]
    assert [iceberg_layout.metadata_number(e.metadata_file) for e in metadata.metadata_log] == [4, 5]
    forget(storage, table_id)
    done = vacuum(lake, retain=0, delete=True, force=True, now=cutoff, check_store=False)
    assert done.version == 6 and log_floor(storage, table_id) == 1
    # The view holds snapshots 5..7: the metadata files below go though the lake retains their
    # versions (its reader still reads them); v5 (holding 3..5) keeps snapshot 3's Avro files.
    numbers, avro = view_files(storage)
    assert numbers == {5, 6, 7}
    assert avro == named_by_metadata(lake, numbers)
    # The lists of snapshots 1 and 2 went; their manifests stay, named by their children's lists.
    assert {iceberg_layout.avro_snapshot(n) for n in avro if n.endswith("-list.avro")} == {3, 4, 5, 6, 7}
    assert ids(read_committed(lake, version=1)) == list(range(20)) + list(range(100, 120))
    for v in (4, 5, 6):
        assert iceberg_ids(lake, snapshot=v + 1) == ids(read_committed(lake, version=v))


def test_orphans_deletes_the_view_files_a_metadata_file_dropped_beyond_its_cap(
    lake: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Snapshots beyond the cap leave the view without a vacuum (none ran: the lake retains
    every version), and their files wait: ``lakesink orphans`` finds and, with ``--delete``,
    deletes them as vacuum would -- exactly what no kept metadata file names --, and every
    snapshot the view holds reads as before. The writers' own sweep after a commit leaves them
    (it does not read the view)."""
    from lakesink.maintenance.sweep import sweep
    from lakesink.views import iceberg_view

    monkeypatch.setattr(iceberg_view, "SNAPSHOT_MAX", 3)
    storage, table_id = v3_table(lake, checkpoint_interval=3)
    a = Writer(viewed_log(storage, table_id, interval=3), W1)
    for i in range(8):
        a.append(i * 100)  # v0..v7: v8.metadata.json holds snapshots 6..8
    numbers, avro = view_files(storage)
    assert numbers == set(range(1, 9)) and log_floor(storage, table_id) == 0
    named = named_by_metadata(lake, {6, 7, 8})  # (v6 holds snapshots 4..6)
    # The lists and manifests of snapshots 1..3: snapshot 4 rolled their manifests up (interval 3).
    assert {iceberg_layout.avro_snapshot(n) for n in avro - named} == {1, 2, 3}
    assert any(n.endswith("-m0.avro") for n in avro - named)
    assert not any(o.kind == "view_file" for o in sweep(lake, older_than=3600).findings)
    capsys.readouterr()
    assert cli_main(["orphans", lake, "--json"]) == 0  # a dry run lists them
    listed = {o["name"] for o in json.loads(capsys.readouterr().out)["findings"] if o["kind"] == "view_file"}
    expected = {f"metadata/v{n}.metadata.json" for n in range(1, 6)} | (avro - named)
    assert listed == expected and view_files(storage) == (numbers, avro)
    assert cli_main(["orphans", lake, "--older-than", "1h", "--delete"]) == 0
    assert view_files(storage) == ({6, 7, 8}, named)
    assert iceberg_ids(lake) == ids(read_committed(lake))
    for v in (5, 6):
        assert iceberg_ids(lake, snapshot=v + 1) == ids(read_committed(lake, version=v))
    assert iceberg_sync(storage, write=False).state == "ok" and verify(lake).ok
    capsys.readouterr()
    assert cli_main(["orphans", lake, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_what_a_writer_holds_of_the_view_is_what_readers_parse(
    lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook carries a metadata version on to the next as the models and JSON texts it holds
    (not read, parsed and serialized again at each commit): each file it writes parses to
    exactly the metadata it holds -- through kept manifests, a roll-up, a compaction, vacuum's
    expiry and the cap -- and to what a process that reads it back would make the next from."""
    from pyiceberg.table.metadata import TableMetadataUtil

    from lakesink.views import iceberg_view

    monkeypatch.setattr(iceberg_view, "SNAPSHOT_MAX", 4)
    storage, table_id = v3_table(lake, checkpoint_interval=3)
    log = viewed_log(storage, table_id, interval=3)
    hook = log.after_commit
    assert isinstance(hook, IcebergView)
    a = Writer(log, W1)

    def same() -> None:
        held = hook.known.held
        assert held is not None
        data = storage.read_bytes(iceberg_layout.metadata_name(held.number))
        assert TableMetadataUtil.parse_raw(data) == held.metadata
        again = iceberg_view.held_version(storage, table_id, held.number)
        for mine, read in ((held.snapshot_texts, again.snapshot_texts), (held.log_texts, again.log_texts)):
            assert [json.loads(t) for t in mine] == [json.loads(t) for t in read]

    for i in range(6):
        a.append(i * 100)  # v0..v5
        same()
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 6
    a.append(700)  # v7: on top of the compaction's metadata, which this process's memo holds
    same()
    assert vacuum(lake, retain=0, delete=True, force=True, check_store=False).version == 8
    a.append(900)  # v9
    same()
    assert [s.snapshot_id for s in static(lake).metadata.snapshots] == [8, 9, 10]  # (floor: 7)
    assert iceberg_ids(lake) == ids(read_committed(lake))


def log_floor(storage: Storage, table_id: str) -> int:
    return VersionedLogWriter(storage, table_id, checkpoint_interval=100).open().retained_from


@pytest.mark.parametrize("elsewhere", ["/etc/passwd", "{lake}/metadata/../../outside-list.avro"])
def test_view_files_are_kept_when_what_kept_metadata_names_cannot_be_trusted(
    lake: str, elsewhere: str
) -> None:
    """A kept metadata file naming a manifest list outside the view (a hostile hand): nothing is
    read there, and no Avro file is deleted; the metadata files below the view's oldest snapshot
    still go (that needs nothing read from a list)."""
    storage, table_id = v3_table(lake)
    a = Writer(viewed_log(storage, table_id, interval=100), W1)
    for i in range(3):
        a.append(i * 100)  # v0..v2
    forget(storage, table_id)
    assert vacuum(lake, retain=0, delete=True, force=True, check_store=False).version == 3
    a.append(300)  # v4: snapshot 5, in v5.metadata.json with snapshots 3..5
    doc = json.loads(storage.read_bytes("metadata/v5.metadata.json"))
    assert [s["snapshot-id"] for s in doc["snapshots"]] == [3, 4, 5]
    # Outside the lake, a copy of the list it replaces: were it read, the lists of snapshots 1
    # and 2 would be found unnamed and deleted.
    Path(lake).parent.joinpath("outside-list.avro").write_bytes(
        Path(doc["snapshots"][0]["manifest-list"]).read_bytes()
    )
    doc["snapshots"][0]["manifest-list"] = elsewhere.format(lake=lake)
    storage.put("metadata/v5.metadata.json", json.dumps(doc).encode())
    avro = view_files(storage)[1]
    forget(storage, table_id)
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 5 and done.ok
    # (Untampered, the lists of snapshots 1 and 2 would go: only v5's snapshot 3 names their
    # manifests, and v5 holds the oldest snapshot.)
    assert {o.name for o in done.files if o.kind == "view_file"} == {
        "metadata/v3.metadata.json",
        "metadata/v4.metadata.json",
    }
    numbers, after = view_files(storage)
    assert numbers == {5, 6} and avro <= after
    assert iceberg_ids(lake) == ids(read_committed(lake))


# The store matrix (issue 54, "Done when"): one scenario, run on local disk, S3 (a moto server)
# and HDFS (a MiniDFSCluster), read by pyiceberg, polars and Iceberg's Java library.

SCORED = SCHEMA.append(pa.field("score", pa.float64()))
OLDER, LATEST = 2, 4  # the lake versions the readers are checked at (snapshots 3 and 5)


@dataclass(frozen=True)
class Store:
    """One store's lake and how each reader reaches it."""

    lake: str
    options: dict[str, Any] | None = None  # lakesink's storage options
    pyiceberg: dict[str, str] = field(default_factory=dict)  # StaticTable's properties (its FileIO)
    polars: dict[str, Any] = field(default_factory=dict)  # scan_iceberg's keywords
    java: dict[str, str] = field(default_factory=dict)  # the Java reader's FileIO properties


def local_store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "lake"))


def s3_store(s3: Any) -> Store:
    """An s3:// lake: pyiceberg, polars' own reader and Iceberg's S3FileIO each told the endpoint."""
    from s3server import BUCKET, KEY, SECRET

    pyiceberg = {
        "s3.endpoint": s3.endpoint_url,
        "s3.access-key-id": KEY,
        "s3.secret-access-key": SECRET,
        "s3.region": "us-east-1",
    }
    polars = {
        "aws_endpoint_url": s3.endpoint_url,
        "aws_access_key_id": KEY,
        "aws_secret_access_key": SECRET,
        "aws_region": "us-east-1",
        "aws_allow_http": "true",
    }
    java = {**pyiceberg, "s3.path-style-access": "true", "client.region": "us-east-1"}
    java["http-client.type"] = "urlconnection"
    return Store(
        f"s3://{BUCKET}/lake", dict(s3.storage_options), pyiceberg, {"storage_options": polars}, java
    )


def hdfs_store(hdfs: str) -> Store:
    """An hdfs:// lake: pyiceberg through lakesink's FileIO over hdfs-native (no libhdfs, no
    JVM), polars through pyiceberg's reader (its own has no hdfs://), Java through Hadoop's
    client (HadoopTables)."""
    io = {"py-io-impl": "lakesink.views.iceberg_fileio.HdfsNativeFileIO"}
    return Store(f"{hdfs}/lake", pyiceberg=io, polars={"reader_override": "pyiceberg"})


def matrix_lake(store: Store) -> Storage:
    """The scenario every store runs: a lake partitioned by ``bucket`` (identity), the view on,
    one data file per commit (a commit costs ~2.5 s on one DataNode: each file's close waits),
    five commits that take the view through each feature once:

    - v0, v1: appends of ids 0..4 and 100..104, both in bucket 0
    - v2: compaction of bucket 0's two files into one (a ``replace`` snapshot)
    - v3: an append of ids 200..204 in bucket 1 with a column added (``score``, as
      ``merge_schema`` commits it): the compacted file has no such column, so readers fill it
      with nulls, finding columns by the name mapping (no file holds field ids, nor ``bucket``)
    - v4: vacuum with its floor at v2: the compaction's inputs and the view's snapshots 1 and 2
      (and their metadata files) go; v2 (``OLDER``, snapshot 3, the first schema) stays readable.
    """
    storage = open_storage(store.lake, store.options)
    table_id = uuid.uuid4().hex
    meta = TableMetadata(3, "epoch", SCHEMA, time.time(), table_id, partition_columns=("bucket",))
    assert storage.put_if_absent(TABLE_FILE, meta.to_json())
    log = viewed_log(storage, table_id)

    def append(batch: int, start: int, bucket: int, schema: pa.Schema = SCHEMA) -> None:
        # (A writer's file name: vacuum deletes only files whose producer the log settles.)
        name = v3_name(W1, batch, 0)
        writer = PartitionedWriter(storage, schema, ["bucket"], lambda: name, WriteOptions())
        keys = range(start, start + 5)
        columns = [pa.array(keys, pa.int64()), pa.array([bucket] * 5, pa.int32())]
        columns.append(pa.array([f"r{i}" for i in keys]))
        if schema == SCORED:
            columns.append(pa.array([i / 2 for i in keys]))
        writer.write(pa.record_batch(columns, schema=schema))
        (one,) = [f.published for f in writer.publish()]  # one folder: one file
        adds = [AddFile(one.name, one.rows, one.size, 0, batch, one.stats)]
        change = encode_schema(schema) if schema != SCHEMA else None
        pending = PendingCommit.append(writer_id=W1, batch=batch, run="run-0000000000000001", adds=adds,
                                       schema=change)  # fmt: skip
        assert log.commit(pending).status == "committed"
        published.append(adds[0].path)

    published: list[str] = []
    append(0, 0, bucket=0)  # v0
    append(1, 100, bucket=0)  # v1
    forget(storage, table_id)  # maintenance as another process: it reads the view afresh
    assert compact(storage, target_file_size=1 << 30, min_files=2, check_store=False).version == OLDER
    inputs = {f.path for f in log.read_commit(OLDER).removes}  # type: ignore[union-attr]
    assert inputs == set(published) and all(p.startswith("bucket=0/") for p in inputs)
    time.sleep(0.02)
    cutoff = time.time()  # vacuum's floor: the compaction, the newest version committed before it
    time.sleep(0.02)
    append(2, 200, bucket=1, schema=SCORED)  # v3
    forget(storage, table_id)
    done = vacuum(storage, retain=0, delete=True, force=True, now=cutoff, check_store=False)
    assert done.version == LATEST and done.ok and inputs <= set(done.removed)
    assert log.open().retained_from == OLDER
    assert view_files(storage)[0] == {3, 4, 5}  # the metadata files of snapshots 1 and 2 went
    assert iceberg_sync(storage, write=False).state == "ok"
    return storage


def lake_rows(store: Store, version: int) -> list[dict[str, Any]]:
    """The lake's rows at ``version`` as lakesink's reader reads them, by id, in the schema the
    lake had at that version: Iceberg readers read a snapshot in its own schema, lakesink's
    reader every version in the newest (docs/FORMAT.md), a column added since reading null."""
    table = read_committed(store.lake, version=version, storage_options=store.options)
    names = (SCHEMA if version < 3 else SCORED).names  # (v3 added score)
    assert all(table.column(n).null_count == len(table) for n in set(table.column_names) - set(names))
    return by_id(table.select(names))


def by_id(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda row: int(row["id"]))


def read_by_pyiceberg_and_polars(store: Store) -> Any:
    """pyiceberg's ``StaticTable`` given the lake's path (the hint) and polars' ``scan_iceberg``
    of it read exactly the lake's rows -- every column, the partition column and the added one
    too -- at the latest version and, by snapshot id, at the older retained one (read with its
    own schema: no ``score``). Returns the table."""
    import polars as pl
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(store.lake, properties=store.pyiceberg)
    assert table.current_snapshot().snapshot_id == iceberg_layout.snapshot_id(LATEST)
    assert [s.snapshot_id for s in table.metadata.snapshots] == [3, 4, 5]
    wanted = {LATEST: lake_rows(store, LATEST), OLDER: lake_rows(store, OLDER)}
    # What the scenario made (so that the readers agree on these rows, not on an empty lake):
    # the older version's two files of bucket 0 compacted into one, the latest's bucket 1 added.
    assert [(r["id"], r["bucket"]) for r in wanted[OLDER]] == [(i, 0) for i in [*range(5), *range(100, 105)]]
    assert wanted[LATEST] == [{**r, "score": None} for r in wanted[OLDER]] + [
        {"id": i, "bucket": 1, "label": f"r{i}", "score": i / 2} for i in range(200, 205)
    ]
    for version, snapshot in ((LATEST, None), (OLDER, iceberg_layout.snapshot_id(OLDER))):
        assert by_id(table.scan(snapshot_id=snapshot).to_arrow()) == wanted[version], ("pyiceberg", version)
        frame = pl.scan_iceberg(table, snapshot_id=snapshot, **store.polars).collect()
        assert by_id(frame.to_arrow()) == wanted[version], ("polars", version)
    return table


def read_by_java(store: Store) -> None:
    """Iceberg's Java library, given the lake's path (the hint), reads exactly the lake's rows:
    each column by id at the current snapshot, and at the older retained one by snapshot id."""
    from devtools import iceberg_java

    at = {LATEST: "", OLDER: f":{iceberg_layout.snapshot_id(OLDER)}"}
    wanted = {v: lake_rows(store, v) for v in at}
    requests = [f"column:{c}{at[v]}" for v, want in wanted.items() for c in want[0] if c != "id"]
    seen = iceberg_java.read(store.lake, *requests, properties=store.java)
    for v, want in wanted.items():
        for c in want[0]:
            if c != "id":
                values = [f"{r['id']}={'null' if r[c] is None else r[c]}" for r in want]
                assert seen[f"column:{c}{at[v]}"] == (iceberg_layout.snapshot_id(v), values), (c, v)


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_every_reader_reads_the_lake_exactly_through_each_feature(
    where: str, request: pytest.FixtureRequest
) -> None:
    """The store matrix on local disk and S3 (moto): every file of the view goes through
    lakesink's storage (create-if-absent, the hint's compare-and-swap), and pyiceberg, polars
    and Iceberg's Java library (its own S3FileIO on S3) read exactly the lake's rows at the
    latest and an older retained version, through compaction, vacuum, a schema change and
    partitions (``matrix_lake``). On local disk Iceberg's Java library reads the same features in
    ``test_icebergs_java_library_reads_the_view_exactly``: its JVM (~3.5 s) is spared here."""
    store = (
        local_store(request.getfixturevalue("tmp_path"))
        if where == "local"
        else s3_store(request.getfixturevalue("s3"))
    )
    matrix_lake(store)
    read_by_pyiceberg_and_polars(store)
    if where == "s3":
        read_by_java(store)


@pytest.mark.hdfs
def test_pyiceberg_and_polars_read_the_view_of_a_lake_on_hdfs_without_libhdfs(hdfs: str) -> None:
    """The store matrix on HDFS (a MiniDFSCluster), read by pyiceberg with lakesink's FileIO over
    hdfs-native (``lakesink.views.iceberg_fileio``: no libhdfs, no JVM) and polars through
    pyiceberg's reader; the FileIO survives the pickling pyiceberg's worker threads need."""
    import pickle

    store = hdfs_store(hdfs)
    storage = matrix_lake(store)
    table = read_by_pyiceberg_and_polars(store)
    again = pickle.loads(pickle.dumps(table.io))  # as pyiceberg ships it to its worker threads
    assert again.new_input(f"{store.lake}/{TABLE_FILE}").open().read() == storage.read_bytes(TABLE_FILE)


@pytest.mark.hdfs
@pytest.mark.long  # ~17-23 s (a loaded machine) beside the cluster's start: `make long`
def test_the_view_of_a_lake_on_hdfs_is_read_by_icebergs_java_library(hdfs: str) -> None:
    """The store matrix on HDFS (a MiniDFSCluster), read by Iceberg's Java library given the
    lake's hdfs:// path (Hadoop's client: HadoopTables). Not in make test: the lake's five
    commits (~2.5 s each on one DataNode: a file's close waits, FACTS) and the Java reader's
    HDFS client (~4 s more than on local disk) cost too much there; ``make long`` runs it."""
    store = hdfs_store(hdfs)
    matrix_lake(store)
    read_by_java(store)


def test_the_views_avro_files_are_checked_before_pyiceberg_decodes_them(lake: str) -> None:
    """Session 22: the view's Avro files were decoded by pyiceberg as they came -- a 3 MB
    manifest list of one deflate block inflated to 3 GB, and ``lakesink verify`` to 6 GB.
    ``iceberg_avro.check`` walks a container by its schema before pyiceberg sees it, building
    nothing: what lakesink writes passes, each way to make a few bytes cost much is refused."""
    storage, table_id = v3_table(lake)
    writer = Writer(viewed_log(storage, table_id), W1)
    for n in range(3):
        writer.append(10 * n)
    metadata = Path(lake) / "metadata"
    listed = max(metadata.glob("*-list.avro"))  # the current snapshot's
    for avro in sorted(metadata.glob("*.avro")):
        assert iceberg_avro.check(avro.read_bytes(), avro.name) >= 1
    meta, sync, blocks = avro_container(listed.read_bytes())
    raw = [(n, zlib.decompress(b, -15)) for n, b in blocks]

    def refused(data: bytes, why: str) -> None:
        started = time.monotonic()
        with pytest.raises(iceberg_avro.AvroRefused, match=why):
            iceberg_avro.check(data, "list.avro")
        assert time.monotonic() - started < 5

    bomb = [(n, deflated_zeros_after(b, 1 << 30)) for n, b in raw]
    refused(avro_file(meta, sync, bomb), "inflates to more than 16 MiB")
    refused(avro_file(meta, sync, [(1 << 40, b) for _, b in blocks]), "past what the file may cost")
    refused(avro_file({**meta, "avro.codec": b"bzip2"}, sync, blocks), "codec 'bzip2'")
    deep = '{"type":"array","items":' * 5000 + '"long"' + "}" * 5000
    refused(avro_file({**meta, "avro.schema": deep.encode()}, sync, blocks), "nested deeper")
    refused(listed.read_bytes()[:-20], "sync marker|past")
    # A billion nulls in five bytes: an array's count is checked before its items are walked.
    nulls = b'{"type":"record","name":"r","fields":[{"name":"a","type":{"type":"array","items":"null"}}]}'
    record = avro_long(10**9) + avro_long(0)
    refused(avro_file({"avro.schema": nulls}, sync, [(1, record)]), "past what the file may cost")

    # Through the CLI: the bomb costs verify little, and verify names the file.
    listed.write_bytes(avro_file({**meta, "avro.codec": b"deflate"}, sync, bomb))
    seconds, grown, answer = measured(lake, "verify")
    assert answer.startswith("exit 1") and listed.name in answer and "inflates" in answer, answer
    assert grown < 100 << 20 and seconds < 20, (seconds, grown >> 20)


def test_a_metadata_file_of_many_invalid_values_is_refused_by_their_count(lake: str) -> None:
    """Fuzz ledger case 59370 (session 23): a metadata file whose ``refs`` hold 200,000 keys
    (3.5 MB, under METADATA_VALUES) is refused by pydantic with 200,000 errors, whose text is
    42 MB; splitting it into one line took ``lakesink verify`` from ~150 to ~580 MiB. The
    refusal names the errors' count, and ``errors.one_line`` keeps the head of any text."""
    storage, table_id = v3_table(lake)
    writer = Writer(viewed_log(storage, table_id), W1)
    writer.append(0)
    current = Path(lake) / iceberg_layout.metadata_name(iceberg_layout.newest_number(storage))
    doc = json.loads(current.read_text())
    doc["refs"].update({f"k{i}": i for i in range(200_000)})
    current.write_text(json.dumps(doc))
    seconds, grown, answer = measured(lake, "verify")
    assert answer.startswith("exit 1") and "200000 validation errors for TableMetadataV2" in answer, answer
    assert grown < 200 << 20 and seconds < 20, (seconds, grown >> 20)
