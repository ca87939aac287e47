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

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pydantic import ValidationError  # pyiceberg's models are pydantic's
from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.manifest import ManifestContent, ManifestFile, read_manifest_list
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadataUtil, TableMetadataV2
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

from lakesink.views import iceberg_avro
from lakesink.views.delta_view import live_at
from lakesink.views.hook import ViewHook
from lakesink.views.iceberg import (
    DERIVED_PROPERTY,
    METADATA_LOG_MAX,
    PARTITION_FIELD_BASE,
    SNAPSHOT_MAX,
    TABLE_ID_PROPERTY,
    BytesInputFile,
    IcebergViewUnsupported,
    LiveFile,
    check_metadata,
    field_paths,
    iceberg_schema,
    live_files,
    manifest,
    manifest_list,
    name_mapping_json,
    partition_spec,
    summary,
    table_uuid,
)
from lakesink.views.iceberg_layout import (
    METADATA_DIR,
    STOP_FILE,
    VERSION_HINT,
    file_stem,
    has_view,
    metadata_name,
    metadata_number,
    newest_number,
    read_hint,
    reader_number,
    snapshot_id,
)
from lakesink.views.memo import StopFile, ViewMemo, ViewMemos
from lakesink_reader import jsondoc, limits
from lakesink_reader.errors import StorageError, one_line
from lakesink_reader.format.opening import open_epoch_log
from lakesink_reader.format.schemas import schema_at
from lakesink_reader.format.table import TableMetadata, probe_store, read_table_metadata
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.storage.base import Storage, sealed_copy

log = logging.getLogger(__name__)

_STOP = StopFile(STOP_FILE, "says the view was touched by a foreign writer", log)
#: A view this many lake versions behind, or less, gets a snapshot of each (the Delta view's
#: bound); further behind, the next snapshot is written on top of the view as it is.
GAP_FILL = 16
#: The most values (``jsondoc``) a metadata file of the view may hold: what lakesink writes holds
#: SNAPSHOT_MAX snapshots of ~40 values, as many snapshot-log entries of 2, 100 metadata-log
#: entries, and the lake's schemas (~6 values a column each); pydantic builds ~200 bytes a value.
METADATA_VALUES = 250_000
#: A metadata file pydantic refuses with more errors than this is named with their count only.
VALIDATION_ERRORS_SHOWN = 10


class ForeignView(Exception):
    """The view holds what lakesink did not derive (the message says what)."""


@dataclass(frozen=True)
class Held:
    """One metadata version of the view as this process holds it: what the next version is made
    from without reading, parsing or serializing it again (a cost that grows with the snapshots
    a metadata file keeps: ~25 ms a commit at 1,000 before session 18).

    ``snapshot_texts`` and ``log_texts`` are the JSON text of each entry of ``metadata``'s
    snapshots and snapshot log, in order: the next version copies them as they are.
    ``manifests``: those of the current snapshot's manifest list when this process wrote it
    (None: read back when an append keeps them)."""

    number: int
    metadata: TableMetadataV2
    snapshot_texts: tuple[str, ...]
    log_texts: tuple[str, ...]
    metadata_log: tuple[dict[str, Any], ...]
    manifests: tuple[ManifestFile, ...] | None = None

    @classmethod
    def of(cls, number: int, metadata: TableMetadataV2) -> Held:
        """What a metadata version read from the store holds (entries as pyiceberg dumps them:
        only what its model knows is carried on)."""
        doc = _dumped(metadata)
        return cls(
            number,
            metadata,
            tuple(_text(e) for e in doc.get("snapshots", [])),
            tuple(_text(e) for e in doc.get("snapshot-log", [])),
            tuple(doc.get("metadata-log", [])),
        )


def held_version(storage: Storage, table_id: str, number: int) -> Held:
    """Metadata version ``number``, read and checked (:func:`read_metadata`)."""
    return Held.of(number, read_metadata(storage, table_id, number))


@dataclass
class _Known(ViewMemo):
    """What this process knows of one lake's Iceberg view."""

    held: Held | None = None  # the newest metadata version this process wrote or read
    checked: bool = False  # the memo's table.json has an Iceberg form (check_metadata)
    unsupported: str | None = None


_MEMOS = ViewMemos(_Known)
forget = _MEMOS.forget


