"""Interleavings of format 3's writers and maintenance that break the lake unless the protocol
covers them (issue 32, docs/design/format-v3.md section 7, docs/FORMAT.md "Fault model").

Each test drives the public entry points -- the driver's committer (``BatchCommitter``, as the
data source drives it), ``vacuum``, the orphan sweep, ``upgrade``, the reader -- on local disk,
without Spark, and forces one legal interleaving through :class:`Interleaving`, a real
``LocalStorage`` whose calls can run another actor to completion first, fail once, or be held
back and applied after their client gave up. Every test asserts that its race happened.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from lakes import epoch_lake, v3_file, v3_name, v3_table

from lakesink.commit.batches import BatchCommitter
from lakesink.commit.versions import RetryPolicy
from lakesink.maintenance import sweep, upgrade, vacuum
from lakesink.maintenance.vacuum import DAY
from lakesink.views.derived import derived_views
from lakesink_reader import Lake, read_committed
from lakesink_reader.errors import CommitStateUnknownError
from lakesink_reader.format.v3.checkpoint import LAST_CHECKPOINT, checkpoint_name, read_hint
from lakesink_reader.format.v3.commits import AddFile
from lakesink_reader.format.v3.logfiles import LOG_DIR, commit_name, parse_commit_name
from lakesink_reader.names import TABLE_FILE
from lakesink_reader.storage.local import LocalStorage

WA = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
WB = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
ROWS = 10  # per batch: one file of ids batch_start .. batch_start + 9


class Interleaving(LocalStorage):
    """Local disk that forces one interleaving on the actor using it.

    ``before_read(name)`` runs before each ``read_bytes`` and ``after_create(name)`` after each
    ``put_if_absent`` that created (another actor may run to completion there); a delete of a
    name in ``fail_delete`` fails once with EIO (not applied); a create of a name in ``held`` is
    never answered (TimeoutError, every try) and its first request is applied by ``release()``,
    after its client gave up (a proxy queue; an S3 request inside its signature window).
    """

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.before_read: Callable[[str], None] | None = None
        self.after_create: Callable[[str], None] | None = None
        self.fail_delete: set[str] = set()
        self.failed_deletes: list[str] = []
        self.held: set[str] = set()
        self.late: list[tuple[str, bytes]] = []

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        if self.before_read is not None:
            self.before_read(name)
        return super().read_bytes(name, first_contact=first_contact, limit=limit)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        if name in self.held:
            if not any(n == name for n, _ in self.late):
                self.late.append((name, data))
            raise TimeoutError(f"no answer to the create of {name}")
        created = super().put_if_absent(name, data)
        if created and self.after_create is not None:
            self.after_create(name)
        return created

    def delete(self, name: str) -> None:
        if name in self.fail_delete:
            self.fail_delete.discard(name)
            self.failed_deletes.append(name)
            raise OSError(5, "Input/output error", name)
        super().delete(name)

    def release(self) -> None:
        """Apply the held creates' first requests, late."""
        for name, data in self.late:
            self.held.discard(name)
            assert LocalStorage.put_if_absent(self, name, data)
        self.late.clear()


def once(
    action: Callable[[], object], when: Callable[[str], bool]
) -> tuple[Callable[[str], None], list[object]]:
    """A hook that runs ``action`` at the first name ``when`` accepts; its results land in the list."""
    done: list[object] = []

    def hook(name: str) -> None:
        if not done and when(name):
            done.append(action())

    return hook, done


def committer(storage: LocalStorage, table_id: str, writer: str, **kw: object) -> BatchCommitter:
    """The driver's committer of ``writer``, without the derived views (the views' own tests)."""
    return BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=writer,
        run="run-00000001",
        checkpoint_interval=4,
        **kw,  # type: ignore[arg-type]
    )


def batch_files(storage: LocalStorage, writer: str, batch: int, start: int) -> list[AddFile]:
    return [v3_file(storage, v3_name(writer, batch, 0), start, ROWS, batch=batch, partition=0)]


def ids(path: str, **selector: object) -> list[int]:
    return sorted(read_committed(path, **selector).column("id").to_pylist())  # type: ignore[arg-type]


