"""Schema evolution (issue 21, item 4): ``merge_schema=True`` lets an epoch writer add nullable
columns and widen types; the lake's log records the new schema with the batch, and every reader
reads older files with nulls in the new columns and the narrower types widened."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_delta_view import isolated, oracle

import lakesink
from lakesink import SchemaMismatchError
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import compact, verify
from lakesink_reader import Lake, read_committed
from lakesink_reader.errors import CommitRefusedError
from lakesink_reader.format.schemas import decode_schema, encode_schema, fit_problems, merge, read_as
from lakesink_reader.format.v3.commits import PendingCommit

V1 = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("score", pa.float32()), ("label", pa.string())])


def test_only_added_columns_and_wider_types_merge() -> None:
    stream = pa.schema(
        [("id", pa.int64()), ("extra", pa.string()), ("n", pa.int64()), ("score", pa.float64())]
    )
    merged = merge(V1, stream)
    # The lake's columns in order, widened; then the new ones, nullable.
    assert merged.names == ["id", "n", "score", "label", "extra"]
    assert [str(t) for t in merged.types] == ["int64", "int64", "double", "string", "string"]
    assert fit_problems(V1, merged) == [] and fit_problems(stream, merged) == []
    assert merge(merged, V1) == merged  # an older stream changes nothing
    with pytest.raises(
        SchemaMismatchError, match=r"column 'n' changed type from int32 to string.*added or widened"
    ):
        merge(V1, pa.schema([("id", pa.int64()), ("n", pa.string())]))
    narrower = merge(V1, pa.schema([("id", pa.int32()), ("x", pa.int8())]))
    assert narrower.field("id").type == pa.int64() and narrower.names[-1] == "x"  # keeps the wider type
    assert merge(V1, pa.schema([("id", pa.int32())])) == V1  # narrower: it fits as it is
    with pytest.raises(SchemaMismatchError, match="'n' changed type"):
        merge(V1, pa.schema([("n", pa.int64())]), partition_columns=("n",))  # a folder's type stays
    assert fit_problems(pa.schema([("n", pa.int64())]), V1) == ["column 'n' changed type from int32 to int64"]
    old = pa.record_batch([pa.array([1], pa.int64()), pa.array([2], pa.int32())], names=["id", "n"])
    assert read_as(old, merged).to_pylist() == [
        {"id": 1, "n": 2, "score": None, "label": None, "extra": None}
    ]
    assert decode_schema(encode_schema(merged), "x") == merged


def test_the_log_records_a_schema_once_and_refuses_one_that_drops_anothers_columns(tmp_path: Path) -> None:
    from lakes import SCHEMA, v3_table

    storage, table_id = v3_table(str(tmp_path / "lake"), checkpoint_interval=2)
    log = VersionedLogWriter(storage, table_id, checkpoint_interval=2)
    with_x = encode_schema(SCHEMA.append(pa.field("x", pa.string())))
    with_y = encode_schema(SCHEMA.append(pa.field("y", pa.string())))

    def append(writer: str, batch: int, schema: str | None) -> Any:
        return log.commit(
            PendingCommit.append(
                writer_id=writer, batch=batch, run="run00001", schema=schema, allow_other_queries=True
            )
        )

    assert append("a" * 32, 0, with_x).version == 0
    assert append("b" * 32, 0, None).version == 1  # an older writer beside it: fits
    # Another writer planned "add y" against the old schema: it would drop x. Refused, naming it.
    with pytest.raises(CommitRefusedError, match=r"changed at version 0.*column 'x' \(string\) is new"):
        append("c" * 32, 0, with_y)
    both = encode_schema(SCHEMA.append(pa.field("x", pa.string())).append(pa.field("y", pa.string())))
    assert append("c" * 32, 0, both).version == 2
    state = log.open()  # through the checkpoint at version 2
    assert [v for v, _ in state.schemas] == [0, 2] and state.schema_at(1) == with_x
    assert state.schema_at(state.version) == both
    assert (
        json.loads(storage.read_bytes("_lakesink/log/00000000000000000002.checkpoint.json"))["schemas"][1][0]
        == 2
    )


def add_input(folder: Path, index: int, schema: pa.Schema, rows: int = 40) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = list(range(index * rows, (index + 1) * rows))
    columns = {
        "id": pa.array(ids, pa.int64()),
        "n": pa.array([i % 5 for i in ids]).cast(schema.field("n").type),
        "score": pa.array([i / 2 for i in ids]).cast(schema.field("score").type),
        "label": pa.array([f"r{i}" for i in ids]),
    }
    if "extra" in schema.names:
        columns["extra"] = pa.array([f"x{i}" for i in ids])
    path = folder / f"in-{index:04d}.parquet"
    pq.write_table(pa.table(columns, schema=schema), path)
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def ddl(schema: pa.Schema) -> str:
    names = {
        pa.int32(): "int",
        pa.int64(): "long",
        pa.float32(): "float",
        pa.float64(): "double",
        pa.string(): "string",
    }
    return ", ".join(f"{f.name} {names[f.type]}" for f in schema)


def test_a_stream_that_adds_and_widens_columns_evolves_the_lake(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    v2 = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("score", pa.float64()), ("label", pa.string()),
                    ("extra", pa.string())])  # fmt: skip
    source = tmp_path / "in"
    for i in range(2):
        add_input(source, i, V1)

    def run(schema: pa.Schema, **options: Any) -> Any:
        reader = spark.readStream.schema(ddl(schema)).option("maxFilesPerTrigger", 1)
        stream = reader.parquet(str(source))
        query = lakesink.write_stream(
            stream.repartition(2), lake, checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True}, **options,
        )  # fmt: skip
        query.awaitTermination(300)
        assert query.exception() is None
        return query

    run(V1)
    for i in range(2, 4):
        add_input(source, i, v2)
    # Without the option the wider stream is refused before it starts, naming the columns and the way.
    with pytest.raises(
        SchemaMismatchError, match=r"'n' changed type from int32 to int64.*'extra'.*merge_schema=True"
    ):
        run(v2)
    run(v2, merge_schema=True)
    table = read_committed(lake)
    assert table.schema.names == ["id", "n", "score", "label", "extra"]
    assert [str(t) for t in table.schema.types] == ["int64", "int64", "double", "string", "string"]
    rows = {r["id"]: r for r in table.to_pylist()}
    assert sorted(rows) == list(range(160))
    assert rows[3]["extra"] is None and rows[3]["n"] == 3 and rows[3]["score"] == 1.5  # an old file
    assert rows[100]["extra"] == "x100"
    log_schemas = Lake(lake)._view("x").state.schemas
    assert len(log_schemas) == 1  # recorded by the first batch of the run, not again
    assert read_committed(lake, version=1).num_rows == 80  # older versions read as it is now
    assert read_committed(lake, version=1).schema.names == table.schema.names

    # Delta readers take the schema from the view's metaData of that version.
    seen = oracle(lake, [None, 1])
    assert seen["None"]["deltalake"] == seen["None"]["polars"] == seen["None"]["duckdb"] == list(range(160))
    assert seen["1"]["deltalake"] == list(range(80))
    assert delta_columns(lake) == {
        "None": ["id", "n", "score", "label", "extra"],
        "1": ["id", "n", "score", "label"],
    }
    # Spark's own reader, given the lake's schema: it widens the older files' columns itself
    # (its mergeSchema cannot: int and bigint do not merge).
    frame = spark.read.schema(ddl(table.schema)).parquet(lake)
    assert sorted((r["id"], r["n"], r["score"], r["extra"]) for r in frame.collect()) == sorted(
        (r["id"], r["n"], r["score"], r["extra"]) for r in table.to_pylist()
    )

    # Compaction rewrites old and new files as the lake's schema; an older writer may go on.
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version is not None
    assert read_committed(lake).sort_by("id").equals(table.sort_by("id"))
    for f in Lake(lake).files():
        assert pq.read_schema(f.path).names == table.schema.names
    assert verify(lake).ok


def delta_columns(lake: str) -> dict[str, list[str]]:
    code = (
        "import json, os, sys\n"
        "from deltalake import DeltaTable\n"
        "table = lambda v: DeltaTable(sys.argv[1], version=v)\n"
        "out = {str(v): [f.name for f in table(v).schema().fields] for v in (None, 1)}\n"
        "sys.stdout.write(json.dumps(out))\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    return isolated(code, lake)  # type: ignore[no-any-return]


NULLS = r"""
import json, os, sys
out = {}
try:
    import polars as pl
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    columns = json.loads(sys.argv[2])
    table = DeltaTable(sys.argv[1]).to_pyarrow_table()
    frame = pl.read_delta(sys.argv[1])
    out["deltalake"] = {"rows": table.num_rows, **{c: table.column(c).null_count for c in columns},
                        "n_sum": pc.sum(table.column("n")).as_py()}
    out["polars"] = {"rows": frame.height, **{c: int(frame[c].null_count()) for c in columns},
                     "n_sum": int(frame["n"].sum())}
