"""The Delta Lake view of a format-3 epoch lake: one lake commit = one Delta commit.

Lake version ``v`` maps to ``_delta_log/<v:020d>.json`` (docs/design/format-v3.md, section 15),
derived by :func:`delta_commit`, a pure function of table.json and the lake commit: any process
re-derives the same bytes, so a create-if-absent that finds other bytes there has found a
foreign writer. The view is derived, never the truth: the lake's own log decides what is
committed, and a view can always be rebuilt from it (``lakesink sync-views``).

What a commit holds (JSON lines, keys sorted, no spaces):

- ``commitInfo`` first: ``timestamp`` (the lake commit's ``committed_at`` in ms), ``operation``
  (``STREAMING UPDATE``, ``OPTIMIZE``, or ``LAKESINK <KIND>`` for abandon/vacuum/upgrade, which
  change no files), ``engineInfo`` ``lakesink`` and the lake header's fields under ``lakesink``.
  No lakesink version: two lakesink releases must derive equal bytes.
- version 0 also ``protocol`` (reader 1, writer 7 with the writer feature
  :data:`FENCE_FEATURE`: Delta writers that do not know it refuse to write, readers read) and
  ``metaData`` (``id`` = table id, Parquet, the schema mapped by :func:`delta_schema`,
  the lake's partition columns, no configuration, ``createdTime`` = table.json's ``created_at``);
- ``append``: ``txn {appId: writer id, version: batch}`` and one ``add`` per file (``dataChange``
  true; ``stats`` the file's exact statistics, or absent);
- ``compact``: one ``remove`` per input and one ``add`` per output, all ``dataChange`` false.

Delta cannot take every Arrow type at reader version 1: :func:`delta_schema` refuses the others
(:class:`DeltaViewUnsupported`), and such a lake has no view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa

from lakesink_reader import jsondoc
from lakesink_reader.arrays import array
from lakesink_reader.format.partitions import partition_texts
from lakesink_reader.format.schemas import decode_schema
from lakesink_reader.format.v3.commits import Commit

if TYPE_CHECKING:
    from lakesink_reader.format.table import TableMetadata

DELTA_LOG_DIR = "_delta_log"
#: The writer feature that fences the view: Delta writers refuse a table whose protocol names a
#: writer feature they do not know (measured with deltalake 1.6.6: append, overwrite, delete,
#: optimize refused; vacuum deletes nothing; reads, checkpoints and metadata cleanup still work).
FENCE_FEATURE = "lakesinkDerivedView"
PROTOCOL = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": [FENCE_FEATURE]}
#: Characters Delta (without column mapping) refuses in column names.
BAD_NAME_CHARS = " ,;{}()\n\t="

_OPERATIONS = {
    "append": "STREAMING UPDATE",
    "compact": "OPTIMIZE",
    "abandon": "LAKESINK ABANDON",
    "vacuum": "LAKESINK VACUUM",
    "upgrade": "LAKESINK UPGRADE",
}


class DeltaViewUnsupported(ValueError):
    """The lake's schema has a type or a column name a Delta reader cannot take: no view."""


def delta_commit_name(version: int) -> str:
    """The name (relative to the table root) of the Delta commit of lake version ``version``."""
    if version < 0:
        raise ValueError(f"a Delta version must be >= 0, got {version}")
    return f"{DELTA_LOG_DIR}/{version:020d}.json"


