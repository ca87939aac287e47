"""Keeping the Iceberg view of a format-3 epoch lake (``lakesink.views.iceberg``): the hook
after each commit, the sync, the check (docs/design/iceberg-view.md).

After lake commit ``v``, :class:`IcebergView` writes snapshot ``n = v + 1``: its manifest and
manifest list (new names, never replacing a file), then ``metadata/v<n>.metadata.json``
create-if-absent -- the view's commit point -- on top of the newest metadata file below ``n``,
then advances ``metadata/version-hint.text`` to ``n`` by compare-and-swap, never to a smaller
number. So the version a reader finds never moves backwards and always describes a lake
version whole:

- a metadata file already at ``n`` is another lakesink process's snapshot of the same commit
  (its summary's ``lakesink.token`` says so: done, this process's own files are removed) or a
  foreign writer's (the view stops, as the Delta view does: a stop file, reported by
  ``status``/``verify``, removed by a ``sync-views`` that finds the view whole again);
- a view already past ``n`` is left alone (a late hook never writes behind a newer version);
- snapshots of lake versions below the lake's retention floor are dropped (expiry follows
  vacuum: their files may be deleted).

Nothing here ever raises into a commit, nor touches the lake's own log.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.manifest import read_manifest_list
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadataUtil, TableMetadataV2
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import MetadataLogEntry, Snapshot, SnapshotLogEntry, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from lakesink.views.delta_view import live_at, remember_time
from lakesink.views.iceberg import (
    DERIVED_PROPERTY,
    METADATA_LOG_MAX,
    TABLE_ID_PROPERTY,
    BytesInputFile,
    IcebergViewUnsupported,
    check_metadata,
    field_paths,
    iceberg_schema,
    live_files,
    name_mapping_json,
    partition_spec,
    snapshot_files,
    summary,
    table_uuid,
)
from lakesink.views.iceberg_layout import (
    VERSION_HINT,
    has_view,
    metadata_name,
    newest_number,
    read_hint,
    reader_number,
    snapshot_id,
)
from lakesink.views.memo import StopFile, ViewMemo, ViewMemos
from lakesink_reader import limits
from lakesink_reader.format.opening import open_epoch_log
from lakesink_reader.format.schemas import schema_at
from lakesink_reader.format.table import TableMetadata, probe_store, read_table_metadata
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.names import META_DIR
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)

STOP_FILE = f"{META_DIR}/iceberg_view_stopped.json"
_STOP = StopFile(STOP_FILE, "says the view was touched by a foreign writer", log)


class ForeignView(Exception):
    """The view holds what lakesink did not derive (the message says what)."""


@dataclass
class _Known(ViewMemo):
    """What this process knows of one lake's Iceberg view."""

    number: int = 0  # the newest metadata version this process wrote or read (0: none)
    metadata: TableMetadataV2 | None = None  # its content
    unsupported: str | None = None
    table: TableMetadata | None = None
    #: One salt per process and lake: the names of the Avro files it writes (iceberg.snapshot_files).
    salt: str = field(default_factory=lambda: secrets.token_hex(6))


_MEMOS = ViewMemos(_Known)
forget = _MEMOS.forget


def root_uri(storage: Storage) -> str:
    """The lake's root as Iceberg's metadata names it: the absolute path of a local lake (no
    ``file://``: a path is taken literally, with no percent-decoding of partition folder names),
    the store's URL otherwise (``s3://``, ``hdfs://``). Iceberg v2 paths are absolute: a lake
    moved elsewhere needs ``sync-views`` after removing ``metadata/``."""
    return storage.url.rstrip("/")


