"""Format v3's checkpoints without Spark (docs/design/format-v3.md, landing step 2): writing one
(file list, small part, hint; the streaming merge), finding one (hint, probes, listing; damaged
candidates), and reading the log through one: one checkpoint plus the commits after it."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from lakesink.commit import checkpoints
from lakesink.commit.checkpoints import write_checkpoint
from lakesink.commit.versions import VersionedLogWriter
from lakesink_reader.errors import CorruptFileError
from lakesink_reader.format.v3 import checkpoint as cp
from lakesink_reader.format.v3.checkpoint import (
    LAST_CHECKPOINT,
    Checkpoint,
    checkpoint_name,
    find_checkpoint,
    live_files_of,
    live_files_table,
    parse_file_list_name,
    read_checkpoint,
)
from lakesink_reader.format.v3.commits import AddFile, PendingCommit, RemoveFile, new_op_token
from lakesink_reader.format.v3.logfiles import LOG_DIR, commit_name
from lakesink_reader.format.v3.state import LiveFiles, TableState
from lakesink_reader.storage.base import StoredFile
from lakesink_reader.storage.local import LocalStorage
from tests.lakes import v3_table

TABLE = "7ab1e000000000000000000000000001"


@pytest.fixture(autouse=True)
def _table_json(tmp_path: Path) -> None:
    """The lake's table.json naming TABLE: a writer checks it before it creates version 0."""
    v3_table(str(tmp_path), table_id=TABLE)


RUN = "run-0000000000000001"
W1 = "11111111-1111-4111-8111-111111111111"
W2 = "22222222-2222-4222-8222-222222222222"


def add(path: str, rows: int = 10, size: int = 1000, partition: int | None = 0, **kw: Any) -> AddFile:
    return AddFile(path, rows, size, partition, **kw)


def append(writer: str, batch: int, *files: AddFile, **kw: Any) -> PendingCommit:
    return PendingCommit.append(
        writer_id=writer, batch=batch, run=RUN, adds=files, allow_other_queries=True, **kw
    )


def compaction(base: int, inputs: list[tuple[str, int, int]], output: str) -> PendingCommit:
    return PendingCommit.compact(
        op_token=new_op_token(),
        base_version=base,
        removes=[RemoveFile(p, r, s) for p, r, s in inputs],
        adds=[AddFile(output, sum(r for _, r, _ in inputs), sum(s for _, _, s in inputs))],
    )


class CountingStorage(LocalStorage):
    """Local disk that counts what it is asked: reads (found or not), probes, listings, writes."""

    def __init__(self, root: Path | str) -> None:
        super().__init__(str(root))
        self.reads: Counter[str] = Counter()
        self.missed: Counter[str] = Counter()
        self.probes: Counter[str] = Counter()
        self.listings = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        self.reads.clear()
        self.missed.clear()
        self.probes.clear()
        self.listings = 0

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        try:
            data = super().read_bytes(name, first_contact=first_contact, limit=limit)
        except FileNotFoundError:
            with self._lock:
                self.missed[name] += 1
            raise
        with self._lock:
            self.reads[name] += 1
        return data

    def exists(self, name: str) -> bool:
        with self._lock:
            self.probes[name] += 1
        return super().exists(name)

    def list(self, folder: str = "") -> list[StoredFile]:
        self.listings += 1
        return super().list(folder)

    def commits_read(self) -> list[int]:
        return sorted(int(n.rsplit("/", 1)[-1][:20]) for n in self.reads if _is_commit(n))

    def checkpoints_read(self) -> list[int]:
        return sorted(int(n.rsplit("/", 1)[-1][:20]) for n in self.reads if n.endswith(".checkpoint.json"))


