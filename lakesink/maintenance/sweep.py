"""The orphan sweep: what crashed or losing writers left in a table, and which of it may go.

Orphans are invisible to ``read_committed`` but cost space or money: staged data (``.uncommitted``
files, open multipart uploads on S3, which S3 bills until aborted) and, in epoch mode, data
files that were published but that no epoch record lists (a task or driver died between
publishing and recording, a speculative duplicate, a commit that lost a race).

The rule that makes a sweep safe beside live writers (docs/FORMAT.md, "Fault model") is read
off the log, not off clocks: an epoch is *settled* once its record exists, and records never
change, so

- a published file of a settled epoch that its record does not list will never be committed:
  it is garbage, removed whatever its age;
- a published, unrecorded file of an epoch *not* settled may be a commit in flight (its record
  is written next): it is never removed. The replay of that epoch settles it;
- staged data of a settled epoch is a dead or losing attempt's: removed whatever its age. Not
  in foreach mode, where nothing settles a staged file: one whose (partition, epoch) is
  published may be the longer retry about to replace a truncated file (``FileWriter.publish``);
- other staged data may belong to a task that is still writing: removed only when older than
  ``older_than``. If that guess is wrong, the task's publish fails and Spark retries the task;
  nothing committed is touched.

File ages cannot decide more than that: a hard link keeps the staged file's mtime, and on AWS
a multipart object's LastModified is when its upload began.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pyarrow as pa

from lakesink.maintenance.compact import open_v3, stream_live_files
from lakesink.views.derived import expired_view_files, files_lagging_views_list
from lakesink.views.iceberg_layout import METADATA_DIR as ICEBERG_DIR
from lakesink_reader.errors import CorruptFileError, LakeSinkError
from lakesink_reader.format.log import EpochLog
from lakesink_reader.format.opening import oldest_commit
from lakesink_reader.format.partitions import partition_folders
from lakesink_reader.format.table import probe_store, read_table_metadata
from lakesink_reader.format.v3.logfiles import LOG_DIR, parallel
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.names import (
    EPOCHS_DIR,
    META_DIR,
    OPS_DIR,
    PROBE_ABANDONED_AGE,
    PROBE_PREFIX,
    parse_compaction_file,
    parse_data_file,
    parse_writer_file,
)
from lakesink_reader.storage import StagedEntry, Storage, open_storage

log = logging.getLogger(__name__)

#: Folders of a table that writers stage files in (the table layout is flat, docs/FORMAT.md).
TABLE_FOLDERS = ("", META_DIR, EPOCHS_DIR)

#: ``removed_file``: a data file a retained commit removed (a compaction replaced it) before the
#: retained range; ``unrecorded_file``: one no retained version lists for another reason.
#: ``view_file``: a derived view's file of versions the view no longer holds (vacuum, and a
#: sweep asked for ``views``: ``lakesink orphans``).
OrphanKind = Literal[
    "staged_file", "multipart_upload", "unrecorded_file", "removed_file", "lease", "probe", "view_file"
]


@dataclass(frozen=True)
class Orphan:
    """Something in a table that no reader of committed data needs.

    Attributes
    ----------
    kind
        ``staged_file`` (local ``.uncommitted`` file), ``multipart_upload`` (S3 upload never
        completed), ``unrecorded_file`` (epoch mode: published, listed by no record; format 3:
        by no retained version), ``lease`` (format 3: the lease of an op the log settled),
        ``probe`` (a store probe's object whose prober died before removing it) or ``view_file``
        (vacuum, ``lakesink orphans``: a derived view's file of snapshots it no longer holds).
    name
        The name relative to the table root (for staged data: the name it would publish as).
    epoch
        The epoch (format 3: the writer's batch) it belongs to, when its name says.
    age
        Seconds since it was staged (None when the storage cannot say).
    size
        Bytes, when known without extra requests.
    settled
        The log (or, in foreach mode, a published file of the same name) proves it garbage.
    reason
        Why it may be removed, or why it is kept.
    """

    kind: OrphanKind
    name: str
    epoch: int | None
    age: float | None
    size: int | None
    settled: bool
    reason: str
    handle: str = field(default="", repr=False, compare=False)


@dataclass
class SweepReport:
    """What a sweep found and, with ``delete=True``, what it removed or failed to remove.

    ``findings`` may be removed (oldest first); ``kept`` are unrecorded files of epochs not
    settled yet, which no age makes safe to remove.
    """

    path: str
    older_than: float
    delete: bool
    findings: list[Orphan] = field(default_factory=list)
    kept: list[Orphan] = field(default_factory=list)
    removed: list[Orphan] = field(default_factory=list)
    failed: list[tuple[Orphan, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


Progress = Callable[[int, int], None]


def sweep(
    path_or_storage: str | Storage,
    *,
    older_than: float,
    delete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    now: float | None = None,
    progress: Progress | None = None,
    check_store: bool = True,
    views: bool = False,
) -> SweepReport:
    """List (and with ``delete=True`` remove) the orphans of the table at ``path``.

    Parameters
    ----------
    path_or_storage
        The table root (local path, ``file://`` or ``s3://bucket/prefix``) or its storage.
    older_than
        Seconds. Staged data of epochs that may still be in flight is removed only when
        older than this; choose it longer than any task keeps a file staged. What the log
        proves garbage is removed whatever its age.
    delete
        Remove what is found. False (the default) only lists.
    storage_options
        As for the writer (S3: ``endpoint_url``, ``key``, ``secret``, ...).
    now
        The clock for ages (tests pass their own).
    progress
        Called as ``progress(done, total)`` while removing.
    check_store
        With ``delete``, first check that the store still honours create-if-absent writes
        (``Storage.check_conditional_writes``: six requests on S3), and remove nothing if it
        does not. The writers' own sweep skips it: their run was checked when it started.
    views
        Also the derived views' files of versions they no longer hold (a format-3 lake's Iceberg
        view: ``view_orphans``), as vacuum finds them: those of snapshots a metadata file
        dropped beyond its cap, or that an interrupted vacuum left. It reads the view's kept
        metadata and their manifest lists (up to thousands of reads), so the writers' own sweep
        after a commit leaves it out; ``lakesink orphans`` asks for it.

    Raises
    ------
    ValueError
        ``older_than`` is negative or not a number.
    TableNotFoundError, NotALakeError
        Nothing at ``path``, or no lakesink table there: nothing is touched.
    """
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not older_than >= 0:
        raise ValueError(f"older_than must be a number of seconds >= 0, got {older_than!r}")
    storage = (
        open_storage(path_or_storage, storage_options)
        if isinstance(path_or_storage, str)
        else path_or_storage
    )
    metadata = read_table_metadata(storage)  # refuses a folder that is not a lake
    if delete and check_store:
        probe_store(storage)  # a store that overwrites: refuse before touching anything
    now = time.time() if now is None else now
    report = SweepReport(storage.url, float(older_than), delete)
    if metadata.has_log:
        _, vlog = open_v3(storage, "the sweep")
        plan = plan_v3(
            storage,
            vlog,
            retained_from=None,
            older_than=float(older_than),
            now=now,
            partition_columns=metadata.partition_columns,
        )
        report.findings, report.kept = _spare_what_lagging_views_list(storage, plan)
        report.findings += _abandoned_probes(storage, now)
        if views:
            report.findings += view_orphans(storage)  # last, in their order: see view_orphans
        if delete:
            _remove(storage, report, progress)
        return report

    recorded_epochs: set[int] = set()
    recorded_names: set[str] = set()
    if metadata.mode == "epoch":
        # A record never changes, so this snapshot can only make the sweep keep too much.
        for record in EpochLog(storage).records():
            recorded_epochs.add(record.epoch)
            recorded_names.update(f.name for f in record.files)
    # A partitioned foreach lake's files are in its partition folders; staged ones beside them.
    data_folders = ["", *partition_folders(storage, metadata.partition_columns)]
    listing = [
        (entry, parse_data_file(entry.name.rpartition("/")[2]))
        for folder in data_folders
        for entry in storage.list(folder)
    ]
    published = {
        entry.name for entry, parsed in listing if parsed is not None and parsed.state == "published"
    }

    for entry, parsed in listing:
        if metadata.mode != "epoch" or entry.name not in published or entry.name in recorded_names:
            continue
        assert parsed is not None
        settled = parsed.epoch in recorded_epochs
        orphan = Orphan(
            "unrecorded_file",
            entry.name,
            parsed.epoch,
            None if entry.modified is None else now - entry.modified,
            entry.size,
            settled,
            f"epoch {parsed.epoch} is recorded without it"
            if settled
            else f"epoch {parsed.epoch} has no record yet: a commit may be in flight (its replay settles it)",
        )
        (report.findings if settled else report.kept).append(orphan)

    for folder in (*TABLE_FOLDERS, *data_folders[1:]):
        for staged in storage.staged(folder):
            parsed = parse_data_file(staged.name.rsplit("/", 1)[-1])
            epoch = parsed.epoch if parsed is not None else None
            age = None if staged.started is None else now - staged.started
            if _live_probe(staged, age):
                continue
            if metadata.mode == "epoch":
                settled = epoch is not None and epoch in recorded_epochs
                why = f"epoch {epoch} is recorded without it"
            else:
                # Foreach: a published name does not settle a staged attempt at it, which may
                # be the longer retry about to replace a truncated file (FileWriter.publish).
                settled, why = False, ""
            if not settled and (age is None or age < older_than):
                continue  # may be a live task's: too young to judge
            reason = why if settled else f"staged {age:.0f} s ago, longer than {older_than:g} s"
            kind: OrphanKind = "multipart_upload" if staged.kind == "multipart_upload" else "staged_file"
            orphan = Orphan(kind, staged.name, epoch, age, staged.size, settled, reason, staged.handle)
            report.findings.append(orphan)

    report.findings += _abandoned_probes(storage, now)
    report.findings.sort(key=lambda o: (-(o.age or 0.0), o.name))
    if metadata.mode == "epoch" and read_table_metadata(storage).has_log:
        # `lakesink upgrade` reached its commit point since table.json was read, and format-3
        # writers may have committed files since, which no epoch record lists: this plan would
        # take them for orphans. Every listing above came before this read, so a table.json
        # still at format 2 here means none of them holds a format-3 file. (Simulation seed 28.)
        log.info("%s was upgraded to format 3 while it was swept: sweeping it as format 3", storage.url)
        return sweep(
            storage, older_than=older_than, delete=delete, now=now, progress=progress, check_store=False
        )
    if delete:
        _remove(storage, report, progress)
    return report


def view_orphans(storage: Storage) -> list[Orphan]:
    """The derived views' files of versions they no longer hold (``expired_view_files``), in the
    order they may go: metadata files before the Avro files they name, so a removal stopped half
    way never leaves a metadata file naming a missing file. Their safety is read off the view,
    not off the log or ages: only files of snapshots below the oldest one the view's hint and
    newest metadata file hold, which no reader given the lake's path reaches, and which a hook
    writing the next snapshot never names (docs/design/iceberg-view.md, section 6)."""
    return [
        Orphan("view_file", e.name, None, None, e.size, True, e.reason) for e in expired_view_files(storage)
    ]


def _abandoned_probes(storage: Storage, now: float) -> list[Orphan]:
    """Store probes' objects (``_lakesink/probe-<id>``) at least PROBE_ABANDONED_AGE old: a probe
    removes its object within seconds, so one that old was left by a prober that died (kill -9)
    or whose delete failed. Younger ones may belong to a probe still running: kept, unreported."""
    found = []
    for entry in storage.list(META_DIR):
        if not entry.name.startswith(PROBE_PREFIX) or "/" in entry.name[len(PROBE_PREFIX) :]:
            continue
        age = None if entry.modified is None else now - entry.modified
        if age is not None and age >= PROBE_ABANDONED_AGE:
            why = f"a store probe's object, {age:.0f} s old: its prober died before removing it"
            found.append(Orphan("probe", entry.name, None, age, entry.size, True, why))
    return found


def _spare_what_lagging_views_list(storage: Storage, plan: SweepPlan) -> tuple[list[Orphan], list[Orphan]]:
    """The findings and the kept, less what a derived view behind the retained versions still
    lists (kept, with the reason): its readers read the version it holds (issue 32, hole 4;
    ``vacuum`` spares them too, after bringing the views up). Simulation seed 182: a Delta view
    started on an upgraded lake at its version 0, its writer killed after that first version."""
    names = {o.name for o in plan.findings}
    listed = files_lagging_views_list(storage, plan.facts.retained_from, names) if names else {}
    spared = [replace(o, reason=listed[o.name]) for o in plan.findings if o.name in listed]
    return [o for o in plan.findings if o.name not in listed], plan.kept + spared


def _live_probe(staged: StagedEntry, age: float | None) -> bool:
    """A store probe's staged object that may belong to a probe still running (see PROBE_PREFIX):
    younger than PROBE_ABANDONED_AGE by its staging marker (or, on file systems, its file).

    An S3 probe upload listed without a marker (an empty ``handle``) is no live probe's: a probe
    writes its marker before it creates its upload, and ``S3Storage.staged`` lists the uploads
    before the markers. It is a twin a lost answer left, or a killed probe's; its age is the
    store's ``Initiated`` time, and the sweep's own age rule applies to it.
    """
    if not staged.name.startswith(PROBE_PREFIX):
        return False
    orphaned = staged.kind == "multipart_upload" and not staged.handle
    return not orphaned and (age is None or age < PROBE_ABANDONED_AGE)


def _remove(storage: Storage, report: SweepReport, progress: Progress | None) -> None:
    total = len(report.findings)
    for done, orphan in enumerate(report.findings, 1):
        try:
            if orphan.kind in ("unrecorded_file", "removed_file", "lease", "probe", "view_file"):
                storage.delete(orphan.name)
            else:
                storage.drop_staged(StagedEntry(orphan.name, orphan.kind, None, orphan.size, orphan.handle))
        except (OSError, LakeSinkError) as exc:  # one stuck orphan must not stop the sweep: report it
            log.warning("could not remove %s %s: %s", orphan.kind, orphan.name, exc)
            report.failed.append((orphan, str(exc)))
        else:
            log.info("removed %s %s: %s", orphan.kind, orphan.name, orphan.reason)
            report.removed.append(orphan)
        if progress is not None:
            progress(done, total)


def sweep_after_commit(storage: Storage, *, older_than: float) -> SweepReport | None:
    """The writer's sweep after its first commit of a run (format 2 and 3): ``sweep`` with
    ``delete=True`` and no store probe (the run probed the store when it started). Never raises:
    the commit stands whatever the sweep does; a failure is logged and None returned."""
    try:
        return sweep(storage, older_than=older_than, delete=True, check_store=False)
    except Exception:
        log.warning("the sweep of %s after a commit failed; the commit stands", storage.url, exc_info=True)
        return None


# Format 3: the log-driven sweep shared with vacuum (docs/design/format-v3.md, section 11) --------


@dataclass(frozen=True)
class LogFacts:
    """What the log says at one version, for deciding which files no retained version needs.

    ``needed``: every path a version ``>= retained_from`` lists (the live files at the latest
    version plus what the commits after ``retained_from`` removed); ``removed_before``: paths
    removed by the retained commits up to ``retained_from`` (committed once, needed by no
    version from ``retained_from`` on); ``oldest``: the oldest commit still in the log.
    """

    state: TableState
    retained_from: int
    oldest: int
    needed: frozenset[str]
    removed_before: frozenset[str]


@dataclass
class SweepPlan:
    facts: LogFacts
    findings: list[Orphan]
    kept: list[Orphan]


def read_log_facts(storage: Storage, vlog: VersionedLog, retained_from: int | None) -> LogFacts:
    """The log's facts at its latest version, for the retention floor ``retained_from`` (None:
    the oldest retained version, ``max(state.retained_from, oldest commit)``; a floor below the
    state's is raised to it).

    Memory: the paths of the live files and of the removes of the retained commits (~100 B
    each). The design's merge-join of the sorted checkpoint list with a sorted listing, which
    bounds it, is left for later (docs/design/format-v3.md, section 11)."""
    snap = vlog.snapshot()
    state = snap.state
    if state.version < 0:
        return LogFacts(state, 0, 0, frozenset(), frozenset())
    oldest = oldest_commit(storage, vlog)
    oldest = state.version if oldest is None else oldest
    floor = max(state.retained_from, oldest, retained_from or 0)
    needed: set[str] = set()

    def take(table: pa.Table) -> None:
        needed.update(str(p) for p in table.column("path").to_pylist())

    stream_live_files(storage, vlog, snap, take)
    known = {h.version: h for h in snap.headers}
    missing = [v for v in range(oldest, state.version + 1) if v not in known]
    for v, header in zip(missing, parallel(vlog.read_header, missing), strict=True):
        if header is None:
            raise CorruptFileError(f"{storage.url}: log version {v} vanished while the log was read")
        known[v] = header
    removing = [v for v in range(oldest + 1, state.version + 1) if known[v].counts.remove_files]
    removed_before: set[str] = set()
    for v, commit in zip(removing, parallel(vlog.read_commit, removing), strict=True):
        if commit is None:
            raise CorruptFileError(f"{storage.url}: log version {v} vanished while the log was read")
        (needed if v > floor else removed_before).update(r.path for r in commit.removes)
    return LogFacts(state, floor, oldest, frozenset(needed), frozenset(removed_before - needed))


def plan_v3(
    storage: Storage,
    vlog: VersionedLog,
    *,
    retained_from: int | None,
    older_than: float,
    now: float,
    partition_columns: Sequence[str] = (),
) -> SweepPlan:
    """What may go from a format-3 epoch lake when versions from ``retained_from`` (None: the
    oldest retained one) must stay readable: published data files no such version lists whose
    producer is settled, staged data of settled producers (others when older than
    ``older_than``), and the leases of settled ops.

    The listing is taken *before* the log is read: a file listed then that the log does not
    list is either settled by the log read after it, or still in flight, and then its writer is
    known to that log with an older last batch, or unknown and at its first batch (section 11).
    A partitioned lake's data files are in its partition folders (``partition_columns``).
    """
    data_folders = ["", *partition_folders(storage, partition_columns)]
    listing = [entry for folder in data_folders for entry in storage.list(folder)]
    # (The Iceberg view's hint is replaced through a staged file: one its writer was killed
    # before publishing is swept by age, as any staged file no commit settles.)
    folders = (*TABLE_FOLDERS, LOG_DIR, ICEBERG_DIR, *data_folders[1:])
    staged = [s for folder in folders for s in storage.staged(folder)]
    leases = storage.list(OPS_DIR)
    facts = read_log_facts(storage, vlog, retained_from)
    state = facts.state
    findings: list[Orphan] = []
    kept: list[Orphan] = []
    for entry in listing:
        name = entry.name
        if name in facts.needed:
            continue
        batch, settled, why = _producer(state, name.rpartition("/")[2])
        if settled is None:
            continue  # not a data file of this lake (or a staged one: below)
        kind: OrphanKind = "unrecorded_file"
        if name in facts.removed_before:
            kind, settled, why = (
                "removed_file",
                True,
                f"removed from the table (a compaction replaced it) before version {facts.retained_from}, "
                "the retained range's start",
            )
        elif settled:
            why = f"no version from {facts.retained_from} on lists it; {why}"
        age = None if entry.modified is None else now - entry.modified
        orphan = Orphan(kind, name, batch, age, entry.size, settled, why)
        (findings if settled else kept).append(orphan)
    for part in staged:
        batch, settled, why = _producer(state, part.name.rsplit("/", 1)[-1])
        age = None if part.started is None else now - part.started
        if _live_probe(part, age):
            continue
        if not settled:
            if age is None or age < older_than:
                continue  # may be a live task's (or checkpoint writer's): too young to judge
            why = f"staged {age:.0f} s ago, longer than {older_than:g} s"
        staged_kind: OrphanKind = "multipart_upload" if part.kind == "multipart_upload" else "staged_file"
        findings.append(
            Orphan(staged_kind, part.name, batch, age, part.size, bool(settled), why, part.handle)
        )
    for entry in leases:
        token = entry.name.rsplit("/", 1)[-1].removesuffix(".json")
        op = state.ops.get(token)
        if op is not None:
            age = None if entry.modified is None else now - entry.modified
            why = f"op {token} was {op.outcome} at version {op.version}"
            findings.append(Orphan("lease", entry.name, None, age, entry.size, True, why))
    findings.sort(key=lambda o: (-(o.age or 0.0), o.name))
    return SweepPlan(facts, findings, kept)


def _producer(state: TableState, name: str) -> tuple[int | None, bool | None, str]:
    """(batch, settled, why) for a base name at the root of a format-3 lake: whether whoever
    wrote it can no longer commit it. ``settled`` None: not a data file name of this lake."""
    token = parse_compaction_file(name)
    if token is not None:
        op = state.ops.get(token)
        if op is not None:
            return None, True, f"its op {token} was {op.outcome} at version {op.version}"
        return (
            None,
            False,
            (
                f"op {token} is not in the log: it may still commit (`lakesink compact` abandons it "
                "once idle for --abandon-older-than)"
            ),
        )
    written = parse_writer_file(name)
    if written is not None:
        tag, batch = written
        writers = [w for w in state.writers.values() if w.tag == tag]
        if not writers:
            return batch, False, f"no writer of tag {tag} has committed yet: its first batch may be in flight"
        w = writers[0]
        if w.retired or w.last_batch >= batch:
            return (
                batch,
                True,
                f"batch {batch} of writer {w.id} is settled (its last batch is {w.last_batch})",
            )
        return batch, False, f"batch {batch} of writer {w.id} is not committed yet: a commit may be in flight"
    parsed = parse_data_file(name) if not name.startswith(".") else None
    if parsed is None:
        return None, None, ""
    return parsed.epoch, *_batch_settled(state, parsed.epoch)


def _batch_settled(state: TableState, batch: int) -> tuple[bool, str]:
    """Whether batch ``batch`` of *any* writer is settled, for names that carry the batch but not
    the writer (``part-<partition>-epoch-<batch>-<attempt>.parquet``): every writer that is not
    retired has committed it, and it is not a first batch (a writer the log does not know yet
    may be committing its batch 0; it cannot commit a later one before that)."""
    if batch == 0:
        return False, (
            "batch 0: a writer the log does not know yet may be committing its first batch, and the "
            "name does not say whose file it is"
        )
    behind = [w for w in state.writers.values() if not w.retired and w.last_batch < batch]
    if behind:
        names = ", ".join(f"{w.id} (last batch {w.last_batch})" for w in behind[:3])
        return (
            False,
            f"batch {batch} is not committed by every writer yet: {names}; a commit may be in flight",
        )
    return True, f"batch {batch} is committed by every writer"
