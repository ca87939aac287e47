"""The Delta Lake view of format-3 epoch lakes (issue 21, item 1): ``_delta_log/`` derived from the
lake's own log, read by deltalake and polars (the oracles), fenced against Delta writers.

deltalake is only ever imported in a subprocess that leaves with ``os._exit`` (FACTS, "Delta
readers": an abort at interpreter exit after a pyarrow read), never in this process nor in
Spark's Python workers (delta-rs panics in forked processes).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakes import SCHEMA, rows, v3_table
from test_reader_v3 import W1, W2, Writer, ids

from lakesink.commit.batches import BatchCommitter
from lakesink.commit.versions import VersionedLogWriter
from lakesink.config import SinkConfig
from lakesink.maintenance import compact, status, verify
from lakesink.views.delta import (
    FENCE_FEATURE,
    DeltaViewUnsupported,
    delta_commit,
    delta_commit_name,
    delta_schema,
)
from lakesink.views.delta_view import STOP_FILE, DeltaView, delta_sync, forget
from lakesink.views.derived import derived_views
from lakesink_reader import read_committed
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.storage import Storage

ORACLE = r"""
import json, os, sys
out = {}
try:
    import duckdb
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake
    path, versions, append = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
    apps = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
    for v in versions:
        dt = DeltaTable(path) if v is None else DeltaTable(path, version=v)
        uris = dt.file_uris()
        got = sorted(pq.read_table(uris).column("id").to_pylist()) if uris else []
        names = sorted(os.path.basename(u) for u in uris)
        entry = {"version": dt.version(), "deltalake": got, "files": names}
        frame = pl.read_delta(path) if v is None else pl.read_delta(path, version=v)
        entry["polars"] = sorted(frame["id"].to_list())
        # DuckDB over deltalake's dataset (DuckDB 2.0's delta extension needs a download).
        con = duckdb.connect()
        con.register("view", dt.to_pyarrow_dataset())
        entry["duckdb"] = sorted(r[0] for r in con.sql("select id from view").fetchall())
        entry["txn"] = {a: dt.transaction_version(a) for a in apps}
        out[str(v)] = entry
    if append:
        try:
            write_deltalake(path, pa.table({"id": pa.array([-1], pa.int64())}), mode="append")
            out["append"] = "accepted"
        except Exception as exc:
            out["append"] = "refused: " + str(exc)[:300]
except BaseException as exc:
    out["error"] = repr(exc)
sys.stdout.write(json.dumps(out))
sys.stdout.flush()
os._exit(0)
"""


def isolated(code: str, *args: str) -> Any:
    """What ``code`` (run as ``python -c code *args``, in a subprocess: Delta readers never run in
    this process) writes to stdout as JSON. The code ends with ``os._exit(0)`` after flushing
    (FACTS, "Delta readers": an abort at interpreter exit after a pyarrow read)."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.stdout, done.stderr[-2000:]
    return json.loads(done.stdout)


