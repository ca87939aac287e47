"""Writing and checking the Delta view of a format-3 epoch lake (``lakesink.format.delta``).

After each lake commit, :class:`DeltaView` (a ``VersionedLog`` ``after_commit`` hook) creates
``_delta_log/<v:020d>.json`` create-if-absent: one PUT per commit. The same bytes already there
mean done; other bytes mean a foreign writer touched the view: the view is then left alone
(a marker, :data:`STOP_FILE`, tells every process so) until ``lakesink delta-sync`` finds it
whole again, and ``lakesink status``/``verify`` report it. Nothing here ever raises into a
commit, nor touches the lake's own log.

A view commit ``v`` is written only on top of ``v - 1`` (or at 0), so a view is never a log
with holes: a writer (``create=True``) fills a gap of up to :data:`GAP_FILL` versions, a
maintenance op only continues a view that is there, and ``delta-sync`` writes every missing
commit from the oldest retained lake version. What a process learned (the last view version it
wrote, a stop, a schema Delta cannot take) is kept per lake for the life of the process, so the
steady state costs the one PUT.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

from lakesink.format.delta import DeltaViewUnsupported, delta_commit, delta_commit_name, delta_schema
from lakesink.format.names import META_DIR
from lakesink.format.table import TableMetadata, read_table_metadata
from lakesink.format.v3.commits import Commit
from lakesink.format.v3.state import TableState
from lakesink.format.v3.vlog import VersionedLog
from lakesink.storage.base import Storage

log = logging.getLogger(__name__)

#: Written when a view commit holds bytes lakesink did not derive: writers stop updating the view.
STOP_FILE = f"{META_DIR}/delta_view_stopped.json"
#: A writer fills at most this many missing view versions in a commit; more is delta-sync's job.
GAP_FILL = 16


@dataclass
class _Known:
    """What this process knows of one lake's view."""

    version: int = -1  # the newest view version known to be this lake's bytes
    stop_checked: bool = False
    stopped: str | None = None
    unsupported: str | None = None
    metadata: TableMetadata | None = None
    warned: set[str] = field(default_factory=set)


_KNOWN: dict[tuple[str, str], _Known] = {}
_LOCK = threading.Lock()


def _known(storage: Storage, table_id: str) -> _Known:
    with _LOCK:
        return _KNOWN.setdefault((storage.url, table_id), _Known())


def forget(storage: Storage, table_id: str) -> None:
    """Drop what this process knows of a lake's view (after delta-sync, in tests)."""
    with _LOCK:
        _KNOWN.pop((storage.url, table_id), None)