def delta_commit(metadata: TableMetadata, commit: Commit) -> bytes:
    """The bytes of the Delta commit derived from lake commit ``commit`` of the table ``metadata``.

    DeltaViewUnsupported when the schema cannot be expressed (checked at every version, so that
    a lake without a version 0 in its view never gets later ones either).
    """
    header = commit.header
    if metadata.table_id != header.table_id:
        raise ValueError(f"commit of table {header.table_id} derived with table.json of {metadata.table_id}")
    schema_string = jsondoc.canonical(delta_schema(metadata.schema))
    if header.schema is not None:  # the commit changes the lake's schema: so does the view's
        schema_string = jsondoc.canonical(
            delta_schema(decode_schema(header.schema, f"lake version {header.version}"))
        )
    ms = _ms(header.committed_at)
    lines: list[dict[str, Any]] = [{"commitInfo": _commit_info(commit, ms)}]
    if header.version == 0:
        lines.append({"protocol": PROTOCOL})
    if header.version == 0 or header.schema is not None:
        lines.append({"metaData": _metadata_action(metadata, schema_string)})
    if header.writer is not None:
        lines.append({"txn": {"appId": header.writer.id, "version": header.writer.batch, "lastUpdated": ms}})
    data_change = header.kind == "append"
    for r in commit.removes:
        lines.append(
            {
                "remove": {
                    "path": _uri(r.path),
                    "deletionTimestamp": ms,
                    "dataChange": data_change,
                    "extendedFileMetadata": True,
                    "partitionValues": _partition_values(metadata, r.path),
                    "size": r.size,
                }
            }
        )
    for a in commit.adds:
        add: dict[str, Any] = {
            "path": _uri(a.path),
            "partitionValues": _partition_values(metadata, a.path),
            "size": a.size,
            "modificationTime": ms,
            "dataChange": data_change,
        }
        if a.stats is not None:
            add["stats"] = a.stats  # canonical text already (AddFile)
        lines.append({"add": add})
    return "".join(jsondoc.canonical(line) + "\n" for line in lines).encode("utf-8")


def _partition_values(metadata: TableMetadata, path: str) -> dict[str, str | None]:
    """Delta's ``partitionValues`` of a file: its folders' values, as text (Delta's partition value
    serialization is the text lakesink writes in folder names: decimal integers, ``true``/``false``,
    ``YYYY-MM-DD``; null for null)."""
    if not metadata.partition_columns:
        return {}
    return partition_texts(path, metadata.partition_columns)


def _metadata_action(metadata: TableMetadata, schema_string: str) -> dict[str, Any]:
    return {
        "id": metadata.table_id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_string,
        "partitionColumns": list(metadata.partition_columns),
        "configuration": {},
        "createdTime": _ms(metadata.created_at),
    }


def _commit_info(commit: Commit, ms: int) -> dict[str, Any]:
    header = commit.header
    info: dict[str, Any] = {
        "timestamp": ms,
        "operation": _OPERATIONS[header.kind],
        "operationParameters": {},
        "engineInfo": "lakesink",
        "isBlindAppend": header.kind == "append",
        "lakesink": {
            "version": header.version,
            "table_id": header.table_id,
            "kind": header.kind,
            "token": header.token,
            "committed_at": header.committed_at,
        },
    }
    if header.writer is not None:
        info["lakesink"]["writer"] = {
            "id": header.writer.id,
            "batch": header.writer.batch,
            "run": header.writer.run,
        }
    if header.op is not None:
        info["lakesink"]["op"] = header.op.token
        if header.op.trigger == "auto":
            # As Delta's own autoCompact marks its OPTIMIZE commits.
            info["operationParameters"] = {"auto": "true"}
    if header.kind == "append":
        info["operationParameters"] = {
            "outputMode": "Append",
            "epochId": str(header.writer.batch if header.writer else 0),
        }
    return info


def delta_schema(schema: pa.Schema) -> dict[str, Any]:
    """The Delta schema (a ``struct``) of an Arrow schema, mapped strictly.

    DeltaViewUnsupported, naming the column and why, for what Delta readers cannot take at
    protocol reader 1: unsigned integers, nanosecond timestamps, timestamps without a time zone
    (``timestamp_ntz`` needs reader version 3, which deltalake refuses to read), times,
    durations, intervals, half floats, dictionaries, nulls, and names with `` ,;{}()\\n\\t=``.
    """
    return {"type": "struct", "fields": [_field(f.name, f.type, f.nullable, f.name) for f in schema]}


