"""Table metadata (``_lakesink/table.json``): format version, writer mode, schema, owner.

The first writer creates it (create-if-absent, so concurrent first writers agree on one);
every later writer checks its stream against it, and the reader takes the schema from it.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from lakesink_reader import jsondoc, limits
from lakesink_reader.errors import (
    CorruptFileError,
    FormatVersionError,
    ModeMismatchError,
    NotALakeError,
    SchemaMismatchError,
    TableNotFoundError,
)
from lakesink_reader.format.partitions import check_partition_columns, shown
from lakesink_reader.format.v3.logfiles import DEFAULT_CHECKPOINT_INTERVAL
from lakesink_reader.names import (
    FORMAT_VERSION,
    READABLE_FORMAT_VERSION,
    READER_FEATURES,
    TABLE_FILE,
    probe_name,
)
from lakesink_reader.storage.base import Storage

WriterMode = Literal["foreach", "epoch"]
WRITER_MODES: tuple[WriterMode, ...] = ("foreach", "epoch")


def has_versioned_log(format_version: int, mode: str) -> bool:
    """The one rule for whether a lake's versioned log says what is committed: format 3 in epoch
    mode (``TableMetadata.has_log``; ``status`` reports it from the figures it keeps)."""
    return mode == "epoch" and format_version >= 3


@dataclass(frozen=True)
class TableMetadata:
    """What ``_lakesink/table.json`` says.

    ``table_id`` is unique per table (it makes the file's bytes unique, which is how a
    create-if-absent whose answer was lost recognises its own write). ``owner_query`` is the
    tag of the streaming query that created a foreach-mode table (None in epoch mode, where
    the epoch log records the query of every epoch, and for tables of format version 1).
    ``checkpoint_interval``: format 3, the versions between two checkpoints of the log (fixed
    when the table is created, so that every writer checkpoints at the same versions; None:
    the default, 100). ``partition_columns``: format 3, the columns whose values name the
    folders files are in (``lakesink_reader.format.partitions``; empty: files in the root).
    ``upgrade_version``: format 3 upgraded from format 1/2, the version of the upgrade's commit
    (``upgraded_from``; only read here: ``lakesink upgrade`` writes it). ``auto_compact``: the
    lake's default for its writers' ``auto_compact`` (None: not set; writers then do not
    auto-compact unless told to); set by ``lakesink config``, never read by readers.
    ``iceberg_view``: whether the lake keeps the derived Iceberg view (None: not set; a writer's
    ``iceberg_view`` option, or ``lakesink config``, sets it); never read by readers.

    Parsed once, by :meth:`from_json`, for everyone (writers, maintenance, views, readers): the
    one reading of table.json (``read_table_metadata``), whose checks are the only ones.
    """

    format_version: int
    mode: WriterMode
    schema: pa.Schema
    created_at: float
    table_id: str | None = None
    owner_query: str | None = None
    checkpoint_interval: int | None = None
    partition_columns: tuple[str, ...] = ()
    upgrade_version: int | None = None
    auto_compact: bool | None = None
    iceberg_view: bool | None = None

    @property
    def has_log(self) -> bool:
        """Whether a versioned log says what is committed: format 3 in epoch mode. Otherwise the
        lake is a foreach lake (a file is committed by its published name) or a format-1/2 epoch
        lake (per-epoch records, ``lakesink_reader.format.log``, read until it is upgraded)."""
        return has_versioned_log(self.format_version, self.mode)

    @property
    def log_interval(self) -> int:
        """The versioned log's checkpoint interval: table.json's, else the default (100)."""
        return self.checkpoint_interval or DEFAULT_CHECKPOINT_INTERVAL

    @classmethod
    def new(
        cls,
        mode: WriterMode,
        schema: pa.Schema,
        *,
        owner_query: str | None = None,
        format_version: int = FORMAT_VERSION,
        checkpoint_interval: int | None = None,
        partition_columns: tuple[str, ...] = (),
    ) -> TableMetadata:
        interval = checkpoint_interval if format_version >= 3 else None
        table_id, now = uuid.uuid4().hex, time.time()
        return cls(format_version, mode, schema, now, table_id, owner_query, interval, partition_columns)

    @property
    def reader_features(self) -> tuple[str, ...]:
        """What a reader must implement to read this lake (table.json's ``reader_features``)."""
        return ("partitions",) if self.partition_columns else ()

    @property
    def data_schema(self) -> pa.Schema:
        """The columns its data files hold: the schema without the partition columns."""
        return pa.schema([f for f in self.schema if f.name not in self.partition_columns])

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format_version": self.format_version,
            "mode": self.mode,
            "table_id": self.table_id,
            "created_at": self.created_at,
            # For humans; the exact schema is the Arrow IPC serialization below.
            "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema],
            "arrow_schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii"),
        }
        if self.owner_query is not None:
            doc["owner_query"] = self.owner_query
        if self.checkpoint_interval is not None:
            doc["checkpoint_interval"] = self.checkpoint_interval
        if self.partition_columns:
            doc["partition_columns"] = list(self.partition_columns)
        if self.reader_features:
            doc["reader_features"] = list(self.reader_features)
        if self.auto_compact is not None:
            doc["auto_compact"] = self.auto_compact
        if self.iceberg_view is not None:
            doc["iceberg_view"] = self.iceberg_view
        return json.dumps(doc, indent=2).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> TableMetadata:
        try:
            doc: dict[str, Any] = jsondoc.loads(data)
            version = int(doc["format_version"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptFileError(f"{where}: table metadata is not valid lakesink JSON: {exc}") from exc
        if version > READABLE_FORMAT_VERSION:
            raise FormatVersionError(
                f"{where}: lake format version {version} is newer than this lakesink "
                f"understands ({READABLE_FORMAT_VERSION}); upgrade lakesink"
            )
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["arrow_schema"])))
            mode = doc["mode"]
        except (ValueError, KeyError, TypeError, OSError, pa.ArrowException) as exc:  # IPC garbage: OSError
            raise CorruptFileError(f"{where}: table metadata has no readable schema: {exc}") from exc
        if mode not in WRITER_MODES:
            raise CorruptFileError(f"{where}: unknown writer mode {mode!r}")
        owner = doc.get("owner_query")
        table_id = doc.get("table_id")
        interval = doc.get("checkpoint_interval")
        if interval is not None:
            try:
                jsondoc.count(interval, "checkpoint_interval", least=1)
            except ValueError as exc:
                raise CorruptFileError(f"{where}: {exc}") from None
        features = doc.get("reader_features", [])
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise CorruptFileError(f"{where}: reader_features must be a list of names, got {shown(features)}")
        unknown = [f for f in features if f not in READER_FEATURES]
        if unknown:
            raise FormatVersionError(
                f"{where}: the lake needs reader feature(s) {unknown}, which this lakesink does not "
                f"implement (it reads {list(READER_FEATURES)}); upgrade lakesink"
            )
        columns = doc.get("partition_columns", [])
        if not isinstance(columns, list):
            raise CorruptFileError(f"{where}: partition_columns must be a list, got {shown(columns)}")
        if columns and "partitions" not in features:
            raise CorruptFileError(f"{where}: partition_columns without the reader feature 'partitions'")
        try:
            partition_columns = check_partition_columns(schema, columns, "the table")
        except (TypeError, ValueError) as exc:
            raise CorruptFileError(f"{where}: partition_columns: {exc}") from exc
        upgraded = doc.get("upgraded_from")
        upgrade_version = upgraded.get("upgrade_version") if isinstance(upgraded, dict) else None
        auto_compact = doc.get("auto_compact")
        if auto_compact is not None and not isinstance(auto_compact, bool):
            raise CorruptFileError(f"{where}: auto_compact must be true or false, got {auto_compact!r}")
        iceberg_view = doc.get("iceberg_view")
        if iceberg_view is not None and not isinstance(iceberg_view, bool):
            raise CorruptFileError(f"{where}: iceberg_view must be true or false, got {iceberg_view!r}")
        try:
            created_at = jsondoc.seconds(doc.get("created_at", 0.0), "created_at")
        except ValueError as exc:
            raise CorruptFileError(f"{where}: {exc}") from None
        if upgrade_version is not None and (
            type(upgrade_version) is not int or upgrade_version > jsondoc.MAX_COUNT
        ):
            upgrade_version = None  # as for any value that is not a version: not an upgraded lake's
        return cls(
            version,
            mode,
            schema,
            created_at,
            str(table_id) if table_id is not None else None,
            str(owner) if owner is not None else None,
            interval,
            partition_columns,
            upgrade_version if type(upgrade_version) is int and upgrade_version > 0 else None,
            auto_compact,
            iceberg_view,
        )


