"""Turning Spark rows (Python tuples) into Arrow record batches, and Spark schemas into Arrow's.

Where the foreach writer's time goes -- measured with cProfile inside the Python worker
(bench/profile_writer.py foreach: one partition, 500k rows of long, timestamp, 20-character
string, double; Spark 4.3 local mode, pyarrow 26; shares of the worker's time):

- ~70% is pyspark building each row before ``process`` sees it: unpickling what the JVM
  pickled, then ``StructType.fromInternal`` per row (``TimestampType.fromInternal`` alone,
  ``datetime.fromtimestamp(...).replace(...)``, is ~28%) and ``Row`` creation (~10%).
- ~9% is waiting on the socket for the JVM, which pickles every row (Pyrolite) first.
- lakesink's own share is ~13%: ``process`` (~3.5%: a list append and a length check),
  ``rows_to_batch`` (~8%: ``zip(*rows)`` and one ``pa.array`` per column, in C per batch of
  ``batch_rows``), and Parquet encoding (~1.5%).

Converting timestamps back to UTC value by value (``astimezone``) used to cost as much as
everything else of ours together (1.3 us of 2.7 us a row); it is now vectorized
(:func:`_timestamps_to_utc`). What is left is the row API itself: the way to go faster is the
epoch mode (Arrow batches end to end), or fewer timestamp columns per row. In ``make bench``
(10M rows, 2 cores, load 3-5) the foreach writer ran at 0.20x of Spark's parquet sink (0.21x
in CPU time); of its CPU, 53% was the JVM pickling rows for Python and 47% the Python worker.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def arrow_schema(schema: Any) -> pa.Schema:
    """An Arrow schema from a pyarrow Schema or a pyspark StructType (imported lazily)."""
    if isinstance(schema, pa.Schema):
        return schema
    try:
        # Here, not at the top: rows imports no pyspark (foreach's module imports it), and a
        # pyarrow schema needs none.
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


_UTC_ZONES = frozenset(
    {"UTC", "UCT", "Universal", "Zulu", "GMT", "GMT0", "Greenwich"}
    | {f"Etc/{z}" for z in ("UTC", "UCT", "Universal", "Zulu", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich")}
)


@functools.cache
def _local_zone() -> str | None:
    """The IANA name of this process's local time zone as libc sees it; None when unknown.

    glibc reads ``TZ`` (an IANA name, ":name", or a path) and otherwise /etc/localtime, a
    link into the zoneinfo database on every mainstream distribution; no TZ and no
    /etc/localtime means UTC.
    """
    tz = os.environ.get("TZ")
    if tz is not None:
        tz = tz.removeprefix(":")
        if not tz:
            return "UTC"
        if not tz.startswith("/"):
            return tz
        path = tz
    elif not os.path.lexists("/etc/localtime"):
        return "UTC"
    else:
        path = "/etc/localtime"
    _, sep, name = os.path.realpath(path).partition("/zoneinfo/")
    return name if sep and name else None


_zone_trusted = True


def _timestamps_to_utc(values: Sequence[Any], dtype: pa.TimestampType) -> pa.Array[Any]:
    """A UTC timestamp array from pyspark's naive local datetimes, vectorized where exact.

    Converting value by value (``_local_to_utc``) costs about 1.3 us a row -- half of
    lakesink's own per-row time in the foreach writer. Instead read the naive values as wall
    times and shift them from the local zone to UTC in C++ (free when the zone is UTC, as on
    nearly every Spark worker). An ambiguous wall time (the hour repeated when DST ends:
    ``fromtimestamp`` marks it with ``fold``, which Arrow ignores), an unknown zone, or a zone
    guess that fails the spot check falls back to the exact per-value path.
    """
    global _zone_trusted
    zone = _local_zone() if _zone_trusted else None
    first = next((v for v in values if v is not None), None)
    if zone is None or not isinstance(first, dt.datetime) or first.tzinfo is not None:
        return pa.array(_local_to_utc(values), type=dtype)
    try:
        wall = pa.array(values, type=pa.timestamp(dtype.unit))
        if zone in _UTC_ZONES:
            utc = wall.cast(dtype)
        else:
            utc = pc.assume_timezone(wall, zone, ambiguous="raise", nonexistent="raise").cast(dtype)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
        return pa.array(_local_to_utc(values), type=dtype)
    index = list(values).index(first) if values[0] is None else 0
    if utc[index].as_py() != first.astimezone(dt.UTC):
        _zone_trusted = False  # the zone name does not match what libc does: stop guessing
        return pa.array(_local_to_utc(values), type=dtype)
    return utc


def rows_to_batch(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """A record batch from row tuples laid out as ``schema`` (one ``pa.array`` per column)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    if len(columns) != len(schema):
        raise ValueError(f"rows have {len(columns)} fields, the schema has {len(schema)}: {schema.names}")
    arrays = []
    for field, values in zip(schema, columns, strict=True):
        try:
            if pa.types.is_timestamp(field.type) and field.type.tz is not None:
                arrays.append(_timestamps_to_utc(values, field.type))
            else:
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