def _is_commit(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base.endswith(".json") and base[:20].isdigit() and len(base) == 25


class FailingStorage(LocalStorage):
    """Local disk whose create of a checkpoint's small part calls ``hook`` first (it may raise:
    the writer was killed between its list and its small part)."""

    def __init__(self, root: Path | str, hook: Callable[[str], None]) -> None:
        super().__init__(str(root))
        self.hook = hook

    def put_if_absent(self, name: str, data: bytes) -> bool:
        if name.endswith(".checkpoint.json"):
            self.hook(name)
        return super().put_if_absent(name, data)


def lists_in(storage: LocalStorage) -> list[str]:
    return sorted(f.name for f in storage.list(LOG_DIR) if f.name.endswith(".files"))


def build(
    log: VersionedLogWriter, commits: int, files_per_commit: int, *, compact_every: int = 0
) -> LiveFiles:
    """Commit ``commits`` versions: appends of two writers and, every ``compact_every`` versions,
    a compaction of some live files; returns the live files folded from the whole commits."""
    live = LiveFiles()
    state: TableState | None = None
    batches = {W1: 0, W2: 0}
    for n in range(commits):
        version = state.version + 1 if state is not None else 0
        if compact_every and n % compact_every == compact_every - 1 and len(live) > 4:
            picked = [f for i, f in enumerate(live) if i % 7 == 3][:files_per_commit]
            pending = compaction(
                version - 1, [(f.path, f.rows, f.size) for f in picked], f"c/{version:06d}-out.parquet"
            )
        else:
            writer = W1 if n % 3 else W2
            batch = batches[writer]
            batches[writer] += 1
            files = [
                add(
                    f"{writer[0]}/b{batch:06d}-p{p:04d}.parquet",
                    rows=p + 1,
                    size=1000 + p,
                    partition=p,
                    stats={"numRecords": p + 1, "nullCount": {"id": 0}} if p % 2 else None,
                )
                for p in range(files_per_commit)
            ]
            pending = append(writer, batch, *files, source_offsets=[{"o": n}])
        result = log.commit(pending, state=state)
        assert result.status == "committed"
        state = result.state
        commit = log.read_commit(result.state.version)
        assert commit is not None
        live.apply(commit)
    return live


def listed_files(storage: LocalStorage, checkpoint: Checkpoint) -> list[Any]:
    return [f for batch in cp.iter_file_list(storage, checkpoint) for f in live_files_of(batch)]


# The streaming merge ----------------------------------------------------------------------------


def test_a_checkpoint_list_is_the_folds_live_files_sorted_in_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "LIST_ROW_GROUP_ROWS", 50)  # many row groups: the merge crosses them
    storage = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(storage, TABLE, checkpoint_interval=10)
    live = build(log, 35, 12, compact_every=4)
    for version in (10, 20, 30):
        found = read_checkpoint(storage, TABLE, version)
        assert found is not None
        fold = LiveFiles()
        for v in range(version + 1):
            commit = log.read_commit(v)
            assert commit is not None
            fold.apply(commit)
        assert listed_files(storage, found) == list(fold)  # exactly the fold's, in path order
        assert found.state == VersionedLogWriter(storage, TABLE).snapshot(at_most=version).state
        groups = pq.ParquetFile(storage.path_of(found.files_name)).metadata
        sizes = [groups.row_group(i).num_rows for i in range(groups.num_row_groups)]
        assert all(s == 50 for s in sizes[:-1]) and 0 < sizes[-1] <= 50 and sum(sizes) == len(fold)
        assert found.files_bytes == Path(storage.path_of(found.files_name)).stat().st_size
    assert any(f.writer is None for f in live) and any(f.stats for f in live)  # compactions, stats
    table = live_files_table(storage, TABLE, 34, interval=10)
    assert list(f for b in table.to_batches() for f in live_files_of(b)) == list(live)
    assert json.loads(storage.read_bytes(LAST_CHECKPOINT)) == {"version": 30}
    assert not any(f.name.endswith(".parquet") for f in storage.list(LOG_DIR))  # no glob finds a list


def test_the_merge_refuses_a_remove_of_a_path_that_is_not_live(tmp_path: Path) -> None:
    changes = cp.Changes({"nope"}, {})
    with pytest.raises(CorruptFileError, match="remove 1 path"):
        cp.merge_file_list((), changes, lambda t: None, where="here")