def root_uri(storage: Storage) -> str:
    """The lake's root as Iceberg's metadata names it: the absolute path of a local lake (no
    ``file://``: a path is taken literally, with no percent-decoding of partition folder names),
    the store's URL otherwise (``s3://``, ``hdfs://``). Iceberg v2 paths are absolute: a lake
    moved elsewhere needs ``sync-views`` after removing ``metadata/``."""
    return storage.url.rstrip("/")


class IcebergView(ViewHook[_Known]):
    """The ``after_commit`` hook that keeps a lake's Iceberg view.

    ``create``: a writer with ``iceberg_view`` on may start the view; else (compaction, vacuum,
    through ``lakesink.views.derived.maintenance_views``) only a view that is there is updated.
    """

    view = "Iceberg view"
    memos = _MEMOS
    log = log

    def _after(self, commit: Commit, state: TableState) -> None:
        k = self.known
        if k.unsupported is not None or _STOP.stops(self.storage, k, "Iceberg view"):
            return
        table = self._table()
        if not k.checked:  # (once per memo: its table.json is read once too)
            try:
                check_metadata(table)
            except IcebergViewUnsupported as exc:
                self._unsupported(exc)
                return
            k.checked = True
        n = snapshot_id(commit.version)
        try:
            found = newest(self.storage, self.table_id, below=n, known=k.held)
        except ForeignView as exc:
            self._stop(commit.version, str(exc))
            return
        if found is None:
            return  # the view is at n or past it already: never written behind a newer version
        previous = found[0]
        if previous is None and not self.create:
            return  # no view to continue (the writers of this lake keep none)
        if commit.version < state.retained_from:
            return  # vacuumed already: its files may be gone
        vlog = VersionedLog(self.storage, self.table_id, checkpoint_interval=table.log_interval)
        try:
            if previous is not None:
                previous = fill_gap(self.storage, table, vlog, previous, commit.version)
            written = write_snapshot(self.storage, table, vlog, commit, state, previous)
        except ForeignView as exc:
            self._stop(commit.version, str(exc))
            return
        except IcebergViewUnsupported as exc:  # a schema change to a type Iceberg cannot take
            self._unsupported(exc)
            return
        k.held = written

    def _unsupported(self, exc: IcebergViewUnsupported) -> None:
        """The lake's schema has no Iceberg form: no view, said once per process and lake (the
        view stays at the last version it could hold; ``sync-views`` reports it)."""
        self.known.unsupported = str(exc)
        self.known.warn_once(log, "unsupported", "%s has no Iceberg view: %s", self.storage.url, exc)

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


def _refusal(exc: Exception) -> str:
    """Why pyiceberg refused a metadata file, in a line. pydantic's text lists every error, one
    per value of a crafted file (42 MB for 200,000 refs): above a few, their count says enough."""
    if isinstance(exc, ValidationError) and exc.error_count() > VALIDATION_ERRORS_SHOWN:
        return f"{exc.error_count()} validation errors for {exc.title}"
    return one_line(exc)[:200]


def read_metadata(storage: Storage, table_id: str, number: int) -> TableMetadataV2:
    """Metadata version ``number``, checked to be this lake's view (ForeignView otherwise).
    A bounded read: the view's files are input like any other the lake holds."""
    name = metadata_name(number)
    try:
        data = limits.read(storage, name, limits.VIEW_FILE)
    except FileNotFoundError:
        # lakesink never deletes a metadata file it wrote: a number found (the hint's, or a
        # probe's) without its file is a hand's or another tool's doing.
        raise ForeignView(f"names {name}, which is not there") from None
    try:
        # Bounded before pydantic builds it (its own parser is not): METADATA_VALUES.
        parsed = TableMetadataUtil.parse_obj(jsondoc.loads(data, max_elements=METADATA_VALUES))
    except Exception as exc:  # noqa: BLE001 -- pyiceberg's validators raise AttributeError, TypeError... on crafted content
        raise ForeignView(
            f"has {name}, which is not Iceberg table metadata lakesink wrote ({_refusal(exc)})"
        ) from None
    if not isinstance(parsed, TableMetadataV2) or parsed.properties.get(TABLE_ID_PROPERTY) != table_id:
        raise ForeignView(
            f"has {name}, which is not lakesink's view of this lake (format version "
            f"{parsed.format_version}, {TABLE_ID_PROPERTY} {parsed.properties.get(TABLE_ID_PROPERTY)!r})"
        )
    # An Iceberg writer committing on the view keeps its properties: what only lakesink writes is
    # metadata n whose current snapshot is n, made from lake version n - 1.
    snap = parsed.current_snapshot()
    held = snap.summary["lakesink.version"] if snap is not None and snap.summary is not None else None
    if snap is None or snap.snapshot_id != number or held != str(number - 1):
        raise ForeignView(
            f"has {name}, whose current snapshot is not lakesink's snapshot {number} of lake version "
            f"{number - 1} (snapshot {snap.snapshot_id if snap is not None else None}, lake version {held})"
        )
    return parsed


