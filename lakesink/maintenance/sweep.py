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
- staged data of a settled epoch (foreach mode: of a (partition, epoch) already published) is
  a dead or losing attempt's: removed whatever its age;
- other staged data may belong to a task that is still writing: removed only when older than
  ``older_than``. If that guess is wrong, the task's publish fails and Spark retries the task;
  nothing committed is touched.

File ages cannot decide more than that: a hard link keeps the staged file's mtime, and on AWS
a multipart object's LastModified is when its upload began.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lakesink.errors import LakeSinkError
from lakesink.format.log import EpochLog
from lakesink.format.names import EPOCHS_DIR, META_DIR, parse_data_file
from lakesink.format.table import read_table_metadata
from lakesink.storage import StagedEntry, Storage, open_storage

log = logging.getLogger(__name__)

#: Staged data younger than this may belong to a task still writing (writers' default).
DEFAULT_STAGED_AGE = 3600.0
#: Folders of a table that writers stage files in (the table layout is flat, docs/FORMAT.md).
TABLE_FOLDERS = ("", META_DIR, EPOCHS_DIR)

OrphanKind = Literal["staged_file", "multipart_upload", "unrecorded_file"]


@dataclass(frozen=True)
class Orphan:
    """Something in a table that no reader of committed data needs.

    Attributes
    ----------
    kind
        ``staged_file`` (local ``.uncommitted`` file), ``multipart_upload`` (S3 upload never
        completed) or ``unrecorded_file`` (epoch mode: published, listed by no record).
    name
        The name relative to the table root (for staged data: the name it would publish as).
    epoch
        The epoch it belongs to, when its name says.
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
        storage.check_conditional_writes()  # a store that overwrites: refuse before touching anything
    now = time.time() if now is None else now
    report = SweepReport(storage.url, float(older_than), delete)

    recorded_epochs: set[int] = set()
    recorded_names: set[str] = set()
    if metadata.mode == "epoch":
        # A record never changes, so this snapshot can only make the sweep keep too much.
        for record in EpochLog(storage).records():
            recorded_epochs.add(record.epoch)
            recorded_names.update(f.name for f in record.files)
    listing = [(entry, parse_data_file(entry.name)) for entry in storage.list("")]
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

    for folder in TABLE_FOLDERS:
        for staged in storage.staged(folder):
            parsed = parse_data_file(staged.name.rsplit("/", 1)[-1])
            epoch = parsed.epoch if parsed is not None else None
            age = None if staged.started is None else now - staged.started
            if metadata.mode == "epoch":
                settled = epoch is not None and epoch in recorded_epochs
                why = f"epoch {epoch} is recorded without it"
            else:
                settled = staged.name in published
                why = f"{staged.name} is published by another attempt"
            if not settled and (age is None or age < older_than):
                continue  # may be a live task's: too young to judge
            reason = why if settled else f"staged {age:.0f} s ago, longer than {older_than:g} s"
            kind: OrphanKind = "multipart_upload" if staged.kind == "multipart_upload" else "staged_file"
            orphan = Orphan(kind, staged.name, epoch, age, staged.size, settled, reason, staged.handle)
            report.findings.append(orphan)

    report.findings.sort(key=lambda o: (-(o.age or 0.0), o.name))
    if delete:
        _remove(storage, report, progress)
    return report


def _remove(storage: Storage, report: SweepReport, progress: Progress | None) -> None:
    total = len(report.findings)
    for done, orphan in enumerate(report.findings, 1):
        try:
            if orphan.kind == "unrecorded_file":
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