def _field(name: str, type_: pa.DataType, nullable: bool, where: str) -> dict[str, Any]:
    bad = sorted({c for c in name if c in BAD_NAME_CHARS})
    if bad or not name:
        raise DeltaViewUnsupported(
            f"column {where!r}: Delta (without column mapping) refuses names with any of {bad or ['<empty>']}"
        )
    return {"name": name, "type": _type(type_, where), "nullable": nullable, "metadata": {}}


def _type(t: pa.DataType, where: str) -> Any:
    types = pa.types
    simple = {
        pa.bool_(): "boolean",
        pa.int8(): "byte",
        pa.int16(): "short",
        pa.int32(): "integer",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.string(): "string",
        pa.large_string(): "string",
        pa.binary(): "binary",
        pa.large_binary(): "binary",
        pa.date32(): "date",
    }
    if t in simple:
        return simple[t]
    if types.is_timestamp(t):
        assert isinstance(t, pa.TimestampType)
        if t.tz is None:
            raise DeltaViewUnsupported(
                f"column {where!r} is {t}, a timestamp without a time zone: Delta's timestamp_ntz needs "
                "reader version 3 (the timestampNtz feature), which Delta readers here refuse"
            )
        if t.unit not in ("ms", "us"):
            raise DeltaViewUnsupported(
                f"column {where!r} is {t}: Delta timestamps are microseconds; {t.unit} values are not exact"
            )
        return "timestamp"
    if types.is_decimal128(t):
        assert isinstance(t, pa.Decimal128Type)
        return f"decimal({t.precision},{t.scale})"
    if types.is_list(t) or types.is_large_list(t):
        item = t.value_field  # type: ignore[attr-defined]
        return {
            "type": "array",
            "elementType": _type(item.type, f"{where}.element"),
            "containsNull": item.nullable,
        }
    if types.is_map(t):
        assert isinstance(t, pa.MapType)
        return {
            "type": "map",
            "keyType": _type(t.key_type, f"{where}.key"),
            "valueType": _type(t.item_type, f"{where}.value"),
            "valueContainsNull": t.item_field.nullable,
        }
    if types.is_struct(t):
        assert isinstance(t, pa.StructType)
        return {
            "type": "struct",
            "fields": [
                _field(f.name, f.type, f.nullable, f"{where}.{f.name}")
                for f in (t.field(i) for i in range(t.num_fields))
            ],
        }
    raise DeltaViewUnsupported(
        f"column {where!r} is {t}, a type Delta readers cannot take at reader version 1"
    )


def _uri(path: str) -> str:
    """A lake path as Delta's relative URI (percent-encoded; '/' kept)."""
    return quote(path, safe="/")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


# Checkpoints -----------------------------------------------------------------------------------

#: The hint Delta readers read first: ``{"version": c, ...}`` of the newest checkpoint.
LAST_CHECKPOINT = f"{DELTA_LOG_DIR}/_last_checkpoint"


def delta_checkpoint_name(version: int) -> str:
    """The classic (V1, single-file) checkpoint of view version ``version``."""
    if version < 0:
        raise ValueError(f"a Delta version must be >= 0, got {version}")
    return f"{DELTA_LOG_DIR}/{version:020d}.checkpoint.parquet"