# Reading through a checkpoint -------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LiveFiles]:
    """~10,000 live files in 349 versions, checkpoints at 100, 200 and 300."""
    root = tmp_path_factory.mktemp("big")
    v3_table(str(root), table_id=TABLE)
    live = build(VersionedLogWriter(LocalStorage(str(root)), TABLE), 349, 30, compact_every=25)
    return root, live


def test_opening_reads_one_checkpoint_and_the_commits_after_it(big_log: tuple[Path, LiveFiles]) -> None:
    root, live = big_log
    assert len(live) > 9_000
    storage = CountingStorage(root)
    opened_lists: list[int] = []
    real_open = cp.open_file_list

    def counting_open(storage: Any, checkpoint: Checkpoint) -> Any:
        opened_lists.append(checkpoint.version)
        return real_open(storage, checkpoint)

    log = VersionedLogWriter(storage, TABLE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cp, "open_file_list", counting_open)
        snapshot = log.snapshot()
    assert snapshot.version == 348 and snapshot.checkpoint is not None and snapshot.checkpoint.version == 300
    assert storage.checkpoints_read() == [300] and storage.reads[LAST_CHECKPOINT] == 1
    # The headers after it, then the checkpoint's own commit (the proof that the log was not
    # truncated under the read, VersionedLog.snapshot).
    assert storage.commits_read() == list(range(300, 349))
    assert set(storage.reads) == {LAST_CHECKPOINT, checkpoint_name(300)} | {
        commit_name(v) for v in range(300, 349)
    }
    assert storage.listings == 0 and opened_lists == []  # no listing, no file list at open
    assert (
        snapshot.state == VersionedLogWriter(LocalStorage(str(root)), TABLE, checkpoint_interval=None).open()
    )

    storage.reset()
    old = log.snapshot(at_most=250)  # time travel: the checkpoint at or below, and what follows
    assert old.version == 250 and old.checkpoint is not None and old.checkpoint.version == 200
    assert storage.checkpoints_read() == [200] and storage.commits_read() == list(range(200, 251))

    storage.reset()
    table = live_files_table(storage, TABLE, 348, start=snapshot.checkpoint, read_commit=log.read_commit)
    assert [f for b in table.to_batches() for f in live_files_of(b)] == list(live)
    assert storage.checkpoints_read() == [] and storage.commits_read() == list(range(301, 349))


def test_a_fresh_log_object_continues_from_the_checkpoint(
    big_log: tuple[Path, LiveFiles], tmp_path: Path
) -> None:
    root, _ = big_log
    storage = CountingStorage(root)
    state = VersionedLogWriter(storage, TABLE).open()
    assert state.version == 348 and state.writers[W1].last_batch + state.writers[W2].last_batch > 300


# Writing under faults ---------------------------------------------------------------------------


