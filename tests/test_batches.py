"""The format-3 batch commit (``lakesink.commit.batches``) without Spark: the driver's cursor, and
a batch whose tasks took it for a replay. The writer's doors are in test_epoch_v3.py."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from lakesink.commit.batches import BatchCommitter
from lakesink.views.derived import derived_views
from lakesink_reader.errors import CommitRefusedError, CorruptFileError
from lakesink_reader.format.v3.commits import AddFile
from lakesink_reader.storage.local import LocalStorage
from tests.lakes import v3_table

TABLE = "7ab1e000000000000000000000000001"


@pytest.fixture(autouse=True)
def _table_json(tmp_path: Path) -> None:
    """The lake's table.json naming TABLE: a writer checks it before it creates version 0."""
    v3_table(str(tmp_path), table_id=TABLE)


W1 = "11111111-1111-4111-8111-111111111111"
W2 = "22222222-2222-4222-8222-222222222222"


class CountingStorage(LocalStorage):
    """Local storage that counts the objects read."""

    reads: list[str]

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.reads = []
        # The lake's table.json (the views read it: a lake without one is no lake).
        import pyarrow as pa

        from lakesink_reader.format.table import TableMetadata
        from lakesink_reader.names import TABLE_FILE

        schema = pa.schema([("id", pa.int64())])
        metadata = TableMetadata(3, "epoch", schema, 0.0, TABLE, checkpoint_interval=10)
        self.put_if_absent(TABLE_FILE, metadata.to_json())

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        self.reads.append(name)
        return super().read_bytes(name, first_contact=first_contact, limit=limit)


def published(storage: LocalStorage, name: str) -> AddFile:
    storage.put(name, b"x" * 10)
    return AddFile(name, 1, 10, partition=0)


def committer(
    storage: LocalStorage, writer: str = W1, *, table_id: str = TABLE, **kw: object
) -> BatchCommitter:
    """A committer of ``writer``; its hook the Spark view alone unless ``after_commit`` says."""
    kw.setdefault("after_commit", derived_views(storage, table_id, delta_log=False))
    return BatchCommitter(
        storage, table_id=table_id, writer_id=writer, run="run-00000001", checkpoint_interval=10, **kw
    )  # type: ignore[arg-type]


def test_a_cursor_reads_two_commits_where_an_open_reads_the_checkpoint_and_every_header_after_it(
    tmp_path: Path,
) -> None:
    storage = CountingStorage(str(tmp_path))
    ours = committer(storage)
    result = None
    for batch in range(15):  # a checkpoint at version 10, then five headers after it
        result = ours.commit(batch, [published(storage, f"a{batch}.parquet")])
    assert result is not None and result.version == 14
    committer(storage, W2, allow_other_queries=True).commit(0, [])  # another writer's version 15

    storage.reads.clear()
    fresh = ours.commit(15, [published(storage, "a15.parquet")])
    from_open = list(storage.reads)
    storage.reads.clear()
    cursor = ours.commit(16, [published(storage, "a16.parquet")], state=fresh.state)
    # With the cursor: the commit it was folded at (same token: the same log) and the probe of
    # the next version, which is absent; then the create, and the commit it was folded at once
    # more (still there: vacuum did not delete the version it created, VersionedLog._base_stands).
    assert storage.reads == [
        "_lakesink/log/00000000000000000016.json",
        "_lakesink/log/00000000000000000017.json",
        "_lakesink/log/00000000000000000016.json",
    ], storage.reads
    assert len(from_open) >= len(storage.reads) + 6, from_open  # hint, checkpoint, headers 11..16
    assert cursor.version == 17 and cursor.state == ours.log.open()

    # The cursor also brings in what others committed since (W2's next batch).
    other = committer(storage, W2, allow_other_queries=True).commit(1, [])
    after = ours.commit(17, [], state=cursor.state)
    assert (other.version, after.version) == (18, 19)