class IcebergView:
    """The ``after_commit`` hook that keeps a lake's Iceberg view.

    ``create``: a writer with ``iceberg_view`` on may start the view; else (compaction, vacuum,
    through ``lakesink.views.derived.maintenance_views``) only a view that is there is updated.
    """

    def __init__(
        self, storage: Storage, table_id: str, *, create: bool, metadata: TableMetadata | None = None
    ) -> None:
        self.storage = storage
        self.table_id = table_id
        self.create = create
        self._given = metadata

    @property
    def known(self) -> _Known:
        known = _MEMOS.get(self.storage, self.table_id)
        if known.table is None and self._given is not None:
            known.table = self._given
        return known

    def __call__(self, commit: Commit, state: TableState) -> None:
        remember_time(self.known.times, commit)
        try:
            self._after(commit, state)
        except Exception:
            log.warning(
                "updating the Iceberg view of %s at version %d failed; the lake commit stands, and the "
                "next commit or `lakesink sync-views` writes it",
                self.storage.url,
                commit.version,
                exc_info=True,
            )

    def _after(self, commit: Commit, state: TableState) -> None:
        k = self.known
        if k.unsupported is not None or _STOP.stops(self.storage, k, "Iceberg view"):
            return
        table = self._table()
        try:
            check_metadata(table)
        except IcebergViewUnsupported as exc:
            k.unsupported = str(exc)
            k.warn_once(log, "unsupported", "%s has no Iceberg view: %s", self.storage.url, exc)
            return
        n = snapshot_id(commit.version)
        try:
            found = newest(self.storage, self.table_id, below=n, known=(k.number, k.metadata))
        except ForeignView as exc:
            self._stop(commit.version, str(exc))
            return
        if found is None:
            return  # the view is at n or past it already: never written behind a newer version
        number, previous = found
        if previous is None and not self.create:
            return  # no view to continue (the writers of this lake keep none)
        if commit.version < state.retained_from:
            return  # vacuumed already: its files may be gone
        vlog = VersionedLog(self.storage, self.table_id, checkpoint_interval=table.log_interval)
        try:
            written = write_snapshot(self.storage, table, vlog, commit, state, previous, number, k.salt)
        except ForeignView as exc:
            self._stop(commit.version, str(exc))
            return
        k.number, k.metadata = n, written

    def _table(self) -> TableMetadata:
        if self.known.table is None:
            self.known.table = read_table_metadata(self.storage)
        return self.known.table

    def _stop(self, version: int, reason: str) -> None:
        k = self.known
        k.stopped = reason
        log.warning(
            "%s: the Iceberg view %s; it is no longer updated (the lake is unaffected). `lakesink "
            "sync-views` resumes it once the view is removed or repaired",
            self.storage.url,
            reason,
        )
        _STOP.mark(self.storage, version, reason)


# Writing a snapshot --------------------------------------------------------------------------


def read_metadata(storage: Storage, table_id: str, number: int) -> TableMetadataV2:
    """Metadata version ``number``, checked to be this lake's view (ForeignView otherwise).
    A bounded read: the view's files are input like any other the lake holds."""
    name = metadata_name(number)
    data = limits.read(storage, name, limits.VIEW_FILE)
    try:
        parsed = TableMetadataUtil.parse_raw(data.decode("utf-8"))
    except (IcebergValidationError, ValueError, UnicodeDecodeError) as exc:
        reason = str(exc)[:200]
        raise ForeignView(
            f"has {name}, which is not Iceberg table metadata lakesink wrote ({reason})"
        ) from None
    if not isinstance(parsed, TableMetadataV2) or parsed.properties.get(TABLE_ID_PROPERTY) != table_id:
        raise ForeignView(
            f"has {name}, which is not lakesink's view of this lake (format version "
            f"{parsed.format_version}, {TABLE_ID_PROPERTY} {parsed.properties.get(TABLE_ID_PROPERTY)!r})"
        )
    # An Iceberg writer committing on the view keeps its properties: what only lakesink writes is
    # metadata n whose current snapshot is n, made from lake version n - 1.
    snap = parsed.current_snapshot()
    held = (snap.summary or {}).get("lakesink.version") if snap is not None else None
    if snap is None or snap.snapshot_id != number or held != str(number - 1):
        raise ForeignView(
            f"has {name}, whose current snapshot is not lakesink's snapshot {number} of lake version "
            f"{number - 1} (snapshot {snap.snapshot_id if snap is not None else None}, lake version {held})"
        )
    return parsed


