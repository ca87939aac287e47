"""jobs/stream_to_lake.py as a user runs it: a subprocess with plain python."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reader import read_committed

JOB = Path(__file__).resolve().parent.parent / "jobs" / "stream_to_lake.py"


def run_job(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(JOB), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--source", "files"], "--source files needs --input"),
        (["--rows-per-second", "0"], "--rows-per-second must be >= 1, got 0"),
        (["--duration", "5", "--available-now"], "not allowed with argument"),
        (["--storage-option", "novalue"], "KEY=VALUE, got 'novalue'"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, args: list[str], complaint: str) -> None:
    out = run_job("--lake", str(tmp_path / "l"), "--checkpoint", str(tmp_path / "c"), *args, timeout=60)
    assert out.returncode != 0
    assert complaint in out.stderr


@pytest.mark.spark
def test_files_source_with_an_injected_failure(tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for i in range(3):
        ids = pa.array(range(i * 1000, (i + 1) * 1000), pa.int64())
        pq.write_table(
            pa.table({"id": ids, "label": pa.array([f"x{n}" for n in ids.to_pylist()])}),
            source / f"{i}.parquet",
        )
    lake = str(tmp_path / "lake")
    out = run_job(
        "--source", "files", "--input", str(source), "--available-now", "--partitions", "2",
        "--fail-once-after-rows", "100", "--lake", lake, "--checkpoint", str(tmp_path / "chk"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "chk" / "_fault_injected").exists()
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(3000))
    logged = re.findall(r"epoch (\d+): rows=(\d+) files=(\d+) seconds=", out.stdout)
    assert [(int(e), int(r)) for e, r, _ in logged] == [(0, 1000), (1, 1000), (2, 1000)]
    assert all(int(f) == 2 for _, _, f in logged)
