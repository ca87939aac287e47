"""Per-file statistics (lakesink.commit.stats) from the FileWriter: exact or absent, for every type.

Every bound is checked against the data read back from the published file (pyarrow.compute),
never against hard-coded values only: a bound tighter than the data makes Delta readers skip
rows silently. No Spark; no Delta reader (deltalake is not a dependency).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lakesink.commit import FileWriter, Published, WriteOptions
from lakesink.commit import stats as stats_module
from lakesink.commit.stats import INDEXED_COLUMNS, file_stats
from lakesink_reader.names import data_file_name
from lakesink_reader.storage import Storage, open_storage

TYPES = pa.schema(
    [
        ("flag", pa.bool_()),
        ("tiny", pa.int8()),
        ("small", pa.int16()),
        ("int", pa.int32()),
        ("long", pa.int64()),
        ("real", pa.float32()),
        ("double", pa.float64()),
        ("dec38", pa.decimal128(38, 18)),
        ("dec10", pa.decimal128(10, 2)),
        ("text", pa.string()),
        ("blob", pa.binary()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us", tz="America/New_York")),  # Spark TIMESTAMP in a non-UTC session
        ("ntz", pa.timestamp("us")),  # Spark TIMESTAMP_NTZ
        ("items", pa.list_(pa.int32())),
        ("attrs", pa.map_(pa.string(), pa.int64())),
        ("nested", pa.struct([("a", pa.int32()), ("inner", pa.struct([("b", pa.string())]))])),
    ]
)
NESTED = {"items", "attrs", "nested"}
BOUNDED = set(TYPES.names) - NESTED - {"blob"}
CHARS = ["a", "b", "Z", "\x00", "é", "日本", "😀", "\U0010ffff", " "]
US_1900, US_2100 = -2_208_988_800 * 10**6, 4_102_444_800 * 10**6


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return open_storage(str(tmp_path / "lake"))


Batches = Sequence[pa.RecordBatch] | pa.Table


def write(storage: Storage, schema: pa.Schema, batches: Batches, *, row_group_bytes: int = 64 << 20,
          name: str | None = None) -> tuple[Published, pa.Table]:  # fmt: skip
    """Write ``batches`` through a FileWriter; the publish result and the table read back."""
    if isinstance(batches, pa.Table):
        batches = batches.to_batches()
    name = name or data_file_name(0, 0, "a" * 16)
    writer = FileWriter(storage, name, schema, WriteOptions(row_group_bytes=row_group_bytes))
    for batch in batches:
        writer.write(batch)
    published = writer.publish()
    assert published is not None and published.won
    assert published.stats is not None and published.stats == writer.stats
    fs, base = storage.arrow_filesystem()
    return published, pq.read_table(f"{base.rstrip('/')}/{name}", filesystem=fs, schema=schema)


def footer(storage: Storage, name: str) -> pq.FileMetaData:
    fs, base = storage.arrow_filesystem()
    return pq.read_metadata(f"{base.rstrip('/')}/{name}", filesystem=fs)


def group_stats(meta: pq.FileMetaData, group: int, column: int = 0) -> pq.Statistics:
    stats = meta.row_group(group).column(column).statistics
    assert stats is not None
    return stats


def bounds(stats: dict[str, Any], name: str) -> tuple[Any, Any]:
    return stats["minValues"][name], stats["maxValues"][name]


# The oracle --------------------------------------------------------------------------------------


def assert_exact_or_absent(stats: dict[str, Any], table: pa.Table) -> None:
    """Every count and bound in ``stats`` is the data's own (timestamps: rounded outward to ms)."""
    assert json.loads(json.dumps(stats, allow_nan=False)) == stats  # plain JSON, no NaN/inf
    assert set(stats) == {"numRecords", "minValues", "maxValues", "nullCount"}
    assert stats["numRecords"] == table.num_rows
    for name, count in stats["nullCount"].items():
        assert count == table.column(name).null_count, name
    assert stats["minValues"].keys() == stats["maxValues"].keys()
    for name in stats["minValues"]:
        column = table.column(name)
        low, high = stats["minValues"][name], stats["maxValues"][name]
        assert_bound(column, low, "min")
        assert_bound(column, high, "max")


