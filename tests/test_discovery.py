"""``format("lakesink")`` on a plain SparkSession, found by pyspark itself: no ``register`` call.

pyspark 4 imports every installed top-level module named ``pyspark_*`` at its first lookup of a
Python data source and registers its ``DefaultSource``; lakesink installs ``pyspark_lakesink``.
The job runs in its own interpreter, so that its JVM has never seen ``register``; the
checkout's root is on its workers' path as site-packages would be for an installed lakesink.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink_reader import Lake, read_committed

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent

JOB = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    source, lake, checkpoint = sys.argv[1:4]
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    df = spark.readStream.schema("id long").parquet(source)
    query = (df.writeStream.format("lakesink").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(lake))
    query.awaitTermination()
    assert "lakesink" not in sys.modules, "the driver never imported lakesink"
    spark.stop()
    """
)


def test_format_lakesink_works_without_register(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), source / "a.parquet")
    lake = tmp_path / "lake"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_HOME", None)  # the plain pip-installed Spark home, as a user has it
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(source), str(lake), str(tmp_path / "chk")],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(100))
    assert Lake(lake).mode == "epoch"


def test_the_wheels_ship_the_discovery_module_and_the_reader(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT / "reader"),
         str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    import zipfile

    [writer] = tmp_path.glob("lakesink-*.whl")
    names = zipfile.ZipFile(writer).namelist()
    assert "pyspark_lakesink.py" in names and "lakesink/views/delta_view.py" in names
    others = ("devtools/", "tests/", "bench/", "reader/", "lakesink_reader/")
    assert not any(n.startswith(others) for n in names)
    [reader] = tmp_path.glob("lakesink_reader-*.whl")
    names = zipfile.ZipFile(reader).namelist()
    wanted = ("__init__.py", "format/v3/vlog.py", "storage/s3.py", "py.typed")
    assert {f"lakesink_reader/{n}" for n in wanted} <= set(names)
    assert not any(n.startswith(("lakesink/", "pyspark_lakesink")) for n in names)


def test_finding_the_data_source_imports_neither_pyarrow_nor_the_commit_protocol() -> None:
    """Spark's lookup worker imports ``pyspark_lakesink`` on the way to every query's start.

    It needs the class only; pyarrow and the commit protocol (0.25 CPU-s) wait for the hooks.
    """
    probe = (
        "import sys, pyspark_lakesink\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'numpy', 'boto3')"
        " or m.startswith(('lakesink.commit', 'lakesink.config'))))\n"
        "from lakesink.spark.datasource import import_hook_modules\n"
        "import_hook_modules()\n"
        "print('pyarrow' in sys.modules and 'lakesink.commit.files' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
