"""The Spark view of format-3 epoch lakes (issue 21, item 2): ``_spark_metadata/``, derived from the
lake's own log, so that ``spark.read.parquet(lake)`` reads exactly the committed files -- and,
in one test, every reader of the lake (Spark, deltalake, polars, DuckDB) against
``read_committed``, on a lake with a compaction and a stray file, at its latest version and
older ones.

Lakes are built with the library (``VersionedLogWriter`` and the views' hook, as a writer commits);
``tests/test_delta_view.py`` has the real Spark writer.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakes import rows, v3_table
from test_delta_view import oracle
from test_reader_v3 import W1, W2, Writer, ids

from lakesink.commit.batches import BatchCommitter
from lakesink.commit.versions import VersionedLogWriter
from lakesink.config import SinkConfig
from lakesink.maintenance import compact, status, verify
from lakesink.views import delta_view
from lakesink.views.derived import derived_views
from lakesink.views.spark_metadata_view import (
    ANCHOR_DIR,
    SPARK_DIR,
    STOP_FILE,
    LostRace,
    base_uri,
    forget,
    parse_batch,
    read_layout,
    spark_sync,
    write_version,
)
from lakesink_reader import read_committed
from lakesink_reader.storage import Storage

STRAY = "w1111111111111111-b000000000009-p00000-ffffffffffffffff.parquet"


def viewed_log(storage: Storage, table_id: str, *, delta_log: bool = True) -> VersionedLogWriter:
    forget(storage, table_id)
    delta_view.forget(storage, table_id)
    return VersionedLogWriter(
        storage,
        table_id,
        checkpoint_interval=5,
        after_commit=derived_views(storage, table_id, delta_log=delta_log),
    )


def batches(storage: Storage) -> list[str]:
    """The names Spark reads as batches, by id."""
    names = [f.name.rsplit("/", 1)[-1] for f in storage.list(SPARK_DIR)]
    return sorted(names, key=lambda n: int(n.split(".")[0]))


def files_of(storage: Storage, name: str) -> dict[str, int]:
    base = base_uri(storage)
    out = {}
    for entry in parse_batch(storage.read_bytes(f"{SPARK_DIR}/{name}")):
        path = str(entry["path"])
        assert path.startswith(base + "/") and entry["action"] == "add" and entry["isDir"] is False
        assert os.path.exists(urlparse(path).path)  # an absolute URI Spark can open
        out[path[len(base) + 1 :]] = int(entry["size"])  # type: ignore[call-overload]
    return out


def live(lake: str, version: int | None = None) -> dict[str, int]:
    from lakesink_reader import Lake

    return {f.name: int(f.size or 0) for f in Lake(lake).at(version=version).files()}


def lake_log_digest(lake: str) -> dict[str, str]:
    folder = Path(lake, "_lakesink", "log")
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_compaction_jumps_to_a_compact_batch_and_the_interval_is_pinned(lake: str) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    writer = Writer(viewed_log(storage, table_id, delta_log=False), W1)
    for i in range(3):
        writer.append(i * 100)  # versions 0..2
    # The first batch is the compact 19, pinned by the empty compact 9: K = 10 for every reader.
    assert batches(storage) == ["9.compact", "19.compact", "20", "21"]
    assert storage.read_bytes(f"{SPARK_DIR}/9.compact") == b"v1"
    layout = read_layout(storage)
    assert layout.version_of(21) == 2 and layout.batch_of(1) == 20
    adds = files_of(storage, "21")
    assert len(adds) == 2 and all(name.startswith("w") for name in adds)
    # Placing a version where another lakesink process placed another one is a lost race (look
    # again), not a foreign writer.
    vlog = VersionedLogWriter(storage, table_id)
    with pytest.raises(LostRace):
        write_version(storage, vlog, vlog.read_commit(1), 20, jump=False)  # type: ignore[arg-type]
    # A compaction removes files: only a compact batch can say so, so the view jumps to 29 --
    # after an earlier attempt wrote its anchor and died (the same bytes: carried on, not foreign).
    anchor = json.dumps({"batch": 29, "table_id": table_id, "version": 3}, sort_keys=True).encode()
    assert storage.put_if_absent(f"{ANCHOR_DIR}/{29:020d}.json", anchor)
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    assert not storage.exists(STOP_FILE)
    assert batches(storage) == ["19.compact", "20", "21", "29.compact"]  # pin gone: 19 and 29 pin K
    assert files_of(storage, "29.compact") == live(lake) and len(live(lake)) == 1
    assert read_layout(storage).version_of(29) == 3
    for i in range(10):
        writer.append(1000 + i * 100)  # versions 4..13: batches 30..38, then the compact 39
    assert batches(storage)[-3:] == ["37", "38", "39.compact"]
    assert files_of(storage, "39.compact") == live(lake)
    assert "29.compact" in batches(storage) and "21" not in batches(storage)  # older ones deleted
    assert sorted(f.name.rsplit("/", 1)[-1][:20] for f in storage.list(ANCHOR_DIR)) == [
        f"{29:020d}",
        f"{39:020d}",
    ]
    report = spark_sync(storage, write=False)
    assert (report.state, report.view_version, report.batch) == ("ok", 13, 39)
    # A process that knows no commit times (a restarted writer) carries each file's time over
    # from the previous compact batch: the same time in 49.compact as in 39.compact.
    forget(storage, table_id)
    writer.log = viewed_log(storage, table_id, delta_log=False)
    for i in range(10):
        writer.append(5000 + i * 100)  # versions 14..23: batches 40..48, then the compact 49

    def times(name: str) -> dict[str, int]:
        entries = parse_batch(storage.read_bytes(f"{SPARK_DIR}/{name}"))
        return {str(e["path"]): int(e["modificationTime"]) for e in entries}  # type: ignore[call-overload]

    before, after = times("39.compact"), times("49.compact")
    assert len(before) == 21 and len(after) == 41 and set(before) < set(after)
    assert {p: after[p] for p in before} == before


def test_paths_are_absolute_uris_as_spark_names_them() -> None:
    from types import SimpleNamespace

    def uri(url: str) -> str:
        return base_uri(SimpleNamespace(url=url))  # type: ignore[arg-type]

    assert uri("s3://bucket/lakes/a b") == "s3a://bucket/lakes/a%20b"  # Hadoop's S3 client
    assert uri("/data/lake #1") == "file:///data/lake%20%231"
    assert uri("hdfs://nn:8020/data/lake") == "hdfs://nn:8020/data/lake"


def test_a_compact_batch_is_one_spark_entry_per_live_file_in_path_order() -> None:
    """The Arrow-built compact batch, byte for byte against Spark's line format written one
    entry at a time: names that need quoting, missing sizes and times, a sliced table."""
    from urllib.parse import quote

    from lakesink.views.spark_metadata_view import BLOCK_SIZE, compact_batch, parse_batch

    paths = [
        "c00-a.parquet",
        "day=2026-11-22/country=FR é/x%y.parquet",
        "w01-b000000000001-p00000-ff.parquet",
    ]
    live = pa.table({"path": paths, "bytes": pa.array([10, None, 3_000_000_000], pa.int64())})
    stamps = pa.array([1_795_000_000_000, 5, None], pa.int64())
    base = "s3a://bucket/a%20lake"
    for table, times in ((live, stamps), (live.slice(1), stamps[1:]), (live.slice(0, 0), stamps[:0])):
        lines = [
            json.dumps(
                {"path": f"{base}/{quote(p, safe='/')}", "size": s or 0, "isDir": False,
                 "modificationTime": t or 0, "blockReplication": 1, "blockSize": BLOCK_SIZE, "action": "add"},
                separators=(",", ":"),
            )
            for p, s, t in zip(table.column("path").to_pylist(), table.column("bytes").to_pylist(),
                               times.to_pylist(), strict=True)
        ]  # fmt: skip
        data = compact_batch(base, table, times)
        assert data == ("v1" + "".join("\n" + line for line in lines)).encode()
        assert [e["path"] for e in parse_batch(data)] == [
            f"{base}/{quote(p, safe='/')}" for p in table["path"].to_pylist()
        ]


def test_a_foreign_batch_stops_the_view_and_sync_views_rebuilds_it(lake: str, capsys: Any) -> None:
    from lakesink.cli import main

    storage, table_id = v3_table(lake, checkpoint_interval=5)
    log = viewed_log(storage, table_id, delta_log=False)
    writer = Writer(log, W1)
    writer.append(0)
    writer.append(20)  # batches 19.compact, 20
    assert status(lake).spark_view == "ok"
    # Another writer (Spark's own file sink, say) takes the next batch id.
    foreign = {"path": f"{base_uri(storage)}/{STRAY}", "size": 1, "isDir": False, "modificationTime": 0,
               "blockReplication": 1, "blockSize": 1, "action": "add"}  # fmt: skip
    storage.put_if_absent(f"{SPARK_DIR}/21", b"v1\n" + json.dumps(foreign).encode())
    before = lake_log_digest(lake)
    assert writer.append(40) == 2  # the lake commit stands
    assert writer.append(60) == 3
    assert lake_log_digest(lake).items() >= before.items()  # the lake's own log: only appended to
    assert storage.exists(STOP_FILE) and batches(storage)[-1] == "21"  # no longer updated
    assert (status(lake).spark_view or "").startswith("foreign")
    checked = verify(lake)
    assert not checked.ok and not checked.problems and (checked.spark_view or "").startswith("foreign")
    assert main(["sync-views", lake, "--only", "spark"]) == 1
    # Removing _spark_metadata/ and syncing rebuilds it at the latest version; writers resume.
    for f in storage.list(SPARK_DIR) + storage.list(ANCHOR_DIR):
        storage.delete(f.name)
    capsys.readouterr()
    assert main(["sync-views", lake, "--only", "spark"]) == 0
    assert "Spark view (_spark_metadata/) ok" in capsys.readouterr().out
    assert not storage.exists(STOP_FILE)
    # (a short history is written again in order from version 0; a long one as one compact)
    assert batches(storage) == ["9.compact", "19.compact", "20", "21", "22"]
    assert files_of(storage, "19.compact") == live(lake, 0) and files_of(storage, "22") == {
        name: size for name, size in live(lake).items() if name not in live(lake, 2)
    }
    assert writer.append(80) == 4 and batches(storage)[-1] == "23"
    assert status(lake).spark_view == "ok" and verify(lake).ok


def test_the_spark_metadata_option_and_a_view_started_on_a_written_lake(lake: str) -> None:
    assert SinkConfig.from_options({"path": lake, "spark_metadata": "false"}).sink.spark_metadata is False
    assert SinkConfig.from_options({"path": lake}).sink.spark_metadata is True
    storage, table_id = v3_table(lake)
    forget(storage, table_id)
    off = BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=W1,
        run="run-0000000000000001",
        checkpoint_interval=100,
        after_commit=derived_views(storage, table_id, spark_metadata=False),
    )
    for batch in range(20):
        off.commit(batch, [])
    assert not storage.list(SPARK_DIR) and status(lake).spark_view == "absent"
    # A writer with the view on starts it at its first commit: far behind, as one compact batch
    # of the live files at its version (a short history is written in order from version 0).
    on = BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=W1,
        run="run-0000000000000001",
        checkpoint_interval=100,
        after_commit=derived_views(storage, table_id),
    )
    on.commit(20, [])
    assert batches(storage) == ["9.compact", "19.compact"] and read_layout(storage).version_of(19) == 20
    on.commit(21, [])
    assert batches(storage)[-1] == "20" and spark_sync(storage, write=False).state == "ok"


@pytest.mark.spark
def test_every_reader_reads_exactly_the_committed_rows(spark: Any, lake: str) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    log = viewed_log(storage, table_id)
    a, b = Writer(log, W1), Writer(log, W2, allow_other_queries=True)

    def spark_rows() -> int:
        return int(spark.read.parquet(lake).count())

    for i in range(6):
        (a if i % 2 == 0 else b).append(i * 100)  # versions 0..5
    # A stray valid Parquet file with a writer's data-file name (a crashed task's leftover).
    pq.write_table(pa.Table.from_batches([rows(5000, 7)]), os.path.join(lake, STRAY))
    assert spark_rows() == read_committed(lake).num_rows == 120
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 6
    assert spark_rows() == read_committed(lake).num_rows == 120  # the inputs are gone for Spark too
    for i in range(10):
        a.append(10_000 + i * 100)  # versions 7..16: past a compact batch, a view checkpoint at 15
    assert spark_rows() == read_committed(lake).num_rows == 320
    # Whatever the reader's own compact interval, the view's two newest compacts pin it.
    spark.conf.set("spark.sql.streaming.fileSink.log.compactInterval", "3")
    try:
        assert spark_rows() == 320
    finally:
        spark.conf.unset("spark.sql.streaming.fileSink.log.compactInterval")
    # Without the view, Spark lists the folder: the compacted-away inputs and the stray file too.
    hidden = Path(lake, "_hidden_spark_metadata")
    Path(lake, SPARK_DIR).rename(hidden)
    try:
        assert spark_rows() == 120 + 120 + 7 + 200
    finally:
        hidden.rename(Path(lake, SPARK_DIR))
    versions: list[int | None] = [None, 3, 6, 12]
    seen = oracle(lake, versions)
    for v in versions:
        got, expected = seen[str(v)], ids(read_committed(lake, version=v))
        assert got["deltalake"] == got["polars"] == got["duckdb"] == expected, v
    assert 5000 not in seen["None"]["deltalake"]
    assert status(lake).spark_view == "ok" and status(lake).delta_view == "ok" and verify(lake).ok
    # Vacuum deletes the compacted-away inputs (and commits a version): Spark reads on.
    from lakesink.maintenance.vacuum import vacuum

    assert vacuum(lake, retain=0, delete=True, force=True, check_store=False).version == 17
    assert spark_rows() == read_committed(lake).num_rows == 320
    assert status(lake).spark_view == "ok"