except BaseException as exc:
    out["error"] = repr(exc)
sys.stdout.write(json.dumps(out))
sys.stdout.flush()
os._exit(0)
"""


def truth(lake: str, columns: list[str]) -> dict[str, int]:
    """Rows, nulls per column and the sum of ``n`` as ``read_committed`` reads the lake."""
    table = read_committed(lake)
    return {"rows": table.num_rows, **{c: table.column(c).null_count for c in columns},
            "n_sum": sum(table.column("n").to_pylist())}  # fmt: skip


def spark_answers(
    spark: Any, lake: str, columns: list[str], *, source: str = "parquet", **options: str
) -> dict[str, int]:
    """The same, as Spark's Parquet reader answers, in one job: ``count_if(col IS NULL)`` per
    column (what Catalyst folds to 0 for a column it believes non-nullable). ``source``
    "lakesink": ``spark.read.format("lakesink")`` (its ``scan`` option in ``options``)."""
    from pyspark.sql import functions as F

    frame = spark.read.format(source).options(**options).load(lake)
    assert frame.columns == columns, frame.columns  # every column of the lake, in its order
    counts = [F.count(F.lit(1)).alias("rows")] + [F.expr(f"count_if({c} IS NULL)").alias(c) for c in columns]
    row = frame.agg(*counts, F.sum("n").alias("n_sum")).collect()[0]
    return {k: int(v) for k, v in row.asDict().items()}


def test_every_engine_answers_as_the_log_after_a_column_is_added_and_a_type_widened(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    """Issue 32, item 4: ``withColumn("newcol", F.lit("x"))`` is a non-nullable column in Spark's
    stream; the files store it as the lake declares it (nullable), so Spark's own reader, with
    and without ``mergeSchema``, deltalake and polars count its nulls (the older files' rows) as
    ``read_committed`` does. A widened type (int -> long) too, except where Spark refuses
    loudly (``mergeSchema`` does not merge int and bigint) until a compaction rewrites the files."""
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    for i in range(2):
        add_input(source, i, V1)
    reader = spark.readStream.schema(ddl(V1)).option("maxFilesPerTrigger", 2)

    def run(shape: Any) -> None:
        query = lakesink.write_stream(
            shape(reader.parquet(str(source))).repartition(2), lake,
            checkpoint_location=str(tmp_path / "chk"), trigger={"availableNow": True}, merge_schema=True,
        )  # fmt: skip
        query.awaitTermination(300)
        assert query.exception() is None

    run(lambda df: df)  # ids 0..79, as V1
    for i in range(2, 4):
        add_input(source, i, V1)
    run(lambda df: df.withColumn("newcol", F.lit("x")))  # ids 80..159: a non-nullable new column
    columns = ["id", "n", "score", "label", "newcol"]
    expected = truth(lake, columns)
    assert expected["newcol"] == 80 and expected["rows"] == 160
    for f in Lake(lake).files():  # what each file stores is what the log declares: nullable
        stored = pq.read_schema(f.path)
        assert "newcol" not in stored.names or stored.field("newcol").nullable, f.path
    assert spark_answers(spark, lake, columns) == expected
    assert spark_answers(spark, lake, columns, mergeSchema="true") == expected
    seen = isolated(NULLS, lake, json.dumps(columns))
    assert "error" not in seen, seen
    assert seen["deltalake"] == seen["polars"] == expected

    for i in range(4, 6):
        add_input(source, i, V1)
    run(lambda df: df.withColumn("n", F.col("n").cast("long")).withColumn("newcol", F.lit("x")))
    assert read_committed(lake).schema.field("n").type == pa.int64()
    expected = truth(lake, columns)
    assert expected["rows"] == 240 and expected["newcol"] == 80
    # Spark's reader without mergeSchema takes the lake's schema from the Spark view's summary
    # (the first file by path has neither newcol nor a long n), and widens older files itself.
    assert spark_answers(spark, lake, columns) == expected
    # spark.read.format("lakesink"): Spark's scan of the pinned files with the log's schema
    # (older files widened, missing columns null), and the Python data source, answer alike.
    from lakesink.spark.scan import is_spark_scan

    lakesink.register(spark, warm_up=False)
    assert is_spark_scan(spark.read.format("lakesink").option("scan", "spark").load(lake))
    assert spark_answers(spark, lake, columns, source="lakesink", scan="spark") == expected
    assert spark_answers(spark, lake, columns, source="lakesink", scan="python") == expected
    with pytest.raises(Exception, match="CANNOT_MERGE_SCHEMAS"):  # loud, not a wrong answer
        spark_answers(spark, lake, columns, mergeSchema="true")
    seen = isolated(NULLS, lake, json.dumps(columns))
    assert "error" not in seen, seen
    assert seen["deltalake"] == seen["polars"] == expected
    # Compaction rewrites every file as the lake declares it: mergeSchema answers too.
    assert compact(lake, target_file_size=1 << 30, min_files=2, check_store=False).version is not None
    declared = read_committed(lake).schema
    for f in Lake(lake).files():
        assert pq.read_schema(f.path).remove_metadata().equals(declared.remove_metadata()), f.path
    assert spark_answers(spark, lake, columns) == expected
    assert spark_answers(spark, lake, columns, mergeSchema="true") == expected
    assert verify(lake).ok