def commits(path: str) -> list[int]:
    folder = os.path.join(path, LOG_DIR)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(v for v in (parse_commit_name(n) for n in names) if v is not None)


def truncate(path: str, *, storage: LocalStorage | None = None) -> object:
    """``vacuum --retain 0 --force --delete``: every version but the latest goes."""
    return vacuum(
        storage if storage is not None else path,
        retain=0,
        force=True,
        delete=True,
        now=time.time() + 1,
        check_store=False,
    )


def lake_of_two_writers(path: str, b_batches: int = 10) -> tuple[str, BatchCommitter, LocalStorage, object]:
    """A's batch 0 at version 0 (its cursor there), then B's batches 0..9 at versions 1..10
    (checkpoints at 4 and 8). Returns the table id, A's committer, A's storage and A's cursor."""
    _, table_id = v3_table(path, checkpoint_interval=4)
    a_store = Interleaving(path)
    a = committer(a_store, table_id, WA)
    first = a.commit(0, batch_files(a_store, WA, 0, 0))
    assert first.status == "committed" and first.version == 0
    b_store = LocalStorage(path)
    b = committer(b_store, table_id, WB, allow_other_queries=True)
    for batch in range(b_batches):
        assert b.commit(batch, batch_files(b_store, WB, batch, 1000 + ROWS * batch)).version == batch + 1
    return table_id, a, a_store, first.state


B_IDS = list(range(1000, 1100))


# Hole 1: a commit in the vacuumed part of the log ----------------------------------------------