def assert_bound(column: pa.ChunkedArray, bound: Any, side: str) -> None:
    kind = column.type
    assert column.null_count < len(column), "bounds of an all-null column"
    if pa.types.is_timestamp(kind):
        raw = pc.min_max(column.cast(pa.int64()))[side].as_py()
        per_ms = {"ms": 1, "us": 1_000, "ns": 1_000_000}[kind.unit]
        want = raw // per_ms if side == "min" else -(-raw // per_ms)  # outward: floor min, ceil max
        assert isinstance(bound, str) and bound.endswith("Z") == (kind.tz is not None), bound
        parsed = datetime.fromisoformat(bound)
        epoch = datetime(1970, 1, 1, tzinfo=UTC if kind.tz is not None else None)
        assert (parsed - epoch) // timedelta(milliseconds=1) == want, (bound, raw)
        return
    true = pc.min_max(column)[side].as_py()
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        assert type(bound) is type(true) and bound == true
    elif pa.types.is_floating(kind):
        assert not pc.any(pc.is_nan(column)).as_py(), "float bounds although the column holds NaN"
        assert isinstance(bound, float) and bound == true
        if true == 0:  # -0.0 == 0.0: the bound must lie outside both zeros
            assert math.copysign(1, bound) == (-1 if side == "min" else 1)
    elif pa.types.is_decimal(kind):
        assert isinstance(bound, int | float) and not isinstance(bound, bool)
        assert Decimal(repr(bound)) == true, (bound, true)  # the number as JSON spells it
    elif pa.types.is_date(kind):
        assert date.fromisoformat(bound) == true
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        assert bound == true
    else:
        pytest.fail(f"a bound for {column.type}, which must have none")


# Data --------------------------------------------------------------------------------------------


def every_type(rng: random.Random, n: int) -> pa.Table:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.1 else value

    def text() -> str:
        return "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 8)))

    def real() -> float:
        return rng.choice([0.0, -0.0, rng.uniform(-1e6, 1e6), rng.uniform(-1, 1)])

    rows = range(n)

    columns = {
        "flag": [maybe(rng.random() < 0.5) for _ in rows],
        "tiny": [maybe(rng.randint(-128, 127)) for _ in rows],
        "small": [maybe(rng.randint(-(2**15), 2**15 - 1)) for _ in rows],
        "int": [maybe(rng.randint(-(2**31), 2**31 - 1)) for _ in rows],
        "long": [maybe(rng.randint(-(2**63), 2**63 - 1)) for _ in rows],
        "real": [maybe(real()) for _ in rows],
        "double": [maybe(real()) for _ in rows],
        # Spark-shaped decimals: few significant digits at scale 18, any at scale 2.
        "dec38": [maybe(Decimal(rng.randint(-(10**15), 10**15)).scaleb(-rng.randint(0, 6))) for _ in rows],
        "dec10": [maybe(Decimal(rng.randint(-(10**10) + 1, 10**10 - 1)).scaleb(-2)) for _ in rows],
        "text": [maybe(text()) for _ in rows],
        "blob": [maybe(rng.randbytes(rng.randint(0, 6))) for _ in rows],
        "day": [maybe(date(1900, 1, 1) + timedelta(days=rng.randint(0, 200 * 366))) for _ in rows],
        "ts": [maybe(rng.randint(US_1900, US_2100)) for _ in rows],
        "ntz": [maybe(rng.randint(US_1900, US_2100)) for _ in rows],
        "items": [maybe([maybe(rng.randint(0, 9)) for _ in range(rng.randint(0, 3))]) for _ in rows],
        "attrs": [
            maybe([(text(), maybe(rng.randint(0, 9))) for _ in range(rng.randint(0, 2))]) for _ in rows
        ],
        "nested": [
            maybe({"a": maybe(rng.randint(0, 9)), "inner": maybe({"b": maybe(text())})}) for _ in rows
        ],
    }
    return pa.table(columns, schema=TYPES)


