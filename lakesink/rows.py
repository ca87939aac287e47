"""Turning Spark rows (Python tuples) into Arrow record batches, and Spark schemas into Arrow's.

Where the foreach writer's time goes (profiled with pyinstrument on 1M rows of long,
timestamp, string, double): most of it is outside lakesink, in Spark unpickling each row into
a ``Row`` and calling ``process`` once per row. Of ours, the column transpose ``zip(*rows)``
and ``pa.array`` per column dominate; both run in C per batch, not per row in Python.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa


def arrow_schema(schema: Any) -> pa.Schema:
    """An Arrow schema from a pyarrow Schema or a pyspark StructType (imported lazily)."""
    if isinstance(schema, pa.Schema):
        return schema
    try:
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType
    except ImportError as exc:  # pragma: no cover - only without pyspark
        raise TypeError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}") from exc
    if not isinstance(schema, StructType):
        raise TypeError(
            f"schema must be a pyspark StructType (df.schema) or a pyarrow.Schema, got {schema!r}"
        )
    return to_arrow_schema(schema, timezone="UTC")


def _local_to_utc(values: Sequence[Any]) -> list[Any]:
    # pyspark hands timestamps to Python as naive datetimes in the worker's local time zone
    # (TimestampType.fromInternal uses datetime.fromtimestamp); astimezone() reads a naive
    # datetime as local time, which is exactly what undoes that.
    return [v.astimezone(dt.UTC) if v is not None and v.tzinfo is None else v for v in values]


def rows_to_batch(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """A record batch from row tuples laid out as ``schema`` (one ``pa.array`` per column)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    if len(columns) != len(schema):
        raise ValueError(f"rows have {len(columns)} fields, the schema has {len(schema)}: {schema.names}")
    arrays = []
    for field, values in zip(schema, columns, strict=True):
        if pa.types.is_timestamp(field.type) and field.type.tz is not None:
            values = tuple(_local_to_utc(values))
        try:
            arrays.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise ValueError(f"column {field.name!r} does not fit type {field.type}: {exc}") from exc
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def infer_schema(rows: Sequence[Any]) -> pa.Schema:
    """Infer an Arrow schema from the first rows (pyspark ``Row`` objects carry field names).

    Fragile by nature (an all-null column has no type): pass ``schema=df.schema`` instead.
    """
    first = rows[0]
    names = list(getattr(first, "__fields__", None) or [f"_{i}" for i in range(len(first))])
    table = pa.Table.from_pylist([dict(zip(names, row, strict=True)) for row in rows])
    fields = []
    for field in table.schema:
        dtype = field.type
        if pa.types.is_null(dtype):
            raise ValueError(
                f"cannot infer a type for column {field.name!r}: all of its first values are null; "
                "pass schema=df.schema to the writer"
            )
        if pa.types.is_timestamp(dtype) and dtype.tz is None:
            dtype = pa.timestamp("us", tz="UTC")
        fields.append(pa.field(field.name, dtype))
    return pa.schema(fields)
