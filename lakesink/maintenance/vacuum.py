"""Vacuum of a format-3 lake: what no version from the retention floor on needs goes.

One run (docs/design/format-v3.md, section 11), with ``delete=True``:

1. R = the newest version committed at or before ``now - retain`` by both its committer's
   clock and the store's (``retain`` of at least
   :data:`RETAIN_FLOOR`, 24 h, unless forced: the floor absorbs writer clock skew and long
   reads of old versions). When R is above the lake's ``retained_from``, a ``vacuum`` commit
   with ``retained_from = R`` is made: from then on readers refuse older versions;
2. the data files no version ``>= R`` lists go -- those removed by compactions before R, and
   published files no commit ever listed whose producer is settled -- with the staged data of
   settled producers (others when older than ``older_than``) and the leases of settled ops;
   then the derived views' files of versions they no longer hold (the Iceberg view's metadata
   and Avro files of expired snapshots: ``lakesink.views.iceberg_cleanup``).
   This is the orphan sweep's engine (``lakesink.maintenance.sweep.plan_v3``): a file of a
   batch a live writer may still commit is never touched;
3. C_R, the checkpoint at ``floor(R / N) * N`` (N = ``checkpoint_interval``), is written when
   missing, then read whole and its counts checked: from here on it is load-bearing;
4. the hint is made to name C_R, then the log entries below C_R go, in ascending version order
   (a checkpoint's small part before its file list, so no checkpoint ever names a missing list;
   the commit last), stopping at the first delete that fails: what is deleted of the log is a
   prefix, which committers rely on (``VersionedLogWriter._base_stands``); then the file lists no
   small part references at versions whose small part exists.

Every step is idempotent and none needs the previous run's memory: a kill -9 anywhere and a
rerun converge (the rerun's R is at least the committed one). Nothing is deleted without
``delete=True`` (the dry run reports what would go, for the R it would commit).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from lakesink.commit.checkpoints import advance_hint, write_checkpoint
from lakesink.commit.files import DEFAULT_STAGED_AGE
from lakesink.maintenance.compact import open_v3
from lakesink.maintenance.sweep import Orphan, SweepReport, _remove, plan_v3, view_orphans
from lakesink.views.derived import bring_up, files_lagging_views_list
from lakesink_reader.errors import CorruptFileError, LakeSinkError
from lakesink_reader.format.opening import oldest_commit
from lakesink_reader.format.table import TableMetadata, probe_store
from lakesink_reader.format.v3.checkpoint import (
    LAST_CHECKPOINT,
    due_checkpoint,
    iter_file_list,
    listed_log,
    parse_checkpoint_name,
    parse_file_list_name,
    read_checkpoint,
    read_hint,
)
from lakesink_reader.format.v3.commits import PendingCommit, new_op_token
from lakesink_reader.format.v3.logfiles import parallel, parse_commit_name
from lakesink_reader.format.v3.vlog import Snapshot, VersionedLog
from lakesink_reader.storage import Storage, open_storage

log = logging.getLogger(__name__)

DAY = 86400.0
#: ``retain`` below this is refused unless forced.
RETAIN_FLOOR = DAY
DEFAULT_RETAIN = 7 * DAY

#: Called at the run's steps ("committed", "files", "checkpoint", "log_entry" after each log entry
#: removed, "log"); tests pause or kill there.
Hook = Callable[[str], None]
Progress = Callable[[int, int], None]


@dataclass
class VacuumReport:
    """What a vacuum did (or, without ``delete``, would do).

    ``retained_from``: R, the oldest version that stays readable (None: no version is older
    than ``retain`` and nothing was retained before); ``version``: the vacuum commit (None: a
    dry run, or R was retained already); ``checkpoint``: C_R, the log is kept from there.
    ``files``: data files, staged data and leases that go (went); ``kept``: published files no
    retained version lists whose producer may still commit them; ``log_entries``: log entries
    that go (went).
    """

    path: str
    retain: float
    delete: bool
    latest: int
    retained_from: int | None = None
    previous_retained_from: int = 0
    version: int | None = None
    checkpoint: int | None = None
    files: list[Orphan] = field(default_factory=list)
    kept: list[Orphan] = field(default_factory=list)
    log_entries: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


def vacuum(
    path_or_storage: str | Storage,
    *,
    retain: float = DEFAULT_RETAIN,
    delete: bool = False,
    force: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    older_than: float = DEFAULT_STAGED_AGE,
    now: float | None = None,
    check_store: bool = True,
    progress: Progress | None = None,
    hook: Hook | None = None,
) -> VacuumReport:
    """Remove what no version committed within ``retain`` seconds needs (see the module docstring).

    Parameters
    ----------
    retain
        Seconds: versions committed since ``now - retain`` (and the newest one before) stay
        readable. Below :data:`RETAIN_FLOOR` (24 h) only with ``force``.
    delete
        Commit the retention floor and delete. False (the default): a dry run.
    force
        Allow ``retain`` below the floor (a reader of an older version, or a writer whose
        clock runs late, may then find its files gone).
    older_than
        Seconds: staged data of producers that may still be writing goes only when older.
    check_store
        With ``delete``, first check that the store honours create-if-absent (issue 27).

    Raises
    ------
    ValueError
        ``retain`` is negative, or below the floor without ``force``; or a foreach lake.
    FormatVersionError
        The lake is not format 3.
    CorruptFileError
        The checkpoint the log would be kept from cannot be read whole: nothing of the log is
        deleted (the data files have gone already, and no retained version needs them).
    """
    if isinstance(retain, bool) or not isinstance(retain, int | float) or not retain >= 0:
        raise ValueError(f"retain must be a number of seconds >= 0, got {retain!r}")
    if retain < RETAIN_FLOOR and not force:
        raise ValueError(
            f"retain {retain:g} s is below the safety floor of {RETAIN_FLOOR:g} s (24h): readers of older "
            "versions and writers whose clocks run late could find their files gone. Pass force=True "
            "(--force) if that is what you want"
        )
    storage = (
        open_storage(path_or_storage, storage_options)
        if isinstance(path_or_storage, str)
        else path_or_storage
    )
    metadata, vlog = open_v3(storage, "vacuum")
    if delete and check_store:
        probe_store(storage)  # a store that overwrites: refuse before touching anything
    now = time.time() if now is None else now
    snap = vlog.snapshot()
    state = snap.state
    report = VacuumReport(storage.url, float(retain), delete, state.version)
    report.previous_retained_from = state.retained_from
    if state.version < 0:
        return report
    found = retention_version(storage, vlog, snap, now - retain)
    target = max(found if found is not None else 0, state.retained_from)
    report.retained_from = target if (found is not None or state.retained_from) else None
    if delete and found is not None and found > state.retained_from:
        result = vlog.commit(PendingCommit.vacuum(op_token=new_op_token(), retained_from=found), state=state)
        report.version = result.version
        log.info("vacuum of %s retains versions from %d (commit %s)", storage.url, found, result.version)
    _call(hook, "committed")
    if report.retained_from is None:
        return report

    plan = plan_v3(
        storage,
        vlog,
        retained_from=target,
        older_than=older_than,
        now=now,
        partition_columns=metadata.partition_columns,
    )
    report.files, report.kept = _spare_what_views_list(storage, vlog, metadata, target, plan.findings, delete)
    report.kept += plan.kept
    # After the views were brought up (their snapshot of this vacuum expires the older ones),
    # and after the data files in the order of removal: a view's file goes once no reader of
    # the view can reach it.
    report.files += view_orphans(storage)
    if delete:
        swept = SweepReport(storage.url, older_than, True, findings=list(report.files))
        _remove(storage, swept, progress)
        report.removed += [o.name for o in swept.removed]
        report.failed += [(o.name, error) for o, error in swept.failed]
    _call(hook, "files")

    report.checkpoint, report.log_entries = _truncation(storage, vlog, target, write=delete)
    _call(hook, "checkpoint")
    if delete and report.checkpoint is not None:
        for name in report.log_entries:
            try:
                storage.delete(name)
            except (OSError, LakeSinkError) as exc:
                # Stop here: what is deleted of the log must stay a prefix (a committer proves its
                # create did not land in the deleted part by its base commit still being there,
                # VersionedLogWriter._base_stands). The next run starts from the checkpoint and goes on.
                log.warning("could not remove %s (%s): the log's truncation stops here", name, exc)
                report.failed.append((name, str(exc)))
                break
            report.removed.append(name)
            _call(hook, "log_entry")
    _call(hook, "log")
    return report


def _spare_what_views_list(
    storage: Storage,
    vlog: VersionedLog,
    metadata: TableMetadata,
    target: int,
    findings: list[Orphan],
    delete: bool,
) -> tuple[list[Orphan], list[Orphan]]:
    """The derived views' step (issue 32, hole 4): a view that lags behind the lake (a writer
    killed between its lake commit and its view update) is read at the version it holds, so
    its files must outlive that version's retention. The views are brought up to the latest
    version first (``delete`` only: a dry run writes nothing); the files that a view still
    behind ``target`` lists are then kept, with the reason, out of ``findings``. Returns the
    findings left and those kept."""
    if delete:
        bring_up(storage, vlog, metadata)
    listed = files_lagging_views_list(storage, target, {o.name for o in findings}) if findings else {}
    if not listed:
        return findings, []
    kept = [dataclasses.replace(o, reason=listed[o.name]) for o in findings if o.name in listed]
    if kept:
        log.warning(
            "vacuum of %s keeps %d file(s) that a derived view behind version %d still lists: %s",
            storage.url,
            len(kept),
            target,
            kept[0].reason,
        )
    return [o for o in findings if o.name not in listed], kept


def retention_version(storage: Storage, vlog: VersionedLog, snap: Snapshot, cutoff: float) -> int | None:
    """The newest version committed at or before ``cutoff``, searched from the latest version
    down to the oldest retained one; None when there is none.

    A version is that old only when both clocks that saw it say so: its committer's
    (``committed_at``) and the store's (the commit object's modification time in a listing of
    the log, where the store gives one). A writer whose clock runs behind by more than
    ``retain`` cannot make a fresh version look old, and so cannot move R past versions a
    reader may have pinned a moment ago: what decides is the store's clock against vacuum's,
    one pair that the 24 h floor covers, not every writer's."""
    state = snap.state
    headers = {h.version: h for h in snap.headers}
    stored: dict[int, float] = {}
    for entry in listed_log(storage):
        v = parse_commit_name(entry.name.rsplit("/", 1)[-1])
        if v is not None and entry.modified is not None:
            stored[v] = entry.modified
    oldest = oldest_commit(storage, vlog)
    floor = max(state.retained_from, oldest if oldest is not None else state.version)
    version = state.version
    while version >= floor:
        batch = [v for v in range(version, max(floor, version - 16) - 1, -1) if v not in headers]
        for v, header in zip(batch, parallel(vlog.read_header, batch), strict=True):
            if header is None:
                raise CorruptFileError(f"{storage.url}: log version {v} vanished while the log was read")
            headers[v] = header
        for v in range(version, max(floor, version - 16) - 1, -1):
            seen = [t for t in (headers[v].committed_at, stored.get(v)) if t is not None]
            if seen and max(seen) <= cutoff:
                return v
        version = max(floor, version - 16) - 1
    return None