def _file_in_the_way(path: str) -> str:
    """The part of a local ``path`` that exists (as a file, since it was in the way)."""
    while path and not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _where(storage: Storage) -> str:
    return f"{storage.url.rstrip('/')}/{TABLE_FILE}"


def find_table(storage: Storage, *, first_contact: bool = True) -> TableMetadata | None:
    """The table's metadata, or None when there is none yet (the path may not exist either).

    This is how readers, the maintenance commands and a starting query first reach a lake, so
    by default a storage that cannot be connected to at all fails at once, as the configuration
    error it is then (``Storage.read_bytes``'s ``first_contact``). The writers of a running
    query pass ``first_contact=False``: a store restarting under them is retried.
    """
    try:
        data = limits.read(storage, TABLE_FILE, limits.TABLE, first_contact=first_contact)
    except NotADirectoryError:
        raise NotADirectoryError(
            f"{storage.url!r} cannot be a lake folder: {_file_in_the_way(storage.url)!r} is a file"
        ) from None
    except FileNotFoundError:
        return None
    return TableMetadata.from_json(data, _where(storage))


def read_table_metadata(storage: Storage, *, first_contact: bool = True) -> TableMetadata:
    """The table's metadata; TableNotFoundError / NotALakeError naming the path otherwise.

    ``first_contact`` as for :func:`find_table`.
    """
    found = find_table(storage, first_contact=first_contact)
    if found is not None:
        return found
    if not storage.root_exists():
        raise TableNotFoundError(f"no lake at {storage.url!r}: the path does not exist")
    # The folder is there: a first writer may have created the lake since the read above (its
    # table.json comes with its folder). One more look before calling it no lake.
    found = find_table(storage, first_contact=first_contact)
    if found is not None:
        return found
    raise NotALakeError(
        f"{storage.url!r} is not a lakesink table: {TABLE_FILE} is missing "
        "(nothing was ever committed here by lakesink)"
    )