def oracle(
    path: str, versions: list[int | None], *, append: bool = False, apps: list[str] | None = None
) -> dict[str, Any]:
    """deltalake's, polars' and DuckDB's rows at each of ``versions`` (None: the latest), and
    deltalake's ``transaction_version`` of each of ``apps``, in a subprocess."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            ORACLE,
            path,
            json.dumps(versions),
            "1" if append else "0",
            json.dumps(apps or []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout, done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout)
    assert "error" not in out, out["error"]
    return out


def viewed_log(storage: Storage, table_id: str, *, create: bool = True) -> VersionedLogWriter:
    forget(storage, table_id)
    return VersionedLogWriter(
        storage, table_id, checkpoint_interval=5, after_commit=DeltaView(storage, table_id, create=create)
    )


def lake_log_digest(storage: Storage) -> dict[str, str]:
    root = Path(storage.url.removeprefix("file://"))
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "_lakesink" / "log").iterdir())
    }


def view_bytes(storage: Storage, version: int) -> bytes:
    return storage.read_bytes(delta_commit_name(version))


def test_a_commit_maps_to_deterministic_delta_bytes(lake: str) -> None:
    storage, table_id = v3_table(lake)
    log = viewed_log(storage, table_id)
    writer = Writer(log, W1)
    writer.append(0)
    writer.append(20)
    metadata = read_table_metadata(storage)
    for version in (0, 1):
        commit = log.read_commit(version)
        assert commit is not None
        data = delta_commit(metadata, commit)
        assert data == delta_commit(metadata, commit) == view_bytes(storage, version)
    first = [json.loads(line) for line in view_bytes(storage, 0).splitlines()]
    kinds = [next(iter(line)) for line in first]
    assert kinds == ["commitInfo", "protocol", "metaData", "txn", "add", "add"]
    protocol, meta = first[1]["protocol"], first[2]["metaData"]
    assert protocol == {
        "minReaderVersion": 1,
        "minWriterVersion": 7,
        "writerFeatures": [FENCE_FEATURE],
    }
    assert meta["id"] == table_id and meta["partitionColumns"] == [] and meta["configuration"] == {}
    assert [f["type"] for f in json.loads(meta["schemaString"])["fields"]] == ["long", "integer", "string"]
    assert first[3]["txn"]["appId"] == W1 and first[3]["txn"]["version"] == 0
    add = first[4]["add"]
    assert add["dataChange"] is True and add["partitionValues"] == {}
    assert json.loads(add["stats"])["numRecords"] == 10
    second = [next(iter(json.loads(line))) for line in view_bytes(storage, 1).splitlines()]
    assert second == ["commitInfo", "txn", "add", "add"]


def test_the_views_started_together_read_each_commit_time_once_between_them(
    lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Delta and Spark views started at once on a lake that had neither need the time of
    every version that added a live file (their ``modificationTime``): on a lake of 100,000
    versions that is 100,000 header reads. The lake's commit times are shared by its views
    (``lakesink.views.memo.CommitTimes``), so each version's header is read once between the
    two, not once per view (session 19: the log-scale bench's first commit, 50 -> ~30 s)."""
    from lakesink.views import delta_view

    storage, table_id = v3_table(lake)
    writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=100), W1)
    for i in range(20):  # versions 0-19, no view: more than the 16 a view fills one by one
        writer.append(i * 100)
    asked: list[int] = []
    real = delta_view.parallel

    def counted(fn: Any, items: Any, threads: int = 16) -> Any:
        asked.extend(items)
        return real(fn, items, threads)

    monkeypatch.setattr(delta_view, "parallel", counted)  # added_times's header reads, both views
    viewed = VersionedLogWriter(
        storage, table_id, checkpoint_interval=100, after_commit=derived_views(storage, table_id)
    )
    Writer(viewed, W2, allow_other_queries=True).append(5000)  # version 20: both views start
    assert storage.exists("_delta_log/00000000000000000020.json")
    assert storage.exists("_spark_metadata/19.compact")
    assert sorted(asked) == list(range(20))  # each once; before: each twice


def test_the_schema_maps_strictly() -> None:
    fine = pa.schema(
        [
            ("b", pa.bool_()),
            ("d", pa.decimal128(12, 3)),
            ("t", pa.timestamp("us", tz="UTC")),
            ("day", pa.date32()),
            ("l", pa.list_(pa.int32())),
            ("m", pa.map_(pa.string(), pa.float64())),
            ("s", pa.struct([("x", pa.binary())])),
        ]
    )
    types = [f["type"] for f in delta_schema(fine)["fields"]]
    assert types[:4] == ["boolean", "decimal(12,3)", "timestamp", "date"]
    assert types[4] == {"type": "array", "elementType": "integer", "containsNull": True}
    for bad in (
        pa.field("u", pa.uint32()),
        pa.field("ns", pa.timestamp("ns", tz="UTC")),
        pa.field("naive", pa.timestamp("us")),
        pa.field("time", pa.time64("us")),
        pa.field("half", pa.float16()),
        pa.field("a b", pa.int64()),
        pa.field("s", pa.struct([("x=1", pa.int64())])),
    ):
        with pytest.raises(DeltaViewUnsupported, match=bad.name.split(" ")[0]):
            delta_schema(pa.schema([bad]))