def test_a_kill_between_the_list_and_the_small_part_leaves_a_harmless_list(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def killed(name: str) -> None:
        raise OSError(f"killed before creating {name}")

    dying = VersionedLogWriter(FailingStorage(tmp_path, killed), TABLE, checkpoint_interval=5)
    for batch in range(6):
        assert dying.commit(append(W1, batch, add(f"b{batch}.parquet"))).status == "committed"
    storage = LocalStorage(str(tmp_path))
    assert "writing the checkpoint due after version 5" in caplog.text
    [leftover] = lists_in(storage)
    assert parse_file_list_name(leftover.rsplit("/", 1)[-1])[0] == 5  # type: ignore[index]
    assert not storage.exists(checkpoint_name(5)) and not storage.exists(LAST_CHECKPOINT)
    log = VersionedLogWriter(storage, TABLE, checkpoint_interval=5)
    assert log.open().version == 5  # from the commits: the leftover list is never read
    # The next commit of a writer whose state has no checkpoint at 5 writes it (a new list).
    assert log.commit(append(W1, 6, add("b6.parquet"))).version == 6
    written = read_checkpoint(storage, TABLE, 5)
    assert written is not None and written.files_name != leftover and len(lists_in(storage)) == 2
    for batch in range(7, 11):
        log.commit(append(W1, batch, add(f"b{batch}.parquet")))
    ten = read_checkpoint(storage, TABLE, 10)
    assert ten is not None and [f.path for f in listed_files(storage, ten)] == sorted(
        f"b{b}.parquet" for b in range(11)
    )
    assert json.loads(storage.read_bytes(LAST_CHECKPOINT)) == {"version": 10}


def test_two_writers_of_one_checkpoint_one_wins_and_the_other_deletes_its_list(tmp_path: Path) -> None:
    plain = LocalStorage(str(tmp_path))
    log = VersionedLogWriter(plain, TABLE, checkpoint_interval=None)
    for batch in range(5):
        log.commit(append(W1, batch, add(f"b{batch}.parquet")))
    rival: list[Checkpoint] = []

    def rival_first(name: str) -> None:
        if not rival:
            rival.append(write_checkpoint(plain, TABLE, 4, interval=4))

    ours = write_checkpoint(FailingStorage(tmp_path, rival_first), TABLE, 4, interval=4)
    assert ours == rival[0]  # the winner's checkpoint, read back
    assert lists_in(plain) == [ours.files_name]  # ours was deleted
    assert read_checkpoint(plain, TABLE, 4) == ours
    again = write_checkpoint(plain, TABLE, 4, interval=4)  # exists: nothing written
    assert again == ours and lists_in(plain) == [ours.files_name]


# Finding a checkpoint ---------------------------------------------------------------------------


@pytest.fixture
def checkpointed(tmp_path: Path) -> CountingStorage:
    """Versions 0..17, checkpoints at 5, 10 and 15, the hint at 15."""
    storage = CountingStorage(tmp_path)
    log = VersionedLogWriter(storage, TABLE, checkpoint_interval=5)
    for batch in range(18):
        log.commit(append(W1, batch, add(f"b{batch:02d}.parquet")))
    assert [read_checkpoint(storage, TABLE, c) is not None for c in (5, 10, 15)] == [True] * 3
    storage.reset()
    return storage


def found(storage: CountingStorage, *, at_most: int | None = None) -> int | None:
    storage.reset()
    checkpoint = find_checkpoint(storage, TABLE, interval=5, at_most=at_most)
    return checkpoint.version if checkpoint is not None else None


def test_the_hint_names_the_checkpoint_and_time_travel_probes_below(checkpointed: CountingStorage) -> None:
    assert found(checkpointed) == 15
    assert checkpointed.checkpoints_read() == [15] and checkpointed.listings == 0
    assert found(checkpointed, at_most=14) == 10 and checkpointed.checkpoints_read() == [10]
    assert found(checkpointed, at_most=4) is None and checkpointed.listings == 0


def test_a_missing_hint_is_found_by_probing_upward(checkpointed: CountingStorage) -> None:
    checkpointed.delete(LAST_CHECKPOINT)
    assert found(checkpointed) == 15
    assert checkpointed.checkpoints_read() == [15] and checkpointed.listings == 0


def test_a_stale_hint_is_overtaken_by_the_checkpoints_after_it(checkpointed: CountingStorage) -> None:
    checkpointed.put(LAST_CHECKPOINT, json.dumps({"version": 5}).encode())  # a kill before the hint
    assert found(checkpointed) == 15 and checkpointed.checkpoints_read() == [15]
    log = VersionedLogWriter(checkpointed, TABLE, checkpoint_interval=5)
    assert log.open().version == 17
    log.commit(append(W1, 18, add("b18.parquet")))
    log.commit(append(W1, 19, add("b19.parquet")))
    log.commit(append(W1, 20, add("b20.parquet")))  # writes 20 and moves the hint
    assert json.loads(checkpointed.read_bytes(LAST_CHECKPOINT)) == {"version": 20}


def test_a_damaged_hint_is_ignored_for_the_probes_or_one_listing(checkpointed: CountingStorage) -> None:
    checkpointed.put(LAST_CHECKPOINT, b"{not json")
    assert found(checkpointed) == 15 and checkpointed.listings == 0  # probes upward from N
    checkpointed.reset()
    without_probes = find_checkpoint(checkpointed, TABLE, interval=None)
    assert without_probes is not None and without_probes.version == 15 and checkpointed.listings == 1


def test_a_hint_too_old_or_beyond_the_log_still_finds_the_newest(checkpointed: CountingStorage) -> None:
    # Too old: its checkpoint and the commits before it are gone (vacuum), newer ones are there.
    checkpointed.put(LAST_CHECKPOINT, json.dumps({"version": 5}).encode())
    checkpointed.delete(checkpoint_name(5))
    for v in range(5):
        checkpointed.delete(commit_name(v))
    assert found(checkpointed) == 15
    state = VersionedLogWriter(checkpointed, TABLE, checkpoint_interval=5).open()
    assert state.version == 17 and state.counts.files == 18
    # Beyond the log (a lake restored from a backup): probes below it.
    checkpointed.put(LAST_CHECKPOINT, json.dumps({"version": 40}).encode())
    assert found(checkpointed) == 15


def test_a_damaged_checkpoint_is_skipped_for_an_older_one(checkpointed: CountingStorage) -> None:
    checkpointed.put(checkpoint_name(15), b'{"format_version": 3, "version": 15}')
    assert found(checkpointed) == 10
    other = json.loads(checkpointed.read_bytes(checkpoint_name(10)))
    other["table_id"] = "another"
    checkpointed.put(checkpoint_name(10), json.dumps(other).encode())
    assert found(checkpointed) == 5
    log = VersionedLogWriter(checkpointed, TABLE, checkpoint_interval=5)
    assert (
        log.open()
        == VersionedLogWriter(checkpointed, TABLE, checkpoint_interval=None).snapshot(at_most=17).state
    )


def test_a_damaged_list_is_read_around_and_not_built_upon(checkpointed: CountingStorage) -> None:
    fifteen = read_checkpoint(checkpointed, TABLE, 15)
    assert fifteen is not None
    path = Path(checkpointed.path_of(fifteen.files_name))
    path.write_bytes(path.read_bytes()[:-20])  # truncated: no footer
    with pytest.raises(CorruptFileError, match="not a Parquet file"):
        cp.open_file_list(checkpointed, fifteen)
    table = live_files_table(checkpointed, TABLE, 17, interval=5, start=fifteen)
    assert table.column("path").to_pylist() == [f"b{b:02d}.parquet" for b in range(18)]
    log = VersionedLogWriter(checkpointed, TABLE, checkpoint_interval=5)
    for batch in (18, 19, 20):
        log.commit(append(W1, batch, add(f"b{batch:02d}.parquet")))
    twenty = read_checkpoint(checkpointed, TABLE, 20)
    assert twenty is not None  # built on the checkpoint at 10, whose list is fine
    assert [f.path for f in listed_files(checkpointed, twenty)] == [f"b{b:02d}.parquet" for b in range(21)]


def test_a_log_without_its_first_versions_opens_from_a_checkpoint_found_by_listing(tmp_path: Path) -> None:
    storage = CountingStorage(tmp_path)
    log = VersionedLogWriter(storage, TABLE, checkpoint_interval=5)
    for batch in range(8):
        log.commit(append(W1, batch, add(f"b{batch}.parquet")))
    storage.delete(LAST_CHECKPOINT)
    for v in range(5):
        storage.delete(commit_name(v))
    reopened = VersionedLogWriter(storage, TABLE, checkpoint_interval=None)  # no probes: the listing
    assert reopened.open().version == 7 and storage.listings >= 1
    storage.delete(checkpoint_name(5))
    with pytest.raises(
        CorruptFileError, match=r"has no version 0 but has versions from 5.*no usable checkpoint"
    ):
        reopened.open()
