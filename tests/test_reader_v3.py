"""The reader on format-3 lakes (docs/design/format-v3.md, landing step 4), built by hand: data
files from FileWriter, commits through VersionedLogWriter, table.json with format_version 3."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from lakes import SCHEMA, epoch_lake, v3_file, v3_name, v3_table
from test_v3_checkpoint import CountingStorage

import lakesink_reader.lake as reader_lake
from lakesink.commit.versions import VersionedLogWriter
from lakesink_reader import Lake, read_committed
from lakesink_reader.format.v3 import checkpoint as cp
from lakesink_reader.format.v3.commits import AddFile, Continuation, PendingCommit, RemoveFile, new_op_token
from lakesink_reader.storage import Storage

RUN = "run-0000000000000001"
W1 = "11111111-1111-4111-8111-111111111111"
W2 = "22222222-2222-4222-8222-222222222222"


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


class Writer:
    """Appends batches of ``files`` files of ``rows`` ids each to a v3 lake, as a writer would."""

    def __init__(self, log: VersionedLogWriter, writer_id: str, **options: Any) -> None:
        self.log, self.id, self.options = log, writer_id, options
        self.batch = 0

    def append(self, start: int, *, files: int = 2, rows: int = 10, offsets: Any = None) -> int:
        adds = [
            v3_file(self.log.storage, v3_name(self.id, self.batch, p), start + p * rows, rows, partition=p)
            for p in range(files)
        ]
        pending = PendingCommit.append(
            writer_id=self.id, batch=self.batch, run=RUN, adds=adds, source_offsets=offsets, **self.options
        )
        result = self.log.commit(pending)
        assert result.status == "committed" and result.version is not None
        self.options.pop("continues", None)
        self.batch += 1
        return result.version


def compact(
    log: VersionedLogWriter, inputs: list[AddFile], start: int, count: int, trigger: str | None = None
) -> int:
    """Rewrite ``inputs`` (ids ``start..start+count-1``, in order) as one file; returns its version.
    ``trigger="auto"``: as a writer's auto-compaction commits it."""
    op = new_op_token()
    output = v3_file(log.storage, f"c{op}-00000-{'0' * 16}.parquet", start, count)
    base = log.open().version
    result = log.commit(
        PendingCommit.compact(
            op_token=op,
            base_version=base,
            removes=[RemoveFile(f.path, f.rows, f.size) for f in inputs],
            adds=[output],
            trigger=trigger,
        )
    )
    assert result.status == "committed" and result.version is not None
    return result.version


def live_adds(log: VersionedLogWriter, *versions: int) -> list[AddFile]:
    return [a for v in versions for a in log.read_commit(v).adds]  # type: ignore[union-attr]


@pytest.fixture
def v3(lake: str) -> tuple[Storage, VersionedLogWriter]:
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    return storage, VersionedLogWriter(storage, table_id, checkpoint_interval=5)


