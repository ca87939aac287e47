"""Views that lag behind the lake, then maintenance (issue 32, hole 4).

A writer killed -9 between its lake commit and its view update leaves the Delta view
(``_delta_log/``) and the Spark view (``_spark_metadata/``) behind the lake. Whatever updates a
view afterwards (the writer's next commit, ``compact``, ``vacuum``, ``sync-views``) brings it up
to the lake's version, however far behind it is; ``vacuum`` never deletes a file a view still
lists; ``lakesink verify`` fails on a view that lists a gone file or is behind a version vacuum
removed, and ``lakesink sync-views`` repairs it.

The kill is simulated by committing through a ``VersionedLogWriter`` without the views' hook (what
the lake holds after a writer died between its create and its ``after_commit``); a view that
cannot be written at all, by a store that refuses writes under the views' folders. Spark-free:
the Delta view is read by deltalake and polars in a subprocess (``test_delta_view.oracle``), the
Spark view by parsing what Spark reads of it (the newest compact batch and the batches after it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from lakes import v3_table
from test_delta_view import oracle
from test_reader_v3 import W1, Writer, ids
from test_spark_view import live, viewed_log

from lakesink.cli import main
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import compact as compact_lake
from lakesink.maintenance import vacuum, verify
from lakesink.maintenance.vacuum import DAY
from lakesink.views import delta_view, spark_metadata_view
from lakesink.views.delta import delta_commit_name
from lakesink.views.spark_metadata_view import (
    COMPACT_INTERVAL,
    base_uri,
    batch_name,
    parse_batch,
    read_layout,
)
from lakesink_reader import read_committed
from lakesink_reader.format.v3.logfiles import commit_name
from lakesink_reader.storage import Storage
from lakesink_reader.storage.local import LocalStorage

INTERVAL = 5


class ViewsRefused(LocalStorage):
    """Local disk that refuses every write under the views' folders (a view that cannot be
    brought up: a permission, a quota, an outage of that prefix)."""

    #: The folders whose writes are refused.
    refused: tuple[str, ...] = ("_delta_log/", "_spark_metadata/")

    def _refuse(self, name: str) -> None:
        if name.startswith(self.refused):
            raise PermissionError(f"{name}: writes refused (test)")

    def put_if_absent(self, name: str, data: bytes) -> bool:
        self._refuse(name)
        return super().put_if_absent(name, data)

    def put(self, name: str, data: bytes) -> None:
        self._refuse(name)
        super().put(name, data)

    def delete(self, name: str) -> None:
        self._refuse(name)
        super().delete(name)


def restart(storage: Storage, table_id: str) -> None:
    """A new process: nothing known of the views."""
    delta_view.forget(storage, table_id)
    spark_metadata_view.forget(storage, table_id)


def plain(storage: Storage, table_id: str) -> VersionedLogWriter:
    """The lake's log without the views' hook: a commit through it is a writer killed after its
    lake commit, before its view update."""
    return VersionedLogWriter(storage, table_id, checkpoint_interval=INTERVAL)


def spark_reads(storage: Storage) -> dict[str, int]:
    """What ``spark.read.parquet(lake)`` reads through ``_spark_metadata/``: the newest compact
    batch and every batch after it (path relative to the lake -> size)."""
    layout = read_layout(storage)
    assert layout.latest is not None
    start = (layout.latest + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1
    base = base_uri(storage)
    out: dict[str, int] = {}
    for b in range(start, layout.latest + 1):
        for entry in parse_batch(storage.read_bytes(batch_name(b))):
            path = str(entry["path"])
            assert path.startswith(base + "/")
            out[path[len(base) + 1 :]] = int(entry["size"])  # type: ignore[call-overload]
    return out


def spark_view_version(storage: Storage) -> int | None:
    layout = read_layout(storage)
    return layout.version_of(layout.latest) if layout.latest is not None else None


def assert_every_reader_reads_the_lake(lake: str, storage: Storage) -> None:
    """deltalake and polars (through the Delta view) and Spark's view read exactly the lake's
    rows at its latest version, every file they list there."""
    expected = ids(read_committed(lake))
    seen = oracle(lake, [None])["None"]
    assert seen["deltalake"] == seen["polars"] == expected
    assert seen["version"] == read_committed_version(lake)
    files = spark_reads(storage)
    assert files == live(lake)
    assert all(os.path.exists(os.path.join(lake, name)) for name in files)
    assert spark_view_version(storage) == read_committed_version(lake)


def read_committed_version(lake: str) -> int:
    from lakesink_reader import Lake

    return Lake(lake).version


def lagging_lake(lake: str) -> tuple[Storage, str, Writer]:
    """Versions 0..3 appended with both views, then version 4 appended by a writer killed before
    its view update: both views hold version 3."""
    storage, table_id = v3_table(lake, checkpoint_interval=INTERVAL)
    writer = Writer(viewed_log(storage, table_id), W1)
    for i in range(4):
        writer.append(i * 100)
    writer.log = plain(storage, table_id)
    assert writer.append(400) == 4
    restart(storage, table_id)
    assert not storage.exists(delta_commit_name(4)) and spark_view_version(storage) == 3
    return storage, table_id, writer


def test_compact_and_vacuum_bring_lagging_views_up_before_files_go(lake: str) -> None:
    """The issue's interleaving: views one version behind, then a compaction and a vacuum that
    deletes the compaction's inputs. Delta and Spark readers read the lake's rows."""
    storage, _, _ = lagging_lake(lake)
    assert compact_lake(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    assert storage.exists(delta_commit_name(4)) and storage.exists(delta_commit_name(5))
    assert spark_view_version(storage) == 5
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 6 and done.ok and len(done.removed) >= 10  # the compaction's inputs went
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok and main(["verify", lake]) == 0


def test_vacuum_alone_brings_lagging_views_up_when_it_commits_nothing(lake: str) -> None:
    """A compaction whose view update was lost too, then a vacuum that cannot write the views
    (it keeps the compaction's inputs they list), then one whose retention floor is already
    committed: it commits nothing, so no commit hook runs; it brings the views up itself
    before it deletes the inputs."""
    storage, table_id, _ = lagging_lake(lake)
    inputs, listed = set(live(lake)), set(live(lake, 3))  # the views (at 3) list version 3's files
    refused = ViewsRefused(lake)
    assert compact_lake(refused, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    compacted = plain(storage, table_id).read_header(5)
    assert compacted is not None and compacted.committed_at is not None
    now = compacted.committed_at + DAY + 0.001  # version 5 is the newest as old as a day
    # ... by the store's clock too (vacuum's retention asks both): the commits' mtimes follow
    for v in range(6):
        at = compacted.committed_at - (5 - v)
        os.utime(os.path.join(lake, commit_name(v)), (at, at))
    restart(storage, table_id)
    first = vacuum(refused, retain=DAY, now=now, delete=True, check_store=False)
    assert first.version == 6 and first.retained_from == 5 and first.ok
    assert {o.name for o in first.kept} == listed
    assert {
        n for n in first.removed if n.endswith(".parquet")
    } == inputs - listed  # version 4's, which no view lists
    restart(storage, table_id)
    second = vacuum(lake, retain=DAY, now=now, delete=True, check_store=False)
    assert (
        second.version is None
        and second.ok
        and {n for n in second.removed if n.endswith(".parquet")} == listed
    )
    assert not any(os.path.exists(os.path.join(lake, name)) for name in inputs)
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok


def test_vacuum_keeps_what_a_view_it_cannot_bring_up_still_lists(lake: str, capsys: Any) -> None:
    """Views that cannot be written: vacuum keeps the files they still list (and says so),
    truncates the lake's log, and ``verify`` then fails (the views are behind versions the lake
    no longer has) until ``sync-views`` repairs them; a later vacuum deletes what was kept."""
    storage, table_id, writer = lagging_lake(lake)
    refused = ViewsRefused(lake)
    assert compact_lake(refused, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    inputs = set(live(lake, 3))  # what the views, at version 3, list
    writer.log = plain(storage, table_id)
    for i in range(6):  # versions 6..11, no view update either
        writer.append(1000 + i * 100)
    at_three = ids(read_committed(lake, version=3))
    restart(storage, table_id)
    done = vacuum(refused, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 12 and done.ok
    kept = {o.name for o in done.kept if "view" in o.reason}
    assert kept == inputs and all(os.path.exists(os.path.join(lake, name)) for name in inputs)
    assert all("sync-views" in o.reason for o in done.kept if o.name in inputs)
    assert plain(storage, table_id).read_header(4) is None  # the log is truncated below 10
    # Delta and Spark readers still read version 3, every file of it there.
    assert oracle(lake, [None])["None"]["deltalake"] == at_three
    assert all(os.path.exists(os.path.join(lake, name)) for name in spark_reads(storage))
    report = verify(lake)
    assert not report.ok and not report.problems
    assert "sync-views" in (report.delta_view or "") and "sync-views" in (report.spark_view or "")
    capsys.readouterr()
    assert main(["verify", lake]) == 1
    assert "lakesink sync-views" in capsys.readouterr().out
    assert main(["sync-views", lake, "--only", "all"]) == 0
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok and main(["verify", lake]) == 0
    restart(storage, table_id)
    again = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert {n for n in again.removed if n.endswith(".parquet")} == inputs and again.ok
    assert_every_reader_reads_the_lake(lake, storage)


def test_a_restarted_writer_brings_views_up_over_any_gap(lake: str) -> None:
    """Views far behind (more versions than a writer used to fill, and the versions they need
    vacuumed from the lake's log): the next writer commit brings both up, the Delta view from
    a view checkpoint built from the lake's checkpoint."""
    storage, table_id, writer = lagging_lake(lake)
    refused = ViewsRefused(lake)
    for _ in range(20):  # versions 5..24 (25 with the compaction): maintenance with no view update
        writer.append(5000 + writer.batch * 10)
    assert compact_lake(refused, target_file_size=1 << 30, min_files=2, check_store=False).version == 25
    restart(storage, table_id)
    assert vacuum(refused, retain=0, delete=True, force=True, check_store=False).version == 26
    assert plain(storage, table_id).read_header(20) is None
    restart(storage, table_id)
    writer.log = viewed_log(storage, table_id)
    assert writer.append(90_000) == 27
    assert storage.exists(delta_commit_name(27)) and spark_view_version(storage) == 27
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok


def test_verify_fails_on_a_view_that_lists_a_gone_file_and_sync_views_repairs_it(
    lake: str, capsys: Any
) -> None:
    """A compaction committed without its view update, and its inputs deleted by something that
    did not look at the views (an older lakesink's vacuum): the views list gone files."""
    storage, table_id, _ = lagging_lake(lake)
    inputs = sorted(live(lake))
    assert (
        compact_lake(ViewsRefused(lake), target_file_size=1 << 30, min_files=2, check_store=False).version
        == 5
    )
    gone = inputs[0]
    os.remove(os.path.join(lake, gone))
    restart(storage, table_id)
    report = verify(lake)
    assert not report.ok and not report.problems  # the lake is whole; its views are not
    assert gone in (report.delta_view or "") and gone in (report.spark_view or "")
    capsys.readouterr()
    assert main(["verify", lake]) == 1
    assert "lakesink sync-views" in capsys.readouterr().out
    assert main(["sync-views", lake, "--only", "all"]) == 0
    assert_every_reader_reads_the_lake(lake, storage)
    assert main(["verify", lake]) == 0


@pytest.fixture
def lake(tmp_path: Path) -> str:
    return str(tmp_path / "lake")


class KilledAtCompact(LocalStorage):
    """Local disk where the process dies as it puts a compact batch of ``_spark_metadata/``:
    after the compact's anchor went in, before the batch did (what a writer killed there leaves)."""

    def put_if_absent(self, name: str, data: bytes) -> bool:
        if name.startswith("_spark_metadata/") and name.endswith(".compact") and name != batch_name(9):
            raise OSError(f"{name}: the process died here (test)")
        return super().put_if_absent(name, data)


@pytest.mark.parametrize(
    ("later", "vacuumed"),
    [(0, False), (2, False), (spark_metadata_view.GAP_FILL + 2, False), (12, True)],
    ids=["same-version", "filled-in-order", "jumped", "its-version-vacuumed"],
)
def test_a_compact_anchor_without_its_batch_does_not_block_the_spark_view(
    lake: str, later: int, vacuumed: bool
) -> None:
    """A writer killed between a compact's anchor and its batch leaves an anchor naming a batch
    that is not there (the simulation's seed 160). Whoever updates the view next -- sync-views, or
    a writer of a later version -- writes over it: the same version's compact where the anchor
    already says so, else the next compact after it. Before, every try lost the same "race" to
    the dead writer, and sync-views said "behind: run it again" forever. (A view a few versions
    behind is filled in order from version 0, whose anchor the dead writer wrote alike; one far
    behind -- or whose early versions vacuum truncated -- jumps to the latest version, which the
    dead writer's anchor does not name.)"""
    storage, table_id = v3_table(lake, checkpoint_interval=INTERVAL)
    killed = KilledAtCompact(lake)
    writer = Writer(viewed_log(killed, table_id), W1)
    assert writer.append(0) == 0  # the hook's failure is logged, not raised
    layout = read_layout(storage)
    assert 19 in layout.anchors and 19 not in layout.batches and layout.latest is None
    writer.log = plain(storage, table_id)
    for i in range(later):
        assert writer.append(100 * (i + 1)) == i + 1
    if vacuumed:  # the version the anchor names is gone: the id is taken over
        # (A vacuum that reaches the Spark view fills the anchor before it truncates the log:
        # seed 36381. This one does not, so the anchor's version goes first.)
        done = vacuum(SparkViewRefused(lake), retain=0, delete=True, force=True, check_store=False)
        later = done.version
        assert plain(storage, table_id).read_commit(0) is None
    restart(storage, table_id)
    assert main(["sync-views", lake]) == 0
    assert spark_view_version(storage) == later
    if vacuumed:
        assert read_layout(storage).anchors == {19: later}
    compacts = sorted(b for b in read_layout(storage).batches if (b + 1) % COMPACT_INTERVAL == 0)
    assert compacts[-1] - compacts[-2] == COMPACT_INTERVAL  # Spark reads K from the two newest
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok
    writer.log = viewed_log(storage, table_id)  # and the view goes on from there
    assert writer.append(1000) == later + 1
    assert spark_view_version(storage) == later + 1
    assert_every_reader_reads_the_lake(lake, storage)


def test_a_view_checkpoint_older_than_the_lakes_log_is_reported_not_raised(lake: str) -> None:
    """The simulation's seed 2428: the Delta view's newest checkpoint is at a version the lake
    can no longer derive (the view checkpoint due later was never written -- its writer killed
    -- and vacuum truncated the lake's log below it): `verify` reports the view behind and names
    `sync-views` (it used to raise CorruptFileError), and `sync-views` writes the checkpoint."""
    from lakesink.views.delta import delta_checkpoint_name

    storage, table_id = v3_table(lake, checkpoint_interval=INTERVAL)
    writer = Writer(viewed_log(storage, table_id), W1)
    for i in range(11):  # versions 0..10: view checkpoints at 5 and 10
        writer.append(i * 100)
    restart(storage, table_id)
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.ok and not storage.exists(commit_name(4))  # the lake's log starts at 10 now
    assert storage.exists(delta_checkpoint_name(10))
    storage.delete(delta_checkpoint_name(10))  # as if its writer had been killed before it
    restart(storage, table_id)
    checked = verify(lake)  # raised CorruptFileError: "... the live files at version 5 cannot be derived"
    assert checked.delta_view is not None and checked.delta_view.startswith("behind"), checked.delta_view
    assert "sync-views" in checked.delta_view and "version 5" in checked.delta_view
    assert main(["sync-views", lake]) == 0
    assert storage.exists(delta_checkpoint_name(10))
    assert verify(lake).ok
    assert_every_reader_reads_the_lake(lake, storage)


class Watched(LocalStorage):
    """Local disk that checks, after every write to a view, what that view's readers would read
    at that moment: every file the Spark view's current batches list, and every file live at the
    Delta view's newest version, exists. (Noted, not raised: the views' hook logs any exception.)"""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.seen: list[str] = []
        self.problems: list[str] = []

    def put_if_absent(self, name: str, data: bytes) -> bool:
        created = super().put_if_absent(name, data)
        gone: list[str] = []
        if name.startswith("_spark_metadata/") and not name.startswith("_spark_metadata/_"):
            self.seen.append(name)
            if read_layout(self).latest is not None:
                gone = [f for f in spark_reads(self) if not os.path.exists(os.path.join(self.root, f))]
        if name.startswith("_delta_log/") and name.endswith(".json") and name[11:31].isdigit():
            self.seen.append(name)
            try:
                listed = live(self.root, int(name[11:31]))
            except Exception as exc:  # noqa: BLE001 - a version the lake no longer reads
                self.problems.append(f"after {name}: the lake cannot read that version: {exc}")
                listed = {}
            gone = [f for f in listed if not os.path.exists(os.path.join(self.root, f))]
        if gone:
            self.problems.append(f"after {name}, the view's readers meet gone files: {gone}")
        return created


class LogDeletesFail(LocalStorage):
    """Local disk on which deleting a log entry fails (vacuum stops after its commit)."""

    def delete(self, name: str) -> None:
        if name.startswith("_lakesink/log/"):
            raise OSError(f"{name}: delete failed (test)")
        super().delete(name)


class SparkViewRefused(ViewsRefused):
    """Local disk that refuses every write under ``_spark_metadata/``: maintenance that cannot
    reach the Spark view leaves an anchor without its batch as it found it (else its bring-up of
    the views fills it: simulation seed 36381)."""

    refused = ("_spark_metadata/",)


class SparkViewRefusedLogDeletesFail(SparkViewRefused, LogDeletesFail):
    """Both: the Spark view's writes refused, and deleting a log entry fails."""


def test_a_late_writer_never_places_a_view_below_the_versions_the_lake_retains(lake: str) -> None:
    """Simulation seed 211: a lake written without views is compacted and vacuumed (the retention
    floor committed, the log's truncation failed, the compaction's inputs deleted by a sweep);
    then a writer that keeps the views commits. Its hook used to fill both views from version 0,
    and until it reached its own version, readers of the views met the deleted files. It now
    places each view at a version the lake retains."""
    storage, table_id = v3_table(lake, checkpoint_interval=INTERVAL)
    writer = Writer(plain(storage, table_id), W1)  # the views off
    for i in range(3):
        writer.append(i * 100)  # versions 0..2
    inputs = set(live(lake))
    assert compact_lake(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    done = vacuum(LogDeletesFail(lake), retain=0, delete=True, force=True, check_store=False)
    assert done.version == 4 and done.retained_from == 3
    assert storage.exists(commit_name(0))  # the log was not truncated
    from lakesink.maintenance import sweep

    sweep(lake, older_than=0, delete=True, check_store=False)
    assert not any(os.path.exists(os.path.join(lake, name)) for name in inputs)  # gone
    assert not storage.exists(delta_commit_name(0)) and not storage.exists("_spark_metadata")
    restart(storage, table_id)
    watched = Watched(lake)
    writer.log = viewed_log(watched, table_id)  # the same writer, now keeping the views
    assert writer.append(900) == 5  # the views' hook runs here; Watched checks every step of it
    assert not watched.problems, watched.problems
    assert any(n.startswith("_spark_metadata/") for n in watched.seen)
    assert any(n.startswith("_delta_log/") for n in watched.seen)
    assert_every_reader_reads_the_lake(lake, storage)


def test_an_unfilled_spark_anchor_keeps_its_versions_files_until_its_batch_is_written(lake: str) -> None:
    """Simulation seed 30060: a writer that started the Spark view stopped (died, or stalled for
    good) between the compact anchor of its first batch, naming lake version 0, and the batch.
    The lake was then compacted and vacuumed (floor 3, the log not truncated; neither reached the
    Spark view) and swept, and the next writer keeping the views filled that anchor as its writer
    would have (hole 13): a compact of version 0, listing a file the sweep had deleted. An
    anchor whose batch is not written is a promise that batch keeps: maintenance now spares the
    files of the version it names (that writer, or the next, writes them into the view), and
    they go once the view is above the floor."""
    from lakesink.maintenance import sweep

    storage, table_id = v3_table(lake, checkpoint_interval=INTERVAL)
    writer = Writer(viewed_log(KilledAtCompact(lake), table_id), W1)
    assert writer.append(0) == 0  # the hook's failure is logged, not raised
    layout = read_layout(storage)
    assert layout.anchors == {19: 0} and 19 not in layout.batches and layout.latest is None
    promised = set(live(lake, 0))
    writer.log = plain(storage, table_id)
    for i in (1, 2):
        assert writer.append(i * 100) == i
    # Neither compaction nor vacuum reaches the Spark view here (else their bring-up fills the
    # anchor: seed 36381); the promise then stands until a writer's commit.
    refused = SparkViewRefusedLogDeletesFail(lake)
    assert compact_lake(refused, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    done = vacuum(refused, retain=0, delete=True, force=True, check_store=False)
    assert done.version == 4 and done.retained_from == 3
    assert storage.exists(commit_name(0))  # the log was not truncated: the anchor can be filled
    sweep(lake, older_than=0, delete=True, check_store=False)  # a writer's sweep (the seed's)
    restart(storage, table_id)
    watched = Watched(lake)
    writer.log = viewed_log(watched, table_id)  # a writer keeping the views commits
    assert writer.append(900) == 5  # its hook fills batch 19 (version 0), then version 5 at 29
    assert not watched.problems, watched.problems  # (batch 19 listed version 0's deleted files)
    assert {o.name for o in done.kept} == promised and len(done.removed) == 4  # versions 1, 2's went
    assert all("anchor" in o.reason and "version 0" in o.reason for o in done.kept), done.kept
    assert {19: 0, 29: 5}.items() <= read_layout(storage).anchors.items()
    sweep(lake, older_than=0, delete=True, check_store=False)  # the view is above the floor now
    assert not any(os.path.exists(os.path.join(lake, name)) for name in promised)
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok


class ViewReadsFail(LocalStorage):
    """Local disk on which reading the views' file lists fails (EIO, a 503): the Delta log's
    entries and the Spark view's batches (its anchors read)."""

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        spark_batch = name.startswith("_spark_metadata/") and not name.startswith(
            "_spark_metadata/_lakesink/"
        )
        if name.startswith("_delta_log/") or spark_batch:
            raise OSError(f"{name}: read failed (test)")
        return super().read_bytes(name, first_contact=first_contact, limit=limit)


def test_a_failed_read_of_a_lagging_views_files_deletes_nothing(lake: str) -> None:
    """Views behind a compaction, and a vacuum whose reads of the views fail: it cannot tell
    which files they list, so it deletes none of them (it used to take the failed read for a
    foreign view and keep nothing: Delta and Spark readers then met deleted files)."""
    storage, table_id, _ = lagging_lake(lake)
    refused = ViewsRefused(lake)  # the views stay at version 3
    assert compact_lake(refused, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    inputs = set(live(lake, 3))
    restart(storage, table_id)
    failing = ViewReadsFail(lake)
    with pytest.raises(OSError, match="read failed"):
        vacuum(failing, retain=0, delete=True, force=True, check_store=False)
    assert all(os.path.exists(os.path.join(lake, name)) for name in inputs)
    assert all(os.path.exists(os.path.join(lake, name)) for name in spark_reads(storage))
    # Readable again: the vacuum keeps what the views list, or brings them up first.
    restart(storage, table_id)
    assert vacuum(lake, retain=0, delete=True, force=True, check_store=False).ok
    assert_every_reader_reads_the_lake(lake, storage)


class KilledAtCompact29(LocalStorage):
    """Local disk where the process dies as it puts compact batch 29 of ``_spark_metadata/``."""

    def put_if_absent(self, name: str, data: bytes) -> bool:
        if name == batch_name(29):
            raise OSError(f"{name}: the process died here (test)")
        return super().put_if_absent(name, data)


@pytest.mark.parametrize("first", ["vacuum", "sync-views", "a-vacuum-killed-after-the-fill"])
def test_maintenance_fills_an_unfilled_spark_anchor_below_the_floor_and_converges(
    lake: str, first: str
) -> None:
    """Simulation seed 36381: a lake written without views was compacted; then a writer keeping
    the views started the Spark view in order from lake version 0 and stopped between the anchor
    of compact batch 19 (version 0) and the batch. The view has no batch, only that anchor.
    vacuum then raised the floor above version 0 and kept version 0's files for the anchor (hole
    15), but its bring-up of the views ("update the views the lake has, never start one") took
    "no batch" for "no view" and wrote nothing; the sweep kept them too, and no maintenance run
    ever ended the keep. The anchor is a view the lake has: vacuum (as sync-views does) now fills
    it with what its writer would write, puts the lake's version after it, and the files go. A
    vacuum killed between the fill and its own compact keeps them (the view then lags at version
    0), and the next run converges."""
    from lakesink.maintenance import sweep

    storage, table_id = v3_table(lake, checkpoint_interval=INTERVAL)
    writer = Writer(plain(storage, table_id), W1)  # the views off
    for i in range(3):
        assert writer.append(i * 100) == i
    assert compact_lake(lake, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    promised = live(lake, 0)
    writer.log = viewed_log(KilledAtCompact(lake), table_id)
    assert writer.append(300) == 4  # its hook fills the view from version 0 and dies at batch 19
    layout = read_layout(storage)
    assert layout.anchors == {19: 0} and layout.latest is None
    restart(storage, table_id)

    def filled_as_promised() -> None:
        # Batch 19 is what its writer would write, version 0's files: that writer, alive but
        # slow, finds it there when it puts its own (put_if_absent, a compare by files), no Foreign.
        assert read_layout(storage).anchors.get(19) == 0
        listed = spark_metadata_view._files_of(storage.read_bytes(batch_name(19)), base_uri(storage))
        assert listed == promised

    if first == "sync-views":
        assert main(["sync-views", lake]) == 0
    # The floor (4) is below the first checkpoint (5): the first vacuum keeps the log whole, as
    # in the seed (floor 3, interval 4), and the anchor names a version the lake can derive.
    killed = first == "a-vacuum-killed-after-the-fill"
    if killed:
        killed_run = vacuum(KilledAtCompact29(lake), retain=0, delete=True, force=True, check_store=False)
        assert killed_run.retained_from == 4 and {o.name for o in killed_run.kept} == set(promised)
        assert all("at lake version 0" in o.reason for o in killed_run.kept), killed_run.kept
        filled_as_promised()
        assert spark_view_version(storage) == 0
        restart(storage, table_id)
    done = vacuum(lake, retain=0, delete=True, force=True, check_store=False)
    assert done.ok and done.retained_from == (5 if killed else 4)
    assert not done.kept, done.kept  # (kept version 0's files for the anchor, every run)
    assert not any(os.path.exists(os.path.join(lake, name)) for name in promised)
    assert spark_view_version(storage) == done.version
    if not killed:  # (else the fill came first, and this vacuum's compact at 39 cleaned 19 up)
        filled_as_promised()
    swept = sweep(lake, older_than=0, delete=True, check_store=False)
    assert swept.ok and not swept.kept and not swept.findings, (swept.kept, swept.findings)
    assert_every_reader_reads_the_lake(lake, storage)
    assert verify(lake).ok
