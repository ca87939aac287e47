"""The Apache Iceberg view of a format-3 epoch lake (format version 2): what one snapshot of it is.

Lake version ``v`` is snapshot ``v + 1`` (``iceberg_layout.snapshot_id``; its sequence number is
the same number: Iceberg reserves sequence number 0 for files of format-1 tables), described by
the metadata file ``metadata/v<v + 1>.metadata.json`` (docs/design/iceberg-view.md). Everything here
is derived from table.json and the lake's log; the Avro files are written by pyiceberg's
manifest and manifest-list writers into memory, and the caller (``iceberg_view``) stores the
bytes through lakesink's ``Storage`` -- so the view is written the same way on every store.

What one snapshot holds (``iceberg_view.write_snapshot`` decides which form):

- an append on its parent snapshot: the parent's manifests, and one of its own listing its
  adds as ``ADDED`` (snapshot and sequence number ``v + 1``);
- otherwise (a compaction, a view that starts or skipped versions, a parent with as many
  manifests as the lake's checkpoint interval): one manifest of every live file at ``v``,
  ``ADDED`` for the files ``v`` added, ``EXISTING`` (snapshot and sequence number ``a + 1``,
  ``a`` the version that added it) for the others.

Either way the snapshot lists exactly the lake's live files at ``v``, and the ``ADDED`` entries
of a snapshot are exactly its version's adds: an incremental reader between two snapshots
finds exactly the appended files, and a compaction's outputs are ``ADDED`` in a ``replace``
snapshot, which incremental readers skip. A summary carries Iceberg's counts and the lake
commit's fields under ``lakesink.``.

The schema's field ids are kept across schema changes (:func:`iceberg_schema`: a column keeps
its id, a new one takes the next); every field is optional (a reader that trusts a ``required``
may answer ``col IS NULL`` wrongly for files written before the column existed). The lake's
``partition_columns`` are identity partitions; data files lack those columns, which Iceberg
readers fill from the partition values.
"""

from __future__ import annotations

import datetime
import io
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.conversions import to_bytes
from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from lakesink.views.iceberg_layout import snapshot_id
from lakesink_reader import jsondoc
from lakesink_reader.format.partitions import partition_texts

if TYPE_CHECKING:
    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.format.v3.commits import Commit

#: Table properties lakesink sets: the lake it is derived from (how a view is known for ours).
TABLE_ID_PROPERTY = "lakesink.table-id"
DERIVED_PROPERTY = "lakesink.derived-view"
#: The first partition field id (Iceberg's convention: 1000 and up).
PARTITION_FIELD_BASE = 1000
#: Metadata files a metadata file remembers (Iceberg's ``write.metadata.previous-versions-max``).
METADATA_LOG_MAX = 100
#: Snapshots a metadata file keeps at most (the newest), whatever the lake retains: time travel
#: through the view reaches the last this many lake versions (lakesink's reader, every retained
#: one). Each costs ~0.85 KB in every later metadata file (measured: 854 KB at 1,000) and ~5 KB
#: of a writer's memory; unbounded, a lake retaining 100,000 versions writes an 85 MB metadata
#: file per commit.
SNAPSHOT_MAX = 1000

_OPERATIONS = {"append": "append", "compact": "replace"}  # abandon, vacuum, upgrade: no data change


class IcebergViewUnsupported(ValueError):
    """The lake's schema has a type an Iceberg v2 reader cannot take: no view."""


def table_uuid(table_id: str) -> uuid.UUID:
    """The view's ``table-uuid``: the lake's table id (32 hex digits) as a UUID."""
    return uuid.UUID(hex=table_id)


# Schema ---------------------------------------------------------------------------------------


def iceberg_schema(
    schema: pa.Schema, known: Mapping[str, int], last_column_id: int, schema_id: int
) -> tuple[Schema, int]:
    """The Iceberg schema of an Arrow schema, and the new last column id.

    ``known``: field ids by path (``a``, ``a.b``, ``a.element``, ``m.key``, ``m.value``) from
    the view's previous schema: a path keeps its id, a new one takes the next above
    ``last_column_id`` (top-level columns before nested ones, in order). A type Iceberg v2 cannot
    take raises IcebergViewUnsupported naming the column.
    """
    ids = _Ids(known, last_column_id)
    for f in schema:  # top-level columns first: their ids are small, as Iceberg's own are
        ids.of(f.name)
    fields = [_field(f.name, f.type, f.name, ids) for f in schema]
    return Schema(*fields, schema_id=schema_id), ids.last


