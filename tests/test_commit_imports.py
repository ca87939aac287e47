"""What the commit path imports (issue 38's memory target): a foreachBatch-door commit runs in
the user's own Python process, every micro-batch, and its tasks in Spark's workers; neither may
import pandas (~27 MiB in each process that does). pyarrow imports it at the first ``pa.array``
or ``pa.scalar`` of Python values; the log and the views build theirs with
``lakesink_reader.arrays``, which these tests also compare with pyarrow's own converter.
Spark-free: the door's own objects (``LakeSinkDataSource.streamWriter``, its
``write_partition`` and ``commit_batch``), in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.views.delta import PROTOCOL, checkpoint_schema
from lakesink_reader.arrays import array, scalar

ROOT = Path(__file__).resolve().parent.parent

#: Two runs of one query on each lake (a restart), a replay, an abort; checkpoints every 2
#: versions (the lake's and the Delta view's), the Spark view's compact batches, and
#: auto-compaction: everything a long-running query's commits do, in ~25 commits a lake.
SCRIPT = r"""
import json, os, struct, sys, uuid
import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType
from lakesink.spark.datasource import LakeSinkDataSource
from lakesink_reader import Lake

schema = StructType([StructField("id", LongType()), StructField("ts", TimestampType()),
                     StructField("label", StringType())])

def rows(arrow_schema, n=10):
    # From buffers: pa.array here would import pandas itself.
    zeros = pa.py_buffer(bytes(8 * n))
    offsets = pa.py_buffer(struct.pack(f"<{n + 1}i", *range(n + 1)))
    labels = pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(b"ab" * (n // 2))])
    return pa.record_batch([pa.Array.from_buffers(pa.int64(), n, [None, zeros]),
                            pa.Array.from_buffers(pa.timestamp("us", "UTC"), n, [None, zeros]), labels],
                           schema=arrow_schema)

found = {}
for name, extra in (("plain", {}), ("partitioned", {"partition_by": json.dumps(["label"])})):
    path = os.path.join(sys.argv[1], name)
    options = {"path": path, "checkpoint_interval": "2", "auto_compact": "true", **extra}
    query, batch = str(uuid.uuid4()), 0
    for run in range(2):
        writer = LakeSinkDataSource(options).streamWriter(schema, False)
        if run:  # the restart replays its last batch
            replayed = writer.write_partition(iter([rows(writer.schema)]), 0, batch - 1, query)
            writer.commit_batch([replayed], batch - 1)
        for _ in range(10):
            tasks = [writer.write_partition(iter([rows(writer.schema)]), p, batch, query) for p in range(2)]
            writer.commit_batch(tasks, batch)
            batch += 1
        writer.abort([writer.write_partition(iter([rows(writer.schema)]), 0, batch, query)], batch)
    lake = Lake(options["path"])
    found[name] = {"operations": sorted({v.operation for v in lake.versions()}),
                   "views": sorted(os.listdir(os.path.join(options["path"], "_delta_log"))),
                   "spark": sorted(os.listdir(os.path.join(options["path"], "_spark_metadata")))}
found["pandas"] = "pandas" in sys.modules
print(json.dumps(found))
"""


def test_commits_through_the_door_never_import_pandas(tmp_path: Path) -> None:
    env_path = f"{ROOT}:{ROOT / 'reader'}"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    for name in ("plain", "partitioned"):
        lake = found[name]
        # The paths ran: appends, an auto-compaction, the views' checkpoints and compact batches.
        assert {"append", "auto-compaction"} <= set(lake["operations"]), lake
        assert any(f.endswith(".checkpoint.parquet") for f in lake["views"]), lake
        assert any(f.endswith(".compact") for f in lake["spark"]), lake
    assert found["pandas"] is False, "a commit imported pandas: a pa.array/pa.scalar of Python values?"


MAP = pa.map_(pa.string(), pa.string())
CASES: list[tuple[list[Any], pa.DataType]] = [
    (["a", "é", None, ""], pa.string()),
    ([b"x", None, b""], pa.binary()),
    ([1, None, -(2**63)], pa.int64()),
    ([2**31 - 1, -1], pa.int32()),
    ([255, None], pa.uint8()),
    ([True, False, None] * 5 + [True], pa.bool_()),
    ([False] * 17, pa.bool_()),
    ([True] * 9 + [None], pa.bool_()),
    ([["a", "b"], None, []], pa.list_(pa.string())),
    ([{"k": "v"}, [], None, [("a", None)]], MAP),
    ([{"appId": "q", "version": 3, "lastUpdated": 5}, None, {"appId": "r"}], pa.struct([
        ("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])),
    ([], pa.string()),
]  # fmt: skip


@pytest.mark.parametrize(("values", "type_"), CASES, ids=lambda c: str(c)[:30])
def test_arrays_are_pyarrows_own(values: list[Any], type_: pa.DataType) -> None:
    built = array(values, type_)
    built.validate(full=True)
    assert built.equals(pa.array(values, type_))


def test_the_delta_checkpoints_rows_are_pyarrows_own() -> None:
    fields = {f.name: f.type for f in checkpoint_schema()}
    meta = {"id": "t", "format": {"provider": "parquet", "options": []}, "schemaString": "{}",
            "partitionColumns": ["day"], "configuration": [("k", "v")], "createdTime": 1}  # fmt: skip
    for values, type_ in (([PROTOCOL], fields["protocol"]), ([meta], fields["metaData"])):
        assert array(values, type_).equals(pa.array(values, type_))


def test_a_scalar_and_what_is_refused() -> None:
    assert scalar(False, pa.bool_()).equals(pa.scalar(False))
    assert scalar(None, pa.int64()).equals(pa.scalar(None, pa.int64()))
    with pytest.raises(TypeError, match="double"):
        array([1.5], pa.float64())
