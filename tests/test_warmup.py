"""``register`` starts the driver's Python workers a lakesink query needs, and the query uses them.

The jobs run in interpreters of their own: a warm-up runs once per Spark application, and the
tests' shared session has long had its workers started. Each job is a user's: a plain
``SparkSession.builder`` session and ``lakesink.register``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink_reader import read_committed

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent

#: The Python worker kinds a lakesink query runs on the driver, which the warm-up starts.
DRIVER_KINDS = (
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.python_streaming_sink_runner",
)

JOB = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[4])
    from devtools.procs import cmdline, descendants
    from pyspark.sql import SparkSession
    import lakesink
    from lakesink.spark import warmup

    source, lake, checkpoint = sys.argv[1:4]
    spark = SparkSession.builder.master("local[2]").getOrCreate()

    def python_workers():
        return {pid: cmdline(pid) for pid in descendants(os.getpid()) if "pyspark.daemon" in cmdline(pid)}

    lakesink.register(spark)
    warm_up = warmup.warm_up_of(spark)
    assert warm_up is not None and warm_up.done.wait(120), "the warm-up did not end"
    assert warm_up.error is None, repr(warm_up.error)
    assert warmup.start_driver_workers(spark) is None, "a second warm-up for one application"
    after_warm_up = python_workers()
    df = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).parquet(source)
    query = (df.writeStream.format("lakesink").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(lake))
    query.awaitTermination()
    after_query = python_workers()
    spark.stop()
    late = warmup.WarmUp("after-stop")
    late.run(spark)  # on a stopped session: it fails, and keeps the failure to itself
    print(json.dumps({"after_warm_up": after_warm_up, "after_query": after_query,
                      "late_error": repr(late.error) if late.done.is_set() else "not done"}))
    """
)


def kinds(workers: dict[str, str], kind: str) -> set[str]:
    return {pid for pid, command in workers.items() if command.split()[-1] == kind}


def test_the_first_query_reuses_the_workers_register_started(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for part in range(2):
        ids = pa.array(range(part * 100, part * 100 + 100), pa.int64())
        pq.write_table(pa.table({"id": ids}), source / f"{part}.parquet")
    lake = tmp_path / "lake"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("SPARK_HOME", None)  # the pip-installed Spark home, as a user has it
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(source), str(lake), str(tmp_path / "chk"), str(ROOT)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for kind in DRIVER_KINDS:
        warmed = kinds(seen["after_warm_up"], kind)
        assert len(warmed) == 2, (kind, seen["after_warm_up"])  # its daemon, and the worker it forked
        # The query's two epochs asked for these kinds of worker again and again: they were
        # handed the warm ones, and no daemon or worker of theirs was started after the warm-up.
        assert kinds(seen["after_query"], kind) == warmed, (kind, seen)
    # The tasks' workers are not warmed (they run on executors): the query started them.
    assert not kinds(seen["after_warm_up"], "pyspark.worker")
    assert kinds(seen["after_query"], "pyspark.worker")
    # A warm-up that fails (here: its session had stopped) raises nothing and says why.
    assert seen["late_error"] not in ("None", "not done"), seen["late_error"]
    # The warm-up wrote nothing: the lake holds the query's rows, once.
    assert sorted(read_committed(str(lake)).column("id").to_pylist()) == list(range(200))
