"""The reader as its own distribution (issue 21, item 5): ``pip install ./reader`` into a fresh
virtualenv -- no pyspark, no Java, no writer -- reads lakes the writers wrote, partitioned ones
included, and says which extra an S3 lake or ``to_pandas`` needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakesink
from lakesink import LakeForeachWriter
from lakesink_reader import read_committed

ROOT = Path(__file__).resolve().parent.parent

READ = r"""
import importlib.util, json, sys
import lakesink_reader
from lakesink_reader import Lake, read_committed
out = {"absent": [m for m in ("lakesink", "pyspark", "reader", "boto3", "pandas")
                  if importlib.util.find_spec(m) is None]}
for path in sys.argv[1:]:
    table = read_committed(path)
    out[path] = {"rows": table.num_rows, "columns": table.column_names, "mode": Lake(path).mode,
                 "ids": sorted(table.column("id").to_pylist())}
errors = []
for call in (lambda: Lake(sys.argv[1]).to_pandas(), lambda: read_committed("s3://bucket/lake")):
    try:
        call()
    except ImportError as exc:
        errors.append(str(exc))
out["errors"] = errors
print(json.dumps(out))
"""


def reader_venv(tmp_path: Path) -> Path:
    """A fresh venv with the lakesink-reader distribution installed from ./reader, and nothing
    else but its one dependency, pyarrow (linked from this venv: no download)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    import numpy
    import pyarrow

    pyarrow_dir = Path(pyarrow.__file__).parent
    for linked in (pyarrow_dir, *pyarrow_dir.parent.glob("pyarrow-*.dist-info"), Path(numpy.__file__).parent):
        os.symlink(linked, Path(site) / linked.name)  # numpy: pyarrow's to_pylist does not need it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for step in (["install", "-q", "--no-deps", str(ROOT / "reader")], ["check"]):
        done = subprocess.run(
            [str(python), "-m", "pip", "--disable-pip-version-check", *step],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]  # pip check: pyarrow declared
    return python


@pytest.mark.timeout(900)
def test_the_reader_installs_alone_and_reads_what_the_writers_wrote(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    ids = pa.array(range(50), pa.int64())
    labels = pa.array([f"r{i % 3}" for i in range(50)])
    pq.write_table(pa.table({"id": ids, "label": labels}), source / "a.parquet")
    stream = spark.readStream.schema("id long, label string").parquet(str(source))
    epoch_lake, foreach_lake = str(tmp_path / "epoch"), str(tmp_path / "foreach")
    lakesink.write_stream(
        stream, epoch_lake, checkpoint_location=str(tmp_path / "chk-e"), trigger={"availableNow": True},
        partition_by=["label"],
    ).awaitTermination(300)  # fmt: skip
    query = (
        stream.writeStream.foreach(LakeForeachWriter(foreach_lake, schema=stream.schema))
        .option("checkpointLocation", str(tmp_path / "chk-f")).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(300)
    assert read_committed(epoch_lake).num_rows == read_committed(foreach_lake).num_rows == 50

    python = reader_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(python), "-c", READ, epoch_lake, foreach_lake],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["absent"] == ["lakesink", "pyspark", "reader", "boto3", "pandas"]  # the reader alone
    assert seen[epoch_lake] == {"rows": 50, "columns": ["id", "label"], "mode": "epoch", "ids": [*range(50)]}
    assert seen[foreach_lake]["mode"] == "foreach" and seen[foreach_lake]["ids"] == list(range(50))
    pandas_error, s3_error = seen["errors"]
    assert "pip install 'lakesink-reader[pandas]'" in pandas_error
    assert "pip install 'lakesink-reader[s3]'" in s3_error
