"""jobs/stream_to_lake.py as a user runs it: a subprocess with plain python."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lakesink_reader import read_committed

JOB = Path(__file__).resolve().parent.parent / "jobs" / "stream_to_lake.py"


def run_job(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(JOB), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--source", "files"], "--source files needs --input"),
        (["--source", "lake"], "--source lake needs --input LAKE"),
        (["--rows-per-second", "0"], "--rows-per-second must be >= 1, got 0"),
        (["--duration", "5", "--available-now"], "not allowed with argument"),
        (["--storage-option", "novalue"], "--storage-option number 1 is not KEY=VALUE"),
        (["--via", "foreach_batch"], "--via chooses the door of epoch mode (--mode epoch)"),
        (
            ["--source", "lake", "--input", "s3://b/raw", "--mode", "epoch", "--lake-read", "spark"],
            "--lake-read spark: Spark's Hadoop client reaches local disk and HDFS by itself, not s3://b/raw",
        ),
        (
            ["--source", "lake", "--input", "raw", "--lake-read", "spark"],
            "--lake-read spark: it writes in epoch mode",
        ),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, args: list[str], complaint: str) -> None:
    out = run_job("--lake", str(tmp_path / "l"), "--checkpoint", str(tmp_path / "c"), *args, timeout=60)
    assert out.returncode != 0
    assert complaint in out.stderr


def test_help_shows_each_example_command_on_its_own_lines() -> None:
    out = run_job("--help", timeout=60)
    assert out.returncode == 0 and "--source kafka --bootstrap" in out.stdout
    # A line break inside an example stays a line break, not a run of spaces (issue 53).
    assert not re.search(r"\S {3,}--", out.stdout.split("options:")[0]), out.stdout


def test_via_reaches_write_stream_and_none_keeps_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    import lakesink

    spec = importlib.util.spec_from_file_location("stream_to_lake", JOB)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    doors: list[str] = []
    record = lambda df, path, **kw: doors.append(kw.get("via", "default"))  # noqa: E731
    monkeypatch.setattr(lakesink, "write_stream", record)
    common = ["--lake", str(tmp_path / "l"), "--checkpoint", str(tmp_path / "c"), "--mode", "epoch"]
    for via in ([], ["--via", "data_source"], ["--via", "foreach_batch"], ["--via", "auto"]):
        job.start_query(object(), job.parse_args([*common, *via]), {})
    assert doors == ["default", "data_source", "foreach_batch", "auto"]


@pytest.mark.spark
def test_json_files_through_an_injected_failure_then_a_failing_query_ends_in_one_line(tmp_path: Path) -> None:
    """``--source files`` on JSON files, recognised by their extension (the guide's example: no
    ``--input-format``), through a task failure injected once; then a second stream of another
    schema into the same lake, whose failure the job says in one line. (Parquet input through
    the job: test_connect.py's job run; JSON and the failure were a test and a JVM of their own.)"""
    source = tmp_path / "in"
    source.mkdir()
    for i in range(3):
        (source / f"{i}.json").write_text(
            "".join(f'{{"id": {n}, "label": "x{n}"}}\n' for n in range(i * 1000, (i + 1) * 1000))
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
    # A second stream of another schema into the same lake: the query fails, said in one line.
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.json").write_text('{"id": "not-a-number"}\n')
    out = run_job("--source", "files", "--input", str(other), "--available-now", "--lake", lake,
                  "--checkpoint", str(tmp_path / "chk2"))  # fmt: skip
    assert out.returncode == 1
    [line] = [line for line in out.stdout.splitlines() if "query failed" in line]
    assert "SchemaMismatchError" in line and "'id' changed type from int64 to string" in line
    assert "--verbose" in line and "== Physical Plan ==" not in out.stdout + out.stderr


@pytest.mark.spark
def test_a_lake_is_the_source_of_the_next_job(tmp_path: Path) -> None:
    """``--source lake``: an epoch-mode lake's appends (3 of 2 files, written as a writer
    commits), every row once, 4 files a micro-batch, read by Spark's Parquet scan (``--lake-read
    auto`` on local disk: ``lakesink.follow_lake``, test_follow_lake.py)."""
    from lakes import v3_table
    from test_reader_v3 import W1, Writer

    from lakesink.commit.versions import VersionedLogWriter

    raw = str(tmp_path / "raw")
    storage, table_id = v3_table(raw)
    writer = Writer(VersionedLogWriter(storage, table_id), W1)
    for batch in range(3):
        writer.append(batch * 100)
    cleaned = str(tmp_path / "cleaned")
    out = run_job(
        "--source", "lake", "--input", raw, "--max-files-per-trigger", "4", "--available-now",
        "--mode", "epoch", "--lake", cleaned, "--checkpoint", str(tmp_path / "chk"),
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sorted(read_committed(cleaned).column("id").to_pylist()) == sorted(
        read_committed(raw).column("id").to_pylist()
    )
    assert "--source lake: read with Spark's Parquet scan" in out.stdout
    logged = re.findall(
        r"epoch \d+: rows=(\d+) files=\d+ seconds=[\d.]+ \(read (\d+) upstream files\)", out.stdout
    )
    assert [(int(r), int(f)) for r, f in logged] == [(40, 4), (20, 2)], out.stdout  # 6 files, 4 a micro-batch
    # While the first epoch is awaited (issue 53, item 9): a line at start, then Spark's status.
    lines = out.stdout.splitlines()
    first_epoch = next(i for i, line in enumerate(lines) if re.search(r"epoch 0: rows=", line))
    started = [i for i, line in enumerate(lines) if "started; its first epoch takes longer" in line]
    waiting = [
        i for i, line in enumerate(lines) if re.search(r"waiting for the first epoch, \d+ s after", line)
    ]
    assert len(started) == 1 and waiting and started[0] < waiting[0] and waiting[-1] < first_epoch, out.stdout