def schema_differences(expected: pa.Schema, actual: pa.Schema) -> list[str]:
    """Human-readable column differences; empty when the schemas match.

    Nullability is ignored: Spark reports the same stream as nullable or not depending on the
    plan, and Parquet readers do not care.
    """
    diffs = []
    want = {f.name: f.type for f in expected}
    got = {f.name: f.type for f in actual}
    for name, dtype in want.items():
        if name not in got:
            diffs.append(f"column {name!r} ({dtype}) is missing from the stream")
        elif got[name] != dtype:
            diffs.append(f"column {name!r} changed type from {dtype} to {got[name]}")
    diffs.extend(f"column {name!r} ({got[name]}) is new" for name in got if name not in want)
    if not diffs and list(want) != list(got):
        diffs.append(f"column order changed from {list(want)} to {list(got)}")
    return diffs


def check_compatible(existing: TableMetadata, schema: pa.Schema, mode: WriterMode, url: str) -> None:
    """Raise ModeMismatchError / SchemaMismatchError when a writer does not fit the table."""
    if existing.mode != mode:
        raise ModeMismatchError(
            f"{url!r} is {'an' if existing.mode == 'epoch' else 'a'} {existing.mode}-mode lake; "
            f"refusing to write to it in {mode} mode"
        )
    diffs = schema_differences(existing.schema, schema)
    if diffs:
        raise SchemaMismatchError(
            f"schema of the stream differs from the lake at {url!r}: "
            + "; ".join(diffs)
            + ". Write to a new lake path (schema evolution is not supported)."
        )