def test_deltalake_and_polars_read_exactly_the_committed_rows_at_every_version(lake: str) -> None:
    storage, table_id = v3_table(lake)
    log = viewed_log(storage, table_id)
    a, b = Writer(log, W1), Writer(log, W2, allow_other_queries=True)
    a.append(0)  # v0
    b.append(1000)  # v1
    a.append(20)  # v2
    # A stray valid Parquet file with a writer's data-file name: a crashed task's leftover.
    pq.write_table(
        pa.Table.from_batches([rows(5000, 7)]),
        os.path.join(lake, "w1111111111111111-b000000000009-p00000-ffffffffffffffff.parquet"),
    )
    report = compact(lake, target_file_size=1 << 30, min_files=2, check_store=False)
    assert report.version == 3
    versions: list[int | None] = [None, 0, 1, 2, 3]
    expected = {str(v): ids(read_committed(lake, version=v)) for v in versions}
    assert expected["None"] == expected["2"] == expected["3"]
    seen = oracle(lake, versions, append=True)
    for v in versions:
        got = seen[str(v)]
        assert got["deltalake"] == got["polars"] == got["duckdb"] == expected[str(v)], v
    assert seen["None"]["version"] == 3
    assert len(seen["3"]["files"]) == 1 and seen["3"]["files"][0].startswith("c")  # the compaction's output
    assert 5000 not in seen["None"]["deltalake"]  # the stray file is not read
    # The fence: deltalake refuses to append to the view (it would write outside the lake's log).
    assert seen["append"].startswith("refused") and "lakesinkDerivedView" in seen["append"]
    assert not storage.exists(delta_commit_name(4))
    assert delta_sync(storage, write=False).state == "ok"


def test_a_foreign_writer_stops_the_view_and_status_and_verify_say_so(lake: str) -> None:
    storage, table_id = v3_table(lake)
    log = viewed_log(storage, table_id)
    writer = Writer(log, W1)
    writer.append(0)
    writer.append(20)
    assert status(lake).delta_view == "ok"
    # A foreign Delta writer (one that ignores the fence) takes the view's next version.
    storage.put_if_absent(delta_commit_name(2), b'{"commitInfo":{"operation":"WRITE"}}\n')
    before = lake_log_digest(storage)
    assert writer.append(40) == 2  # the lake commit stands
    assert writer.append(60) == 3
    assert lake_log_digest(storage).items() >= before.items()  # the lake's own log: only appended to
    assert storage.exists(STOP_FILE)
    assert not storage.exists(delta_commit_name(3))  # the view is no longer updated
    assert status(lake).delta_view.startswith("foreign")  # type: ignore[union-attr]
    checked = verify(lake)
    assert not checked.ok and not checked.problems and (checked.delta_view or "").startswith("foreign")
    assert delta_sync(storage).state == "foreign"
    # Removing the view and syncing rebuilds it, and writers update it again.
    for f in storage.list("_delta_log"):
        storage.delete(f.name)
    synced = delta_sync(storage)
    assert synced.state == "ok" and synced.written == [0, 1, 2, 3] and not storage.exists(STOP_FILE)
    writer.log = viewed_log(storage, table_id)
    assert writer.append(80) == 4 and storage.exists(delta_commit_name(4))
    assert verify(lake).ok and status(lake).delta_view == "ok"


def test_a_changed_view_commit_is_reported(lake: str) -> None:
    storage, table_id = v3_table(lake)
    writer = Writer(viewed_log(storage, table_id), W1)
    writer.append(0)
    writer.append(20)
    before = lake_log_digest(storage)
    path = os.path.join(lake, delta_commit_name(1))
    Path(path).write_bytes(view_bytes(storage, 1).replace(b'"dataChange":true', b'"dataChange":false'))
    assert status(lake).delta_view.startswith("foreign")  # type: ignore[union-attr]
    report = delta_sync(storage, write=False)
    assert report.state == "foreign" and report.foreign == [1]
    assert lake_log_digest(storage) == before