def newest(
    storage: Storage, table_id: str, *, below: int, known: tuple[int, TableMetadataV2 | None] = (0, None)
) -> tuple[int, TableMetadataV2 | None] | None:
    """The view's newest metadata version and content when it is below ``below`` ((0, None): no
    view); None when the view is at ``below`` or past it. ``known``: what this process wrote last
    (used, without a read, when it is the version just below). ForeignView when the newest
    metadata is not lakesink's."""
    number, metadata = known
    if metadata is not None and number == below - 1 and not storage.exists(metadata_name(below)):
        return number, metadata
    number = newest_number(storage)
    if number >= below:
        read_metadata(storage, table_id, number)  # the view is ahead: lakesink's, or foreign
        return None
    return (number, read_metadata(storage, table_id, number)) if number > 0 else (0, None)


def write_snapshot(
    storage: Storage,
    table: TableMetadata,
    vlog: VersionedLog,
    commit: Commit,
    state: TableState,
    previous: TableMetadataV2 | None,
    previous_number: int,
    salt: str,
) -> TableMetadataV2:
    """Write the snapshot of lake version ``commit.version`` on top of ``previous`` (metadata
    version ``previous_number``; None: a new view), then advance the hint. Returns the metadata
    that stands at that version (this process's, or another lakesink process's that wrote it
    first); ForeignView when a foreign writer holds that version."""
    v = commit.version
    n = snapshot_id(v)
    root = root_uri(storage)
    lake_schema = schema_at(table.schema, state.schema_at(v))
    if previous is not None:
        current = previous.schema()
        schema, last_id = iceberg_schema(
            lake_schema, field_paths(current), previous.last_column_id, current.schema_id
        )
        schemas = list(previous.schemas)
        if schema.as_struct() != current.as_struct():
            schema = Schema(*schema.fields, schema_id=max(s.schema_id for s in schemas) + 1)
            schemas.append(schema)
    else:
        schema, last_id = iceberg_schema(lake_schema, {}, 0, 0)
        schemas = [schema]
    spec = partition_spec(schema, table.partition_columns)
    files = live_files(live_at(storage, vlog, v, table.log_interval, state.counts.files))
    written, list_name = snapshot_files(
        root, v, commit.header.token, files, schema, spec, table.partition_columns, salt
    )
    for w in written:
        if not storage.put_if_absent(w.name, w.data):
            raise ForeignView(f"has {w.name}, a name lakesink had chosen for a file of its own")
    ms = round(commit.header.committed_at * 1000)
    if previous is not None:
        ms = max(ms, previous.last_updated_ms)  # Iceberg readers expect snapshot times in order
    snap = Snapshot(
        snapshot_id=n,
        parent_snapshot_id=previous.current_snapshot_id if previous is not None else None,
        sequence_number=n,
        timestamp_ms=ms,
        manifest_list=f"{root}/{list_name}",
        summary=Summary(**summary(commit, files)),
        schema_id=schema.schema_id,
    )
    floor = snapshot_id(max(state.retained_from, 0))
    kept = [s for s in previous.snapshots if s.snapshot_id >= floor] if previous is not None else []
    snapshot_log = (
        [e for e in previous.snapshot_log if e.snapshot_id >= floor] if previous is not None else []
    )
    metadata_log = list(previous.metadata_log) if previous is not None else []
    if previous is not None:
        metadata_log.append(
            MetadataLogEntry(
                metadata_file=f"{root}/{metadata_name(previous_number)}",
                timestamp_ms=previous.last_updated_ms,
            )
        )
    metadata = TableMetadataV2(
        location=root,
        table_uuid=table_uuid(table.table_id or ""),
        last_updated_ms=ms,
        last_column_id=last_id,
        schemas=schemas,
        current_schema_id=schema.schema_id,
        partition_specs=[spec],
        default_spec_id=spec.spec_id,
        last_partition_id=max([f.field_id for f in spec.fields], default=999),
        properties={
            TABLE_ID_PROPERTY: table.table_id or "",
            DERIVED_PROPERTY: "true",
            "schema.name-mapping.default": name_mapping_json(schema),
        },
        current_snapshot_id=n,
        snapshots=[*kept, snap],
        snapshot_log=[*snapshot_log, SnapshotLogEntry(snapshot_id=n, timestamp_ms=ms)],
        metadata_log=metadata_log[-METADATA_LOG_MAX:],
        sort_orders=[UNSORTED_SORT_ORDER],
        default_sort_order_id=UNSORTED_SORT_ORDER.order_id,
        refs={"main": SnapshotRef(snapshot_id=n, snapshot_ref_type=SnapshotRefType.BRANCH)},
        last_sequence_number=n,
    )
    data = metadata.model_dump_json(exclude_none=True).encode("utf-8")
    if not storage.put_if_absent(metadata_name(n), data):
        standing = read_metadata(storage, table.table_id or "", n)
        current_snap = standing.current_snapshot()
        if current_snap is None or (current_snap.summary or {}).get("lakesink.token") != commit.header.token:
            raise ForeignView(f"has {metadata_name(n)}, whose snapshot is not lake version {v}'s")
        for w in written:  # another lakesink process wrote this version first: ours are unused
            storage.delete(w.name)
        metadata = standing
    advance_hint(storage, n)
    return metadata