def probe_store(storage: Storage) -> None:
    """Refuse (StorageError) a store that would silently overwrite a create-if-absent write:
    exactly-once cannot hold there. Probes with temporary objects under ``_lakesink/`` (see
    ``names.PROBE_PREFIX``: sweeps leave a young one alone)."""
    storage.check_conditional_writes(probe_name())


def check_writable_format(existing: TableMetadata, url: str) -> None:
    """Refuse to write a lake of an older format: writers write the current one only, and
    ``lakesink upgrade`` converts a format-1/2 lake in place."""
    if existing.format_version < FORMAT_VERSION:
        raise FormatVersionError(
            f"{url!r} is a lake of format {existing.format_version}, which this lakesink reads but no "
            f"longer writes: convert it in place with `lakesink upgrade {url}` (safe to rerun or to "
            "kill; readers keep reading), then restart this query from its checkpoint."
        )


def check_partitioning(existing: TableMetadata, partition_by: Sequence[str] | None, url: str) -> None:
    """Refuse a writer that asks for other partition columns than the lake has."""
    if partition_by is None or tuple(partition_by) == existing.partition_columns:
        return
    has = list(existing.partition_columns)
    raise SchemaMismatchError(
        f"the lake at {url!r} is "
        + (f"partitioned by {has}" if has else "not partitioned")
        + f", and this writer asks for partition_by {list(partition_by)}: a lake keeps the partitioning it "
        "was created with. Leave partition_by out to write it as it is, or write to a new lake path."
    )


def ensure_table(
    storage: Storage,
    schema: pa.Schema,
    mode: WriterMode,
    *,
    owner_query: str | None = None,
    check_store: bool = False,
    checkpoint_interval: int | None = None,
    partition_by: Sequence[str] | None = None,
    check_schema: bool = True,
) -> TableMetadata:
    """Create the table metadata if absent, else check ``schema`` and ``mode`` against it.

    ``check_schema=False``: the caller checks the schema itself (a format-3 epoch writer, against
    the schema the log records: ``lakesink_reader.format.schemas``).

    Creating a table first checks that the storage honours create-if-absent writes
    (``Storage.check_conditional_writes``): on one that silently overwrites, exactly-once
    cannot hold, and the writer is refused before anything is written.

    Called by the writers of a running query (each task, each Python worker): their requests
    keep every retry, unlike the opening ones of :func:`find_table`.

    A table this call creates is of the current format (``FORMAT_VERSION``); an existing table
    of an older one is refused (FormatVersionError, :func:`check_writable_format`): a writer
    cannot convert one, ``lakesink upgrade`` does.

    ``check_store`` runs the store check on an existing table too: a lake outlives the endpoint
    it was created through (a gateway, a proxy, a migration to another store), so each run of a
    query checks it once, when it starts (the epoch writer's driver; the foreach writer's
    constructor).

    ``partition_by``: the partition columns of a table this call creates; an existing table
    partitioned otherwise is refused (None: whatever the table has).
    """
    existing = find_table(storage, first_contact=False)
    if existing is None:
        columns = check_partition_columns(schema, partition_by or (), "the stream")
        fresh = TableMetadata.new(
            mode,
            schema,
            owner_query=owner_query,
            checkpoint_interval=checkpoint_interval,
            partition_columns=columns,
        )
        probe_store(storage)
        if storage.put_if_absent(TABLE_FILE, fresh.to_json()):
            return fresh
        existing = read_table_metadata(storage, first_contact=False)  # a concurrent first writer made it
    check_compatible(existing, schema if check_schema else existing.schema, mode, storage.url)
    check_writable_format(existing, storage.url)
    check_partitioning(existing, partition_by, storage.url)
    if check_store:
        probe_store(storage)
    return existing