def test_an_idle_writers_commit_never_lands_in_the_vacuumed_part_of_the_log(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    _, a, a_store, cursor = lake_of_two_writers(path)
    # A validates its cursor (header 0: there), then reads header 1 -- and vacuum runs to
    # completion just before that read: a checkpoint at 8, every log entry below it deleted.
    a_store.before_read, vacuumed = once(lambda: truncate(path), lambda name: name == commit_name(1))
    late = a.commit(1, batch_files(a_store, WA, 1, ROWS), state=cursor)  # type: ignore[arg-type]
    assert vacuumed and vacuumed[0].ok and vacuumed[0].checkpoint == 8  # type: ignore[attr-defined]
    # A's create of version 1 succeeded (the file was gone), but version 1 is not where the log
    # is: A finds its base gone, reads the log again, removes its stray and commits at 12.
    assert late.status == "committed" and late.version == 12 and late.lost_races == 1
    assert ids(path) == [*range(2 * ROWS), *B_IDS]
    assert commits(path) == [8, 9, 10, 11, 12]  # no stray below the checkpoint
    nxt = a.commit(2, batch_files(a_store, WA, 2, 2 * ROWS), state=late.state)
    assert nxt.version == 13 and ids(path) == [*range(3 * ROWS), *B_IDS]
    assert truncate(path).ok  # type: ignore[attr-defined]
    assert sweep(path, older_than=3600, delete=True, check_store=False).ok
    assert ids(path) == [*range(3 * ROWS), *B_IDS]


def test_a_reader_and_a_fresh_writer_opening_while_vacuum_truncates_see_the_latest_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lakesink_reader.lake as reader_lake

    path = str(tmp_path / "lake")
    table_id, a, a_store, _ = lake_of_two_writers(path, b_batches=13)  # versions 0..13, hint 12
    b_store = LocalStorage(path)
    b = committer(b_store, table_id, WB, allow_other_queries=True)
    batches = iter(range(13, 100))

    def more_then_vacuum() -> object:  # B commits 4 more (checkpoint 16), the log goes below 16
        for batch in [next(batches) for _ in range(4)]:
            b.commit(batch, batch_files(b_store, WB, batch, 1000 + ROWS * batch))
        return truncate(path)

    # The reader read the hint and checkpoint 12; the log is truncated before its next read.
    reader_store = Interleaving(path)
    reader_store.before_read, vacuumed = once(more_then_vacuum, lambda name: name == commit_name(13))
    monkeypatch.setattr(reader_lake, "open_storage", lambda path, options=None: reader_store)
    lake = Lake(path)
    assert vacuumed and vacuumed[0].checkpoint == 16  # type: ignore[attr-defined]
    assert lake.version == 18  # not 12, where the headers it could read ended
    assert sorted(lake.to_table().column("id").to_pylist()) == [*range(ROWS), *range(1000, 1170)]
    # A writer without a cursor, the same way: it commits at the latest version, not at 13.
    a_store.before_read, again = once(more_then_vacuum, lambda name: name == commit_name(19))
    result = a.commit(1, batch_files(a_store, WA, 1, ROWS))
    assert again and again[0].checkpoint == 20 and result.version == 24  # type: ignore[attr-defined]
    assert commits(path) == [20, 21, 22, 23, 24]
    assert ids(path) == [*range(2 * ROWS), *range(1000, 1210)]


def test_a_commit_that_vacuum_truncates_past_right_after_its_create_stands_once(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    table_id, a, a_store, cursor = lake_of_two_writers(path)
    b_store = LocalStorage(path)
    b = committer(b_store, table_id, WB, allow_other_queries=True)

    def more_then_vacuum() -> object:  # B commits 12, 13; vacuum keeps the log from 12
        for batch in (10, 11):
            b.commit(batch, batch_files(b_store, WB, batch, 1000 + ROWS * batch))
        return truncate(path)

    a_store.after_create, vacuumed = once(more_then_vacuum, lambda name: name == commit_name(11))
    result = a.commit(1, batch_files(a_store, WA, 1, ROWS), state=cursor)  # type: ignore[arg-type]
    assert vacuumed and vacuumed[0].checkpoint == 12  # type: ignore[attr-defined]
    assert 0 not in commits(path) and 11 not in commits(path)  # its base and itself: vacuumed
    # The base is gone, so A read the log again: its batch is in the checkpoint, at version 11.
    assert result.status == "committed" and result.version == 11 and result.lost_races == 0
    assert ids(path) == [*range(2 * ROWS), *range(1000, 1120)]


# Hole 2: one failed delete wedged maintenance --------------------------------------------------


def test_a_failed_log_delete_stops_the_truncation_and_a_rerun_converges(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    lake_of_two_writers(path)
    store = Interleaving(path)
    store.fail_delete = {commit_name(3)}
    first = truncate(path, storage=store)
    assert store.failed_deletes == [commit_name(3)] and not first.ok  # type: ignore[attr-defined]
    # The truncation stopped at the failed delete: the log is still contiguous from there.
    assert commits(path) == list(range(3, 12))
    assert sweep(path, older_than=3600, delete=True, check_store=False).ok
    again = truncate(path)  # R is 11 now: its vacuum commit is 12, the checkpoint 8 again
    assert again.ok and commits(path) == [8, 9, 10, 11, 12]  # type: ignore[attr-defined]
    assert not any(n < "00000000000000000008" for n in os.listdir(os.path.join(path, LOG_DIR)))
    assert ids(path) == [*range(ROWS), *B_IDS]


def test_leftovers_below_a_gap_are_removed_by_the_next_vacuum(tmp_path: Path) -> None:
    """A lake an older lakesink left wedged: it went on past a failed delete of version 3."""
    path = str(tmp_path / "lake")
    lake_of_two_writers(path)
    store = Interleaving(path)
    store.fail_delete = {commit_name(3)}
    truncate(path, storage=store)
    for v in range(4, 8):  # what the older vacuum deleted after the failure
        os.unlink(os.path.join(path, commit_name(v)))
    assert commits(path) == [3, *range(8, 12)]
    report = sweep(path, older_than=3600, delete=True, check_store=False)
    assert report.ok
    assert truncate(path).ok and commits(path) == [8, 9, 10, 11, 12]  # type: ignore[attr-defined]
    assert ids(path) == [*range(ROWS), *B_IDS]


# Hole 3: abort after an unknown outcome ---------------------------------------------------------


def test_abort_after_an_unknown_outcome_keeps_the_files_a_late_create_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    _, table_id = v3_table(path, checkpoint_interval=4)
    store = Interleaving(path)
    a = committer(store, table_id, WA)
    a.log.retry = RetryPolicy(create_attempts=3, create_backoff=0.001)
    a.commit(0, batch_files(store, WA, 0, 0))
    store.held = {commit_name(1)}
    files = batch_files(store, WA, 1, ROWS)
    with pytest.raises(CommitStateUnknownError):
        a.commit(1, files)
    a.abort(1, files)  # what Spark does after the commit raised
    assert all(os.path.exists(os.path.join(path, f.path)) for f in files)
    store.release()  # the first request lands after all
    assert commits(path) == [0, 1] and ids(path) == list(range(2 * ROWS))
    # The restarted query replays batch 1 (new files): skipped as committed, its files dropped.
    replay_store = LocalStorage(path)
    replayed = committer(replay_store, table_id, WA).commit(1, batch_files(replay_store, WA, 1, ROWS))
    assert replayed.status == "replayed" and replayed.version == 1
    assert ids(path) == list(range(2 * ROWS))
    assert sweep(path, older_than=3600, delete=True, check_store=False).ok
    assert ids(path) == list(range(2 * ROWS))


def test_abort_of_a_batch_whose_commit_failed_cleanly_deletes_its_files(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    _, table_id = v3_table(path, checkpoint_interval=4)
    store = Interleaving(path)
    a = committer(store, table_id, WA)
    files = batch_files(store, WA, 0, 0)
    a.abort(0, files)  # a task failed: no commit was tried
    assert not any(os.path.exists(os.path.join(path, f.path)) for f in files)


# Suspected: hints moving backwards --------------------------------------------------------------


def test_a_hint_moved_back_below_the_truncation_neither_stalls_readers_nor_misplaces_commits(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "lake")
    _, a, a_store, _ = lake_of_two_writers(path, b_batches=14)  # checkpoints 4, 8, 12
    # Right after vacuum made sure the hint names 12 (its C_R), a writer's late read-then-put of
    # the hint (it read it before checkpoint 8 was written) moves it back to 4.
    store = Interleaving(path)
    reads: list[str] = []

    def move_back() -> None:
        LocalStorage.put(store, LAST_CHECKPOINT, json.dumps({"version": 4}).encode())

    hook, moved = once(
        move_back,
        lambda name: reads[-2:] == [checkpoint_name(12), LAST_CHECKPOINT] and name == LAST_CHECKPOINT,
    )

    def record(name: str) -> None:
        hook(name)
        reads.append(name)

    store.before_read = record
    report = truncate(path, storage=store)
    assert moved and report.ok and report.checkpoint == 12  # type: ignore[attr-defined]
    assert commits(path) == [12, 13, 14, 15]
    assert not os.path.exists(os.path.join(path, checkpoint_name(4)))  # the hinted one went too
    assert read_hint(LocalStorage(path)) == 12
    # A later late put names a deleted checkpoint: readers look further, they do not stop at 4.
    LocalStorage(path).put(LAST_CHECKPOINT, json.dumps({"version": 4}).encode())
    assert Lake(path).version == 15 and ids(path) == [*range(ROWS), *range(1000, 1140)]
    fresh = a.commit(1, batch_files(a_store, WA, 1, ROWS))  # no cursor: it opens the log
    assert fresh.version == 16 and ids(path) == [*range(2 * ROWS), *range(1000, 1140)]


def test_a_checkpoint_left_below_the_truncation_is_not_where_readers_start(tmp_path: Path) -> None:
    """A lake an older vacuum left: it kept the checkpoint the hint named (moved back to 4)."""
    path = str(tmp_path / "lake")
    _, a, a_store, _ = lake_of_two_writers(path, b_batches=14)
    folder = Path(path) / LOG_DIR
    kept = {n: (folder / n).read_bytes() for n in os.listdir(folder) if n.startswith(f"{4:020d}.checkpoint")}
    assert len(kept) == 2 and truncate(path).ok  # type: ignore[attr-defined]
    for name, data in kept.items():
        (folder / name).write_bytes(data)
    LocalStorage(path).put(LAST_CHECKPOINT, json.dumps({"version": 4}).encode())
    # Checkpoint 8 is gone, so probing up from the hint stops at 4, whose next commits are gone.
    assert Lake(path).version == 15 and ids(path) == [*range(ROWS), *range(1000, 1140)]
    fresh = a.commit(1, batch_files(a_store, WA, 1, ROWS))
    assert fresh.version == 16 and commits(path) == [12, 13, 14, 15, 16]
    assert ids(path) == [*range(2 * ROWS), *range(1000, 1140)]
    assert truncate(path).ok and not any(n.startswith(f"{4:020d}") for n in os.listdir(folder))  # type: ignore[attr-defined]


# Suspected: clock skew between a writer and vacuum ----------------------------------------------


def test_a_writer_clock_behind_by_more_than_retain_does_not_move_retention_past_fresh_versions(
    tmp_path: Path,
) -> None:
    from lakesink.commit.versions import VersionedLogWriter
    from lakesink.maintenance import compact
    from lakesink_reader.format.v3.commits import PendingCommit

    path = str(tmp_path / "lake")
    storage, table_id = v3_table(path, checkpoint_interval=4)
    vlog = VersionedLogWriter(storage, table_id, checkpoint_interval=4)
    for batch in range(4):  # versions 0..3, today
        adds = batch_files(storage, WA, batch, ROWS * batch)
        vlog.commit(PendingCommit.append(writer_id=WA, batch=batch, run="run-0000000000000001", adds=adds))
    t0 = time.time()
    inputs = {f.name for f in Lake(path).files()}
    assert compact(path, min_files=2, target_file_size=1 << 20).version == 4
    # Three days later by the store's clock: the compaction an hour ago, then a writer whose
    # clock runs ten days behind commits version 5 now (its header says ten days ago).
    behind = PendingCommit.append(
        writer_id=WB, batch=0, run="run-0000000000000002", adds=batch_files(storage, WB, 0, 1000),
        allow_other_queries=True, committed_at=t0 + 3 * DAY - 10 * DAY,
    )  # fmt: skip
    assert vlog.commit(behind).version == 5
    for v, at in ((4, t0 + 3 * DAY - 3600), (5, t0 + 3 * DAY)):
        os.utime(os.path.join(path, commit_name(v)), (at, at))
    report = vacuum(path, retain=DAY, delete=True, now=t0 + 3 * DAY, check_store=False)
    # The newest version both clocks date a day old is 3: a reader pinned at 3 an hour ago
    # (before the compaction) still finds its files. By the writer's clock alone it was 5.
    assert report.retained_from == 3
    assert inputs <= {n for n in os.listdir(path) if n.endswith(".parquet")}
    assert ids(path, version=3) == list(range(4 * ROWS))


# Suspected: a slow upgrade run after the log moved on --------------------------------------------


def test_a_slow_upgrade_run_does_not_recreate_vacuumed_versions(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    storage = epoch_lake(path, epochs=3)
    doc = json.loads(storage.read_bytes(TABLE_FILE))
    storage.put(TABLE_FILE, json.dumps({**doc, "checkpoint_interval": 4}).encode())

    def another_run_then_writers_and_vacuum() -> None:
        assert upgrade(path, check_store=False).status == "upgraded"  # versions 0..2, the upgrade at 3
        table_id = Lake(path).metadata.table_id or ""
        w_store = LocalStorage(path)
        w = committer(w_store, table_id, WA, allow_other_queries=True)
        for batch in range(6):  # versions 4..9: checkpoint at 8
            w.commit(batch, batch_files(w_store, WA, batch, 10_000 + ROWS * batch))
        assert truncate(path).ok  # type: ignore[attr-defined]

    done: list[str] = []

    def hook(step: str) -> None:
        if step == "fenced" and not done:
            done.append(step)
            another_run_then_writers_and_vacuum()

    before = commits(path)
    assert before == []
    slow = upgrade(path, check_store=False, hook=hook)
    assert done and slow.status == "already_format_3"
    assert commits(path) == [8, 9, 10]  # nothing recreated below the truncation
    assert not os.path.exists(os.path.join(path, checkpoint_name(3)))
    assert len(ids(path)) == 600 + 6 * ROWS
    assert truncate(path).ok  # type: ignore[attr-defined]


# Found by the simulation's upgrade world (seed 28): a format-2 sweep straddling the commit point ---


def test_a_format_2_sweep_straddling_the_upgrade_keeps_the_format_3_files(tmp_path: Path) -> None:
    """A sweep that read table.json as format 2 (``lakesink orphans --delete``, or a format-2
    writer's sweep after its commit) judges files by the epoch log; if the upgrade reaches its
    commit point and a format-3 writer commits meanwhile, that writer's file is in no epoch
    record -- and was deleted as an orphan of "recorded epoch 0", leaving the lake unreadable."""
    path = str(tmp_path / "lake")
    epoch_lake(path, epochs=2)  # ids 0..399

    def upgrade_then_a_format_3_batch() -> None:
        assert upgrade(path, check_store=False).status == "upgraded"
        w_store = LocalStorage(path)
        w = committer(w_store, Lake(path).metadata.table_id or "", WA, allow_other_queries=True)
        assert w.commit(0, batch_files(w_store, WA, 0, 10_000)).status == "committed"

    store = Interleaving(path)
    # The sweep read table.json (format 2); the upgrade and a format-3 batch land before it reads
    # the epoch log and lists the lake.
    store.before_read, done = once(upgrade_then_a_format_3_batch, lambda n: n.startswith("_lakesink/epochs/"))
    report = sweep(store, older_than=0.0, delete=True, check_store=False)
    assert done  # the race happened
    assert not report.removed and report.ok
    assert ids(path) == [*range(400), *range(10_000, 10_000 + ROWS)]


def test_the_orphan_sweep_keeps_what_a_view_behind_the_retained_versions_lists(tmp_path: Path) -> None:
    """Hole 4 through the sweep (simulation seed 182 of ``--world upgrade``): a Delta view left
    behind (its writer died after the view's first version; the vacuum that moved the retained
    versions on died before its view update) lists files that no retained version needs.
    ``vacuum`` keeps what a view behind the retained versions lists -- the orphan sweep
    (``lakesink orphans --delete``, and every writer's sweep after its first commit) deleted them."""
    from lakesink.maintenance import compact
    from lakesink.views.delta_view import listed_files

    path = str(tmp_path / "lake")
    storage, table_id = v3_table(path, checkpoint_interval=100)
    a = committer(storage, table_id, WA)  # views off
    for batch in range(3):
        a.commit(batch, batch_files(storage, WA, batch, ROWS * batch))
    assert compact(path, min_files=2, check_store=False).version == 3  # removes batches 0..2's files
    b_store = Interleaving(path)
    b_store.held.add("_delta_log/00000000000000000001.json")  # its writer dies after view version 0
    b = BatchCommitter(
        b_store, table_id=table_id, writer_id=WB, run="run-00000002", allow_other_queries=True,
        checkpoint_interval=100, after_commit=derived_views(b_store, table_id, spark_metadata=False),
    )  # fmt: skip
    assert b.commit(0, batch_files(b_store, WB, 0, 1000)).status == "committed"

    def stop(step: str) -> None:
        if step == "committed":
            raise RuntimeError("vacuum killed after its commit")

    class ViewsDown(LocalStorage):
        """The vacuum process dies between its lake commit and its view update."""

        def put_if_absent(self, name: str, data: bytes) -> bool:
            if name.startswith("_delta_log/"):
                raise TimeoutError(f"no answer to the create of {name}")
            return super().put_if_absent(name, data)

    with pytest.raises(RuntimeError, match="killed"):  # the retained versions now start at 4
        vacuum(
            ViewsDown(path),
            retain=0,
            force=True,
            delete=True,
            now=time.time() + 1,
            check_store=False,
            hook=stop,
        )
    found = listed_files(storage)
    assert found is not None and found[0] == 0  # the view lags at version 0: the race happened
    lagging = set(found[1])
    assert lagging and not lagging & {f.name for f in Lake(path).files()}

    report = sweep(path, older_than=0.0, delete=True, check_store=False)
    assert report.ok and not lagging & {o.name for o in report.removed}
    assert all(os.path.exists(os.path.join(path, name)) for name in lagging)
    assert {o.name for o in report.kept} >= lagging
    assert ids(path) == [*range(3 * ROWS), *range(1000, 1000 + ROWS)]


def test_a_view_started_on_a_vacuumed_lake_lists_no_file_vacuum_deleted(tmp_path: Path) -> None:
    """A writer that starts the Delta view on a lake whose retained versions begin above 0 (an
    upgraded lake; one whose writers kept no view) filled the view from version 0 up, one view
    version per lake version -- versions whose files vacuum already deleted, while their commits
    stay in a log not yet truncated. Until it reached the latest version (forever, when its writer
    died on the way), a Delta reader of the view met missing files."""
    from lakesink.maintenance import compact
    from lakesink.views.delta_view import listed_files

    path = str(tmp_path / "lake")
    storage, table_id = v3_table(path, checkpoint_interval=100)
    a = committer(storage, table_id, WA)  # views off
    for batch in range(3):
        a.commit(batch, batch_files(storage, WA, batch, ROWS * batch))
    assert compact(path, min_files=2, check_store=False).version == 3
    report = truncate(path)  # versions from 3 on retained; batches 0..2's files deleted
    assert report.removed and commits(path)[0] == 0  # type: ignore[attr-defined]  # log kept whole
    b_store = Interleaving(path)
    b_store.held.add("_delta_log/00000000000000000001.json")  # a writer walking up from 0 dies here
    b = BatchCommitter(
        b_store, table_id=table_id, writer_id=WB, run="run-00000002", allow_other_queries=True,
        checkpoint_interval=100, after_commit=derived_views(b_store, table_id, spark_metadata=False),
    )  # fmt: skip
    assert b.commit(0, batch_files(b_store, WB, 0, 1000)).status == "committed"
    found = listed_files(storage)
    assert found is not None
    gone = [name for name in found[1] if not os.path.exists(os.path.join(path, name))]
    assert not gone, f"the Delta view at version {found[0]} lists deleted files {gone}"
    assert found[0] == Lake(path).version


def test_a_failed_read_of_a_spark_view_anchor_does_not_stop_the_view(tmp_path: Path) -> None:
    """Simulation seed 3041 of ``--world upgrade``: a writer reading the Spark view's layout
    met one failed read of an anchor (``_spark_metadata/_lakesink/<batch>.json``: EIO, a 503),
    skipped it, found a batch "no anchor explains" and stopped the view as foreign for good --
    its files then outlived every vacuum and sweep until ``sync-views``. A failed read is no
    foreign content: the update fails and the next commit does it."""
    from lakesink.views import spark_metadata_view
    from lakesink.views.spark_metadata_view import STOP_FILE, listed_files

    path = str(tmp_path / "lake")
    _, table_id = v3_table(path, checkpoint_interval=4)
    store = Interleaving(path)

    def writer(run: str) -> BatchCommitter:
        return BatchCommitter(
            store, table_id=table_id, writer_id=WA, run=run, checkpoint_interval=4,
            after_commit=derived_views(store, table_id, delta_log=False),
        )  # fmt: skip

    first = writer("run-00000001")
    for batch in range(12):  # Spark's compact batches at 9 and 19: anchors in _spark_metadata/_lakesink
        first.commit(batch, batch_files(store, WA, batch, ROWS * batch))
    assert os.listdir(os.path.join(path, "_spark_metadata", "_lakesink"))
    spark_metadata_view.forget(store, table_id)  # a restarted driver reads the view's layout
    failed: list[str] = []

    def fail_once(name: str) -> None:  # each anchor's first read, while batch 12 commits
        if name.startswith("_spark_metadata/_lakesink/") and name not in failed:
            failed.append(name)
            raise OSError(5, "Input/output error", name)

    store.before_read = fail_once
    second = writer("run-00000002")
    second.commit(12, batch_files(store, WA, 12, ROWS * 12))
    assert failed  # the read failed
    assert not os.path.exists(os.path.join(path, STOP_FILE))
    store.before_read = None
    second.commit(13, batch_files(store, WA, 13, ROWS * 13))
    found = listed_files(store)
    assert found is not None and found[0] == Lake(path).version == 13
