"""The epoch log on its own: records, checkpoints, time travel, and a 10,000-epoch table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.epochlog import CommittedFile, EpochLog
from lakesink.layout import EPOCH_LAST_CHECKPOINT, committed_name, epoch_checkpoint_name, epoch_record_name
from lakesink.metadata import ensure_table
from lakesink.storage import open_storage
from reader import Lake, read_committed

SCHEMA = pa.schema([("id", pa.int64())])


def test_record_is_create_if_absent_and_keeps_the_first(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    log = EpochLog(storage)
    first = [CommittedFile("a.parquet", 0, 5, 10, 100)]
    assert log.commit(5, first, source_offsets=[{"x": 1}], query_id="q1")
    assert not log.commit(5, [CommittedFile("b.parquet", 0, 5, 1, 1)], query_id="q2")
    record = log.record(5)
    assert record is not None and record.query_id == "q1" and record.source_offsets == [{"x": 1}]
    assert [f.name for f in log.committed_files()] == ["a.parquet"]
    assert log.record(6) is None
    with pytest.raises(ValueError, match="-1"):
        log.commit(-1, [])


def test_checkpoint_lost_to_a_crash_is_written_by_the_replay(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    log = EpochLog(storage, checkpoint_interval=2)
    for epoch in range(3):
        log.commit(epoch, [CommittedFile(f"f{epoch}.parquet", 0, epoch, 1, 1)])
    storage.delete(epoch_checkpoint_name(2))  # as if the process died between record and checkpoint
    assert not log.commit(2, [])  # the replay: record exists ...
    assert storage.exists(epoch_checkpoint_name(2))  # ... and the checkpoint is back
    assert [f.name for f in log.committed_files()] == ["f0.parquet", "f1.parquet", "f2.parquet"]


def test_log_is_read_from_the_hinted_checkpoint_or_by_listing(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    log = EpochLog(storage, checkpoint_interval=4)
    for epoch in range(7):
        log.commit(epoch, [CommittedFile(f"f{epoch}.parquet", 0, epoch, 1, 1)])
    assert json.loads(storage.read_bytes(EPOCH_LAST_CHECKPOINT)) == {"epoch": 4}
    via_hint = [e.epoch for e in log.epochs()]
    assert [e.epoch for e in log.epochs(as_of_epoch=2)] == [0, 1, 2]  # below the hint: listed
    storage.delete(EPOCH_LAST_CHECKPOINT)  # a lost hint costs a listing, never a wrong answer
    assert via_hint == [e.epoch for e in log.epochs()] == list(range(7))
    assert log.latest_epoch() == 6


def build_log(root: Path, epochs: int, *, interval: int = 100) -> None:
    """A table of ``epochs`` epochs, one tiny data file each, log written directly."""
    storage = open_storage(str(root))
    ensure_table(storage, SCHEMA, "epoch")
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array([0], pa.int64())}), sink)
    template = sink.getvalue().to_pybytes()
    log = EpochLog(storage, checkpoint_interval=interval)
    records: list[dict[str, object]] = []
    for epoch in range(epochs):
        name = committed_name(0, epoch, "0" * 16)
        data = template if epoch % 1000 else _one_row_file(epoch)
        (root / name).write_bytes(data)
        doc = {
            "format_version": 1,
            "epoch": epoch,
            "committed_at": 0.0,
            "source_offsets": None,
            "query_id": "q",
            "files": [{"path": name, "partition": 0, "rows": 1, "bytes": len(data)}],
        }
        # Plain writes instead of put_if_absent (no fsync per file): this builds a fixture fast,
        # the create-if-absent path is tested above. Checkpoints are built the same way.
        (root / epoch_record_name(epoch)).write_text(json.dumps(doc))
        records.append({k: v for k, v in doc.items() if k != "format_version"})
        if epoch and epoch % interval == 0:
            checkpoint = {"format_version": 1, "epoch": epoch, "epochs": records}
            (root / epoch_checkpoint_name(epoch)).write_text(json.dumps(checkpoint))
            (root / EPOCH_LAST_CHECKPOINT).write_text(json.dumps({"epoch": epoch}))
    assert log.latest_epoch() == epochs - 1


def _one_row_file(epoch: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array([epoch], pa.int64())}), sink)
    return sink.getvalue().to_pybytes()


def test_ten_thousand_epochs_open_from_the_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    root.mkdir()
    (root / "_lakesink" / "epochs").mkdir(parents=True)
    build_log(root, 10_000)
    start = time.perf_counter()
    lake = Lake(str(root))
    files = lake.files()
    elapsed = time.perf_counter() - start
    print(f"\n10,000-epoch table: Lake(...) + files() in {elapsed * 1000:.0f} ms")
    assert len(files) == 10_000
    assert [f.epoch for f in files] == list(range(10_000))
    assert all(f.state == "committed" and f.rows == 1 for f in files)
    assert len(lake.epochs()) == 10_000
    # Time travel and incremental reads cut at the right epochs, across checkpoint boundaries.
    assert [f.epoch for f in lake.files(as_of_epoch=150)] == list(range(151))
    assert [f.epoch for f in lake.files(epochs=(199, 201))] == [199, 200, 201]
    assert sorted(read_committed(str(root), epochs=(2000, 2000)).column("id").to_pylist()) == [2000]
    assert read_committed(str(root), as_of_epoch=1000).num_rows == 1001
