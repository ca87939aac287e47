"""Schema evolution of format-3 epoch lakes: which schema changes a lake takes, and how they merge.

A lake's schema is table.json's until a commit records another (``CommitHeader.schema``,
docs/FORMAT.md "Schema evolution"); a writer with ``merge_schema=True`` records the merge of the
lake's schema and its stream's. The only changes are those every reader applies to older files
without rewriting them: a new column (files without it read as nulls), a wider integer
(int8 -> int16 -> int32 -> int64), float -> double. Nullability is not compared, as elsewhere
(Spark reports the same stream as nullable or not depending on the plan).
"""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa

from lakesink_reader.errors import CorruptFileError, SchemaMismatchError

_WIDER: dict[pa.DataType, tuple[pa.DataType, ...]] = {
    pa.int8(): (pa.int16(), pa.int32(), pa.int64()),
    pa.int16(): (pa.int32(), pa.int64()),
    pa.int32(): (pa.int64(),),
    pa.uint8(): (pa.uint16(), pa.uint32(), pa.uint64()),
    pa.uint16(): (pa.uint32(), pa.uint64()),
    pa.uint32(): (pa.uint64(),),
    pa.float32(): (pa.float64(),),
}


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether values of ``old`` read as ``new`` unchanged (the same type, or a wider one)."""
    return old == new or new in _WIDER.get(old, ())


def fit_problems(files: pa.Schema, lake: pa.Schema) -> list[str]:
    """Why files of schema ``files`` cannot be read as the lake's schema ``lake``; empty when
    they can (every column of theirs is the lake's, of the same or a narrower type; the lake's
    other columns read as nulls)."""
    wanted = {f.name: f.type for f in lake}
    problems = []
    for f in files:
        if f.name not in wanted:
            problems.append(f"column {f.name!r} ({f.type}) is new")
        elif not widens(f.type, wanted[f.name]):
            problems.append(f"column {f.name!r} changed type from {wanted[f.name]} to {f.type}")
    return problems


def merge(lake: pa.Schema, stream: pa.Schema, partition_columns: tuple[str, ...] = ()) -> pa.Schema:
    """The lake's schema after it takes ``stream``: its columns in order, each of the wider type
    of the two, then the stream's new columns (nullable) in the stream's order. SchemaMismatchError
    naming the columns for a change no reader applies to older files."""
    theirs = {f.name: f for f in stream}
    problems = []
    fields = []
    for f in lake:
        other = theirs.get(f.name)
        if other is None or widens(other.type, f.type):
            fields.append(f)
        elif widens(f.type, other.type) and f.name not in partition_columns:
            fields.append(f.with_type(other.type))
        else:
            problems.append(f"column {f.name!r} changed type from {f.type} to {other.type}")
    known = set(lake.names)
    fields += [f.with_nullable(True) for f in stream if f.name not in known]
    if problems:
        raise SchemaMismatchError(
            "; ".join(problems)
            + ": a lake's columns may only be added or widened (int8 -> int16 -> int32 -> "
            "int64, float -> double). Write to a new lake path, or cast the column in the query"
        )
    metadata: Any = lake.metadata
    return pa.schema(fields, metadata=metadata)


def file_schema(stream: pa.Schema, lake: pa.Schema) -> pa.Schema:
    """The schema a data file of ``stream`` stores in a lake whose declared schema is ``lake``
    (the one its log, table.json and the Delta view say): the stream's columns, each with the
    lake's type and nullability. Engines that read the files' own schemas (Spark's Parquet
    reader, with or without ``mergeSchema``) then answer as the log does: a column the lake
    declares nullable but a file stores ``not null`` (``F.lit`` makes one) makes Spark's merged
    schema non-nullable, and it folds ``col IS NULL`` to false over the older files' nulls.

    A column the lake declares ``not null`` that the stream may hold nulls in stays nullable in
    the file (the file then says less than the lake, which no reader misreads; a null there
    would fail the write otherwise). Columns the lake does not have (a stream that does not fit
    is refused before any file is written) keep the stream's field."""
    wanted = {f.name: f for f in lake}
    fields = []
    for f in stream:
        declared = wanted.get(f.name)
        if declared is None:
            fields.append(f)
        else:
            fields.append(pa.field(f.name, declared.type, declared.nullable or f.nullable, f.metadata))
    metadata: Any = stream.metadata
    return pa.schema(fields, metadata=metadata)


def encode_schema(schema: pa.Schema) -> str:
    """The schema as table.json's ``arrow_schema`` holds it: base64 of its Arrow IPC bytes."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str, where: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except (ValueError, TypeError, OSError, pa.ArrowException) as exc:  # IPC garbage: OSError too
        raise CorruptFileError(f"{where}: not a readable schema: {exc}") from exc


def schema_at(table_schema: pa.Schema, encoded: str | None, where: str = "the log") -> pa.Schema:
    """The lake's schema given what its state says at a version (``TableState.schema_at``):
    the recorded one, or table.json's when none was recorded."""
    return table_schema if encoded is None else decode_schema(encoded, where)


def read_as(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A batch of an older file as ``schema`` has it: missing columns as nulls, narrower types
    widened, columns in the schema's order (the files of an evolved lake, for compaction)."""
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    problems = fit_problems(batch.schema, schema)
    if problems:
        raise SchemaMismatchError("a file does not fit the lake's schema: " + "; ".join(problems))
    names = batch.schema.names
    columns = [
        batch.column(names.index(f.name)).cast(f.type)
        if f.name in names
        else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def schema_change(
    lake: pa.Schema,
    stream: pa.Schema,
    *,
    merge_schema: bool,
    url: str,
    partition_columns: tuple[str, ...] = (),
) -> pa.Schema | None:
    """What an epoch writer's stream does to the lake's schema: None when its files fit the lake
    as it is (the same columns, or fewer or narrower ones: an older writer beside a newer one);
    with ``merge_schema`` the lake's new schema (:func:`merge`); else SchemaMismatchError naming
    the columns and the way out."""
    problems = fit_problems(stream, lake)
    if not problems:
        return None
    if merge_schema:
        return merge(lake, stream, partition_columns)
    raise SchemaMismatchError(
        f"schema of the stream differs from the lake at {url!r}: "
        + "; ".join(problems)
        + ". merge_schema=True lets the stream add columns and widen types (int -> long, float -> "
        "double); otherwise write to a new lake path."
    )
