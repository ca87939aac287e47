"""A new user's first hour: each usual mistake gets one clear error, before anything starts.

Every test goes through a public entry point (``register``, ``write_stream``,
``format("lakesink")``, ``LakeForeachWriter``) and checks that nothing was started or written
when the start was refused, and that the right start is not refused by mistake.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3server import BUCKET, S3Server, free_port

from lakesink import LakeForeachWriter, OtherQueryError, SchemaMismatchError, WorkerPythonError
from lakesink_reader import Lake, read_committed

pytestmark = pytest.mark.spark


def make_input(folder: Path, start: int, rows: int, *, extra_column: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    columns: dict[str, Any] = {"id": pa.array(range(start, start + rows), pa.int64())}
    columns["label"] = pa.array([f"r{i}" for i in range(start, start + rows)])
    if extra_column:
        columns["extra"] = pa.array([1.0] * rows)
    pq.write_table(pa.table(columns), folder / f"in-{start:06d}.parquet")


def stream_of(spark: Any, folder: Path, *, extra_column: bool = False) -> Any:
    schema = "id long, label string" + (", extra double" if extra_column else "")
    return spark.readStream.schema(schema).parquet(str(folder))


def finish(query: Any) -> None:
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def ids(lake: str) -> list[int]:
    return sorted(read_committed(lake).column("id").to_pylist())


def foreach_start(df: Any, lake: str, checkpoint: Path, **writer: Any) -> Any:
    return (
        df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema, **writer))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


@pytest.fixture
def registered(spark: Any) -> Any:
    import lakesink

    lakesink.register(spark, warm_up=False)
    return spark


# 1, 2. Named queries; format("lakesink") found without register, from any folder -------------

NEW_USER_JOB = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    source, lake, checkpoint = sys.argv[1:4]
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    df = spark.readStream.schema("id long, label string").parquet(source)
    query = (df.writeStream.format("lakesink").queryName("events")
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(lake))
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    assert "lakesink" not in sys.modules, "the driver imported lakesink"
    print("QUERY-NAME", query.name, flush=True)
    import lakesink
    lakesink.register(spark, warm_up=False)
    lakesink.register(spark, warm_up=False)  # idempotent, and quiet
    print("REGISTERED", flush=True)
    spark.stop()
    """
)


