"""The orphan sweep, ``verify`` and the ``lakesink`` command, on local disk and on S3 (moto).

The sweep's rule (lakesink/maintenance/sweep.py): what the epoch log proves garbage goes at
any age; staged data of an epoch that may be in flight only when older than the age; a
published file of an epoch with no record yet never.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from lakes import SCHEMA, foreach_lake, rows, v3_table, write_file
from s3server import BUCKET, S3Server

from lakesink import NotALakeError, TableNotFoundError
from lakesink.cli import main, parse_duration
from lakesink.commit import FileWriter, WriteOptions
from lakesink.maintenance import sweep, verify
from lakesink_reader.format.log import CommittedFile
from lakesink_reader.format.table import ensure_table
from lakesink_reader.names import data_file_name, staged_name
from lakesink_reader.storage import Storage, open_storage
from lakesink_reader.storage.options import parse_option_pairs
from tests.sim.legacy import EpochCommitter, format2_table

HOUR = 3600.0


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def dead_writer(storage: Storage, partition: int, epoch: int, writer: str | None = None) -> FileWriter:
    """A writer that died mid-file: a row group is in storage, the file never sealed."""
    file = FileWriter(
        storage, data_file_name(partition, epoch, writer), SCHEMA, WriteOptions(row_group_bytes=1024)
    )
    file.write(rows(0, 1_000))
    return file


def published(storage: Storage, partition: int, epoch: int, writer: str) -> CommittedFile:
    """A file published by an epoch-mode task (attempt ``writer``), not recorded yet."""
    file = FileWriter(storage, data_file_name(partition, epoch, writer), SCHEMA)
    file.write(rows(epoch * 100, 10))
    done = file.publish()
    assert done is not None
    return CommittedFile(done.name, partition, epoch, done.rows, done.size)


@pytest.fixture
def foreach_table(tmp_path: Path) -> tuple[str, list[Path], list[Path]]:
    """A foreach lake with one committed file, two old orphans and a young staged file."""
    lake = tmp_path / "lake"
    storage = foreach_lake(str(lake), epochs=1, partitions=1)
    (lake / "_lakesink" / "epochs").mkdir(parents=True, exist_ok=True)
    old = [
        lake / staged_name(data_file_name(1, 0), "00000000aaaaaaaa"),
        lake / "_lakesink" / "epochs" / staged_name("00000000000000000003.json", "00000000bbbbbbbb"),
    ]
    young = [lake / staged_name(data_file_name(2, 0), "00000000cccccccc")]
    for path in old + young:
        path.write_bytes(b"half a parquet file")
    for path in old:
        age(path, 2 * HOUR)
    assert storage.root_exists()
    return str(lake), old, young


def test_dry_run_lists_old_staged_files_and_removes_nothing(foreach_table) -> None:  # type: ignore[no-untyped-def]
    lake, old, young = foreach_table
    report = sweep(lake, older_than=HOUR)
    assert sorted(o.name for o in report.findings) == sorted(
        [data_file_name(1, 0), "_lakesink/epochs/00000000000000000003.json"]
    )
    assert all(
        o.kind == "staged_file" and 2 * HOUR - 60 < (o.age or 0) < 2 * HOUR + 60 for o in report.findings
    )
    assert all(o.size == len(b"half a parquet file") and not o.settled for o in report.findings)
    assert report.removed == [] and all(p.exists() for p in old + young)


def test_delete_removes_only_old_orphans(foreach_table) -> None:  # type: ignore[no-untyped-def]
    lake, old, young = foreach_table
    report = sweep(lake, older_than=HOUR, delete=True)
    assert len(report.removed) == 2 and report.ok
    assert not any(p.exists() for p in old) and all(p.exists() for p in young)
    assert sweep(lake, older_than=HOUR).findings == []


def test_foreach_staged_data_of_a_published_file_goes_only_by_age(tmp_path: Path) -> None:
    # A second attempt at a published (partition, epoch) may be the longer retry that is about to
    # replace a truncated file (FileWriter.publish): the published name does not settle it.
    storage = foreach_lake(str(tmp_path / "lake"), epochs=1, partitions=1)
    retry = dead_writer(storage, 0, 0, "0123456789abcdef")
    report = sweep(storage, older_than=HOUR, delete=True)
    assert report.removed == [] and len(storage.staged("")) == 1
    # Once older than --older-than it counts as a dead task's, as any staged file of foreach mode.
    later = sweep(storage, older_than=HOUR, delete=True, now=time.time() + 2 * HOUR)
    assert [(o.name, o.settled) for o in later.removed] == [(retry.name, False)]
    assert storage.staged("") == []


def test_epoch_mode_sweep_follows_the_log_not_the_clock(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "lake"))
    format2_table(storage, SCHEMA, "epoch")
    committer = EpochCommitter(storage, query_id="q")
    kept = published(storage, 0, 0, "a" * 16)
    committer.commit(0, [kept])
    settled = published(storage, 1, 0, "b" * 16)  # epoch 0 was recorded without it: a dead task's
    in_flight = published(storage, 0, 1, "c" * 16)  # epoch 1: published, its record comes next
    dead_settled = dead_writer(storage, 2, 0, "d" * 16)  # staged, epoch 0 recorded
    dead_young = dead_writer(storage, 2, 1, "e" * 16)  # staged, epoch 1 in flight: young

    report = sweep(storage, older_than=HOUR, delete=True, now=time.time() + 10 * HOUR)
    # At any age the file of the epoch in flight is kept: its record may be written next.
    assert [o.name for o in report.kept] == [in_flight.name]
    assert "no record yet" in report.kept[0].reason
    # Ten hours on, the young staged file counts as a dead task's; settled garbage goes anyway.
    assert sorted(o.name for o in report.removed) == sorted(
        [settled.name, dead_settled.name, dead_young.name]
    )
    assert storage.exists(in_flight.name) and storage.exists(kept.name)

    dead_young2 = dead_writer(storage, 3, 1, "f" * 16)
    report = sweep(storage, older_than=HOUR, delete=True)  # now: the staged file is too young
    assert report.findings == [] and storage.staged("")[0].name == dead_young2.name
    committer.commit(1, [in_flight])  # epoch 1 is recorded: its staged leftovers are garbage now
    report = sweep(storage, older_than=HOUR, delete=True)
    assert report.kept == [] and [(o.name, o.settled) for o in report.removed] == [(dead_young2.name, True)]
    assert storage.staged("") == []
    assert sorted(os.listdir(storage.url)) == sorted(["_lakesink", kept.name, in_flight.name])


def test_format_3_sweep_follows_the_versioned_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Format 3 (docs/design/format-v3.md, section 11): an unlisted published file goes when its
    producer is settled -- its writer (by tag) committed the batch, or, for names that carry only
    the batch, every writer did and it is not a first batch; its compaction op is in the log --
    and is kept otherwise, at any age. Files a retained version lists are never touched."""
    from lakes import v3_file, v3_name, v3_table

    from lakesink.commit.versions import VersionedLogWriter
    from lakesink.maintenance import compact
    from lakesink_reader import Lake, read_committed
    from lakesink_reader.format.v3.commits import PendingCommit, new_op_token
    from lakesink_reader.names import OPS_DIR, compaction_file_name

    w1, w2 = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"
    path = str(tmp_path / "lake")
    storage, table_id = v3_table(path, checkpoint_interval=4)
    vlog = VersionedLogWriter(storage, table_id, checkpoint_interval=4)
    for batch in range(4):
        adds = [
            v3_file(storage, v3_name(w1, batch, p), 100 * batch + 50 * p, 50, batch=batch) for p in range(2)
        ]
        vlog.commit(PendingCommit.append(writer_id=w1, batch=batch, run="run00001", adds=adds))
    replaced = {f.name for f in Lake(path).files()}
    assert compact(path, min_files=2, target_file_size=1 << 20).version == 4
    dead_op, live_op = new_op_token(), new_op_token()
    vlog.commit(PendingCommit.abandon(op_token=new_op_token(), abandons=dead_op))

    def unlisted(name: str) -> str:
        v3_file(storage, name, 9000, 5)
        return name

    garbage = {
        unlisted(v3_name(w1, 2, 0)),  # a losing attempt of a committed batch
        unlisted(data_file_name(0, 2, "a" * 16)),  # batch 2, by name only: every writer committed it
        unlisted(compaction_file_name(dead_op, 0, "b" * 16)),  # an abandoned op's output
    }
    kept = {
        unlisted(v3_name(w1, 4, 0)): "not committed yet",  # the writer's next batch: in flight
        unlisted(v3_name("99999999-0000-0000-0000-000000000000", 0, 0)): "first batch may be in flight",
        unlisted(data_file_name(0, 0, "c" * 16)): "batch 0",  # any unknown writer's first batch
        unlisted(data_file_name(0, 5, "d" * 16)): "not committed by every writer",
        unlisted(compaction_file_name(live_op, 0, "e" * 16)): "may still commit",
    }
    small = WriteOptions(row_group_bytes=1024)
    staged = FileWriter(storage, v3_name(w1, 1, 1), SCHEMA, small)  # a dead attempt of a committed batch
    staged.write(rows(0, 1_000))
    young = FileWriter(storage, v3_name(w1, 4, 1), SCHEMA, small)  # the batch in flight: a live task's?
    young.write(rows(0, 1_000))
    storage.put(f"{OPS_DIR}/{dead_op}.json", b"{}")  # the lease of a settled op
    storage.put(f"{OPS_DIR}/{live_op}.json", b"{}")

    dry = sweep(path, older_than=HOUR)
    assert {o.name for o in dry.kept} == set(kept)
    for o in dry.kept:
        assert kept[o.name] in o.reason, o.reason
    assert {o.name for o in dry.findings} == garbage | {staged.name, f"{OPS_DIR}/{dead_op}.json"}
    assert all(o.settled for o in dry.findings)
    assert (
        main(["orphans", path, "--json"]) == 0
        and str(len(garbage))
        and "unrecorded_file" in capsys.readouterr().out
    )

    report = sweep(path, older_than=HOUR, delete=True)
    assert report.ok and {o.name for o in report.removed} == {o.name for o in dry.findings}
    left = set(os.listdir(path))
    assert not garbage & left and set(kept) <= left and replaced <= left  # version 3 still needs those
    assert [s.name for s in storage.staged("")] == [young.name]
    assert storage.exists(f"{OPS_DIR}/{live_op}.json") and not storage.exists(f"{OPS_DIR}/{dead_op}.json")
    assert sorted(read_committed(path).column("id").to_pylist()) == list(range(400))
    assert sorted(read_committed(path, version=3).column("id").to_pylist()) == list(range(400))

    # A second writer at batch 0: batch 2 is no longer committed by every writer, so a file that
    # names only the batch may be that writer's in flight; its own first batch settles its tag.
    vlog.commit(PendingCommit.append(writer_id=w2, batch=0, run="run00002", allow_other_queries=True))
    maybe = unlisted(data_file_name(1, 2, "f" * 16))
    settled = unlisted(v3_name(w2, 0, 3))
    report = sweep(path, older_than=HOUR, delete=True)
    assert {o.name for o in report.removed} == {settled}
    assert maybe in {o.name for o in report.kept} and storage.exists(maybe)
    assert sorted(read_committed(path).column("id").to_pylist()) == list(range(400))


