"""Table metadata (``_lakesink/table.json``): format version, writer mode and schema.

The first writer creates it (create-if-absent, so concurrent first writers agree on one);
every later writer checks its stream against it, and the reader takes the schema from it.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from lakesink.errors import (
    CorruptFileError,
    FormatVersionError,
    ModeMismatchError,
    NotALakeError,
    SchemaMismatchError,
    TableNotFoundError,
)
from lakesink.layout import FORMAT_VERSION, TABLE_FILE
from lakesink.storage import Storage

WriterMode = Literal["foreach", "epoch"]
WRITER_MODES: tuple[WriterMode, ...] = ("foreach", "epoch")


@dataclass(frozen=True)
class TableMetadata:
    format_version: int
    mode: WriterMode
    schema: pa.Schema
    created_at: float

    def to_json(self) -> bytes:
        sink = self.schema.serialize()
        doc = {
            "format_version": self.format_version,
            "mode": self.mode,
            "created_at": self.created_at,
            # For humans; the exact schema is the Arrow IPC serialization below.
            "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema],
            "arrow_schema": base64.b64encode(sink.to_pybytes()).decode("ascii"),
        }
        return json.dumps(doc, indent=2).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> TableMetadata:
        try:
            doc: dict[str, Any] = json.loads(data)
            version = int(doc["format_version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptFileError(f"{where}: table metadata is not valid lakesink JSON: {exc}") from exc
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"{where}: lake format version {version} is newer than this lakesink "
                f"understands ({FORMAT_VERSION}); upgrade lakesink"
            )
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["arrow_schema"])))
            mode = doc["mode"]
        except (ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
            raise CorruptFileError(f"{where}: table metadata has no readable schema: {exc}") from exc
        if mode not in WRITER_MODES:
            raise CorruptFileError(f"{where}: unknown writer mode {mode!r}")
        return cls(version, mode, schema, float(doc.get("created_at", 0.0)))


def read_table_metadata(storage: Storage) -> TableMetadata:
    """The table's metadata; TableNotFoundError / NotALakeError naming the path otherwise."""
    try:
        data = storage.read_bytes(TABLE_FILE)
    except FileNotFoundError:
        if not storage.root_exists():
            raise TableNotFoundError(f"no lake at {storage.url!r}: the path does not exist") from None
        raise NotALakeError(
            f"{storage.url!r} is not a lakesink table: {TABLE_FILE} is missing "
            "(nothing was ever committed here by lakesink)"
        ) from None
    return TableMetadata.from_json(data, _where(storage))


def _where(storage: Storage) -> str:
    return f"{storage.url.rstrip('/')}/{TABLE_FILE}"


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


def ensure_table(storage: Storage, schema: pa.Schema, mode: WriterMode) -> TableMetadata:
    """Create the table metadata if absent, else check ``schema`` and ``mode`` against it."""
    # Read first: the epoch writer checks on every epoch, and a create attempt costs a write.
    try:
        existing = TableMetadata.from_json(storage.read_bytes(TABLE_FILE), _where(storage))
    except FileNotFoundError:
        fresh = TableMetadata(FORMAT_VERSION, mode, schema, time.time())
        if storage.put_if_absent(TABLE_FILE, fresh.to_json()):
            return fresh
        existing = read_table_metadata(storage)  # a concurrent first writer created it
    if existing.mode != mode:
        raise ModeMismatchError(
            f"{storage.url!r} is a {existing.mode}-mode lake; refusing to write to it in {mode} mode"
        )
    diffs = schema_differences(existing.schema, schema)
    if diffs:
        raise SchemaMismatchError(
            f"schema of the stream differs from the lake at {storage.url!r}: "
            + "; ".join(diffs)
            + ". Write to a new lake path (schema evolution is not supported)."
        )
    return existing