def newest(
    storage: Storage, table_id: str, *, below: int, known: Held | None = None
) -> tuple[Held | None] | None:
    """The view's newest metadata version, in a 1-tuple, when it is below ``below`` ((None,): no
    view); None when the view is at ``below`` or past it. ``known``: what this process wrote last
    (used, without a read, when it is the version just below). ForeignView when the newest
    metadata is not lakesink's."""
    if known is not None and known.number == below - 1 and not storage.exists(metadata_name(below)):
        return (known,)
    number = newest_number(storage)
    if number >= below:
        read_metadata(storage, table_id, number)  # the view is ahead: lakesink's, or foreign
        return None
    return (held_version(storage, table_id, number),) if number > 0 else (None,)


def write_snapshot(
    storage: Storage,
    table: TableMetadata,
    vlog: VersionedLog,
    commit: Commit,
    state: TableState,
    held: Held | None,
) -> Held:
    """Write the snapshot of lake version ``commit.version`` on top of metadata version ``held``
    (None: a new view), then advance the hint. Returns the metadata that stands at that version
    (this process's, or another lakesink process's that wrote it first); ForeignView when a
    foreign writer holds that version."""
    previous = held.metadata if held is not None else None
    v = commit.version
    n = snapshot_id(v)
    root = root_uri(storage)
    schema, schemas, last_id = _schemas(schema_at(table.schema, state.schema_at(v)), previous)
    spec = partition_spec(schema, table.partition_columns)
    # A salt per write (uuid4: the simulation seeds it, so a seed replays to the same names):
    # two hooks deriving the same snapshot at once -- two queries of one process too -- never
    # meet on a name (simulation seed 7 of session 17, when the salt was per process).
    stem = file_stem(v, commit.header.token, uuid.uuid4().hex[:12])
    columns = table.partition_columns
    parent = previous.current_snapshot() if previous is not None else None
    known = held.manifests if held is not None else None
    inherited = _reusable(storage, root, parent, known, commit, state, table.log_interval)
    if inherited is not None:  # an append on its parent: a manifest of its adds, and the parent's
        files = [LiveFile(a.path, a.size, a.rows, v, a.stats) for a in commit.adds]
    else:  # a compaction, a gap, a new view, a long list: one manifest of every live file
        files = live_files(live_at(storage, vlog, v, table.log_interval, state.counts.files))
    made = manifest(root, f"{stem}-m0.avro", v, files, schema, spec, columns)
    manifests = ([made[1]] if made is not None else []) + (inherited or [])
    list_name = f"{stem}-list.avro"
    written = ([made[0]] if made is not None else []) + [
        manifest_list(root, list_name, v, parent.snapshot_id if parent is not None else None, manifests)
    ]
    for w in written:
        if not storage.put_if_absent(w.name, w.data):
            raise ForeignView(f"has {w.name}, a name lakesink had chosen for a file of its own")
    ms = round(commit.header.committed_at * 1000)
    if previous is not None:
        ms = max(ms, previous.last_updated_ms)  # Iceberg readers expect snapshot times in order
    counts = state.counts
    snap: dict[str, Any] = {
        "snapshot-id": n,
        "sequence-number": n,
        "timestamp-ms": ms,
        "manifest-list": f"{root}/{list_name}",
        "summary": summary(commit, counts.files, counts.rows, counts.bytes),
        "schema-id": schema.schema_id,
    }
    if parent is not None:
        snap["parent-snapshot-id"] = parent.snapshot_id
    # Expiry follows vacuum: the snapshots of versions below the retention floor go, and those
    # beyond the newest SNAPSHOT_MAX (the file's size and cost per commit stay bounded).
    floor = max(snapshot_id(max(state.retained_from, 0)), n - SNAPSHOT_MAX + 1)
    metadata_log = list(held.metadata_log) if held is not None else []
    if held is not None and previous is not None:
        entry = {
            "metadata-file": f"{root}/{metadata_name(held.number)}",
            "timestamp-ms": previous.last_updated_ms,
        }
        metadata_log.append(entry)
    # The metadata files of expired snapshots leave the log too: vacuum deletes them
    # (iceberg_cleanup), and the log should not name what is gone.
    metadata_log = [e for e in metadata_log if (metadata_number(e["metadata-file"]) or 0) >= floor]
    metadata_log = metadata_log[-METADATA_LOG_MAX:]
    # The older snapshots and snapshot-log entries are carried on as the models and JSON texts
    # ``held`` has (validated and serialized when they were added), not parsed and serialized
    # again: a commit's cost does not grow with the snapshots kept.
    old_snapshots = previous.snapshots if previous is not None else []
    old_log = previous.snapshot_log if previous is not None else []
    kept = [i for i, s in enumerate(old_snapshots) if s.snapshot_id >= floor]
    kept_log = [i for i, e in enumerate(old_log) if e.snapshot_id >= floor]
    log_entry = {"snapshot-id": n, "timestamp-ms": ms}
    head = {
        "format-version": 2,
        "table-uuid": str(table_uuid(table.table_id or "")),
        "location": root,
        "last-sequence-number": n,
        "last-updated-ms": ms,
        "last-column-id": last_id,
        "current-schema-id": schema.schema_id,
        "default-spec-id": spec.spec_id,
        "last-partition-id": max([f.field_id for f in spec.fields], default=PARTITION_FIELD_BASE - 1),
        "properties": {
            TABLE_ID_PROPERTY: table.table_id or "",
            DERIVED_PROPERTY: "true",
            "schema.name-mapping.default": name_mapping_json(schema),
        },
        "current-snapshot-id": n,
        "metadata-log": metadata_log,
        "default-sort-order-id": UNSORTED_SORT_ORDER.order_id,
        "refs": {"main": {"snapshot-id": n, "type": "branch"}},
    }
    # Validated by pyiceberg's model (as every reader parses it): the new parts from the document,
    # the kept ones as the models they are (pydantic does not validate a model instance again).
    metadata = TableMetadataV2.model_validate(
        {
            **head,
            "schemas": schemas,
            "partition-specs": [spec],
            "sort-orders": [UNSORTED_SORT_ORDER],
            "snapshots": [*(old_snapshots[i] for i in kept), snap],
            "snapshot-log": [*(old_log[i] for i in kept_log), log_entry],
        }
    )
    old_texts = held.snapshot_texts if held is not None else ()
    old_log_texts = held.log_texts if held is not None else ()
    if (len(old_texts), len(old_log_texts)) != (len(old_snapshots), len(old_log)):
        number = held.number if held is not None else 0
        raise ValueError(f"metadata version {number}: its JSON texts and its model disagree")
    texts = (*(old_texts[i] for i in kept), _text(snap))
    log_texts = (*(old_log_texts[i] for i in kept_log), _text(log_entry))
    small = {
        "schemas": [_dumped(s) for s in schemas],
        "partition-specs": [_dumped(spec)],
        "sort-orders": [_dumped(UNSORTED_SORT_ORDER)],
    }
    data = (
        _text({**head, **small})[:-1]
        + f', "snapshots": [{", ".join(texts)}], "snapshot-log": [{", ".join(log_texts)}]}}'
    ).encode("utf-8")
    written_held = Held(n, metadata, texts, log_texts, tuple(metadata_log), tuple(manifests))
    if not storage.put_if_absent(metadata_name(n), data):
        standing = read_metadata(storage, table.table_id or "", n)
        if _token(standing) != commit.header.token:
            raise ForeignView(f"has {metadata_name(n)}, whose snapshot is not lake version {v}'s")
        for w in written:  # another lakesink process wrote this version first: ours are unused
            storage.delete(w.name)
        written_held = Held.of(n, standing)
    advance_hint(storage, n)
    return written_held