def test_a_v3_lake_reads_its_live_files_versions_writers_and_offsets(
    lake: str, v3: tuple[Storage, VersionedLogWriter]
) -> None:
    _, log = v3
    assert read_committed(lake).num_rows == 0 and Lake(lake).versions() == []  # no commit yet
    w1 = Writer(log, W1)
    for batch in range(3):
        w1.append(batch * 20, offsets=[{"ev": {"0": (batch + 1) * 20}}])
    opened = Lake(lake)
    assert opened.version == 2 and ids(opened.to_table()) == list(range(60))
    assert opened.schema.equals(SCHEMA)
    files = opened.files()
    assert [(f.version, f.batch, f.epoch, f.partition, f.writer) for f in files] == [
        (v, v, v, p, W1) for v in range(3) for p in range(2)
    ]
    assert all(f.state == "committed" and f.rows == 10 and f.size and f.path.startswith(lake) for f in files)
    versions = opened.versions()
    assert [(v.version, v.kind, v.writer, v.batch, v.add_rows) for v in versions] == [
        (v, "append", W1, v, 20) for v in range(3)
    ]
    [writer] = opened.writers()
    assert (writer.id, writer.first_batch, writer.last_batch, writer.last_version) == (W1, 0, 2, 2)
    assert opened.offsets() == [{"ev": {"0": 60}}] == opened.offsets(writer.tag) == opened.offsets(W1)
    assert ids(read_committed(lake, version=1)) == list(range(40))
    assert ids(Lake(lake).since(version=0).to_table()) == list(range(20, 60))
    assert [e.epoch for e in opened.epochs()] == [0, 1, 2]  # one writer: epochs are its batches
    assert ids(read_committed(lake, epoch=0)) == list(range(20))
    assert ids(Lake(lake).since(epoch=1).to_table()) == list(range(40, 60))
    with pytest.raises(ValueError, match=r"version=7 is beyond the newest version .* \(2\)"):
        read_committed(lake, version=7)
    with pytest.raises(ValueError, match=r"epoch=9 is beyond the newest committed epoch"):
        read_committed(lake, epoch=9)
    with pytest.raises(ValueError, match="select by one of them"):
        Lake(lake, version=1, epoch=1)
    with pytest.raises(ValueError, match=r"since epoch=0 reads up to a pinned epoch; pin it by epoch"):
        opened.at(version=2).since(epoch=0).files()
    with pytest.raises(ValueError, match=r"since version=2 is after the pinned version=1"):
        opened.at(version=1).since(version=2).files()
    with pytest.raises(ValueError, match="pinned at version=1"):
        opened.at(version=1).refresh()
    assert opened.at(version=1).since(version=1).files() == []  # nothing after the pin
    assert ids(opened.at(version=1).since(version=-1).to_table()) == list(range(40))
    assert opened.version == 2 and opened.at(version=1).version == 1 and opened.at(epoch=0).version == 0
    with pytest.raises(ValueError, match="is not a writer"):
        opened.offsets("nobody")


def test_a_compaction_keeps_the_rows_and_older_versions_read_the_old_files(
    lake: str, v3: tuple[Storage, VersionedLogWriter]
) -> None:
    _, log = v3
    w1 = Writer(log, W1)
    for batch in range(3):
        w1.append(batch * 20)
    inputs = live_adds(log, 0, 1)
    compacted = compact(log, inputs, 0, 40)
    w1.append(60)
    opened = Lake(lake)
    assert compacted == 3 and opened.version == 4
    now = opened.files()
    assert ids(opened.to_table()) == list(range(80))
    assert {f.name for f in now} & {f.path for f in inputs} == set()
    [output] = [f for f in now if f.version == compacted]
    assert (output.writer, output.batch, output.epoch, output.partition, output.rows) == (
        None,
        None,
        None,
        None,
        40,
    )
    before = opened.at(version=2).files()
    assert {f.name for f in before} == {f.path for f in live_adds(log, 0, 1, 2)}  # the old files
    assert ids(opened.at(version=2).to_table()) == ids(opened.at(version=3).to_table()) == list(range(60))
    assert ids(opened.since(version=-1).to_table()) == list(range(80))  # compactions add no rows
    assert ids(opened.at(version=3).since(version=2).to_table()) == []
    assert ids(opened.at(epoch=2).to_table()) == list(range(60))  # as of the version of batch 2
    assert [v.kind for v in opened.versions()] == ["append", "append", "append", "compact", "append"]
    assert opened.versions()[3].remove_files == 4


def test_two_writers_have_versions_but_no_epochs(lake: str, v3: tuple[Storage, VersionedLogWriter]) -> None:
    _, log = v3
    w1, w2 = Writer(log, W1), Writer(log, W2, allow_other_queries=True)
    w1.append(0, offsets=[{"a": 1}])
    w2.append(100, offsets=[{"b": 1}])
    w1.append(20, offsets=[{"a": 2}])
    opened = Lake(lake)
    assert ids(opened.to_table()) == [*range(40), *range(100, 120)]
    assert [w.id for w in opened.writers()] == [W1, W2]
    assert opened.offsets(W2) == [{"b": 1}] and opened.offsets(W1[:8] + W1[9:13] + W1[14:18]) == [{"a": 2}]
    with pytest.raises(ValueError, match=f"2 writers that are not retired.*{W1}.*{W2}"):
        opened.offsets()
    for select in (opened.at(epoch=0), opened.since(epoch=0)):
        with pytest.raises(ValueError, match=f"one writer lineage.*{W1}.*{W2}.*at\\(version=\\)"):
            select.to_table()
    with pytest.raises(ValueError, match="one writer lineage"):
        opened.epochs()
    assert ids(Lake(lake, version=1).since(version=0).to_table()) == list(range(100, 120))
    assert [(f.version, f.writer, f.batch) for f in opened.since(version=0).files()] == [
        (1, W2, 0),
        (1, W2, 0),
        (2, W1, 1),
        (2, W1, 1),
    ]


