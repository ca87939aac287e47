"""Crash recovery for epoch-mode tables: removing what a crashed epoch commit left behind.

An epoch commit publishes its files, then writes the epoch record. A crash in between leaves
published data files that no record lists: invisible to ``read_committed`` (the record decides),
but taking space and showing up in ``read_all``. A crash inside a task leaves a staged
``.uncommitted`` file (an open multipart upload on S3). This module removes both.

Safety rule. A published file that no record lists is garbage for sure when its epoch is at or
below the newest record (records are immutable, and Spark commits epochs in order, so nobody
will ever record it). Above the newest record it may belong to a commit in flight *right now*
-- published, record not yet written -- so it is removed only when the caller knows nothing is
in flight (the writer starting up, the epoch commit itself) or when it is older than a
threshold (the orphan command run beside a live query). The log is read before the listing so
that a commit finishing between the two can only make us keep a file, never drop one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from lakesink.epochlog import EpochLog
from lakesink.errors import NotALakeError, TableNotFoundError
from lakesink.layout import parse_data_file
from lakesink.metadata import read_table_metadata
from lakesink.storage import Storage, StoredFile

log = logging.getLogger(__name__)

#: Staged files and uploads younger than this may belong to a task that is still writing.
DEFAULT_STAGED_AGE = 3600.0


@dataclass
class SweepReport:
    """What a sweep removed (names relative to the table root)."""

    unrecorded: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    uploads: list[str] = field(default_factory=list)

    @property
    def removed(self) -> int:
        return len(self.unrecorded) + len(self.staged) + len(self.uploads)


def unrecorded_files(storage: Storage) -> tuple[list[StoredFile], int | None]:
    """Published data files of an epoch-mode table that no epoch record lists, and the newest epoch.

    Empty for a foreach-mode table (its files are committed by name, no record lists them) and
    for a folder without table metadata: this never offers a committed file for deletion.
    """
    try:
        if read_table_metadata(storage).mode != "epoch":
            return [], None
    except (NotALakeError, TableNotFoundError):
        return [], None
    # Read the log first: see the module docstring for why the order matters.
    records = EpochLog(storage).records()
    latest = records[-1].epoch if records else None
    recorded = {f.name for r in records for f in r.files}
    found = []
    for entry in storage.list(""):
        parsed = parse_data_file(entry.name)
        if parsed is not None and parsed.state == "committed" and entry.name not in recorded:
            found.append(entry)
    return found, latest


def sweep_unrecorded(
    storage: Storage,
    *,
    in_flight_older_than: float | None,
    now: float | None = None,
) -> list[str]:
    """Delete published data files of an epoch-mode table that no epoch record lists.

    Parameters
    ----------
    storage
        The table root.
    in_flight_older_than
        Files of epochs above the newest record may be a commit in flight; they are deleted
        only when older than this many seconds. ``None`` means "nothing is in flight" (the
        caller is the only writer and is not committing): delete them whatever their age.
    now
        The clock for the age test (tests pass their own).

    Returns
    -------
    list of str
        The deleted names.
    """
    now = time.time() if now is None else now
    found, latest = unrecorded_files(storage)
    removed = []
    for entry in found:
        parsed = parse_data_file(entry.name)
        assert parsed is not None
        settled = latest is not None and parsed.epoch <= latest
        old_enough = in_flight_older_than is None or (
            entry.modified is not None and now - entry.modified >= in_flight_older_than
        )
        if not (settled or old_enough):
            continue
        log.info("removing %s/%s: epoch %d has no record listing it", storage.url, entry.name, parsed.epoch)
        storage.delete(entry.name)
        removed.append(entry.name)
    return removed


def sweep_staged(
    storage: Storage, *, older_than: float, keep: Collection[str] = (), now: float | None = None
) -> tuple[list[str], list[str]]:
    """Delete staged ``.uncommitted`` files and abort multipart uploads older than ``older_than`` s.

    ``keep`` names final data-file names whose staged data must survive whatever its age:
    the sealed files of the epoch being committed (on S3 they are open uploads until the
    publish completes them). Returns (staged names removed, upload names aborted). The
    finding and removing is the orphan command's (``lakesink.orphans``); what is added here
    is the ``keep`` list.
    """
    from lakesink.orphans import STAGED_FILES, UPLOADS, Finding

    def final_name(finding: Finding) -> str:
        parsed = parse_data_file(finding.name.rsplit("/", 1)[-1])
        return parsed.committed_name if parsed is not None else finding.name

    now = time.time() if now is None else now
    removed: dict[str, list[str]] = {STAGED_FILES.kind: [], UPLOADS.kind: []}
    for sweeper in (STAGED_FILES, UPLOADS):
        for finding in sweeper.find(storage, now):
            if finding.age < older_than or final_name(finding) in keep:
                continue
            sweeper.remove(storage, finding)
            removed[sweeper.kind].append(finding.name)
    return removed[STAGED_FILES.kind], removed[UPLOADS.kind]


def recover(
    storage: Storage,
    *,
    nothing_in_flight: bool,
    staged_older_than: float = DEFAULT_STAGED_AGE,
    unrecorded_older_than: float = DEFAULT_STAGED_AGE,
    keep: Collection[str] = (),
) -> SweepReport:
    """The recovery sweep of an epoch-mode table: unrecorded published files, then staged ones.

    ``nothing_in_flight=True`` is for the writer itself (on start, inside its epoch commit):
    every unrecorded published file is garbage. Otherwise (the orphan command beside a
    possibly running query) files above the newest record must be older than
    ``unrecorded_older_than`` seconds. Staged files and uploads always need the age test:
    executors of the running query stage files while the driver is elsewhere. ``keep``: see
    :func:`sweep_staged`.
    """
    report = SweepReport()
    report.unrecorded = sweep_unrecorded(
        storage, in_flight_older_than=None if nothing_in_flight else unrecorded_older_than
    )
    report.staged, report.uploads = sweep_staged(storage, older_than=staged_older_than, keep=keep)
    if report.removed:
        log.warning(
            "recovery sweep of %s removed %d unrecorded file(s), %d staged file(s), %d upload(s)",
            storage.url,
            len(report.unrecorded),
            len(report.staged),
            len(report.uploads),
        )
    return report
