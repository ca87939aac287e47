"""The reader on real files: isolation levels, pushdown, DuckDB/polars, and bad inputs."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from lakes import SCHEMA, foreach_lake, write_file

from reader import (
    CorruptFileError,
    Lake,
    NotALakeError,
    SkippedFilesWarning,
    TableNotFoundError,
    read_all,
    read_committed,
)

ROOT = Path(__file__).resolve().parent.parent


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


def test_read_committed_sees_each_committed_file_once(lake: str) -> None:
    foreach_lake(lake, epochs=3, partitions=2, rows_per_file=50)
    table = read_committed(lake)
    assert ids(table) == list(range(300))
    assert table.schema.equals(SCHEMA)
    files = Lake(lake).files()
    assert [(f.epoch, f.partition, f.state) for f in files] == [
        (e, p, "committed") for e in range(3) for p in range(2)
    ]
    assert all(f.size > 0 and f.path.startswith(lake) for f in files)


def test_staged_files_only_in_read_all(lake: str) -> None:
    storage = foreach_lake(lake, epochs=1, partitions=1, rows_per_file=10)
    write_file(storage, 0, 1, 1000, 5, commit=False)  # sealed, never published
    assert ids(read_committed(lake)) == list(range(10))
    assert ids(read_all(lake)) == list(range(10)) + list(range(1000, 1005))
    states = [f.state for f in Lake(lake).files("read_all")]
    assert states == ["committed", "staged"]
    # Plain readers do not see staged files either.
    assert ids(ds.dataset(lake, format="parquet").to_table()) == list(range(10))
    duck = duckdb.sql(f"select id from read_parquet('{lake}/**/*.parquet') order by id").fetchall()
    assert [r[0] for r in duck] == list(range(10))


def test_read_all_skips_and_reports_truncated_files(lake: str) -> None:
    storage = foreach_lake(lake, epochs=1, partitions=1, rows_per_file=10)
    write_file(storage, 0, 1, 1000, 5, commit=False)
    staged = next(f for f in Lake(lake).files("read_all") if f.state == "staged")
    data = Path(staged.path).read_bytes()
    Path(staged.path).write_bytes(data[: len(data) // 2])  # a crash mid-write
    with pytest.warns(SkippedFilesWarning) as caught:
        table = read_all(lake)
    assert ids(table) == list(range(10))
    skipped = caught[0].message.skipped  # type: ignore[union-attr]
    assert [s.path for s in skipped] == [staged.path]
    assert skipped[0].state == "staged" and "Parquet" in skipped[0].reason
    result = Lake(lake).read("read_all")
    assert [s.path for s in result.skipped] == [staged.path]


def test_projection_and_filter_pushdown(lake: str) -> None:
    storage = foreach_lake(lake, epochs=0)
    # One file, many small row groups sorted by id: a selective filter must skip row groups.
    write_file(storage, 0, 0, 0, 20_000, row_group_bytes=16 << 10)
    expr = pc.field("id") >= 19_500
    table = read_committed(lake, columns=["id", "label"], filter=expr)
    assert table.column_names == ["id", "label"]
    assert ids(table) == list(range(19_500, 20_000))
    dataset = Lake(lake).dataset()
    fragments = list(dataset.get_fragments())
    total = sum(f.metadata.num_row_groups for f in fragments)
    kept = sum(len(f.split_by_row_group(expr)) for f in dataset.get_fragments(filter=expr))
    assert total > 10 and kept < total / 4


def test_duckdb_and_polars_over_dataset(lake: str) -> None:
    foreach_lake(lake, epochs=2, partitions=2, rows_per_file=25)
    dataset = Lake(lake).dataset()  # noqa: F841 - DuckDB finds it by its Python name
    [(count, total)] = duckdb.sql("select count(*), sum(id) from dataset").fetchall()
    assert (count, total) == (100, sum(range(100)))
    frame = pl.scan_pyarrow_dataset(Lake(lake).dataset()).filter(pl.col("bucket") == 3).collect()
    assert sorted(frame["id"].to_list()) == [i for i in range(100) if i % 7 == 3]
    assert Lake(lake).to_pandas(columns=["id"])["id"].sum() == sum(range(100))


def test_missing_table_names_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(TableNotFoundError, match="nope"):
        read_committed(missing)


def test_directory_that_is_not_a_lake(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.parquet").write_bytes(b"x")
    with pytest.raises(NotALakeError, match="plain"):
        Lake(str(tmp_path / "plain"))


def test_corrupt_committed_file_is_an_error_naming_it(lake: str) -> None:
    foreach_lake(lake, epochs=2, partitions=1, rows_per_file=10)
    victim = Lake(lake).files()[1]
    Path(victim.path).write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(CorruptFileError, match=os.path.basename(victim.path)):
        read_committed(lake)
    with pytest.raises(CorruptFileError, match=os.path.basename(victim.path)):
        read_all(lake)  # committed data is never skipped, even by read_all


def test_bad_arguments_are_named(lake: str) -> None:
    foreach_lake(lake, epochs=1, partitions=1, rows_per_file=5)
    with pytest.raises(KeyError, match="nosuch"):
        read_committed(lake, columns=["id", "nosuch"])
    with pytest.raises(ValueError, match="dirty"):
        Lake(lake).files("dirty")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ftp"):
        read_committed("ftp://host/lake")


def test_time_travel_on_foreach_lake_selects_epochs(lake: str) -> None:
    foreach_lake(lake, epochs=3, partitions=1, rows_per_file=10)
    assert ids(read_committed(lake, as_of_epoch=1)) == list(range(20))
    assert ids(read_committed(lake, epochs=(1, 2))) == list(range(10, 30))


def test_reader_imports_and_reads_without_pyspark(lake: str) -> None:
    foreach_lake(lake, epochs=1, partitions=1, rows_per_file=7)
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None; sys.modules['py4j'] = None  # any import of them fails\n"
        "import lakesink, lakesink.commit, lakesink.layout, reader\n"
        f"print(reader.read_committed({lake!r}).num_rows)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = os.path.dirname(sys.executable)  # no java on PATH either
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "7"


def test_read_all_warning_lists_skipped(lake: str) -> None:
    foreach_lake(lake, epochs=1, partitions=1, rows_per_file=3)
    (
        Path(lake) / ".part-00009-epoch-000000000009-0123456789abcdef.parquet.00000000aaaaaaaa.uncommitted"
    ).write_bytes(b"")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = read_all(lake)
    assert table.num_rows == 3
    assert any(isinstance(w.message, SkippedFilesWarning) for w in caught)
