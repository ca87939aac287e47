"""The orphan sweep: find (and on request remove) what crashed writers left behind in a table.

Orphans are invisible to ``read_committed`` but cost money or space: multipart uploads never
completed nor aborted (S3 bills their parts until aborted) and ``.uncommitted`` staged files.
A writer that dies hard (kill -9, lost executor) cannot clean up after itself, so this sweep
does, for anything older than an age the caller chooses: that age must exceed the longest
time a live writer keeps a file staged, or the sweep takes a live writer's file away (its
commit then fails and Spark retries the task).

Each kind of orphan is one :class:`Sweeper` in :data:`SWEEPERS` (a finder plus a remover), so
a new kind is one more entry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakesink.errors import LakeSinkError, TableNotFoundError
from lakesink.layout import EPOCHS_DIR, META_DIR, STAGED_SUFFIX
from lakesink.storage import Storage, open_storage

log = logging.getLogger(__name__)

#: Folders of a table that writers stage files in (the table layout is flat, see docs/FORMAT.md).
TABLE_FOLDERS = ("", META_DIR, EPOCHS_DIR)


@dataclass(frozen=True)
class Finding:
    """One orphan.

    Attributes
    ----------
    kind
        What it is: "multipart_upload", "staged_file", ...
    name
        Its name relative to the table root.
    age
        Seconds since it was started (upload) or last modified (file).
    size
        Bytes it holds (the parts uploaded so far, for an upload).
    upload_id
        The multipart upload's id (uploads only).
    """

    kind: str
    name: str
    age: float
    size: int
    upload_id: str | None = None


@dataclass
class SweepReport:
    """What a sweep found and, with ``delete=True``, what it removed or failed to remove."""

    path: str
    older_than: float
    delete: bool
    findings: list[Finding] = field(default_factory=list)
    removed: list[Finding] = field(default_factory=list)
    failed: list[tuple[Finding, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class Sweeper:
    """One kind of orphan: how to find them in a table, and how to remove one."""

    kind: str
    find: Callable[[Storage, float], Iterable[Finding]]  # (storage, now) -> every candidate
    remove: Callable[[Storage, Finding], None]


def _find_uploads(storage: Storage, now: float) -> Iterable[Finding]:
    for folder in TABLE_FOLDERS:
        for upload in storage.pending_uploads(folder):
            yield Finding(
                "multipart_upload", upload.name, now - upload.started, upload.bytes, upload.upload_id
            )


def _remove_upload(storage: Storage, finding: Finding) -> None:
    from lakesink.storage import PendingUpload

    assert finding.upload_id is not None
    storage.abort_upload(PendingUpload(finding.name, finding.upload_id, 0.0, 0, finding.size))


def _find_staged(storage: Storage, now: float) -> Iterable[Finding]:
    for folder in TABLE_FOLDERS:
        for entry in storage.list(folder):
            base = entry.name.rsplit("/", 1)[-1]
            if base.startswith(".") and base.endswith(STAGED_SUFFIX) and entry.modified is not None:
                yield Finding("staged_file", entry.name, now - entry.modified, entry.size)


def _remove_file(storage: Storage, finding: Finding) -> None:
    storage.delete(finding.name)


def _find_unrecorded(storage: Storage, now: float) -> Iterable[Finding]:
    # Epoch mode: files an epoch commit published but never recorded (it crashed in between).
    from lakesink.recovery import unrecorded_files

    for entry in unrecorded_files(storage)[0]:
        age = now - entry.modified if entry.modified is not None else 0.0
        yield Finding("unrecorded_file", entry.name, age, entry.size)


UPLOADS = Sweeper("multipart_upload", _find_uploads, _remove_upload)
STAGED_FILES = Sweeper("staged_file", _find_staged, _remove_file)
UNRECORDED_FILES = Sweeper("unrecorded_file", _find_unrecorded, _remove_file)
SWEEPERS: list[Sweeper] = [UPLOADS, STAGED_FILES, UNRECORDED_FILES]


def sweep_orphans(
    path: str,
    *,
    older_than: float,
    delete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> SweepReport:
    """List (and with ``delete=True`` remove) the orphans older than ``older_than`` seconds.

    Parameters
    ----------
    path
        The table root: local path, ``file://`` or ``s3://bucket/prefix``.
    older_than
        Minimum age in seconds. Choose it longer than any live task keeps a file staged.
    delete
        Abort the uploads and delete the staged files found. False (the default) only lists.
    storage_options
        As for the writer (S3: ``endpoint_url``, ``key``, ``secret``, ...).

    Returns
    -------
    SweepReport
        ``findings`` (oldest first), and with ``delete`` ``removed`` and ``failed``.

    Raises
    ------
    ValueError
        ``older_than`` is negative or not a number.
    TableNotFoundError
        Nothing exists at ``path``.
    """
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not older_than >= 0:
        raise ValueError(f"older_than must be a number of seconds >= 0, got {older_than!r}")
    storage = open_storage(path, storage_options)
    if not storage.root_exists():
        raise TableNotFoundError(f"no lake at {storage.url!r}: the path does not exist")
    report = SweepReport(storage.url, float(older_than), delete)
    now = time.time()
    for sweeper in SWEEPERS:
        found = [f for f in sweeper.find(storage, now) if f.age >= older_than]
        found.sort(key=lambda f: (-f.age, f.name))
        report.findings.extend(found)
        if not delete:
            continue
        for finding in found:
            try:
                sweeper.remove(storage, finding)
            except (OSError, LakeSinkError) as exc:  # one stuck orphan must not stop the sweep; report it
                log.warning("could not remove %s %s: %s", finding.kind, finding.name, exc)
                report.failed.append((finding, str(exc)))
            else:
                log.info("removed %s %s (%.0f s old)", finding.kind, finding.name, finding.age)
                report.removed.append(finding)
    return report