def checkpoint_schema() -> pa.Schema:
    """The Parquet schema of a view checkpoint (Delta PROTOCOL.md, "Checkpoint Schema", V1 spec).

    One column per action kind, a struct each; every row holds one action. ``remove`` is there
    and always null: the view keeps no tombstones (they serve Delta's VACUUM only, which the
    fence stops). ``protocol.readerFeatures`` is left out (reader version 1);
    ``writerFeatures`` is there, as writer version 7 requires.
    """
    strings = pa.map_(pa.string(), pa.string())
    return pa.schema(
        [
            pa.field(
                "txn",
                pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())]),
            ),
            pa.field(
                "add",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("partitionValues", strings),
                        ("size", pa.int64()),
                        ("modificationTime", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("stats", pa.string()),
                        ("tags", strings),
                    ]
                ),
            ),
            pa.field(
                "remove",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("deletionTimestamp", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("extendedFileMetadata", pa.bool_()),
                        ("partitionValues", strings),
                        ("size", pa.int64()),
                    ]
                ),
            ),
            pa.field(
                "metaData",
                pa.struct(
                    [
                        ("id", pa.string()),
                        ("name", pa.string()),
                        ("description", pa.string()),
                        ("format", pa.struct([("provider", pa.string()), ("options", strings)])),
                        ("schemaString", pa.string()),
                        ("partitionColumns", pa.list_(pa.string())),
                        ("configuration", strings),
                        ("createdTime", pa.int64()),
                    ]
                ),
            ),
            pa.field(
                "protocol",
                pa.struct(
                    [
                        ("minReaderVersion", pa.int32()),
                        ("minWriterVersion", pa.int32()),
                        ("writerFeatures", pa.list_(pa.string())),
                    ]
                ),
            ),
        ]
    )


def delta_checkpoint(
    metadata: TableMetadata,
    live: pa.Table,
    modification_ms: pa.Array[Any],
    txns: list[tuple[str, int, int]],
) -> pa.Table:
    """The rows of the view checkpoint at one version: ``protocol``, ``metaData``, one ``txn``
    per writer (``(app id, batch, last updated ms)``, sorted by app id), one ``add`` per live file.

    ``live``: the lake's live files at that version (``lakesink_reader.format.v3.checkpoint.LIST_SCHEMA``,
    sorted by path: ``path``, ``bytes``, ``stats``); ``modification_ms``: per live file, the time
    (ms) of the lake commit that added it -- what that commit's ``add`` says. Adds carry
    ``dataChange`` false, as Delta's own checkpoints do.
    """
    schema = checkpoint_schema()
    fields = {f.name: f.type for f in schema}

    def rows(column: str, value: pa.Array[Any]) -> pa.Table:
        return pa.table(
            {
                name: (value if name == column else pa.nulls(len(value), type_))
                for name, type_ in fields.items()
            },
            schema=schema,
        )

    schema_string = jsondoc.canonical(delta_schema(metadata.schema))
    meta = _metadata_action(metadata, schema_string)
    meta_row = {
        **meta,
        "name": None,
        "description": None,
        "format": {"provider": "parquet", "options": []},
        "configuration": [],
    }
    # Built from buffers (lakesink_reader.arrays): pa.array of Python values imports pandas, in
    # the process that commits every batch.
    n = live.num_rows
    add: Any = fields["add"]
    paths = live.column("path").to_pylist()
    partition_maps = array(
        [_partition_values(metadata, p) if p is not None else {} for p in paths]
        if metadata.partition_columns
        else [{}] * n,
        add.field("partitionValues").type,
    )
    adds = pa.StructArray.from_arrays(
        [
            array([_uri(str(p)) for p in paths], pa.string()),
            partition_maps,
            live.column("bytes").combine_chunks().cast(pa.int64()),
            modification_ms.cast(pa.int64()),
            array([False] * n, pa.bool_()),
            live.column("stats").combine_chunks().cast(pa.string()),
            pa.nulls(n, add.field("tags").type),
        ],
        fields=list(add),
    )
    parts = [
        rows("protocol", array([PROTOCOL], fields["protocol"])),
        rows("metaData", array([meta_row], fields["metaData"])),
        rows(
            "txn",
            array([{"appId": a, "version": v, "lastUpdated": t} for a, v, t in sorted(txns)], fields["txn"]),
        ),
        rows("add", adds),
    ]
    return pa.concat_tables(parts)


def last_checkpoint_doc(version: int, actions: int, adds: int, size: int) -> bytes:
    """``_delta_log/_last_checkpoint`` for the view checkpoint at ``version``."""
    doc = {"version": version, "size": actions, "numOfAddFiles": adds, "sizeInBytes": size}
    return jsondoc.canonical(doc).encode("utf-8")