def test_a_named_format_lakesink_query_runs_without_register_from_any_folder(tmp_path: Path) -> None:
    """pyspark passes ``queryName`` to the sink as an option, and finds the sink by listing modules.

    The script runs in a folder that is not the checkout, with nothing on PYTHONPATH: only
    what ``make`` installed into the venv (an editable install that pyspark's module
    listing can see), as a new user's script would.
    """
    (tmp_path / "in").mkdir()
    make_input(tmp_path / "in", 0, 100)
    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    env["PYSPARK_PYTHON"] = sys.executable
    done = subprocess.run(
        [sys.executable, "-c", NEW_USER_JOB, str(tmp_path / "in"), str(lake), str(tmp_path / "chk")],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "QUERY-NAME events" in done.stdout
    assert ids(str(lake)) == list(range(100))
    assert Lake(str(lake)).mode == "epoch"
    assert "REGISTERED" in done.stdout
    assert "replaced" not in done.stderr, "register logged Spark's 'replaced a data source' WARN"


def test_write_stream_and_format_take_a_query_name(registered: Any, tmp_path: Path, lake: str) -> None:
    import lakesink

    make_input(tmp_path / "in", 0, 10)
    query = lakesink.write_stream(
        stream_of(registered, tmp_path / "in"), lake, checkpoint_location=str(tmp_path / "chk"),
        query_name="events", trigger={"availableNow": True},
    )  # fmt: skip
    finish(query)
    assert query.name == "events"
    make_input(tmp_path / "in", 10, 10)
    query = (
        stream_of(registered, tmp_path / "in").writeStream.format("lakesink").queryName("events-again")
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start(lake)
    )  # fmt: skip
    finish(query)
    assert query.name == "events-again"
    assert ids(lake) == list(range(20))


# 3. The workers' Python ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python of the same version with neither lakesink nor pyarrow: what python3 on PATH often is."""
    folder = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return str(folder / "bin" / "python")


def test_workers_without_lakesink_get_one_error_before_anything_starts(
    spark: Any, bare_python: str, tmp_path: Path, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lakesink

    make_input(tmp_path / "in", 0, 10)
    df = stream_of(spark, tmp_path / "in")
    # What the session's workers would run when it was built without PYSPARK_PYTHON.
    monkeypatch.setattr(spark.sparkContext, "pythonExec", bare_python)
    # (lakesink itself is on the tests' PYTHONPATH, which local workers inherit; pyarrow is not.)
    expected = rf"{bare_python}.* cannot import (lakesink, )?pyarrow.*PYSPARK_PYTHON={sys.executable}"
    with pytest.raises(WorkerPythonError, match=expected):
        lakesink.register(spark)
    with pytest.raises(WorkerPythonError, match=expected):
        lakesink.write_stream(df, lake, checkpoint_location=str(tmp_path / "chk"))
    with pytest.raises(WorkerPythonError, match=expected):
        LakeForeachWriter(lake, schema=df.schema)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "no-such-python3")
    monkeypatch.delenv("PYSPARK_PYTHON")
    with pytest.raises(WorkerPythonError, match=r"'no-such-python3' \(from PATH.*not on PATH"):
        lakesink.register(spark)
    assert spark.streams.active == []
    assert not os.path.exists(lake)


def test_on_a_cluster_a_missing_pyspark_python_is_a_warning_at_the_users_line(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executors' Python cannot be asked from the driver: warn, pointing at the caller."""
    import lakesink
    from lakesink.spark import preflight

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "python3")
    monkeypatch.setattr(preflight, "_is_local", lambda spark: False)  # a cluster master
    with pytest.warns(RuntimeWarning, match=r"spark.pyspark.python") as caught:
        lakesink.register(spark, warm_up=False)
    assert [w.filename for w in caught] == [__file__]


# 4. A reader-only install --------------------------------------------------------------------

WITHOUT_PYSPARK = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoPyspark(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "pyspark":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoPyspark())
    import lakesink
    for name in ("write_stream", "register"):
        try:
            getattr(lakesink, name)
        except ImportError as exc:
            print(name, "->", exc)
    import lakesink_reader  # the reader needs no pyspark
    print("reader ok")
    """
)


def test_a_reader_only_install_names_the_spark_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("write_stream", "register"):
        assert f"{name} -> lakesink.{name} needs the 'spark' extra" in done.stdout
    assert "pip install 'lakesink[spark]'" in done.stdout
    assert "reader ok" in done.stdout


# 5, 6. Foreach mistakes at start(), and epoch mode's second query --------------------------------


def test_foreach_mistakes_are_refused_at_start(registered: Any, tmp_path: Path, lake: str) -> None:
    spark = registered
    folder = tmp_path / "in"
    make_input(folder, 0, 50)
    finish(foreach_start(stream_of(spark, folder), lake, tmp_path / "chk"))
    # A schema change between runs of the same query.
    wider = tmp_path / "wider"
    make_input(wider, 0, 5, extra_column=True)
    with pytest.raises(SchemaMismatchError, match="'extra'"):
        foreach_start(stream_of(spark, wider, extra_column=True), lake, tmp_path / "chk")
    # A second query (a new checkpoint) on the lake.
    with pytest.raises(OtherQueryError, match=r"belongs to streaming query \w+, and this query is a new one"):
        foreach_start(stream_of(spark, folder), lake, tmp_path / "chk-new")
    # The lake's path is a regular file.
    a_file = tmp_path / "a-file"
    a_file.write_text("not a lake")
    with pytest.raises(NotADirectoryError, match="is a file"):
        foreach_start(stream_of(spark, folder), str(a_file), tmp_path / "chk-file")
    # complete and update would append the whole result every epoch.
    counts = stream_of(spark, folder).groupBy("label").count()
    for mode in ("complete", "update"):
        with pytest.raises(ValueError, match=rf"output mode '{mode}'"):
            counts.writeStream.outputMode(mode).foreach(LakeForeachWriter(str(tmp_path / "counts"))).start()
    assert spark.streams.active == []
    assert ids(lake) == list(range(50))
    assert not os.path.exists(tmp_path / "counts")
    # Nothing is refused by mistake: the same query resumes, and one that says so writes beside.
    make_input(folder, 50, 50)
    finish(foreach_start(stream_of(spark, folder), lake, tmp_path / "chk"))
    assert ids(lake) == list(range(100))
    shifted = stream_of(spark, folder).selectExpr("id + 1000 as id", "label")
    finish(foreach_start(shifted, lake, tmp_path / "chk-other", allow_other_queries=True))
    assert len(read_committed(lake)) == 200


def test_an_unreachable_s3_endpoint_is_refused_at_start(registered: Any, tmp_path: Path) -> None:
    spark = registered
    make_input(tmp_path / "in", 0, 5)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
    with pytest.raises(Exception, match=endpoint.split("//")[1]):
        foreach_start(stream_of(spark, tmp_path / "in"), "s3://bucket/lake", tmp_path / "chk",
                      storage_options=options)  # fmt: skip
    assert spark.streams.active == []


def test_epoch_mode_refuses_a_second_query_at_start(registered: Any, tmp_path: Path, lake: str) -> None:
    import lakesink

    spark = registered
    folder = tmp_path / "in"
    make_input(folder, 0, 30)

    def start(checkpoint: str) -> Any:
        return lakesink.write_stream(
            stream_of(spark, folder), lake, checkpoint_location=str(tmp_path / checkpoint),
            trigger={"availableNow": True},
        )  # fmt: skip

    first = start("chk")
    finish(first)
    with pytest.raises(OtherQueryError, match=rf"written by streaming query {first.id} .*a new one"):
        start("chk-new")
    with pytest.raises(OtherQueryError, match=rf"written by streaming query {first.id}"):
        (stream_of(spark, folder).writeStream.format("lakesink")
         .option("checkpointLocation", str(tmp_path / "chk-new")).start(lake))  # fmt: skip
    assert spark.streams.active == []
    assert not os.path.exists(tmp_path / "chk-new" / "commits")
    make_input(folder, 30, 30)
    finish(start("chk"))  # the lake's own query resumes
    assert ids(lake) == list(range(60))
    assert Lake(lake).mode == "epoch"


# 8. Options as users pass them -----------------------------------------------------------------


@pytest.mark.s3
def test_storage_options_may_be_a_dict(registered: Any, s3: S3Server, tmp_path: Path) -> None:
    """pyspark turns an option's dict into its str(); the sink reads it back (never shown)."""
    make_input(tmp_path / "in", 0, 20)
    lake = f"s3://{BUCKET}/dict-options"
    query = (
        stream_of(registered, tmp_path / "in").writeStream.format("lakesink")
        .option("storage_options", s3.storage_options)  # type: ignore[arg-type]
        .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start(lake)
    )  # fmt: skip
    finish(query)
    assert sorted(read_committed(lake, storage_options=s3.storage_options).column("id").to_pylist()) == list(
        range(20)
    )