def field_paths(schema: Schema) -> dict[str, int]:
    """Path -> field id of every field of ``schema`` (the ``known`` of :func:`iceberg_schema`)."""
    out: dict[str, int] = {}

    def walk(prefix: str, t: IcebergType) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                path = f"{prefix}.{f.name}" if prefix else f.name
                out[path] = f.field_id
                walk(path, f.field_type)
        elif isinstance(t, ListType):
            out[f"{prefix}.element"] = t.element_id
            walk(f"{prefix}.element", t.element_type)
        elif isinstance(t, MapType):
            out[f"{prefix}.key"], out[f"{prefix}.value"] = t.key_id, t.value_id
            walk(f"{prefix}.key", t.key_type)
            walk(f"{prefix}.value", t.value_type)

    walk("", schema.as_struct())
    return out


class _Ids:
    def __init__(self, known: Mapping[str, int], last: int) -> None:
        self.known, self.last = dict(known), last

    def of(self, path: str) -> int:
        if path in self.known:
            return self.known[path]
        self.last += 1
        self.known[path] = self.last
        return self.last


_SIMPLE: dict[pa.DataType, PrimitiveType] = {
    pa.bool_(): BooleanType(),
    pa.int8(): IntegerType(),
    pa.int16(): IntegerType(),
    pa.int32(): IntegerType(),
    pa.int64(): LongType(),
    pa.float32(): FloatType(),
    pa.float64(): DoubleType(),
    pa.string(): StringType(),
    pa.large_string(): StringType(),
    pa.binary(): BinaryType(),
    pa.large_binary(): BinaryType(),
    pa.date32(): DateType(),
}


def _field(name: str, t: pa.DataType, path: str, ids: _Ids) -> NestedField:
    return NestedField(field_id=ids.of(path), name=name, field_type=_type(t, path, ids), required=False)


def _type(t: pa.DataType, path: str, ids: _Ids) -> IcebergType:
    types = pa.types
    if t in _SIMPLE:
        return _SIMPLE[t]
    if types.is_timestamp(t):
        assert isinstance(t, pa.TimestampType)
        if t.unit != "us":
            # v2 timestamps are microseconds, and its readers expect Parquet's TIMESTAMP_MICROS.
            raise IcebergViewUnsupported(
                f"column {path!r} is {t}: Iceberg v2 timestamps are microseconds ({t.unit} files are "
                "not read as such by its readers)"
            )
        return TimestamptzType() if t.tz is not None else TimestampType()
    if types.is_decimal128(t):
        assert isinstance(t, pa.Decimal128Type)
        return DecimalType(t.precision, t.scale)
    if types.is_list(t) or types.is_large_list(t):
        item = t.value_field  # type: ignore[attr-defined]
        element = f"{path}.element"
        return ListType(ids.of(element), _type(item.type, element, ids), element_required=False)
    if types.is_map(t):
        assert isinstance(t, pa.MapType)
        key, value = f"{path}.key", f"{path}.value"
        key_id, value_id = ids.of(key), ids.of(value)
        return MapType(
            key_id,
            _type(t.key_type, key, ids),
            value_id,
            _type(t.item_type, value, ids),
            value_required=False,
        )
    if types.is_struct(t):
        assert isinstance(t, pa.StructType)
        children = [t.field(i) for i in range(t.num_fields)]
        for c in children:
            ids.of(f"{path}.{c.name}")
        return StructType(*[_field(c.name, c.type, f"{path}.{c.name}", ids) for c in children])
    raise IcebergViewUnsupported(f"column {path!r} is {t}, a type Iceberg v2 readers cannot take")


def partition_spec(schema: Schema, partition_columns: Sequence[str]) -> PartitionSpec:
    """Identity partitions on the lake's ``partition_columns``, in order, ids from 1000."""
    return PartitionSpec(
        *[
            PartitionField(
                source_id=schema.find_field(column).field_id,
                field_id=PARTITION_FIELD_BASE + i,
                transform=IdentityTransform(),
                name=column,
            )
            for i, column in enumerate(partition_columns)
        ],
        spec_id=0,
    )


def name_mapping_json(schema: Schema) -> str:
    """``schema.name-mapping.default``: the lake's data files carry no field ids, so readers map
    their columns by name to the schema's ids."""
    return create_mapping_from_schema(schema).model_dump_json()


# Data files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveFile:
    """One live file of the lake at a version, as a manifest entry needs it."""

    path: str  # relative to the lake's root
    size: int
    rows: int
    added_version: int
    stats: str | None = None  # lakesink's stats as JSON text (a commit's add, a file list's row)