def test_a_continued_writer_is_one_lineage_whose_epochs_run_on(
    lake: str, v3: tuple[Storage, VersionedLogWriter]
) -> None:
    _, log = v3
    w1 = Writer(log, W1)
    w1.append(0, offsets=[{"ev": {"0": 20}}])
    w1.append(20, offsets=[{"ev": {"0": 40}}])
    w2 = Writer(log, W2, continues=Continuation(W1, 1, 1, [{"ev": {"0": 40}}], "kafka"))
    w2.append(40, offsets=[{"ev": {"0": 60}}])
    w2.append(60, offsets=[{"ev": {"0": 80}}])
    opened = Lake(lake)
    assert [e.epoch for e in opened.epochs()] == [0, 1, 2, 3]
    assert ids(opened.at(epoch=2).to_table()) == list(range(60))
    assert ids(opened.at(epoch=2).since(epoch=0).to_table()) == list(range(20, 60))
    assert opened.offsets() == [{"ev": {"0": 80}}]  # the one writer that is not retired
    assert [w.retired for w in opened.writers()] == [True, False]


def test_opening_a_checkpointed_lake_reads_one_checkpoint_and_no_file_list(
    lake: str, v3: tuple[Storage, VersionedLogWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, log = v3
    w1 = Writer(log, W1)
    for batch in range(8):
        w1.append(batch * 20)
    compact(log, live_adds(log, 0, 1, 2), 0, 60)  # version 8
    for batch in range(8, 13):
        w1.append(batch * 20)  # versions 9..13: checkpoints at 5 and 10
    counting = CountingStorage(lake)
    monkeypatch.setattr(reader_lake, "open_storage", lambda path, options=None: counting)
    lists: list[int] = []
    real_open = cp.open_file_list
    monkeypatch.setattr(cp, "open_file_list", lambda s, c: lists.append(c.version) or real_open(s, c))
    opened = Lake(lake)
    assert opened.version == 13 and lists == []
    # the headers after the checkpoint, and its own commit once (no truncation under the read)
    assert counting.checkpoints_read() == [10] and counting.commits_read() == [10, 11, 12, 13]
    assert set(counting.reads) == {
        "_lakesink/table.json",
        cp.LAST_CHECKPOINT,
        cp.checkpoint_name(10),
        *(f"_lakesink/log/{v:020d}.json" for v in (10, 11, 12, 13)),
    }
    counting.reset()
    assert ids(opened.to_table()) == list(range(260))
    assert lists == [10] and counting.commits_read() == [11, 12, 13] and counting.checkpoints_read() == []
    assert ids(opened.at(version=7).to_table()) == list(range(160))  # from the checkpoint at 5
    assert lists[-1] == 5
    code = (
        "import sys\n"
        "from lakesink_reader import Lake\n"
        f"lake = Lake({lake!r})\n"
        "assert lake.version == 13\n"
        "print('pyarrow.parquet' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # the open does not import pyarrow.parquet


def test_versions_below_the_retained_range_are_refused_naming_it(
    lake: str, v3: tuple[Storage, VersionedLogWriter]
) -> None:
    _, log = v3
    w1 = Writer(log, W1)
    for batch in range(7):
        w1.append(batch * 20)
    log.commit(PendingCommit.vacuum(op_token=new_op_token(), retained_from=4))  # version 7
    opened = Lake(lake)
    assert ids(opened.at(version=4).to_table()) == list(range(100))
    with pytest.raises(ValueError, match=r"version=3 is below the retained range .*: versions 4\.\.7"):
        opened.at(version=3).to_table()
    with pytest.raises(ValueError, match=r"since version=1: .*not all retained .*kept versions 4\.\.7"):
        opened.at(version=5).since(version=1).to_table()
    with pytest.raises(ValueError, match=r"epoch=1 is below the retained range"):
        opened.at(epoch=1).to_table()
    assert [v.version for v in opened.versions()] == [4, 5, 6, 7]
    # Commits below the oldest checkpoint removed (as vacuum will): the range says so too.
    for v in range(5):
        os.unlink(Path(lake) / f"_lakesink/log/{v:020d}.json")
    fresh = Lake(lake)
    assert ids(fresh.to_table()) == list(range(140)) and [v.version for v in fresh.versions()] == [5, 6, 7]


def test_read_all_adds_published_and_staged_files_the_log_does_not_list(
    lake: str, v3: tuple[Storage, VersionedLogWriter]
) -> None:
    storage, log = v3
    Writer(log, W1).append(0)
    v3_file(storage, v3_name(W1, 1, 0), 500, 5, partition=0)  # published, its batch not committed
    from lakes import rows

    from lakesink.commit import FileWriter

    staged = FileWriter(storage, v3_name(W1, 1, 1), SCHEMA)
    staged.write(rows(900, 3))
    staged.seal()  # staged, never published
    opened = Lake(lake)
    assert ids(opened.to_table()) == list(range(20))
    states = [f.state for f in opened.files("read_all")]
    assert sorted(states) == ["committed", "committed", "published", "staged"]
    assert ids(opened.to_table(isolation="read_all")) == [*range(20), *range(500, 505), *range(900, 903)]
    with pytest.raises(ValueError, match="isolation='read_committed'"):
        opened.at(version=0).files("read_all")


def test_v2_lakes_have_no_versions_and_read_as_before(lake: str) -> None:
    epoch_lake(lake, epochs=2, partitions=1, rows_per_file=5)
    opened = Lake(lake)
    assert opened.version is None and [e.epoch for e in opened.epochs()] == [0, 1]
    for call in (opened.versions, opened.writers, opened.offsets):
        with pytest.raises(ValueError, match=r"format-2 epoch-mode lake .*Lake\.epochs\(\)"):
            call()
    with pytest.raises(ValueError, match="needs a versioned log"):
        read_committed(lake, version=0)
    assert ids(read_committed(lake, epoch=0)) == list(range(5))
    assert [(f.version, f.writer, f.batch) for f in opened.files()] == [(None, None, None)] * 2


def test_a_v3_foreach_lake_reads_as_today(tmp_path: Path) -> None:
    from lakes import write_file

    storage, _ = v3_table(str(tmp_path / "fe"), mode="foreach")
    write_file(storage, 0, 0, 0, 7)
    opened = Lake(str(tmp_path / "fe"))
    assert opened.metadata.format_version == 3 and opened.version is None
    assert ids(opened.to_table()) == list(range(7))


def test_changes_return_the_rows_appends_added_and_nothing_of_a_compaction(lake: str) -> None:
    """``Lake.changes``: a job follows a lake without Spark by remembering one version."""
    from lakesink.maintenance import compact as compact_lake
    from lakesink.maintenance import vacuum

    storage, table_id = v3_table(lake, checkpoint_interval=3)
    writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=3), W1)
    writer.append(0)
    writer.append(100)
    first = Lake(lake).changes()  # the lake as it is
    assert ids(first.table) == list(range(20)) + list(range(100, 120)) and first.version == 1
    assert compact_lake(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 2
    writer.append(200)
    opened = Lake(lake)
    assert ids(opened.changes(since_version=first.version).table) == list(range(200, 220))
    assert opened.changes(since_version=2).table.num_rows == 20  # the compaction added no rows
    assert opened.changes(since_version=1, columns=["id"]).table.column_names == ["id"]
    later = opened.changes(since_version=3)
    assert later.table.num_rows == 0 and later.version == 3
    writer.append(300)
    assert opened.changes(since_version=3).table.num_rows == 0  # pinned until refresh()
    opened.refresh()
    assert ids(opened.changes(since_version=3).table) == list(range(300, 320))
    # Vacuumed: the appends after version 1 are gone from the log; the lake as it is still reads.
    assert vacuum(lake, retain=0, delete=True, force=True, check_store=False).ok
    vacuumed = Lake(lake)
    with pytest.raises(ValueError, match=r"since version=1: .*not all retained.*since_version=None"):
        vacuumed.changes(since_version=1)
    assert ids(vacuumed.changes().table) == ids(read_committed(lake))
    with pytest.raises(ValueError, match="since_version must be a version >= -1"):
        vacuumed.changes(since_version=-2)