def fill_gap(
    storage: Storage, table: TableMetadata, vlog: VersionedLog, previous: Held, version: int
) -> Held:
    """Write the snapshots of the lake versions between the view's (metadata version
    ``previous``) and ``version``, in order, when there are at most :data:`GAP_FILL` of them and
    the lake retains them all: time travel then finds every retained version, as in the Delta
    view. Returns the view's newest metadata after (a longer gap, or one reaching below the
    retention floor, is left: the next snapshot is written on top of the view as it is)."""
    missing = range(previous.number, version)  # metadata number N holds lake version N - 1
    if not missing or len(missing) > GAP_FILL:
        return previous
    # The floor now, not the committing writer's: a late hook must not write versions whose
    # files vacuum may have deleted (the Delta view's rule, simulation seed 211).
    if missing[0] < vlog.open().retained_from:
        return previous
    for u in missing:
        commit = vlog.read_commit(u)
        if commit is None:
            break  # vacuumed meanwhile
        state = vlog.snapshot(at_most=u).state
        if state.version != u:
            break
        previous = write_snapshot(storage, table, vlog, commit, state, previous)
    return previous


def _dumped(model: Any) -> Any:
    """A pyiceberg model as its JSON document (the spec's field names)."""
    return json.loads(model.model_dump_json(exclude_none=True))