def data_file(root: str, f: LiveFile, schema: Schema, columns: Sequence[str]) -> DataFile:
    """The manifest's ``data_file`` of ``f``: its absolute path, partition values (from its
    folders), and the bounds lakesink's exact statistics give (bounds absent where they do not)."""
    partition = Record(*_partition_values(f.path, schema, columns)) if columns else Record()
    counts: dict[int, int] = {}
    nulls: dict[int, int] = {}
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    if f.stats:
        _bounds(f.stats, f.rows, schema, counts, nulls, lower, upper)
    return DataFile.from_args(
        _table_format_version=2,
        content=DataFileContent.DATA,
        file_path=f"{root.rstrip('/')}/{f.path}",
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=f.rows,
        file_size_in_bytes=f.size,
        # Empty maps, not nulls, where there are no metrics: the same to the spec, and some
        # readers take a null for a map (pyiceberg 0.12's ``inspect.entries`` fails on one).
        column_sizes={},
        value_counts=counts,
        null_value_counts=nulls,
        nan_value_counts={},
        lower_bounds=lower,
        upper_bounds=upper,
    )


def _partition_values(path: str, schema: Schema, columns: Sequence[str]) -> list[Any]:
    texts = partition_texts(path, columns)
    out: list[Any] = []
    for column in columns:
        text = texts.get(column)
        t = schema.find_field(column).field_type
        if text is None:
            out.append(None)
        elif isinstance(t, IntegerType | LongType):
            out.append(int(text))
        elif isinstance(t, BooleanType):
            out.append(text == "true")
        elif isinstance(t, DateType):
            out.append((datetime.date.fromisoformat(text) - datetime.date(1970, 1, 1)).days)
        else:
            out.append(text)
    return out


def _bounds(
    text: str,
    rows: int,
    schema: Schema,
    counts: dict[int, int],
    nulls: dict[int, int],
    lower: dict[int, bytes],
    upper: dict[int, bytes],
) -> None:
    """Iceberg's column metrics from lakesink's stats (Delta's: ``minValues``, ``maxValues``,
    ``nullCount`` by top-level column, each exact or absent). Only what converts exactly is kept:
    a wrong bound makes readers skip a file whose rows match."""
    try:
        stats = jsondoc.loads(text)  # one file's, decoded here only: the log and lists hold text
    except ValueError:
        return  # no stats is always right
    if not isinstance(stats, dict):
        return
    mins, maxs, null_counts = (stats.get(k) or {} for k in ("minValues", "maxValues", "nullCount"))
    for f in schema.fields:
        t = f.field_type
        if not isinstance(t, PrimitiveType):
            continue
        n = null_counts.get(f.name) if isinstance(null_counts, dict) else None
        if type(n) is int and 0 <= n <= rows:
            nulls[f.field_id] = n
            counts[f.field_id] = rows
        lo = _bound(t, mins.get(f.name) if isinstance(mins, dict) else None)
        hi = _bound(t, maxs.get(f.name) if isinstance(maxs, dict) else None)
        if lo is not None and hi is not None:
            lower[f.field_id], upper[f.field_id] = lo, hi


def _bound(t: PrimitiveType, value: Any) -> bytes | None:
    """``value`` (a stats JSON value) as Iceberg's single-value serialization of type ``t``;
    None when it is not a value of that type this view converts exactly."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(t, IntegerType | LongType) and type(value) is int:
        limit = 1 << (31 if isinstance(t, IntegerType) else 63)
        return to_bytes(t, value) if -limit <= value < limit else None
    if isinstance(t, DoubleType) and isinstance(value, int | float):
        return to_bytes(t, float(value))
    if isinstance(t, StringType) and isinstance(value, str):
        return to_bytes(t, value)
    if isinstance(t, DateType) and isinstance(value, str):
        try:
            return to_bytes(t, datetime.date.fromisoformat(value))
        except ValueError:
            return None
    # float32 (a JSON double may not be the float's value), timestamps (rounded to ms in the
    # stats), decimals, booleans: no bound. Absent is always right.
    return None


def live_files(live: pa.Table) -> list[LiveFile]:
    """The rows of a lake's live-file list (``LIST_SCHEMA``) as :class:`LiveFile`."""
    cols = [live.column(c).to_pylist() for c in ("path", "bytes", "rows", "added_version", "stats")]
    return [LiveFile(p, int(b), int(r), int(a), s) for p, b, r, a, s in zip(*cols, strict=True)]


# Avro, in memory ------------------------------------------------------------------------------