def test_not_a_lake_missing_table_and_bad_age_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="-1"):
        sweep(str(tmp_path), older_than=-1)
    with pytest.raises(TableNotFoundError, match="nowhere"):
        sweep(str(tmp_path / "nowhere"), older_than=0)
    (tmp_path / "plain").mkdir()
    staged = tmp_path / "plain" / staged_name(data_file_name(0, 0), "00000000aaaaaaaa")
    staged.write_bytes(b"x")
    with pytest.raises(NotALakeError, match="plain"):
        sweep(str(tmp_path / "plain"), older_than=0, delete=True)
    assert staged.exists()  # nothing is touched in a folder that is not a lake


@pytest.mark.s3
def test_s3_sweep_aborts_old_uploads_by_their_true_age(s3: S3Server) -> None:
    url = f"s3://{BUCKET}/t"
    storage = open_storage(url, s3.storage_options)
    ensure_table(storage, pa.schema(SCHEMA), "foreach")
    committed = write_file(storage, 0, 0, 0, 10)
    dead = [dead_writer(storage, p, 1) for p in (1, 2)]
    assert len(s3.open_uploads()) == 2
    # The staging markers date the uploads (moto itself reports every upload as begun in 2010).
    assert sweep(url, older_than=HOUR, storage_options=s3.storage_options).findings == []
    report = sweep(url, older_than=0, storage_options=s3.storage_options)
    assert sorted(o.name for o in report.findings) == sorted(d.name for d in dead)
    assert all(o.kind == "multipart_upload" and 0 <= (o.age or -1) < 600 for o in report.findings)
    assert len(s3.open_uploads()) == 2  # dry run
    report = sweep(url, older_than=0, delete=True, storage_options=s3.storage_options)
    assert len(report.removed) == 2 and report.ok
    assert s3.open_uploads() == [] and storage.staged("") == []
    assert [f.name for f in storage.list("")] == [committed]
    for file in dead:  # the dead writers' own cleanup, had they lived, is harmless now
        file.discard()


