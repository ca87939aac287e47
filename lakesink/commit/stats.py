"""Per-file statistics in Delta's shape, read from the footer a ``FileWriter`` has just written.

``{"numRecords": n, "minValues": {...}, "maxValues": {...}, "nullCount": {...}}`` for the Delta
view and pruning (docs/design/format-v3.md, section 3). Every value is **exact or absent**: a
bound that is too tight makes Delta readers (deltalake, polars, DuckDB) silently skip the file,
so whatever cannot be shown correct here is left out, which only costs pruning.

Columns: the first :data:`INDEXED_COLUMNS` top-level fields (Delta's default
``dataSkippingNumIndexedCols``); nested ones (struct, list, map) are left out entirely, since a
leaf's null count there is not the column's. Per column, aggregated over the row groups:

- ``nullCount``: when every row group's footer has a null count (pyarrow's are exact);
- min/max, when every row group has them, or has none because all its values are null:
  booleans, signed integers (8 to 64 bits) and dates as they are (dates ``YYYY-MM-DD``);
  decimals as JSON numbers, when the number JSON writes equals the value (integral values
  always; others when ``repr(float(v))`` spells the exact value without an exponent);
  timestamps rounded outward to the millisecond (min down, max up), written
  ``YYYY-MM-DDTHH:MM:SS.mmmZ`` when the column is UTC-adjusted (Spark's TIMESTAMP) and without
  the ``Z`` when it is not (TIMESTAMP_NTZ), as Delta Kernel writes them; float and double only
  when the writer counted no NaN in the column (Parquet leaves NaN out of min/max, Spark orders
  it above every value) and both bounds are finite (JSON has no infinity), a zero min written
  ``-0.0`` and a zero max ``0.0`` so that either zero lies within them in any ordering; strings
  only from footers of a pyarrow measured to drop (not truncate) long min/max values;
- left out: binary, unsigned integers, float16, INT96, time, and anything else.

Measured with pyarrow 26.0.1: ``pq.ParquetWriter(...).writer.metadata`` is the written footer
after ``close()``; a row group whose string min or max is over 4096 bytes has no min/max at all
(``has_min_max`` False, null count still set) while a long value between them leaves them
intact; NaN is left out of float min/max ([1.0, NaN, 3.0] gives 1.0 and 3.0; all NaN gives
none); zeros are written as min -0.0 and max +0.0; INT96 columns have no statistics.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

INDEXED_COLUMNS = 32
"""How many top-level columns get statistics (Delta's default ``dataSkippingNumIndexedCols``)."""

MEASURED_ARROW_MAJOR = 26
"""Newest pyarrow major version measured to drop, not truncate, string min/max over 4 KiB.

Footers written by a newer one get no string bounds until it is measured again (the test
``test_a_long_string_drops_the_bounds_of_its_row_group`` pins the behaviour), since a
truncated max would be below the true one.
"""

_ARROW_WRITER = re.compile(r"parquet-cpp-arrow version (\d+)\.")
_EPOCH = datetime(1970, 1, 1)
_EPOCH_DAY = date(1970, 1, 1)
_UNIT_PER_MS = {"milliseconds": 1, "microseconds": 1_000, "nanoseconds": 1_000_000}

JsonScalar = bool | int | float | str


# Counting NaN while writing ----------------------------------------------------------------------


def nan_columns(schema: pa.Schema) -> tuple[int, ...]:
    """The indices of the top-level float and double columns that get statistics.

    A ``FileWriter`` counts NaN in these (:func:`count_nans`): float bounds are written only
    for a column counted NaN-free.
    """
    return tuple(
        i
        for i in range(min(len(schema), INDEXED_COLUMNS))
        if pa.types.is_float32(schema.field(i).type) or pa.types.is_float64(schema.field(i).type)
    )


def count_nans(counts: dict[str, int], batch: pa.RecordBatch, columns: Sequence[int]) -> None:
    """Add the NaNs of ``batch``'s ``columns`` (from :func:`nan_columns`) to ``counts``, by name."""
    if not columns:
        return
    # Here, not at the top: pyarrow.compute is ~2.9 MiB in each task worker, and only a float
    # column needs it.
    import pyarrow.compute as pc

    for i in columns:
        name = batch.schema.field(i).name
        counts[name] = counts.get(name, 0) + pc.is_nan(batch.column(i)).true_count  # nulls: not NaN


# Statistics from a footer -----------------------------------------------------------------------


def file_stats(metadata: pq.FileMetaData, nan_counts: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Delta's stats object for the Parquet file whose footer is ``metadata``; plain JSON.

    ``nan_counts``: NaNs per float column name, as counted by the writer; a float column
    missing from it gets no bounds.
    """
    nan_counts = nan_counts or {}
    min_values: dict[str, JsonScalar] = {}
    max_values: dict[str, JsonScalar] = {}
    null_count: dict[str, int] = {}
    strings = _string_bounds_trusted(metadata.created_by)
    for name, leaf in _top_level_leaves(metadata):
        column = _collect(metadata, leaf)
        if column is None:
            continue
        if column.nulls is not None:
            null_count[name] = column.nulls
        if column.low is None or column.high is None:
            continue
        encode = _encoder(metadata.schema.column(leaf), nan_counts.get(name), strings)
        bounds = encode(column.low, column.high) if encode is not None else None
        if bounds is not None:
            min_values[name], max_values[name] = bounds
    return {
        "numRecords": metadata.num_rows,
        "minValues": min_values,
        "maxValues": max_values,
        "nullCount": null_count,
    }


@dataclass(frozen=True)
class _Column:
    nulls: int | None  # None: some row group has no null count
    low: Any  # None (with high): no usable bounds
    high: Any


def _top_level_leaves(metadata: pq.FileMetaData) -> list[tuple[str, int]]:
    """(name, Parquet leaf index) of the first top-level columns that are single, unnested leaves.

    Nothing when the Arrow schema's leaves do not line up with the footer's (an unknown layout:
    no statistics rather than another column's). Names that occur twice are left out.
    """
    schema = metadata.schema
    fields = list(metadata.schema.to_arrow_schema())
    starts, leaf = [], 0
    for f in fields:
        starts.append(leaf)
        leaf += _leaf_count(f.type)
    if leaf != metadata.num_columns:
        return []
    names = [f.name for f in fields]
    out = []
    for i, f in enumerate(fields[:INDEXED_COLUMNS]):
        column = schema.column(starts[i])
        top_level = column.name == column.path == f.name and column.max_repetition_level == 0
        if top_level and not pa.types.is_nested(f.type) and names.count(f.name) == 1:
            out.append((f.name, starts[i]))
    return out


def _leaf_count(t: pa.DataType) -> int:
    if isinstance(t, pa.ExtensionType):
        return _leaf_count(t.storage_type)
    if pa.types.is_struct(t):
        return sum(_leaf_count(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaf_count(t.key_type) + _leaf_count(t.item_type)
    if isinstance(t, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
        return _leaf_count(t.value_type)
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return _leaf_count(t.value_type)  # type: ignore[attr-defined]
    return 1


def _collect(metadata: pq.FileMetaData, leaf: int) -> _Column | None:
    """Null count and the min of mins / max of maxes of one leaf over all row groups."""
    kind = metadata.schema.column(leaf)
    decoded = kind.logical_type.type == "DECIMAL"  # Decimal objects; raw values otherwise
    nulls: int | None = 0
    lows: list[Any] = []
    highs: list[Any] = []
    bounded = True
    for r in range(metadata.num_row_groups):
        group = metadata.row_group(r)
        stats = group.column(leaf).statistics
        if stats is None:
            return None
        count = stats.null_count
        nulls = None if nulls is None or count is None else nulls + count
        if stats.has_min_max:
            lows.append(stats.min if decoded else stats.min_raw)
            highs.append(stats.max if decoded else stats.max_raw)
        elif count is None or count != group.num_rows:  # no bounds although not all null
            bounded = False
    if not bounded or not lows or any(v is None for v in lows + highs):
        return _Column(nulls, None, None)
    return _Column(nulls, min(lows), max(highs))


_Encode = Callable[[Any, Any], tuple[JsonScalar, JsonScalar] | None]


def _encoder(column: pq.ColumnSchema, nans: int | None, strings: bool) -> _Encode | None:
    """How this column's aggregated (min, max) become JSON, or None to leave its bounds out."""
    physical = column.physical_type
    logical = column.logical_type
    name = logical.type
    detail: dict[str, Any] = json.loads(logical.to_json()) if name in ("INT", "TIMESTAMP") else {}
    if physical == "BOOLEAN" and name == "NONE":
        return _plain(bool)
    if physical in ("INT32", "INT64") and (name == "NONE" or (name == "INT" and detail.get("isSigned"))):
        return _plain(int)
    if physical == "INT32" and name == "DATE":
        return _dates
    if physical == "INT64" and name == "TIMESTAMP" and detail.get("timeUnit") in _UNIT_PER_MS:
        return _timestamps(_UNIT_PER_MS[detail["timeUnit"]], utc=bool(detail.get("isAdjustedToUTC")))
    if name == "DECIMAL":
        return _decimals
    if physical in ("FLOAT", "DOUBLE") and name == "NONE" and nans == 0:
        return _floats
    if physical == "BYTE_ARRAY" and name == "STRING" and strings:
        return _strings
    return None


def _plain(kind: type[bool] | type[int]) -> _Encode:
    def encode(low: Any, high: Any) -> tuple[JsonScalar, JsonScalar] | None:
        return (kind(low), kind(high)) if low <= high else None

    return encode


def _dates(low: Any, high: Any) -> tuple[JsonScalar, JsonScalar] | None:
    try:
        first = _EPOCH_DAY + timedelta(days=int(low))
        last = _EPOCH_DAY + timedelta(days=int(high))
    except OverflowError:
        return None
    return (first.isoformat(), last.isoformat()) if first <= last else None


def _timestamps(per_ms: int, *, utc: bool) -> _Encode:
    def encode(low: Any, high: Any) -> tuple[JsonScalar, JsonScalar] | None:
        first = _iso_millis(int(low) // per_ms, utc)  # floor
        last = _iso_millis(-(-int(high) // per_ms), utc)  # ceiling
        return (first, last) if first is not None and last is not None and low <= high else None

    return encode


def _iso_millis(ms: int, utc: bool) -> str | None:
    """``ms`` after the epoch as ``YYYY-MM-DDTHH:MM:SS.mmm`` (+ ``Z`` if ``utc``); None past years 1-9999."""
    try:
        t = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return None
    text = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    return f"{text}.{t.microsecond // 1000:03d}" + ("Z" if utc else "")


def _decimals(low: Any, high: Any) -> tuple[JsonScalar, JsonScalar] | None:
    first, last = _decimal_number(low), _decimal_number(high)
    if first is None or last is None or not low <= high:
        return None
    return first, last


def _decimal_number(value: Any) -> int | float | None:
    """A JSON number equal to the Decimal ``value``, or None when the json module cannot write one."""
    if not isinstance(value, Decimal) or not value.is_finite():
        return None
    if value == value.to_integral_value():
        return int(value)
    number = float(value)
    text = repr(number)  # what json.dumps writes for it
    return number if "e" not in text and Decimal(text) == value else None


def _floats(low: Any, high: Any) -> tuple[JsonScalar, JsonScalar] | None:
    first, last = float(low), float(high)
    if not (math.isfinite(first) and math.isfinite(last)) or first > last:
        return None
    # -0.0 == 0.0: write a zero min as -0.0 and a zero max as +0.0, outside both zeros in any order.
    return (-0.0 if first == 0 else first), (0.0 if last == 0 else last)


def _strings(low: Any, high: Any) -> tuple[JsonScalar, JsonScalar] | None:
    # Raw bytes, compared bytewise (Parquet's order for UTF-8, and code point order).
    if not isinstance(low, bytes) or not isinstance(high, bytes) or low > high:
        return None
    try:
        return low.decode("utf-8"), high.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _string_bounds_trusted(created_by: str | None) -> bool:
    match = _ARROW_WRITER.match(created_by or "")
    return match is not None and int(match.group(1)) <= MEASURED_ARROW_MAJOR