class _Buffer(io.BytesIO):
    """An OutputStream whose bytes outlive its close (pyiceberg closes it when done)."""

    def close(self) -> None:
        self.kept = self.getvalue()
        super().close()


class MemoryOutputFile(OutputFile):
    """A pyiceberg OutputFile that keeps the bytes (``data``) for the caller to store through
    lakesink's Storage: pyiceberg's own FileIO would write around its no-clobber rules."""

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self._buffer: _Buffer | None = None

    @property
    def data(self) -> bytes:
        if self._buffer is None:
            return b""
        return self._buffer.kept if self._buffer.closed else self._buffer.getvalue()

    def __len__(self) -> int:
        return len(self.data)

    def exists(self) -> bool:
        return self._buffer is not None

    def to_input_file(self) -> InputFile:
        return BytesInputFile(self.location, self.data)

    def create(self, overwrite: bool = False) -> OutputStream:
        self._buffer = _Buffer()
        return self._buffer  # type: ignore[return-value]


class BytesInputFile(InputFile):
    """A pyiceberg InputFile over bytes already read (through a bounded read of the Storage)."""

    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._data)  # type: ignore[return-value]


@dataclass(frozen=True)
class Written:
    """A file of the view to store: its name (relative to the lake's root) and bytes."""

    name: str
    data: bytes


def manifest(
    root: str,
    name: str,
    version: int,
    files: Iterable[LiveFile],
    schema: Schema,
    spec: PartitionSpec,
    columns: Sequence[str],
) -> tuple[Written, ManifestFile] | None:
    """A manifest of snapshot ``version + 1`` listing ``files``: ``ADDED`` for those version
    ``version`` added, ``EXISTING`` (with the snapshot and sequence number of the version that
    added them) for the others; None when there are none (Iceberg has no empty manifests)."""
    sid = snapshot_id(version)
    entries = []
    for f in files:
        added = snapshot_id(f.added_version)
        status = ManifestEntryStatus.ADDED if f.added_version == version else ManifestEntryStatus.EXISTING
        entries.append(
            ManifestEntry.from_args(
                _table_format_version=2,
                status=status,
                snapshot_id=added,
                sequence_number=added,
                file_sequence_number=added,
                data_file=data_file(root, f, schema, columns),
            )
        )
    if not entries:
        return None
    target = MemoryOutputFile(f"{root}/{name}")
    with write_manifest(2, spec, schema, target, sid, "deflate") as writer:
        for entry in entries:
            writer.add_entry(entry)
    return Written(name, target.data), writer.to_manifest_file()


def manifest_list(
    root: str, name: str, version: int, parent: int | None, manifests: Sequence[ManifestFile]
) -> Written:
    """The manifest list of snapshot ``version + 1``, whose parent is snapshot ``parent``."""
    sid = snapshot_id(version)
    target = MemoryOutputFile(f"{root}/{name}")
    with write_manifest_list(2, target, sid, parent, sid, "deflate") as lister:
        lister.add_manifests(list(manifests))
    return Written(name, target.data)


def summary(commit: Commit, files: int, rows: int, size: int) -> dict[str, str]:
    """The snapshot summary of lake commit ``commit``, after which the lake has ``files`` live
    files of ``rows`` rows and ``size`` bytes: Iceberg's counts (strings, as the spec has them)
    and the lake commit's fields under ``lakesink.``."""
    header = commit.header
    out = {
        "operation": _OPERATIONS.get(header.kind, "replace"),
        "added-data-files": str(len(commit.adds)),
        "added-records": str(sum(a.rows for a in commit.adds)),
        "added-files-size": str(sum(a.size for a in commit.adds)),
        "deleted-data-files": str(len(commit.removes)),
        "deleted-records": str(sum(r.rows for r in commit.removes)),
        "removed-files-size": str(sum(r.size for r in commit.removes)),
        "total-data-files": str(files),
        "total-records": str(rows),
        "total-files-size": str(size),
        "total-delete-files": "0",
        "total-position-deletes": "0",
        "total-equality-deletes": "0",
        "lakesink.version": str(header.version),
        "lakesink.kind": header.kind,
        "lakesink.token": header.token,
    }
    if header.writer is not None:
        out["lakesink.writer"] = header.writer.id
        out["lakesink.batch"] = str(header.writer.batch)
    return out


def check_metadata(metadata: TableMetadata) -> None:
    """IcebergViewUnsupported when the lake's schema or partitioning has no Iceberg form."""
    schema, _ = iceberg_schema(metadata.schema, {}, 0, 0)
    partition_spec(schema, metadata.partition_columns)
