"""The orphan sweep and the ``lakesink orphans`` command, on local disk and on S3 (moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from s3server import BUCKET, S3Server

from lakesink import TableNotFoundError
from lakesink.cli import main, parse_duration, parse_storage_options
from lakesink.commit import ParquetStage, WriteOptions, publish
from lakesink.layout import committed_name, staged_name
from lakesink.metadata import ensure_table
from lakesink.orphans import sweep_orphans
from lakesink.storage import Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64())])
HOUR = 3600.0


def commit_one(storage: Storage, partition: int) -> str:
    stage = ParquetStage(storage, committed_name(partition, 0), SCHEMA)
    stage.write(pa.record_batch([pa.array(range(10), pa.int64())], schema=SCHEMA))
    sealed = stage.seal()
    assert sealed is not None and publish(storage, sealed)
    return stage.name


def in_flight(storage: Storage, partition: int) -> ParquetStage:
    """A writer that died mid-file: a row group was written, the file never sealed."""
    stage = ParquetStage(storage, committed_name(partition, 1), SCHEMA, WriteOptions(row_group_bytes=1024))
    stage.write(pa.record_batch([pa.array(range(1_000), pa.int64())], schema=SCHEMA))
    return stage


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def local_lake(tmp_path: Path) -> tuple[str, list[Path], list[Path]]:
    """A lake with one committed file, two old orphans and a young staged file."""
    lake = tmp_path / "lake"
    storage = open_storage(str(lake))
    ensure_table(storage, SCHEMA, "foreach")
    commit_one(storage, 0)
    old = [
        lake / staged_name(committed_name(1, 0), "00000000aaaaaaaa"),
        lake / "_lakesink" / "epochs" / staged_name("00000000000000000003.json", "00000000bbbbbbbb"),
    ]
    young = [lake / staged_name(committed_name(2, 0), "00000000cccccccc")]
    (lake / "_lakesink" / "epochs").mkdir(parents=True, exist_ok=True)
    for path in old + young:
        path.write_bytes(b"half a parquet file")
    for path in old:
        age(path, 2 * HOUR)
    return str(lake), old, young


def test_local_dry_run_lists_old_staged_files_and_removes_nothing(local_lake) -> None:  # type: ignore[no-untyped-def]
    lake, old, young = local_lake
    report = sweep_orphans(lake, older_than=HOUR)
    assert sorted(f.name for f in report.findings) == sorted(str(p.relative_to(lake)) for p in old)
    assert all(f.kind == "staged_file" and 2 * HOUR - 60 < f.age < 2 * HOUR + 60 for f in report.findings)
    assert all(f.size == len(b"half a parquet file") for f in report.findings)
    assert report.removed == [] and all(p.exists() for p in old + young)


def test_local_delete_removes_only_old_orphans(local_lake) -> None:  # type: ignore[no-untyped-def]
    lake, old, young = local_lake
    report = sweep_orphans(lake, older_than=HOUR, delete=True)
    assert len(report.removed) == 2 and report.ok
    assert not any(p.exists() for p in old) and all(p.exists() for p in young)
    assert len(os.listdir(lake)) == 3  # _lakesink/, the committed file, the young staged file
    assert sweep_orphans(lake, older_than=HOUR).findings == []


def test_bad_age_and_missing_table_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="-1"):
        sweep_orphans(str(tmp_path), older_than=-1)
    with pytest.raises(TableNotFoundError, match="nowhere"):
        sweep_orphans(str(tmp_path / "nowhere"), older_than=0)


@pytest.mark.s3
def test_s3_sweep_aborts_old_uploads_and_keeps_committed_data(s3: S3Server) -> None:
    url = f"s3://{BUCKET}/t"
    storage = open_storage(url, s3.storage_options)
    ensure_table(storage, SCHEMA, "foreach")
    committed = commit_one(storage, 0)
    dead = [in_flight(storage, p) for p in (1, 2)]
    assert len(s3.open_uploads()) == 2
    # moto reports every upload as initiated on one fixed day in 2010, so "young" is relative here.
    youngest = min(time.time() - u.started for u in storage.pending_uploads(""))
    too_old = youngest + HOUR
    assert sweep_orphans(url, older_than=too_old, storage_options=s3.storage_options).findings == []
    report = sweep_orphans(url, older_than=0, storage_options=s3.storage_options)
    assert sorted(f.name for f in report.findings) == sorted(d.name for d in dead)
    assert all(f.kind == "multipart_upload" and f.upload_id and f.age >= 0 for f in report.findings)
    assert len(s3.open_uploads()) == 2  # dry run
    report = sweep_orphans(url, older_than=0, delete=True, storage_options=s3.storage_options)
    assert len(report.removed) == 2 and report.ok
    assert s3.open_uploads() == []
    assert [f.name for f in storage.list("")] == [committed]
    for stage in dead:  # the dead writers' own cleanup, had they lived, is harmless now
        stage.discard()


# The command ------------------------------------------------------------------------------------


def test_parse_duration_and_storage_options() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "30m", "1h", "1.5d")] == [90, 90, 1800, 3600, 129600]
    with pytest.raises(ValueError, match="'1 hour'"):
        parse_duration("1 hour")
    options = parse_storage_options(
        [
            "endpoint_url=http://127.0.0.1:9000",
            "secret=12345",
            "client_kwargs.region_name=eu-west-1",
            "part_size=8388608",
        ]
    )
    assert options == {
        "endpoint_url": "http://127.0.0.1:9000",
        "secret": "12345",  # stays a string although it looks like a number
        "client_kwargs": {"region_name": "eu-west-1"},
        "part_size": 8388608,
    }
    with pytest.raises(ValueError, match="number 2 is not KEY=VALUE") as info:
        parse_storage_options(["key=k", "secret:s3cr3t-value"])
    assert "s3cr3t-value" not in str(info.value)  # a mistyped secret is not echoed


def test_cli_lists_then_deletes(local_lake, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    lake, old, _young = local_lake
    assert main(["orphans", lake, "--older-than", "1h"]) == 0
    out = capsys.readouterr().out
    assert "2 orphan(s) older than 1h" in out and "dry run" in out and old[0].name in out
    assert all(p.exists() for p in old)
    assert main(["orphans", lake, "--older-than", "1h", "--delete", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["removed"]) == 2 and doc["failed"] == [] and not any(p.exists() for p in old)


def test_cli_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["orphans", str(tmp_path / "missing"), "--older-than", "1h"]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["orphans", str(tmp_path), "--older-than", "soon"]) == 2
    assert "'soon'" in capsys.readouterr().err
    assert main(["orphans", "gs://bucket/t", "--older-than", "1h"]) == 2
    assert "gs://bucket/t" in capsys.readouterr().err


@pytest.mark.s3
def test_console_script_sweeps_s3(s3: S3Server) -> None:
    url = f"s3://{BUCKET}/t"
    storage = open_storage(url, s3.storage_options)
    ensure_table(storage, SCHEMA, "foreach")
    dead = in_flight(storage, 1)
    script = Path(sys.executable).with_name("lakesink")
    opts = s3.storage_options
    args = [
        str(script),
        "orphans",
        url,
        "--older-than",
        "0s",
        "--delete",
        "--json",
        f"--storage-option=endpoint_url={opts['endpoint_url']}",
        "--storage-option=client_kwargs.region_name=us-east-1",
    ]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": opts["key"], "AWS_SECRET_ACCESS_KEY": opts["secret"]}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["removed"] == [dead.name] and doc["findings"][0]["kind"] == "multipart_upload"
    assert s3.open_uploads() == []