def test_delta_sync_writes_the_view_of_a_lake_written_without_it(lake: str, capsys: Any) -> None:
    from lakesink.cli import main

    storage, table_id = v3_table(lake)
    plain = VersionedLogWriter(storage, table_id, checkpoint_interval=5)
    writer = Writer(plain, W1)
    for start in range(0, 70, 10):
        writer.append(start)
    assert not storage.list("_delta_log")
    assert status(lake).delta_view == "absent" and verify(lake).ok
    # A compaction continues a view only when there is one: it starts none.
    compact(lake, target_file_size=1 << 30, min_files=2, check_store=False)
    assert not storage.list("_delta_log")
    assert main(["sync-views", "--only", "delta", lake]) == 0
    out, err = capsys.readouterr()
    assert "8 commit(s) written" in out
    # Off a terminal, progress is a plain line at the first step and at each tenth of the way.
    assert err.splitlines() == [f"Delta view versions: {n}/8" for n in (1, 2, 3, 4, 5, 6, 7, 8)]
    metadata = read_table_metadata(storage)
    for version in range(8):
        commit = plain.read_commit(version)
        assert commit is not None and view_bytes(storage, version) == delta_commit(metadata, commit)
    assert delta_sync(storage).written == []  # idempotent


def test_a_lake_deleted_and_recreated_in_one_process_gets_a_view_of_its_own(lake: str) -> None:
    """What a process remembers of a view is keyed by the table id: the new lake at the old
    path starts its view at version 0, with its own table id, and nothing of the old lake."""
    storage, old_id = v3_table(lake)
    writer = Writer(viewed_log(storage, old_id), W1)
    for start in (0, 20, 40):
        writer.append(start)
    shutil.rmtree(lake)
    storage, new_id = v3_table(lake)
    log = VersionedLogWriter(
        storage, new_id, after_commit=DeltaView(storage, new_id, create=True)
    )  # no forget
    Writer(log, W2).append(100)
    assert [f.name.rsplit("/", 1)[-1] for f in storage.list("_delta_log")] == [f"{0:020d}.json"]
    meta = next(
        json.loads(line)["metaData"] for line in view_bytes(storage, 0).splitlines() if b"metaData" in line
    )
    assert meta["id"] == new_id != old_id
    seen = oracle(lake, [None])["None"]
    assert seen["deltalake"] == seen["polars"] == seen["duckdb"] == list(range(100, 120))


def test_the_delta_log_option_and_a_writer_that_fills_a_small_gap(lake: str) -> None:
    assert SinkConfig.from_options({"path": lake, "delta_log": "false"}).sink.delta_log is False
    assert SinkConfig.from_options({"path": lake, "delta_log": "true"}).sink.delta_log is True
    assert SinkConfig.from_options({"path": lake}).sink.delta_log is True
    storage, table_id = v3_table(lake)
    forget(storage, table_id)
    off = BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=W1,
        run="run-0000000000000001",
        checkpoint_interval=100,
        after_commit=derived_views(storage, table_id, delta_log=False),
    )
    off.commit(0, [])
    off.commit(1, [])
    assert not storage.list("_delta_log")
    on = BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=W1,
        run="run-0000000000000001",
        checkpoint_interval=100,
        after_commit=derived_views(storage, table_id),
    )
    on.commit(2, [])  # versions 0 and 1 are written first: a view never has holes
    assert sorted(f.name.rsplit("/", 1)[-1][:20] for f in storage.list("_delta_log")) == [
        f"{v:020d}" for v in range(3)
    ]


def test_a_schema_delta_cannot_take_has_no_view(lake: str) -> None:
    import time
    import uuid

    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.names import TABLE_FILE

    storage, _ = v3_table(lake)
    schema = pa.schema([("id", pa.uint64())])
    meta = TableMetadata(3, "epoch", schema, time.time(), uuid.uuid4().hex)
    Path(lake, TABLE_FILE).write_bytes(meta.to_json())
    table_id = meta.table_id or ""
    forget(storage, table_id)
    BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=W1,
        run="run-0000000000000001",
        checkpoint_interval=100,
        after_commit=derived_views(storage, table_id),
    ).commit(0, [])
    assert not storage.list("_delta_log")
    assert status(lake).delta_view.startswith("unsupported: column 'id' is uint64")  # type: ignore[union-attr]