def batches_of(table: pa.Table, size: int) -> list[pa.RecordBatch]:
    return [b for start in range(0, table.num_rows, size) for b in table.slice(start, size).to_batches()]


# Tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row_group_bytes", [64 << 20, 1 << 10], ids=["one-row-group", "many-row-groups"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_type_is_exact_or_absent(storage: Storage, seed: int, row_group_bytes: int) -> None:
    table = every_type(random.Random(seed), 400)
    published, back = write(storage, TYPES, batches_of(table, 97), row_group_bytes=row_group_bytes)
    assert back.equals(table)
    groups = footer(storage, published.name).num_row_groups
    assert groups == 1 if row_group_bytes > 1 << 20 else groups > 4
    stats = published.stats
    assert stats is not None
    assert_exact_or_absent(stats, back)
    # What is present: bounds for every flat type but binary, null counts for every flat column.
    assert set(stats["minValues"]) == BOUNDED
    assert set(stats["nullCount"]) == BOUNDED | {"blob"}
    assert not NESTED & (set(stats["minValues"]) | set(stats["nullCount"]))
    assert stats["nullCount"]["ts"] == back.column("ts").null_count > 0


def test_nan_leaves_out_the_bounds_of_its_column_only(storage: Storage) -> None:
    schema = pa.schema([("x", pa.float64()), ("y", pa.float32()), ("z", pa.float64())])
    first = pa.record_batch([pa.array([1.0, None, 3.0]), pa.array([1.5, 2.5, None], pa.float32()),
                             pa.array([-1.0, 2.0, 0.5])], schema=schema)  # fmt: skip
    later = pa.record_batch([pa.array([2.0, math.nan, -7.0]), pa.array([0.5, -0.5, 9.0], pa.float32()),
                             pa.array([None, None, None], pa.float64())], schema=schema)  # fmt: skip
    writer = FileWriter(storage, data_file_name(0, 0, "b" * 16), schema)
    writer.write(first)
    writer.write(later)
    published = writer.publish()
    assert published is not None and published.stats is not None
    table = pa.Table.from_batches([first, later])
    assert writer.nan_counts == {n: pc.sum(pc.is_nan(table.column(n))).as_py() for n in schema.names} == {
        "x": 1, "y": 0, "z": 0,
    }  # fmt: skip
    # The footer alone would claim [-7.0, 3.0] for x: pyarrow leaves NaN out of min/max.
    x_footer = footer(storage, published.name).row_group(0).column(0).statistics
    assert x_footer is not None and (x_footer.min, x_footer.max) == (-7.0, 3.0)
    stats = published.stats
    assert_exact_or_absent(stats, table)
    assert set(stats["minValues"]) == {"y", "z"} and stats["nullCount"] == {"x": 1, "y": 1, "z": 3}


def test_float_bounds_need_counted_nans_and_finite_values(storage: Storage) -> None:
    schema = pa.schema([("inf", pa.float64()), ("zeros", pa.float64()), ("negative", pa.float32())])
    table = pa.table({"inf": [1.0, math.inf], "zeros": [0.0, 0.0], "negative": [-2.0, -0.0]}, schema=schema)
    published, back = write(storage, schema, table)
    stats = published.stats
    assert stats is not None
    assert_exact_or_absent(stats, back)
    assert set(stats["minValues"]) == {"zeros", "negative"}  # JSON has no infinity
    low, high = bounds(stats, "zeros")
    assert math.copysign(1, low) == -1 and math.copysign(1, high) == 1
    assert math.copysign(1, stats["maxValues"]["negative"]) == 1  # -0.0 is the max: written +0.0
    # Without the writer's NaN counts the footer cannot tell: no float bounds.
    assert file_stats(footer(storage, published.name))["minValues"] == {}