def _text(doc: Any) -> str:
    """``doc`` as the JSON text of a metadata file's parts (compact, key order kept)."""
    return json.dumps(doc, separators=(", ", ": "))


def _token(metadata: TableMetadataV2) -> str | None:
    """The lake commit token of the current snapshot of ``metadata`` (None: none)."""
    snap = metadata.current_snapshot()
    return snap.summary["lakesink.token"] if snap is not None and snap.summary is not None else None


def _schemas(lake_schema: pa.Schema, previous: TableMetadataV2 | None) -> tuple[Schema, list[Schema], int]:
    """The current Iceberg schema of the view at a lake version whose schema is ``lake_schema``,
    every schema the view has had, and the last column id: a changed schema is appended with
    the next schema id, field ids kept by path (``iceberg.iceberg_schema``)."""
    if previous is None:
        schema, last_id = iceberg_schema(lake_schema, {}, 0, 0)
        return schema, [schema], last_id
    current = previous.schema()
    schema, last_id = iceberg_schema(
        lake_schema, field_paths(current), previous.last_column_id, current.schema_id
    )
    schemas = list(previous.schemas)
    if schema.as_struct() != current.as_struct():
        schema = Schema(*schema.fields, schema_id=max(s.schema_id for s in schemas) + 1)
        schemas.append(schema)
    return schema, schemas, last_id