def test_view_checkpoints_are_read_and_versions_before_them_still_are(lake: str, tmp_path: Path) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    log = viewed_log(storage, table_id)
    writer = Writer(log, W1)
    for i in range(7):
        writer.append(i * 100)  # versions 0..6: a view checkpoint at 5
    pq.write_table(  # a stray valid Parquet file with a writer's data-file name
        pa.Table.from_batches([rows(5000, 7)]),
        os.path.join(lake, "w1111111111111111-b000000000009-p00000-ffffffffffffffff.parquet"),
    )
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 7
    for i in range(8):
        writer.append(10_000 + i * 100)  # versions 8..15: checkpoints at 10 and 15
    names = sorted(f.name.rsplit("/", 1)[-1] for f in storage.list("_delta_log"))
    # Written after their version's commit, then the hint; the one two intervals older is gone.
    assert [n[:20] for n in names if n.endswith(".checkpoint.parquet")] == [f"{10:020d}", f"{15:020d}"]
    hint = json.loads(storage.read_bytes("_delta_log/_last_checkpoint"))
    assert hint["version"] == 15 and hint["numOfAddFiles"] == 1 + 2 * 8 and hint["size"] == 3 + 17
    versions: list[int | None] = [None, 3, 5, 7, 12]
    expected = {str(v): ids(read_committed(lake, version=v)) for v in versions}
    seen = oracle(lake, versions, apps=[W1])
    for v in versions:
        got = seen[str(v)]
        assert got["deltalake"] == got["polars"] == got["duckdb"] == expected[str(v)], v
    assert seen["None"]["version"] == 15 and seen["None"]["txn"] == {W1: 14}
    assert 5000 not in seen["None"]["deltalake"]
    # The checkpoint alone: a copy without the view commits up to it reads the same.
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy)
    for v in range(16):
        (copy / delta_commit_name(v)).unlink()
    alone = oracle(str(copy), [None], apps=[W1])["None"]
    assert alone["deltalake"] == alone["polars"] == alone["duckdb"] == expected["None"]
    assert alone["version"] == 15 and alone["txn"] == {W1: 14}
    # Its adds are the lake's: the sizes, the exact stats, the times of the commits that added them.
    from_commits = {}
    for v in range(16):
        for line in view_bytes(storage, v).splitlines():
            action = json.loads(line)
            if "add" in action:
                from_commits[action["add"]["path"]] = action["add"]
    checkpoint = pq.read_table(os.path.join(lake, "_delta_log", f"{15:020d}.checkpoint.parquet"))
    adds = [a for a in checkpoint.column("add").to_pylist() if a is not None]
    assert len(adds) == 17
    for a in adds:
        original = from_commits[a["path"]]
        assert (a["size"], a["stats"], a["modificationTime"]) == (
            original["size"],
            original["stats"],
            original["modificationTime"],
        )
    assert delta_sync(storage, write=False).state == "ok"


def test_delta_sync_writes_checkpoints_and_starts_the_view_of_a_vacuumed_lake(lake: str) -> None:
    from lakesink.maintenance.vacuum import vacuum

    storage, table_id = v3_table(lake, checkpoint_interval=5)
    plain = VersionedLogWriter(storage, table_id, checkpoint_interval=5)
    writer = Writer(plain, W1)
    for i in range(8):
        writer.append(i * 100)  # versions 0..7, no view
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 8
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 9 and plain.read_header(0) is None  # the log starts at its checkpoint 5
    writer.append(1000)  # version 10
    before = lake_log_digest(storage)
    report = delta_sync(storage)
    assert report.state == "ok", report.detail
    # From the retained floor (8), not the oldest commit still in the log (5): versions 5..7 may
    # name files vacuum deleted (simulation seed 62934).
    assert report.written == list(range(8, 11)) and report.checkpoints == [8, 10], report
    assert lake_log_digest(storage) == before
    versions: list[int | None] = [None, 8, 9]
    seen = oracle(lake, versions)
    for v in versions:
        got, expected = seen[str(v)], ids(read_committed(lake, version=v))
        assert got["deltalake"] == got["polars"] == got["duckdb"] == expected, v
    assert delta_sync(storage).written == [] and delta_sync(storage, write=False).state == "ok"


