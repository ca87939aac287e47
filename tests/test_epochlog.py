"""The epoch log on its own: records, checkpoint segments, time travel, and a 10,000-epoch table."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink_reader import Lake, read_committed
from lakesink_reader.format.log import CommittedFile, EpochLog, EpochRecord
from lakesink_reader.names import (
    EPOCH_LAST_CHECKPOINT,
    data_file_name,
    epoch_checkpoint_name,
    epoch_record_name,
)
from lakesink_reader.storage import open_storage
from tests.sim.legacy import format2_table

SCHEMA = pa.schema([("id", pa.int64())])


def commit(log: EpochLog, epoch: int, name: str | None = None) -> EpochRecord:
    record = EpochRecord.new(epoch, [CommittedFile(name or f"f{epoch}.parquet", 0, epoch, 1, 1)])
    won, _ = log.append(record)
    assert won
    log.ensure_checkpoint(epoch)
    return record


def test_record_is_create_if_absent_keeps_the_first_and_knows_its_own_retry(tmp_path: Path) -> None:
    log = EpochLog(open_storage(str(tmp_path)))
    first = EpochRecord.new(
        5, [CommittedFile("a.parquet", 0, 5, 10, 100)], source_offsets=[{"x": 1}], query_id="q1"
    )
    assert log.append(first) == (True, first)
    assert log.append(first) == (True, first)  # the same record again: a retry after a lost answer
    other = EpochRecord.new(5, [CommittedFile("b.parquet", 0, 5, 1, 1)], query_id="q1")
    won, found = log.append(other)  # a twin commit of the same epoch: distinct commit id
    assert not won and found == first and found.commit_id != other.commit_id
    assert [f.name for f in log.committed_files()] == ["a.parquet"]
    assert log.record(6) is None
    with pytest.raises(ValueError, match="-1"):
        EpochRecord.new(-1, [])


def test_checkpoints_are_segments_and_a_lost_one_is_rewritten(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    log = EpochLog(storage, checkpoint_interval=2)
    for epoch in range(7):
        commit(log, epoch)
    segments = {e: json.loads(storage.read_bytes(epoch_checkpoint_name(e))) for e in (2, 4, 6)}
    # Each segment holds its own epochs only: the log grows with the epochs, not their square.
    assert {e: [r["epoch"] for r in s["epochs"]] for e, s in segments.items()} == {
        2: [0, 1, 2],
        4: [3, 4],
        6: [5, 6],
    }
    assert segments[6]["previous"] == [2, 4] and segments[6]["first_epoch"] == 5
    storage.delete(epoch_checkpoint_name(4))  # as if the process died between record and checkpoint
    assert log.ensure_checkpoint(4)  # what a replay of epoch 4 does
    assert json.loads(storage.read_bytes(epoch_checkpoint_name(4)))["epochs"] == segments[4]["epochs"]
    assert [f.name for f in log.committed_files()] == [f"f{e}.parquet" for e in range(7)]


def test_log_is_read_from_the_hinted_checkpoint_or_by_listing(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    log = EpochLog(storage, checkpoint_interval=4)
    for epoch in range(11):
        commit(log, epoch)
    assert json.loads(storage.read_bytes(EPOCH_LAST_CHECKPOINT)) == {"epoch": 8}
    via_hint = [e.epoch for e in log.epochs()]
    assert [e.epoch for e in log.epochs(as_of_epoch=2)] == [0, 1, 2]  # below the hint: its segments
    assert [r.epoch for r in log.records(epochs=(3, 9))] == list(range(3, 10))
    storage.delete(EPOCH_LAST_CHECKPOINT)  # a lost hint costs a listing, never a wrong answer
    assert via_hint == [e.epoch for e in log.epochs()] == list(range(11))
    assert log.latest_epoch() == 10
    storage.put(EPOCH_LAST_CHECKPOINT, b'{"epoch": 8}')
    storage.delete(epoch_checkpoint_name(4))  # a segment of the chain is gone: records are the truth
    assert [e.epoch for e in log.epochs()] == list(range(11))


def test_a_format_1_log_with_cumulative_checkpoints_reads_and_grows(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    docs = []
    for epoch in range(5):
        doc = {"format_version": 1, "epoch": epoch, "committed_at": 0.0, "source_offsets": None,
               "query_id": "q",
               "files": [{"path": f"f{epoch}.parquet", "partition": 0, "rows": 1, "bytes": 1}]}  # fmt: skip
        storage.put(epoch_record_name(epoch), json.dumps(doc).encode())
        docs.append({k: v for k, v in doc.items() if k != "format_version"})
    storage.put(
        epoch_checkpoint_name(4), json.dumps({"format_version": 1, "epoch": 4, "epochs": docs}).encode()
    )
    storage.put(EPOCH_LAST_CHECKPOINT, b'{"epoch": 4}')
    log = EpochLog(storage, checkpoint_interval=4)
    assert [e.epoch for e in log.epochs()] == list(range(5))
    for epoch in range(5, 9):
        commit(log, epoch)  # a format-2 writer continues the log: segment 8 covers 5..8
    segment = json.loads(storage.read_bytes(epoch_checkpoint_name(8)))
    assert segment["previous"] == [4] and [r["epoch"] for r in segment["epochs"]] == [5, 6, 7, 8]
    assert [e.epoch for e in log.epochs()] == list(range(9))
    assert [e.epoch for e in log.epochs(as_of_epoch=6)] == list(range(7))


def build_log(root: Path, epochs: int, *, interval: int = 100) -> None:
    """A table of ``epochs`` epochs, one tiny data file each, log written directly."""
    storage = open_storage(str(root))
    format2_table(storage, SCHEMA, "epoch")
    template = _one_row_file(0)
    log = EpochLog(storage, checkpoint_interval=interval)
    segment: list[dict[str, object]] = []
    chain: list[int] = []
    for epoch in range(epochs):
        name = data_file_name(0, epoch, "0" * 16)
        data = template if epoch % 1000 else _one_row_file(epoch)
        (root / name).write_bytes(data)
        doc = EpochRecord(
            epoch, 0.0, (CommittedFile(name, 0, epoch, 1, len(data)),), None, "q", f"{epoch:x}"
        ).to_doc()
        # Plain writes instead of put_if_absent (no fsync per file): this builds a fixture fast,
        # the create-if-absent path is tested above. Checkpoint segments are built the same way.
        (root / epoch_record_name(epoch)).write_text(json.dumps({"format_version": 2, **doc}))
        segment.append(doc)
        if epoch and epoch % interval == 0:
            first = chain[-1] + 1 if chain else 0
            checkpoint = {"format_version": 2, "epoch": epoch, "first_epoch": first, "previous": chain,
                          "epochs": segment}  # fmt: skip
            (root / epoch_checkpoint_name(epoch)).write_text(json.dumps(checkpoint))
            (root / EPOCH_LAST_CHECKPOINT).write_text(json.dumps({"epoch": epoch}))
            chain, segment = [*chain, epoch], []
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
    assert [f.epoch for f in lake.at(epoch=150).files()] == list(range(151))
    assert [f.epoch for f in lake.at(epoch=201).since(epoch=198).files()] == [199, 200, 201]
    assert sorted(Lake(str(root), epoch=2000).since(epoch=1999).to_table().column("id").to_pylist()) == [2000]
    assert read_committed(str(root), epoch=1000).num_rows == 1001
