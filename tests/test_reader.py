"""The reader on real files: isolation levels, pushdown, DuckDB/polars, and bad inputs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from lakes import SCHEMA, epoch_lake, foreach_lake, write_file

from lakesink_reader import (
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


def test_a_damaged_committed_file_fails_read_committed_and_is_reported_by_read_all(lake: str) -> None:
    epoch_lake(lake, epochs=3, partitions=1, rows_per_file=10)
    damaged, missing = Lake(lake).files()[1:]
    os.unlink(missing.path)
    with pytest.raises(CorruptFileError, match=os.path.basename(missing.path) + "' is missing"):
        read_committed(lake)  # the same error on every backend (it was FileNotFoundError locally)
    Path(damaged.path).write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(CorruptFileError, match=os.path.basename(damaged.path) + "' is corrupt"):
        Lake(lake).read("read_committed", columns=["id"])
    # read_all reads what it can and names the rest; read_committed does on request.
    for read in (lambda: read_all(lake), lambda: read_committed(lake, on_error="skip")):
        with pytest.warns(SkippedFilesWarning) as caught:
            assert ids(read()) == list(range(10))
        skipped = next(w.message for w in caught if isinstance(w.message, SkippedFilesWarning)).skipped  # type: ignore[union-attr]
        assert sorted((s.path, s.state) for s in skipped) == sorted(
            [(damaged.path, "committed"), (missing.path, "committed")]
        )
        assert any("missing" in s.reason for s in skipped) and any("corrupt" in s.reason for s in skipped)


def test_bad_arguments_are_named(lake: str) -> None:
    foreach_lake(lake, epochs=1, partitions=1, rows_per_file=5)
    with pytest.raises(KeyError, match="nosuch"):
        read_committed(lake, columns=["id", "nosuch"])
    with pytest.raises(ValueError, match="dirty"):
        Lake(lake).files("dirty")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ftp"):
        read_committed("ftp://host/lake")


def test_time_travel_on_an_epoch_lake_selects_epochs(lake: str) -> None:
    epoch_lake(lake, epochs=3, partitions=1, rows_per_file=10)
    assert [e.epoch for e in Lake(lake).epochs()] == [0, 1, 2]
    assert ids(read_committed(lake, epoch=1)) == list(range(20))
    assert ids(Lake(lake, epoch=2).since(epoch=0).to_table()) == list(range(10, 30))


def test_time_travel_on_a_foreach_lake_is_refused_saying_why(lake: str) -> None:
    """A foreach lake has no epoch log (``Lake.epochs()`` is empty): "as of epoch N" names no
    state the table was ever in, since each (partition, epoch) file commits on its own."""
    foreach_lake(lake, epochs=3, partitions=2, rows_per_file=10)
    assert Lake(lake).epochs() == []
    with pytest.raises(
        ValueError,
        match=r"epoch=0 selects committed epochs.*foreach-mode lake.*no epoch log.*without an epoch",
    ):
        read_committed(lake, epoch=0)
    with pytest.raises(
        ValueError, match=r"Lake.since\(\) with epoch=0 selects committed epochs.*foreach-mode"
    ):
        Lake(lake).since(epoch=0).dataset()
    assert ids(read_committed(lake)) == list(range(60))  # the way out the error names


def test_reader_imports_and_reads_without_pyspark(lake: str) -> None:
    foreach_lake(lake, epochs=1, partitions=1, rows_per_file=7)
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None; sys.modules['py4j'] = None  # any import of them fails\n"
        "import lakesink, lakesink.commit, lakesink.maintenance, lakesink_reader\n"
        f"print(lakesink_reader.read_committed({lake!r}).num_rows)\n"
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


def test_paths_urls_and_files_in_the_way(tmp_path: Path) -> None:
    lake = tmp_path / "my lake%"
    foreach_lake(str(lake), epochs=1, partitions=1, rows_per_file=4)
    assert ids(read_committed(lake)) == [0, 1, 2, 3]  # a pathlib.Path
    assert ids(read_committed(lake.as_uri())) == [0, 1, 2, 3]  # file:///.../my%20lake%25
    assert ids(read_committed(f"file://localhost{lake}")) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="names the host 'otherhost'"):
        read_committed(f"file://otherhost{lake}")
    afile = tmp_path / "afile.txt"
    afile.write_text("not a lake")
    with pytest.raises(NotADirectoryError, match=r"cannot be a lake folder: '.*afile.txt' is a file"):
        Lake(afile)
    with pytest.raises(NotADirectoryError, match=r"afile\.txt' is a file"):
        read_all(afile / "lake")


def test_as_of_epoch_beyond_the_newest_epoch_is_refused(lake: str) -> None:
    epoch_lake(lake, epochs=3, partitions=1, rows_per_file=2)
    assert ids(read_committed(lake, epoch=2)) == list(range(6))
    with pytest.raises(ValueError, match=r"epoch=7 is beyond the newest committed epoch .* \(2\)"):
        read_committed(lake, epoch=7)


def test_reading_beside_a_writer_that_publishes_staged_files_never_raises(lake: str) -> None:
    """A staged file listed by read_all may be published (renamed away) before it is read."""
    import threading

    storage = foreach_lake(lake, epochs=1, partitions=1, rows_per_file=5)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        epoch = 1
        while not stop.is_set():
            write_file(storage, 0, epoch, epoch * 100, 5)  # staged, complete, then published
            epoch += 1

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SkippedFilesWarning)
                table = read_all(lake)
            got = ids(table)
            assert len(got) == len(set(got)) and set(range(5)) <= set(got)
            reads += 1
    except BaseException as exc:  # noqa: BLE001 - reported below with the thread stopped
        errors.append(exc)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[0]
    assert reads > 5


def test_a_file_listed_mid_publish_under_both_names_is_read_once(lake: str) -> None:
    """A local publish is a link, then the unlink of the staged name: a listing between them
    shows the file under both names. read_all reads it once (it read the rows twice when the
    loaded machine's listing fell between the two calls)."""
    foreach_lake(lake, epochs=1, partitions=1, rows_per_file=5)
    (published,) = [n for n in os.listdir(lake) if n.endswith(".parquet")]
    os.link(os.path.join(lake, published), os.path.join(lake, f".{published}.0123456789abcdef.uncommitted"))
    got = ids(read_all(lake))
    assert sorted(got) == list(range(5))


def test_a_format_3_file_listed_mid_publish_under_both_names_is_read_once(lake: str) -> None:
    """The same for a format-3 lake, whose staged files come from the store's staged list."""
    from lakes import v3_table
    from test_reader_v3 import W1, Writer

    from lakesink.commit.versions import VersionedLogWriter

    storage, table_id = v3_table(lake)
    Writer(VersionedLogWriter(storage, table_id), W1).append(0)
    expected = sorted(ids(read_all(lake)))
    published = next(n for n in os.listdir(lake) if n.endswith(".parquet"))
    os.link(os.path.join(lake, published), os.path.join(lake, f".{published}.0123456789abcdef.uncommitted"))
    assert sorted(ids(read_all(lake))) == expected and len(expected) == len(set(expected)) > 0


def test_a_lake_created_while_the_reader_opens_it_is_read(tmp_path: Path) -> None:
    """A reader whose first read of table.json finds nothing, while a first writer creates the
    lake before its second look, reads the lake (it used to raise the first FileNotFoundError)."""
    from lakesink_reader.format.table import read_table_metadata
    from lakesink_reader.storage.local import LocalStorage

    lake = str(tmp_path / "lake")

    class FirstWriterRacing(LocalStorage):
        """Its first read of table.json misses it; the first writer creates the lake right after."""

        raced = False

        def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
            if self.raced:
                return super().read_bytes(name, first_contact=first_contact, limit=limit)
            self.raced = True
            try:
                return super().read_bytes(name, first_contact=first_contact, limit=limit)
            finally:
                foreach_lake(lake, epochs=1, partitions=1)

    storage = FirstWriterRacing(lake)
    metadata = read_table_metadata(storage)
    assert metadata.mode == "foreach" and storage.raced
    assert read_committed(lake).num_rows == 100