def advance_hint(storage: Storage, number: int) -> None:
    """Make ``version-hint.text`` say at least ``number``: created, or replaced by
    compare-and-swap only when it says less (a late writer never moves it back)."""
    data = str(number).encode("ascii")
    for _ in range(8):
        seen = storage.version(VERSION_HINT)
        if seen is None:
            if storage.put_if_absent(VERSION_HINT, data):
                return
            continue
        current = read_hint(storage)
        if current is not None and current >= number:
            return
        staged = storage.stage(VERSION_HINT)
        try:
            staged.write(data)
            sealed = staged.seal()
        except BaseException:
            staged.discard()
            raise
        if storage.supersede(sealed, seen):
            return
        storage.discard(sealed)
    log.warning("%s/%s kept changing; left as it is", storage.url, VERSION_HINT)


# Checking and syncing -------------------------------------------------------------------------


@dataclass
class IcebergViewReport:
    """The Iceberg view as :func:`iceberg_sync` found it: ``ok`` (its newest snapshot is the
    lake's latest version, listing exactly its live files), ``absent``, ``behind``, ``foreign``
    (a stop file, or metadata lakesink did not write), ``unsupported`` (no Iceberg form)."""

    path: str
    state: str = "ok"
    detail: str = ""
    lake_version: int | None = None
    view_version: int | None = None  # the lake version the view's newest snapshot holds
    written: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in ("ok", "absent")

    def summary(self) -> str:
        return self.state + (f": {self.detail}" if self.detail else "")