def test_a_sync_that_dies_halfway_on_a_vacuumed_lake_leaves_a_readable_view(lake: str) -> None:
    """Simulation seed 7083: `sync-views` on a lake whose log starts at a checkpoint wrote the
    view's commits from there first and its checkpoint last; dying in between left view commits
    5 and 6 with neither 0..4 nor a checkpoint, which no Delta reader can open. The checkpoint
    now comes first, as a hook's rebuild writes it."""
    from lakesink.maintenance.vacuum import vacuum
    from lakesink_reader.storage.local import LocalStorage

    class DiesAtSecondCommit(LocalStorage):
        def put_if_absent(self, name: str, data: bytes) -> bool:
            if name == "_delta_log/00000000000000000006.json":
                raise OSError(f"{name}: killed (test)")
            return super().put_if_absent(name, data)

    storage, table_id = v3_table(lake, checkpoint_interval=5)
    writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=5), W1)
    for i in range(6):
        writer.append(i * 100)  # versions 0..5, no view
    vacuum(lake, retain=0, delete=True, force=True, check_store=False)  # version 6; the log starts at 5
    with pytest.raises(OSError, match="killed"):
        delta_sync(DiesAtSecondCommit(lake))
    assert sorted(os.listdir(os.path.join(lake, "_delta_log")))[:2] == [
        "00000000000000000005.checkpoint.parquet",
        "00000000000000000005.json",
    ]
    assert delta_sync(storage).written == [6]
    seen = oracle(lake, [None, 5])
    assert seen["5"]["deltalake"] == ids(read_committed(lake, version=5))
    assert seen["None"]["deltalake"] == seen["None"]["duckdb"] == ids(read_committed(lake))


def test_a_sync_between_vacuums_commit_and_its_truncation_starts_at_the_retained_floor(lake: str) -> None:
    """Simulation seed 62934: vacuum commits its floor, deletes the files only older versions
    need, and truncates their commits last; a sync in between started the view at version 0
    from commits still in the log, whose files were gone, and a lost answer stopped it there: the
    view's newest version listed deleted files. The sync now starts at the retained floor."""
    from test_reader_v3 import compact as compact_versions
    from test_reader_v3 import live_adds

    from lakesink_reader.format.v3.commits import PendingCommit, new_op_token

    storage, table_id = v3_table(lake, checkpoint_interval=5)
    log = VersionedLogWriter(storage, table_id, checkpoint_interval=5)
    writer = Writer(log, W1)
    for i in range(6):
        writer.append(i * 100)  # versions 0..5, no view
    inputs = live_adds(log, 0, 1)
    compact_versions(log, inputs, 0, 40)  # version 6: batches 0 and 1 rewritten
    log.commit(PendingCommit.vacuum(op_token=new_op_token(), retained_from=6))  # version 7
    for gone in inputs:  # vacuum's next step: the files only versions below 6 need
        storage.delete(gone.path)
    assert log.read_header(0) is not None  # ... and its truncation of 0..5 has not come yet
    report = delta_sync(storage)
    assert min(report.written) >= 6 and not os.path.exists(os.path.join(lake, "_delta_log", f"{0:020d}.json"))
    seen = oracle(lake, [None])
    assert seen["None"]["deltalake"] == seen["None"]["duckdb"] == ids(read_committed(lake))


@pytest.mark.spark
def test_a_spark_epoch_writer_keeps_the_views(spark: Any, tmp_path: Path, lake: str) -> None:
    from test_epoch_v3 import add_input, run

    for i in range(3):
        add_input(tmp_path / "in", i, rows=50)
    query = run(spark, tmp_path / "in", lake, tmp_path / "chk")
    assert query.exception() is None
    expected = ids(read_committed(lake))
    assert len(expected) == 150
    assert spark.read.parquet(lake).count() == 150  # Spark's own reader, through _spark_metadata/
    assert status(lake).spark_view == "ok"
    # A compaction (the lake's own command) and a stray file: every reader still reads the same.
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    stray = pa.table({"id": pa.array(range(7), pa.int64()), "label": pa.array(["stray"] * 7)})
    pq.write_table(stray, os.path.join(lake, "part-00000-epoch-000000000009-ffffffffffffffff.parquet"))
    assert spark.read.parquet(lake).count() == 150
    seen = oracle(lake, [None, 0, 2])
    assert seen["None"]["deltalake"] == seen["None"]["duckdb"] == expected
    assert seen["0"]["deltalake"] == ids(read_committed(lake, version=0))
    assert seen["2"]["polars"] == expected
    assert status(lake).delta_view == "ok" and status(lake).spark_view == "ok" and verify(lake).ok
    assert SCHEMA  # (the hand-built lakes' schema; this one is Spark's)
