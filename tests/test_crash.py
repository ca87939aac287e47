"""kill -9 of a writing job: its staged files stay invisible to every plain reader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pytest
from test_foreach_spark import make_input

from lakesink_reader import Lake, read_all, read_committed

pytestmark = pytest.mark.spark
TESTS = Path(__file__).resolve().parent


def test_staged_files_of_a_killed_job_are_invisible(spark, tmp_path: Path, lake: str) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "in"
    make_input(spark, source, files=2, rows_per_file=1_000)
    marker = tmp_path / "hanging"
    job = subprocess.Popen(
        [sys.executable, str(TESTS / "killed_job.py"), str(source), lake, str(tmp_path / "chk"), str(marker)],
        start_new_session=True,  # its own process group: JVM and Python workers die together
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert job.poll() is None, "the job exited before it started writing epoch 1"
            assert time.monotonic() < deadline, "the job never reached the middle of epoch 1"
            time.sleep(0.2)
        while not [n for n in os.listdir(lake) if n.endswith(".uncommitted")]:
            assert time.monotonic() < deadline, "the hanging task has no staged file"
            time.sleep(0.05)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)

    staged = [f for f in Lake(lake).files("read_all") if f.state == "staged"]
    assert staged and all(f.epoch == 1 for f in staged)
    committed_ids = sorted(read_committed(lake).column("id").to_pylist())
    assert committed_ids == list(range(1_000))  # epoch 0 only
    assert sorted(ds.dataset(lake, format="parquet").to_table().column("id").to_pylist()) == committed_ids
    duck = duckdb.sql(f"select id from read_parquet('{lake}/**/*.parquet') order by id").fetchall()
    assert [r[0] for r in duck] == committed_ids
    assert sorted(r.id for r in spark.read.parquet(lake).select("id").collect()) == committed_ids
    # read_all sees the staged files: it reads them if they are complete, else reports them.
    result = Lake(lake).read("read_all")
    assert {s.path for s in result.skipped} | {f.path for f in staged} == {f.path for f in staged}
    assert result.table.num_rows >= len(committed_ids)
    assert len(result.skipped) == len(staged)  # each hangs before its footer is written
    with pytest.warns(UserWarning, match="unreadable"):
        read_all(lake)