def _reusable(
    storage: Storage,
    root: str,
    parent: Snapshot | None,
    known: Sequence[ManifestFile] | None,
    commit: Commit,
    state: TableState,
    most: int,
) -> list[ManifestFile] | None:
    """The parent snapshot's manifests, for a snapshot that keeps them and adds one of its own;
    None when it must list every live file in a manifest of its own instead: the commit removes
    files (a compaction), the parent is not the previous lake version (a gap, a new view), the
    parent has ``most`` manifests already (the list's length is bounded: the lake's checkpoint
    interval), or what the parent lists does not add up to the lake's files and rows before this
    commit (read back from the view, or ``known`` when this process wrote that list, it is
    checked before it is kept)."""
    v = commit.version
    if parent is None or commit.removes or parent.snapshot_id != snapshot_id(v) - 1:
        return None
    prefix = f"{root}/{METADATA_DIR}/"
    try:
        manifests = (
            list(known)
            if known is not None
            else list(read_manifest_list(bounded_input(storage, root + "/", parent.manifest_list)))
        )
    except Exception as exc:  # noqa: BLE001 -- any list it cannot read is written anew, from the lake
        log.info(
            "%s: the Iceberg view's snapshot %d is not kept as it is: %s",
            storage.url,
            parent.snapshot_id,
            exc,
        )
        return None
    if len(manifests) >= most:
        return None
    files = sum((m.added_files_count or 0) + (m.existing_files_count or 0) for m in manifests)
    rows = sum((m.added_rows_count or 0) + (m.existing_rows_count or 0) for m in manifests)
    want_files = state.counts.files - len(commit.adds)
    want_rows = state.counts.rows - sum(a.rows for a in commit.adds)
    ours = all(
        m.manifest_path.startswith(prefix) and m.content == ManifestContent.DATA and m.partition_spec_id == 0
        for m in manifests
    )
    if not ours or (files, rows) != (want_files, want_rows):
        log.warning(
            "%s: the Iceberg view's snapshot %d lists %d file(s) of %d row(s) where the lake had %d of %d: "
            "the next snapshot lists every live file anew",
            storage.url,
            parent.snapshot_id,
            files,
            rows,
            want_files,
            want_rows,
        )
        return None
    return manifests


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
        sealed = sealed_copy(storage, VERSION_HINT, data)
        try:
            swapped = storage.supersede(sealed, seen)
        except BaseException:
            storage.discard(sealed)  # (safe when the swap landed and its answer was lost)
            raise
        if swapped:
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
            previous = held_version(storage, table_id, number) if number > 0 else None
            commit = vlog.read_commit(state.version)
            if commit is None:
                raise FileNotFoundError(
                    f"{storage.url}: lake version {state.version} vanished during the sync"
                )
            if previous is not None:
                previous = fill_gap(storage, table, vlog, previous, state.version)
                report.written.extend(range(number, previous.number))
                number = previous.number
            write_snapshot(storage, table, vlog, commit, state, previous)
            report.written.append(state.version)
            number = snapshot_id(state.version)
        if number == 0:
            report.state = "absent"
            return report
        metadata = read_metadata(storage, table_id, number)
        # (A version the lake no longer retains cannot be derived to compare with: behind.)
        held = number - 1
        problem = check_snapshot(storage, table, vlog, metadata) if held >= state.retained_from else None
    except ForeignView as exc:
        report.state, report.detail = "foreign", f"the view {exc}"
        if write:
            _STOP.mark(storage, state.version, report.detail)
        return report
    except IcebergViewUnsupported as exc:  # the schema changed to a type Iceberg cannot take
        report.state, report.detail = "unsupported", str(exc)
        return report
    snap = metadata.current_snapshot()
    report.view_version = snap.snapshot_id - 1 if snap is not None else None
    if problem is not None:
        report.state, report.detail = "foreign", problem
    elif report.view_version != state.version:
        report.state = "behind"
        below = (
            f" (below the versions the lake retains, from {state.retained_from})"
            if held < state.retained_from
            else ""
        )
        report.detail = (
            f"its newest snapshot holds lake version {report.view_version}{below}, the lake is at "
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
    try:
        for listed in read_manifest_list(bounded_input(storage, root, snap.manifest_list)):
            for entry in listed.fetch_manifest_entry(_Reads(storage, root), discard_deleted=True):
                path = entry.data_file.file_path
                if not isinstance(path, str) or not path.startswith(root):
                    raise ForeignView(f"lists {str(path)[:200]}, outside the lake")
                files[path[len(root) :]] = entry.data_file.file_size_in_bytes
    except (OSError, StorageError, ForeignView):
        raise  # a failed read says nothing of the view's content
    except Exception as exc:  # noqa: BLE001 -- pyiceberg's decoders raise EOFError, KeyError... on crafted content
        raise ForeignView(
            f"has a manifest list or manifest lakesink did not write (snapshot {snap.snapshot_id}): "
            f"{one_line(exc)[:200]}"
        ) from None
    return snap.snapshot_id - 1, files


def bounded_input(storage: Storage, root: str, location: str) -> BytesInputFile:
    """The view's Avro file at ``location`` (a URI under ``root``, the lake's root URI with its
    slash), read whole through a bounded read of the lake's Storage and checked to decode within
    bounds (``iceberg_avro``); ForeignView when it is outside the lake or does not."""
    if not location.startswith(root):
        raise ForeignView(f"names {location}, outside the lake")
    name = location[len(root) :]
    data = limits.read(storage, name, limits.VIEW_FILE)
    try:
        iceberg_avro.check(data, name)
    except iceberg_avro.AvroRefused as exc:
        raise ForeignView(f"has {exc}") from None
    return BytesInputFile(location, data)


class _Reads(FileIO):
    """A pyiceberg FileIO that only reads, through bounded reads of the lake's Storage (reading
    a manifest takes one): the view's files are input like any other the lake holds."""

    def __init__(self, storage: Storage, root: str) -> None:
        super().__init__()
        self.storage, self.root = storage, root

    def new_input(self, location: str) -> InputFile:
        return bounded_input(self.storage, self.root, location)

    def new_output(self, location: str) -> OutputFile:
        raise PermissionError(f"{location}: the view is read here, never written through a FileIO")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise PermissionError(f"{location}: the view is read here, never written through a FileIO")


def listed_files(
    storage: Storage, keep: Callable[[str], bool] | None = None
) -> tuple[int, dict[str, int]] | None:
    """What every Iceberg reader reads of the view at least: the lake version of the snapshot
    the hint names and the files it lists (only those ``keep`` says, when given, as the other
    views' ``listed_files``); None when the lake has no view (for ``verify`` and ``vacuum``'s
    protection of a view that is behind)."""
    number = reader_number(storage)
    if number == 0:
        return None
    table_id = read_table_metadata(storage).table_id or ""
    found = snapshot_listing(storage, read_metadata(storage, table_id, number))
    if found is None or keep is None:
        return found
    version, files = found
    return version, {name: size for name, size in files.items() if keep(name)}