def test_a_long_string_drops_the_bounds_of_its_row_group(storage: Storage) -> None:
    """Pins pyarrow's behaviour: a min/max over 4096 bytes is dropped, never truncated."""
    schema = pa.schema([("s", pa.string()), ("n", pa.int64())])
    cases = {
        "long max": (["a", "z" * 5000, "b"], False),
        "long min": (["0" * 4097, "b", "c"], False),
        "multibyte max": (["a", "é" * 2049], False),
        "long between": (["a", "m" * 5000, "z"], True),
        "4096 bytes": (["a", "z" * 4096], True),
    }
    for i, (case, (values, bounded)) in enumerate(cases.items()):
        table = pa.table({"s": values, "n": list(range(len(values)))}, schema=schema)
        published, back = write(storage, schema, table, name=data_file_name(i, 0, "c" * 16))
        assert published.stats is not None
        assert_exact_or_absent(published.stats, back)
        assert ("s" in published.stats["minValues"]) == bounded, case
        assert group_stats(footer(storage, published.name), 0).has_min_max == bounded
        assert published.stats["nullCount"]["s"] == 0 and "n" in published.stats["minValues"]


def test_a_long_string_in_one_row_group_drops_the_column_bounds(storage: Storage) -> None:
    schema = pa.schema([("s", pa.string())])
    batches = [pa.record_batch([pa.array([f"{i:04d}" * 300] * 3)], schema=schema) for i in range(3)]
    batches.insert(1, pa.record_batch([pa.array(["zz" * 2100, "0"])], schema=schema))
    published, back = write(storage, schema, batches, row_group_bytes=1 << 10)
    meta = footer(storage, published.name)
    has = [group_stats(meta, r).has_min_max for r in range(meta.num_row_groups)]
    assert len(has) > 1 and has.count(False) == 1
    assert published.stats is not None
    assert_exact_or_absent(published.stats, back)
    assert published.stats["minValues"] == {} and published.stats["nullCount"] == {"s": 0}


def test_row_groups_aggregate_and_all_null_row_groups_keep_the_bounds(storage: Storage) -> None:
    schema = pa.schema(
        [("n", pa.int64()), ("s", pa.string()), ("d", pa.float64()), ("t", pa.timestamp("ns"))]
    )
    rng = random.Random(7)

    def batch(low: int, high: int, nulls: bool = False) -> pa.RecordBatch:
        ns = [None if nulls else rng.randint(low, high) for _ in range(200)]
        return pa.record_batch(
            [
                pa.array(ns, pa.int64()),
                pa.array([None if v is None else f"{v:+021d}" for v in ns], pa.string()),
                pa.array([None if v is None else v / 7 for v in ns], pa.float64()),
                pa.array([None if v is None else v * 1_001 for v in ns], pa.timestamp("ns")),
            ],
            schema=schema,
        )

    batches = [batch(-50, 10), batch(0, 0, nulls=True), batch(100, 10**12), batch(-(10**9), -(10**8))]
    published, back = write(storage, schema, batches, row_group_bytes=1 << 10)
    meta = footer(storage, published.name)
    assert meta.num_row_groups >= 4
    no_bounds = [r for r in range(meta.num_row_groups) if not group_stats(meta, r).has_min_max]
    assert no_bounds and all(group_stats(meta, r).null_count == meta.row_group(r).num_rows for r in no_bounds)
    stats = published.stats
    assert stats is not None
    assert_exact_or_absent(stats, back)
    assert set(stats["minValues"]) == {"n", "s", "d", "t"} and stats["nullCount"]["n"] == 200