def test_a_cursor_of_a_replaced_lake_is_refused_and_nothing_is_committed(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    ours = committer(storage)
    result = ours.commit(0, [published(storage, "a0.parquet")])
    # The lake is deleted and written again (same table id, as a copy would have): the commit at
    # the cursor's version is another one now.
    shutil.rmtree(tmp_path / "_lakesink")
    v3_table(str(tmp_path), table_id=TABLE)
    committer(storage, W2).commit(0, [published(storage, "b0.parquet")])
    late = published(storage, "a1.parquet")
    with pytest.raises(CorruptFileError, match=r"not .* that this writer's state was folded from"):
        ours.commit(1, [late], state=result.state)
    assert ours.log.open().writers.keys() == {W2}
    assert not (tmp_path / "a1.parquet").exists()  # nothing of it committed: its file went


def test_a_first_commit_into_a_recreated_lake_is_refused_and_the_new_lake_stays_readable(
    tmp_path: Path,
) -> None:
    storage = LocalStorage(str(tmp_path))
    ours = committer(storage)  # it read table.json (TABLE) when its run began
    # The lake is deleted and created again by someone else: a new table id, an empty log.
    shutil.rmtree(tmp_path / "_lakesink")
    _, new_id = v3_table(str(tmp_path))
    written = published(storage, "a0.parquet")
    with pytest.raises(CommitRefusedError, match=f"table.json names table {new_id}.*read table {TABLE}"):
        ours.commit(0, [written])
    assert not (tmp_path / "_lakesink" / "log").exists() or not list(
        (tmp_path / "_lakesink" / "log").iterdir()
    )
    assert not (tmp_path / "a0.parquet").exists()  # its file went with the refusal
    # The new lake's own writers commit version 0 and read it back.
    assert committer(storage, W2, table_id=new_id).commit(0, []).version == 0


def test_a_batch_whose_tasks_skipped_it_is_committed_only_as_a_replay(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    ours = committer(storage)
    ours.commit(0, [published(storage, "a0.parquet")])
    # Tasks that took batch 0 for a replay (it is one): skipped whole.
    assert ours.commit(0, [], tasks_skipped=True).status == "replayed"
    # Tasks that took batch 1 for a replay when the log does not hold it: refused, never an
    # empty commit that would lose their rows.
    written = published(storage, "a1-p1.parquet")  # a task that did write
    with pytest.raises(CommitRefusedError, match="took it for a replay"):
        ours.commit(1, [written], tasks_skipped=True)
    assert ours.log.open().writers[W1].last_batch == 0
    assert not (tmp_path / "a1-p1.parquet").exists()


def test_a_replay_with_other_source_offsets_is_refused(tmp_path: Path) -> None:
    # A checkpoint that lost its offset log but kept its id restarts at batch 0 over other input:
    # its "replays" are other batches, and skipping them would lose or double rows silently.
    storage = LocalStorage(str(tmp_path))
    ours = committer(storage)
    for batch in range(3):
        ours.commit(
            batch, [published(storage, f"a{batch}.parquet")], source_offsets=[{"ev": {"0": 10 * (batch + 1)}}]
        )
    # The same batch with the same offsets (Spark re-plans it from its offset log): skipped.
    assert ours.commit(2, [], source_offsets=[{"ev": {"0": 30}}]).status == "replayed"
    assert ours.commit(0, [], source_offsets=[{"ev": {"0": 10}}]).status == "replayed"  # an older one
    with pytest.raises(
        CommitRefusedError,
        match=r"batch 0 .* with source offsets \[\{\"ev\":\{\"0\":10\}\}\].* replays it with",
    ):
        ours.commit(0, [published(storage, "b0.parquet")], source_offsets=[{"ev": {"0": 4}}])
    with pytest.raises(CommitRefusedError, match="Restart from the lake"):
        ours.commit(2, [], source_offsets=[{"ev": {"0": 25}}])
    assert not (tmp_path / "b0.parquet").exists()
    assert ours.log.open().version == 2  # nothing committed


class MeetingStorage(CountingStorage):
    """Local storage whose view writes wait for each other: a Delta view commit and a Spark view
    batch must both be in flight before either lands (a barrier of two)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.barrier = threading.Barrier(2, timeout=20)
        self.met = 0
        self.seen: set[str] = set()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        view = name.split("/", 1)[0]  # _delta_log or _spark_metadata: each view's first write
        if view in ("_delta_log", "_spark_metadata") and view not in self.seen:
            self.seen.add(view)
            self.met += self.barrier.wait() == 0  # one of the two gets index 0 once they met
        return super().put_if_absent(name, data)


def test_a_commits_two_views_are_written_at_once_through_in_threads(tmp_path: Path) -> None:
    """The doors' hook (``together=in_threads``): both views' writes are in flight together (a
    barrier of two only the concurrent hooks pass; one after the other, each hook would log the
    broken barrier and leave its view behind), and both views then hold the commit."""
    from lakesink.views import delta_view, spark_metadata_view
    from lakesink.views.derived import in_threads
    from lakesink_reader import Lake

    storage = MeetingStorage(str(tmp_path))
    ours = committer(storage, after_commit=derived_views(storage, TABLE, together=in_threads))
    ours.commit(0, [published(storage, "a0.parquet")])
    assert storage.met == 1  # the race happened: both writes waited for each other
    assert Lake(str(tmp_path)).version == 0
    for view in (delta_view, spark_metadata_view):
        assert view.listed_files(storage) == (0, {"a0.parquet": 10}), view.__name__


def test_in_threads_waits_for_every_thunk_and_raises_the_first_error() -> None:
    from lakesink.views.derived import in_threads

    done: list[str] = []

    def slow() -> None:
        time.sleep(0.2)
        done.append("slow")

    def failing() -> None:
        raise ValueError("view hook broke")

    with pytest.raises(ValueError, match="view hook broke"):
        in_threads([failing, slow])
    assert done == ["slow"]  # the error waited for the other thread to end