def iceberg_sync(storage: Storage, *, write: bool = True, create: bool | None = None) -> IcebergViewReport:
    """Bring the Iceberg view of the lake at ``storage`` to the lake's latest version and check
    that its newest snapshot lists exactly the lake's live files (``write=False``: check only).
    ``create``: start a view the lake does not have (None: when table.json's ``iceberg_view``
    says so). Resumes a stopped view when the view is whole again."""
    table, vlog = open_epoch_log(storage, "the Iceberg view")
    report = IcebergViewReport(storage.url)
    try:
        check_metadata(table)
    except IcebergViewUnsupported as exc:
        report.state, report.detail = "unsupported", str(exc)
        return report
    state = vlog.open()
    report.lake_version = state.version if state.version >= 0 else None
    exists = has_view(storage)
    wanted = bool(table.iceberg_view) if create is None else create
    if not exists and (not wanted or not write or state.version < 0):
        report.state = "absent"
        return report
    table_id = table.table_id or ""
    forget(storage, table_id)
    try:
        number = newest_number(storage)
        if write and number < snapshot_id(state.version):
            probe_store(storage)
            previous = read_metadata(storage, table_id, number) if number > 0 else None
            commit = vlog.read_commit(state.version)
            if commit is None:
                raise FileNotFoundError(
                    f"{storage.url}: lake version {state.version} vanished during the sync"
                )
            write_snapshot(
                storage, table, vlog, commit, state, previous, number, _MEMOS.get(storage, table_id).salt
            )
            report.written.append(state.version)
            number = snapshot_id(state.version)
        if number == 0:
            report.state = "absent"
            return report
        metadata = read_metadata(storage, table_id, number)
        problem = check_snapshot(storage, table, vlog, metadata)
    except ForeignView as exc:
        report.state, report.detail = "foreign", f"the view {exc}"
        if write:
            _STOP.mark(storage, state.version, report.detail)
        return report
    snap = metadata.current_snapshot()
    report.view_version = snap.snapshot_id - 1 if snap is not None else None
    if problem is not None:
        report.state, report.detail = "foreign", problem
    elif report.view_version != state.version:
        report.state = "behind"
        report.detail = (
            f"its newest snapshot holds lake version {report.view_version}, the lake is at "
            f"{state.version}: run `lakesink sync-views {storage.url}`"
        )
    elif _STOP.name and storage.exists(STOP_FILE):
        if write:
            storage.delete(STOP_FILE)
        else:
            report.state, report.detail = "foreign", _STOP.reason(storage)
    return report


def check_snapshot(
    storage: Storage, table: TableMetadata, vlog: VersionedLog, metadata: TableMetadataV2
) -> str | None:
    """None when the current snapshot of ``metadata`` lists exactly the lake's live files at the
    version it holds (paths and sizes); else what differs."""
    listed = snapshot_listing(storage, metadata)
    if listed is None:
        return "the view has no current snapshot"
    version, files = listed
    live = live_at(storage, vlog, version, table.log_interval, None)
    expected = dict(zip(live.column("path").to_pylist(), live.column("bytes").to_pylist(), strict=True))
    if files != expected:
        extra, lost = len(set(files) - set(expected)), len(set(expected) - set(files))
        return (
            f"its snapshot of lake version {version} lists other files than the lake ({extra} more, "
            f"{lost} fewer)"
        )
    return None


def snapshot_listing(storage: Storage, metadata: TableMetadataV2) -> tuple[int, dict[str, int]] | None:
    """The lake version the current snapshot holds and the files it lists (path relative to the
    lake -> size), read through bounded reads of the manifest list and manifests."""
    snap = metadata.current_snapshot()
    if snap is None:
        return None
    root = root_uri(storage) + "/"
    files: dict[str, int] = {}
    for manifest in read_manifest_list(_input(storage, root, snap.manifest_list)):
        for entry in manifest.fetch_manifest_entry(_Reads(storage, root), discard_deleted=True):
            path = entry.data_file.file_path
            if not path.startswith(root):
                raise ForeignView(f"lists {path}, outside the lake")
            files[path[len(root) :]] = entry.data_file.file_size_in_bytes
    return snap.snapshot_id - 1, files


def _input(storage: Storage, root: str, location: str) -> BytesInputFile:
    if not location.startswith(root):
        raise ForeignView(f"names {location}, outside the lake")
    return BytesInputFile(location, limits.read(storage, location[len(root) :], limits.VIEW_FILE))


class _Reads:
    """The part of a pyiceberg FileIO that reading a manifest uses, over bounded Storage reads."""

    def __init__(self, storage: Storage, root: str) -> None:
        self.storage, self.root = storage, root

    def new_input(self, location: str) -> Any:
        return _input(self.storage, self.root, location)


def listed_files(storage: Storage) -> tuple[int, dict[str, int]] | None:
    """What every Iceberg reader reads of the view at least: the lake version of the snapshot
    the hint names and the files it lists; None when the lake has no view (for ``verify`` and
    ``vacuum``'s protection of a view that is behind)."""
    number = reader_number(storage)
    if number == 0:
        return None
    table_id = read_table_metadata(storage).table_id or ""
    return snapshot_listing(storage, read_metadata(storage, table_id, number))