class DeltaView:
    """The ``after_commit`` hook that keeps a lake's Delta view up to date.

    ``create``: a writer with ``delta_log`` on may start the view and fill small gaps; else
    (compaction, vacuum) only a view that has the previous version is continued.
    """

    def __init__(
        self, storage: Storage, table_id: str, *, create: bool, metadata: TableMetadata | None = None
    ) -> None:
        self.storage = storage
        self.table_id = table_id
        self.create = create
        self.known = _known(storage, table_id)
        if metadata is not None and self.known.metadata is None:
            self.known.metadata = metadata

    def __call__(self, commit: Commit, state: TableState) -> None:
        try:
            self._after(commit)
        except Exception:
            log.warning(
                "updating the Delta view of %s at version %d failed; the lake commit stands, and the "
                "next commit or `lakesink delta-sync` writes it",
                self.storage.url,
                commit.version,
                exc_info=True,
            )

    def _after(self, commit: Commit) -> None:
        k, v = self.known, commit.version
        if k.unsupported is not None or k.stopped is not None:
            return
        if not k.stop_checked:
            if self.storage.exists(STOP_FILE):
                k.stopped = _stop_reason(self.storage)
                self._warn_once(
                    "stopped", "the Delta view of %s is not updated: %s", self.storage.url, k.stopped
                )
                return
            k.stop_checked = True
        if v > 0 and k.version != v - 1 and not self.storage.exists(delta_commit_name(v - 1)):
            if not self.create:
                return  # no view to continue (the writers write none, or it is behind)
            start = self._gap_start(v)
            if start is None:
                return
            vlog = VersionedLog(self.storage, self.table_id, checkpoint_interval=None)
            for u in range(start, v):
                older = vlog.read_commit(u)
                if older is None:
                    self._warn_once(
                        "gone",
                        "the Delta view of %s misses version %d, which the lake no longer has: run "
                        "`lakesink delta-sync`",
                        self.storage.url,
                        u,
                    )
                    return
                if not self._write(older):
                    return
        self._write(commit)

    def _gap_start(self, v: int) -> int | None:
        """The first missing version of a view that lacks ``v - 1``, when the gap is small."""
        for u in range(v - 2, max(-1, v - 1 - GAP_FILL), -1):
            if self.storage.exists(delta_commit_name(u)):
                return u + 1
        if v <= GAP_FILL:
            return 0
        self._warn_once(
            "behind",
            "the Delta view of %s is more than %d versions behind the lake: it is not updated until "
            "`lakesink delta-sync` writes what is missing",
            self.storage.url,
            GAP_FILL,
        )
        return None

    def _metadata(self) -> TableMetadata:
        if self.known.metadata is None:
            self.known.metadata = read_table_metadata(self.storage)
        return self.known.metadata

    def _write(self, commit: Commit) -> bool:
        k = self.known
        try:
            data = delta_commit(self._metadata(), commit)
        except DeltaViewUnsupported as exc:
            k.unsupported = str(exc)
            self._warn_once("unsupported", "%s has no Delta view: %s", self.storage.url, exc)
            return False
        if self.storage.put_if_absent(delta_commit_name(commit.version), data):
            k.version = max(k.version, commit.version)
            return True
        k.stopped = (
            f"version {commit.version} of the view holds bytes lakesink did not derive (a foreign writer)"
        )
        log.warning(
            "%s/%s: %s; the view is no longer updated (the lake is unaffected). `lakesink delta-sync` "
            "resumes it once the view is removed or repaired",
            self.storage.url,
            delta_commit_name(commit.version),
            k.stopped,
        )
        _mark_stopped(self.storage, commit.version, k.stopped)
        return False

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self.known.warned:
            self.known.warned.add(key)
            log.warning(message, *args)


def _mark_stopped(storage: Storage, version: int, reason: str) -> None:
    try:
        doc = {"version": version, "reason": reason, "found_at": time.time()}
        storage.put(STOP_FILE, json.dumps(doc, sort_keys=True).encode())
    except Exception:
        log.warning("could not write %s/%s", storage.url, STOP_FILE, exc_info=True)


def _stop_reason(storage: Storage) -> str:
    try:
        return str(json.loads(storage.read_bytes(STOP_FILE))["reason"])
    except Exception:  # noqa: BLE001 -- only a message
        return f"{STOP_FILE} says the view was touched by a foreign writer"


# Checking and syncing -------------------------------------------------------------------------


@dataclass
class DeltaViewReport:
    """The Delta view of a lake, as :func:`delta_sync` or :func:`check_view` found it.

    ``state``: ``ok`` (the view has every retained lake version, each with lakesink's bytes),
    ``absent`` (no view), ``behind`` (versions missing: ``missing``), ``foreign`` (``foreign``
    versions hold other bytes; writers stopped updating it), ``unsupported`` (the schema has
    types Delta cannot take), ``needs_checkpoint`` (the view lacks versions the lake has
    vacuumed away: only a view checkpoint could start it again, not written yet).
    """

    path: str
    state: str = "ok"
    detail: str = ""
    lake_version: int | None = None
    view_version: int | None = None
    written: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    foreign: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in ("ok", "absent")

    def summary(self) -> str:
        return self.state + (f": {self.detail}" if self.detail else "")