# verify -----------------------------------------------------------------------------------------


def test_verify_names_missing_and_damaged_committed_files(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "lake"))
    format2_table(storage, SCHEMA, "epoch")
    committer = EpochCommitter(storage, query_id="q")
    files = [published(storage, p, 0, f"{p:016x}") for p in range(3)]
    committer.commit(0, files)
    assert verify(storage.url).ok and verify(storage.url).checked == 3
    os.unlink(os.path.join(storage.url, files[0].name))
    Path(storage.url, files[1].name).write_bytes(b"PAR1 not really PAR1")
    report = verify(storage.url)
    assert not report.ok and report.checked == 3
    problems = {p.name: p.problem for p in report.problems}
    assert problems[files[0].name].startswith("missing")
    assert "size differs" in problems[files[1].name] or "unreadable" in problems[files[1].name]
    assert files[2].name not in problems


# The command ------------------------------------------------------------------------------------


def test_parse_duration_and_storage_options() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "30m", "1h", "1.5d")] == [90, 90, 1800, 3600, 129600]
    with pytest.raises(ValueError, match="'1 hour'"):
        parse_duration("1 hour")
    options = parse_option_pairs(
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
        parse_option_pairs(["key=k", "secret:s3cr3t-value"])
    assert "s3cr3t-value" not in str(info.value)  # a mistyped secret is not echoed


def test_cli_lists_then_deletes(foreach_table, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    lake, old, _young = foreach_table
    assert main(["orphans", lake, "--older-than", "1h"]) == 0
    out = capsys.readouterr().out
    assert "2 orphan(s) in" in out and "dry run" in out and data_file_name(1, 0) in out
    assert all(p.exists() for p in old)
    assert main(["orphans", lake, "--older-than", "1h", "--delete", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["removed"]) == 2 and doc["failed"] == [] and not any(p.exists() for p in old)


def test_cli_dry_run_needs_no_age_but_delete_does(foreach_table, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    lake, old, young = foreach_table
    assert main(["orphans", lake]) == 0  # a dry run: staged data older than 1h, the writers' default
    out = capsys.readouterr().out
    assert "2 orphan(s) in" in out and "dry run" in out and data_file_name(1, 0) in out
    assert (
        "older than 1h (the default --older-than)" in out and data_file_name(2, 0) not in out
    )  # young: not listed
    assert main(["orphans", lake, "--older-than", "0", "--json"]) == 0  # everything staged, with its age
    assert len(json.loads(capsys.readouterr().out)["findings"]) == 3
    assert main(["orphans", lake, "--delete"]) == 2  # removing needs the operator's own age
    assert "--delete needs --older-than" in capsys.readouterr().err
    assert all(p.exists() for p in old + young)
    with pytest.raises(SystemExit) as exited:
        main(["orphans", "--help"])
    assert exited.value.code == 0
    assert "default for a dry run: 1h" in " ".join(capsys.readouterr().out.split())


def test_cli_verify_version_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = str(tmp_path / "lake")
    foreach_lake(lake, epochs=1, partitions=2)
    assert main(["verify", lake]) == 0
    assert "2 committed file(s) checked" in capsys.readouterr().out
    victim = next(p for p in Path(lake).iterdir() if p.suffix == ".parquet")
    victim.write_bytes(b"garbage")
    assert main(["verify", lake, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in doc["problems"]] == [victim.name]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("lakesink 0.")
    assert main(["orphans", str(tmp_path / "missing"), "--older-than", "1h"]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["orphans", lake, "--older-than", "soon"]) == 2
    assert "'soon'" in capsys.readouterr().err
    assert main(["orphans", str(tmp_path), "--older-than", "1h"]) == 2  # a folder that is not a lake
    assert "not a lakesink table" in capsys.readouterr().err
    assert main(["verify", "gs://bucket/t"]) == 2
    assert "gs://bucket/t" in capsys.readouterr().err


@pytest.mark.s3
def test_console_script_sweeps_s3(s3: S3Server) -> None:
    url = f"s3://{BUCKET}/t"
    storage = open_storage(url, s3.storage_options)
    ensure_table(storage, SCHEMA, "foreach")
    dead = dead_writer(storage, 1, 0)
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


def test_a_sweep_leaves_a_running_store_probe_alone(tmp_path: Path) -> None:
    """A writer starting (or a command) probes the store while a sweep with a short age runs.

    Removing the probe's staged object failed the run that was probing (seen with
    ``orphans --older-than 1s`` looping beside a starting query on S3): a probe's leftovers go
    only once they are an hour old.
    """
    from lakesink_reader.names import PROBE_ABANDONED_AGE, probe_name

    storage = foreach_lake(str(tmp_path / "lake"))
    probing = storage.stage(probe_name())  # a probe in progress: staged, not yet published
    probing.write(b"1")
    probing.flush()
    assert [s.name for s in storage.staged("_lakesink")]
    report = sweep(storage, older_than=0, delete=True)
    assert not [o for o in report.findings if "probe-" in o.name]
    assert [s.name for s in storage.staged("_lakesink")]  # still there
    later = sweep(storage, older_than=0, delete=True, now=time.time() + PROBE_ABANDONED_AGE + 60)
    assert [o.name for o in later.removed if "probe-" in o.name]
    assert storage.staged("_lakesink") == []


@pytest.mark.parametrize("mode", ["foreach", "epoch"])
def test_a_sweep_removes_the_probe_file_of_a_prober_that_died(tmp_path: Path, mode: str) -> None:
    """A writer (or a command) killed inside its store probe, after the probe's first create and
    before its delete -- or whose delete failed -- left ``_lakesink/probe-<id>`` for good: sweeps
    removed only a probe's *staged* leftovers (found by the simulation's foreach world, issue 32:
    ``orphans --delete`` did not converge). Like those, it goes once an hour old, never younger
    (the probe may still be running)."""
    from lakesink_reader.names import PROBE_ABANDONED_AGE, probe_name

    if mode == "foreach":
        storage = foreach_lake(str(tmp_path / "lake"))
    else:
        storage, _ = v3_table(str(tmp_path / "lake"))
    dead = probe_name()
    assert storage.put_if_absent(dead, b"1")  # the probe's first step; its prober died next
    young = sweep(storage, older_than=0, delete=True)
    assert storage.exists(dead) and not [o for o in young.findings if o.name == dead]
    later = sweep(storage, older_than=0, delete=True, now=time.time() + PROBE_ABANDONED_AGE + 60)
    assert [(o.kind, o.name) for o in later.removed if "probe-" in o.name] == [("probe", dead)]
    assert not storage.exists(dead)
    assert [f.name for f in storage.list("_lakesink") if "probe-" in f.name] == []


@pytest.mark.s3
def test_a_sweep_leaves_a_running_s3_probe_alone_whatever_the_store_says_of_its_age(s3: S3Server) -> None:
    """moto reports every upload as started in 2010: listed without its marker, a probe looked abandoned."""
    from lakesink_reader.names import probe_name

    storage = open_storage(f"s3://{BUCKET}/probed", s3.storage_options)
    format2_table(storage, SCHEMA, "epoch")
    probing = storage.stage(probe_name())
    probing.write(b"1")
    probing.flush()
    try:
        report = sweep(storage, older_than=0, delete=True)
        assert not [o for o in report.findings if "probe-" in o.name], report.findings
        assert len(s3.open_uploads()) == 1  # the probe's upload is still open
    finally:
        storage.discard(probing.seal())


def test_verify_all_versions_checks_what_time_travel_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lakesink verify`` checks the latest version and says so; ``--all-versions`` checks every
    retained one: a file only an older version lists (compacted away since), damaged, is found
    there and only there (issue 53, item 7)."""
    from test_reader_v3 import W1, Writer

    from lakesink.commit.versions import VersionedLogWriter
    from lakesink.maintenance.compact import compact

    lake = str(tmp_path / "lake")
    storage, table_id = v3_table(lake)
    writer = Writer(VersionedLogWriter(storage, table_id), W1)
    for batch in range(3):
        writer.append(batch * 100)
    assert compact(lake, min_files=2, check_store=False).version == 3
    assert main(["verify", lake]) == 0
    assert "1 committed file(s) checked in" in (out := capsys.readouterr().out)
    assert "at version 3 (the latest; --all-versions checks every retained one): ok" in out
    assert main(["verify", lake, "--all-versions"]) == 0
    assert "7 committed file(s) checked in" in (out := capsys.readouterr().out)
    assert "at versions 0..3 (every retained one): ok" in out
    replaced = next(p for p in Path(lake).glob("w*.parquet"))  # an append's file, compacted away
    replaced.unlink()
    assert main(["verify", lake]) == 0  # the latest version does not list it
    capsys.readouterr()
    assert main(["verify", lake, "--all-versions", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["versions"] == [0, 3] and [p["name"] for p in doc["problems"]] == [replaced.name]
    assert doc["problems"][0]["problem"].startswith("missing")