def _truncation(
    storage: Storage, vlog: VersionedLog, target: int, *, write: bool
) -> tuple[int | None, list[str]]:
    """C_R (the checkpoint at ``floor(target / N) * N``; written when missing and ``write``,
    then read whole and checked) and the log entries that may go, in the order to delete them.
    (None, []) when there is no such checkpoint (``target`` below N: the log is kept whole)."""
    interval = vlog.checkpoint_interval
    c = due_checkpoint(target, interval) if interval is not None else None
    if c is None:
        return None, []
    checkpoint = read_checkpoint(storage, vlog.table_id, c)
    if checkpoint is None and write:
        checkpoint = write_checkpoint(
            storage, vlog.table_id, c, interval=interval, read_commit=vlog.read_commit
        )
    if checkpoint is not None:
        files = rows = size = 0
        for batch in iter_file_list(storage, checkpoint, ["rows", "bytes"]):
            files += batch.num_rows
            rows += pc.sum(batch.column("rows")).as_py() or 0
            size += pc.sum(batch.column("bytes")).as_py() or 0
        counts = checkpoint.state.counts
        if (files, rows, size) != (counts.files, counts.rows, counts.bytes):
            raise CorruptFileError(
                f"{storage.url}: the checkpoint at version {c} lists {files} files, {rows} rows, "
                f"{size} bytes but counts {counts.files}, {counts.rows}, {counts.bytes}: log not truncated"
            )
    elif write:
        raise CorruptFileError(f"{storage.url}: the checkpoint at version {c} could not be written")
    if write:
        # A hint below C_R would make readers start from a checkpoint whose next commits are gone
        # (they probe upward only while checkpoints exist, then read commits until one is missing).
        advance_hint(storage, c)
        hinted = read_hint(storage)
        if hinted is not None and hinted < c:  # a writer's read-then-put moved it back: again
            storage.put(LAST_CHECKPOINT, json.dumps({"version": c}).encode())
    commits: dict[int, str] = {}
    smalls: dict[int, str] = {}
    lists: dict[int, list[tuple[str, str]]] = {}
    for entry in listed_log(storage):
        base = entry.name.rsplit("/", 1)[-1]
        v = parse_commit_name(base)
        if v is not None:
            commits[v] = entry.name
            continue
        v = parse_checkpoint_name(base)
        if v is not None:
            smalls[v] = entry.name
            continue
        parsed = parse_file_list_name(base)
        if parsed is not None:
            lists.setdefault(parsed[0], []).append((parsed[1], entry.name))
    doomed: list[str] = []
    # Every entry below C_R goes, the hinted checkpoint's too: a hint moved back later to a
    # deleted checkpoint makes readers look further (a listing), never stop below C_R. Ascending,
    # a version's small part before its lists and its commit: the deleted part stays a prefix.
    for v in sorted(set(commits) | set(smalls) | set(lists)):
        if v < c:
            if v in smalls:
                doomed.append(smalls[v])  # the small part first: it never names a missing list
            doomed += [name for _, name in lists.get(v, [])]
        elif v in lists and v in smalls:
            small = (
                checkpoint
                if checkpoint is not None and v == c
                else read_checkpoint(storage, vlog.table_id, v)
            )
            if small is not None:  # a list its small part does not name: a loser's, or a killed writer's
                doomed += [name for token, name in lists[v] if token != small.token]
        if v < c and v in commits:
            doomed.append(commits[v])
    return c, doomed


def _call(hook: Hook | None, step: str) -> None:
    if hook is not None:
        hook(step)