def delta_sync(storage: Storage, *, write: bool = True) -> DeltaViewReport:
    """Write every Delta commit missing from the view of the lake at ``storage``, from the oldest
    retained lake version, and check the ones there (``write=False``: check only, as ``verify``).

    Resumes a stopped view when every version holds lakesink's bytes. Views of format-2 and
    foreach lakes do not exist (FormatVersionError / ValueError, from ``open_v3``).
    """
    from lakesink.maintenance.compact import open_v3
    from lakesink.maintenance.sweep import oldest_commit

    metadata, vlog = open_v3(storage, "the Delta view")
    report = DeltaViewReport(storage.url)
    try:
        delta_schema(metadata.schema)
    except DeltaViewUnsupported as exc:
        report.state, report.detail = "unsupported", str(exc)
        return report
    latest = vlog.open().version
    report.lake_version = latest if latest >= 0 else None
    present = {
        int(name[:-5])
        for f in storage.list("_delta_log")
        if (name := f.name.rsplit("/", 1)[-1]).endswith(".json") and name[:-5].isdigit() and len(name) == 25
    }
    report.view_version = max(present) if present else None
    if latest < 0:
        report.state = "absent" if not present else "ok"
        return report
    oldest = oldest_commit(storage, vlog) or 0
    if oldest > 0 and not all(u in present for u in range(oldest)):
        report.state = "needs_checkpoint"
        report.detail = (
            f"the lake's versions below {oldest} are vacuumed and the view lacks some of them: a view "
            "checkpoint is needed to start it again (not written by lakesink yet)"
        )
        return report
    if not present and not write:
        report.state = "absent"
        return report
    if write:
        storage.check_conditional_writes()  # a writing command: refuse on a store that overwrites
    for v in range(oldest, latest + 1):
        commit = vlog.read_commit(v)
        if commit is None:
            raise FileNotFoundError(f"{storage.url}: lake version {v} vanished while the view was synced")
        data = delta_commit(metadata, commit)
        name = delta_commit_name(v)
        if v in present:
            try:
                same = storage.read_bytes(name) == data
            except FileNotFoundError:
                same = None
            if same is False:
                report.foreign.append(v)
            if same is not None:
                continue
        if not write or report.foreign:
            report.missing.append(v)
        elif storage.put_if_absent(name, data):
            report.written.append(v)
        else:
            report.foreign.append(v)
    if report.foreign:
        report.state = "foreign"
        report.detail = (
            f"version(s) {report.foreign[:10]} of the view hold bytes lakesink did not derive: a foreign "
            "writer touched it; writers no longer update it (remove `_delta_log/` and run "
            "`lakesink delta-sync` to rebuild it; the lake is unaffected)"
        )
        if write:
            _mark_stopped(storage, report.foreign[0], report.detail)
    elif report.missing:
        report.state = "behind"
        report.detail = (
            f"{len(report.missing)} version(s) missing from {report.missing[0]}: run `lakesink delta-sync`"
        )
    elif write:
        storage.delete(STOP_FILE)
    forget(storage, metadata.table_id or "")
    report.view_version = max(present | set(report.written)) if present or report.written else None
    return report


def check_view(storage: Storage, metadata: TableMetadata, vlog: VersionedLog, latest: int) -> DeltaViewReport:
    """The cheap check of ``lakesink status``: the stop marker, and the view commit of the latest
    lake version compared with what lakesink derives (two or three reads)."""
    report = DeltaViewReport(storage.url, lake_version=latest if latest >= 0 else None)
    try:
        delta_schema(metadata.schema)
    except DeltaViewUnsupported as exc:
        report.state, report.detail = "unsupported", str(exc)
        return report
    if storage.exists(STOP_FILE):
        report.state, report.detail = "foreign", _stop_reason(storage)
        return report
    if latest < 0:
        report.state = "absent"
        return report
    try:
        existing = storage.read_bytes(delta_commit_name(latest))
    except FileNotFoundError:
        existing = None
    if existing is None:
        report.state = "behind" if storage.exists(delta_commit_name(0)) else "absent"
        if report.state == "behind":
            report.detail = f"the view lacks lake version {latest}: run `lakesink delta-sync`"
        return report
    commit = vlog.read_commit(latest)
    if commit is not None and delta_commit(metadata, commit) != existing:
        report.state = "foreign"
        report.foreign = [latest]
        report.detail = f"version {latest} of the view holds bytes lakesink did not derive (a foreign writer)"
        return report
    report.view_version = latest
    return report