def test_timestamps_round_outward_to_milliseconds(storage: Storage) -> None:
    paris = pa.timestamp("ns", tz="Europe/Paris")
    schema = pa.schema([("utc", pa.timestamp("us", tz="UTC")), ("paris", paris), ("ntz", pa.timestamp("us")),
                        ("ms", pa.timestamp("ms"))])  # fmt: skip
    us = [-1_000_001, 1_000_001, -1, 999]
    ns = [-1_000_000_001, 2_000_000_001, 0, 5]
    table = pa.table({"utc": us, "paris": ns, "ntz": us, "ms": [v // 1000 for v in us]}, schema=schema)
    published, back = write(storage, schema, table)
    stats = published.stats
    assert stats is not None
    assert_exact_or_absent(stats, back)
    assert bounds(stats, "utc") == ("1969-12-31T23:59:58.999Z", "1970-01-01T00:00:01.001Z")
    assert bounds(stats, "ntz") == ("1969-12-31T23:59:58.999", "1970-01-01T00:00:01.001")  # no Z: not UTC
    assert bounds(stats, "paris") == ("1969-12-31T23:59:58.999Z", "1970-01-01T00:00:02.001Z")
    assert bounds(stats, "ms") == ("1969-12-31T23:59:58.999", "1970-01-01T00:00:01.000")


def test_dates_and_timestamps_far_from_1970(storage: Storage) -> None:
    schema = pa.schema(
        [("day", pa.date32()), ("ts", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us"))]
    )
    table = pa.table(
        {
            "day": [date(1, 1, 1), date(1900, 1, 1), date(9999, 12, 31)],
            "ts": [datetime(1, 1, 1, tzinfo=UTC), datetime(1582, 10, 4, 0, 0, 0, 1, tzinfo=UTC), None],
            # The max's ceiling (year 10000) has no ISO form: no bounds.
            "end": [datetime(9999, 12, 31, 23, 59, 59, 999_001), datetime(2000, 1, 1), None],
        },
        schema=schema,
    )
    published, back = write(storage, schema, table)
    stats = published.stats
    assert stats is not None
    assert_exact_or_absent(stats, back)
    assert stats["minValues"]["day"] == "0001-01-01"
    assert stats["maxValues"]["ts"] == "1582-10-04T00:00:00.001Z"
    assert "end" not in stats["minValues"] and stats["nullCount"]["end"] == 1


def test_decimals_are_exact_json_numbers_or_absent(storage: Storage) -> None:
    schema = pa.schema(
        [*((f"d{i}", pa.decimal128(38, 18)) for i in range(4)), ("small", pa.decimal128(10, 2))]
    )
    table = pa.table(
        {
            "d0": [Decimal("12345678901234567890.123456789012345678"), Decimal("1")],  # 38 digits: absent
            "d1": [Decimal(10**19), Decimal(-(10**19) + 1)],  # integral: any size
            "d2": [Decimal("0.00001"), Decimal("1")],  # JSON would write 1e-05: absent
            "d3": [Decimal("-0.000000000000000000"), Decimal("123456.789")],
            "small": [Decimal("-99999999.99"), Decimal("99999999.99")],
        },
        schema=schema,
    )
    published, back = write(storage, schema, table)
    stats = published.stats
    assert stats is not None
    assert_exact_or_absent(stats, back)
    assert set(stats["minValues"]) == {"d1", "d3", "small"}
    assert stats["minValues"]["d3"] == 0 and isinstance(stats["minValues"]["d3"], int)


def test_an_all_null_column_has_its_null_count_and_no_bounds(storage: Storage) -> None:
    kinds = [pa.int64(), pa.string(), pa.float64(), pa.timestamp("us", tz="UTC"), pa.date32(), pa.bool_(),
             pa.decimal128(10, 2), pa.binary()]  # fmt: skip
    schema = pa.schema([(f"c{i}", t) for i, t in enumerate(kinds)] + [("id", pa.int32())])
    rows = 300
    table = pa.table([pa.nulls(rows, t) for t in kinds] + [pa.array(range(rows), pa.int32())], schema=schema)
    for row_group_bytes in (64 << 20, 1 << 10):
        name = data_file_name(0, row_group_bytes, "d" * 16)
        published, back = write(storage, schema, table, row_group_bytes=row_group_bytes, name=name)
        stats = published.stats
        assert stats is not None
        assert_exact_or_absent(stats, back)
        assert stats["nullCount"] == {**{f"c{i}": rows for i in range(len(kinds))}, "id": 0}
        assert set(stats["minValues"]) == {"id"}


def test_only_the_first_32_top_level_columns_get_statistics(storage: Storage) -> None:
    schema = pa.schema(
        [("nested", pa.struct([("a", pa.int32())]))] + [(f"c{i:02d}", pa.float64()) for i in range(1, 40)]
    )
    table = pa.table([pa.array([{"a": 1}])] + [pa.array([float(i)]) for i in range(1, 40)], schema=schema)
    writer = FileWriter(storage, data_file_name(0, 0, "e" * 16), schema)
    writer.write(table.to_batches()[0])
    published = writer.publish()
    assert published is not None and published.stats is not None
    indexed = {f"c{i:02d}" for i in range(1, INDEXED_COLUMNS)}
    assert set(writer.nan_counts) == indexed  # NaN counted only where stats will be
    assert set(published.stats["minValues"]) == set(published.stats["nullCount"]) == indexed


def test_types_without_an_order_delta_shares_get_no_bounds(tmp_path: Path) -> None:
    """Unsigned integers, float16, binary, INT96: the pure function on footers pyarrow wrote itself."""
    table = pa.table(
        {
            "u64": pa.array([0, 2**64 - 1], pa.uint64()),
            "u8": pa.array([0, 255], pa.uint8()),
            "half": pa.array([1.0, 2.0], pa.float32()).cast(pa.float16()),
            "blob": pa.array([b"\x00", b"\xff"]),
            "large": pa.array(["x", "y"], pa.large_string()),
            "int96": pa.array([1, 2], pa.timestamp("us")),
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, use_deprecated_int96_timestamps=True)
    stats = file_stats(pq.read_metadata(path), {"half": 0})
    assert_exact_or_absent(stats, pq.read_table(path))
    assert set(stats["minValues"]) == {"large"}
    assert set(stats["nullCount"]) == {"u64", "u8", "half", "blob", "large"}  # INT96: no statistics at all
    pq.write_table(table, path, write_statistics=False)
    empty: dict[str, Any] = {"minValues": {}, "maxValues": {}, "nullCount": {}}
    assert file_stats(pq.read_metadata(path)) == {"numRecords": 2, **empty}


def test_string_bounds_need_a_writer_measured_to_drop_long_values(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pa.schema([("s", pa.string()), ("n", pa.int64())])
    published, _ = write(storage, schema, pa.table({"s": ["a", "b"], "n": [1, 2]}, schema=schema))
    assert footer(storage, published.name).created_by.startswith("parquet-cpp-arrow version ")
    assert "s" in file_stats(footer(storage, published.name))["minValues"]
    monkeypatch.setattr(stats_module, "MEASURED_ARROW_MAJOR", int(pa.__version__.split(".")[0]) - 1)
    assert set(file_stats(footer(storage, published.name))["minValues"]) == {"n"}


def test_stats_describe_the_file_that_stands(storage: Storage) -> None:
    """Foreach mode: a losing attempt's stats are not the published file's; a superseding one's are."""
    schema = pa.schema([("n", pa.int64())])
    name = data_file_name(0, 0, "f" * 16)

    def attempt(values: list[int]) -> Published:
        writer = FileWriter(storage, name, schema)
        writer.write(pa.record_batch([pa.array(values, pa.int64())], schema=schema))
        published = writer.publish()
        assert published is not None
        return published

    first = attempt([5, 6, 7])
    assert first.won and first.stats is not None and first.stats["maxValues"] == {"n": 7}
    lost = attempt([1, 2])
    assert not lost.won and lost.stats is None
    wider = attempt([1, 2, 3, 100])
    assert wider.won and wider.superseded and wider.stats is not None
    fs, base = storage.arrow_filesystem()
    assert_exact_or_absent(wider.stats, pq.read_table(f"{base}/{name}", filesystem=fs))
    assert hash(wider) == hash(Published(name, wider.size, 4, True, True))  # stats stay out of the hash
