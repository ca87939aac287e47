"""The commit protocol without Spark: every branch of the epoch committer and the file writer,
on local disk and on S3 (moto, through the fault-injecting proxy where a fault is needed)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from lakes import SCHEMA, rows
from netfaults import Action, FaultProxy, Rule

from lakesink import CommitError, SchemaMismatchError, StorageError
from lakesink.commit import EpochCommitter, FileWriter, WriteOptions
from lakesink.config import SinkConfig
from lakesink_reader import read_committed
from lakesink_reader.format.log import CommittedFile, EpochLog
from lakesink_reader.format.table import ensure_table
from lakesink_reader.names import data_file_name, epoch_checkpoint_name, epoch_record_name
from lakesink_reader.storage import Storage, open_storage


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "s3":
        from s3server import BUCKET

        server = request.getfixturevalue("s3")
        table = open_storage(f"s3://{BUCKET}/lake", server.storage_options)
    else:
        table = open_storage(str(tmp_path / "lake"))
    ensure_table(table, SCHEMA, "epoch", format_version=2)
    yield table


def task(storage: Storage, epoch: int, partition: int, attempt: str, start: int = 0) -> CommittedFile:
    """What an epoch-mode task does: publish one file under an attempt-unique name."""
    name = data_file_name(partition, epoch, attempt)
    with FileWriter(storage, name, SCHEMA) as file:
        file.write(rows(start, 10))
    return CommittedFile(name, partition, epoch, 10, file_size(storage, name))


def file_size(storage: Storage, name: str) -> int:
    return next(f.size for f in storage.list("") if f.name == name)


def data_files(storage: Storage) -> list[str]:
    return sorted(f.name for f in storage.list("") if f.name.endswith(".parquet"))


def ids(storage: Storage) -> list[int]:
    options = getattr(storage, "_settings", None)
    if options is None:
        return sorted(read_committed(storage.url).column("id").to_pylist())
    from s3server import KEY, SECRET

    endpoint = storage.endpoint  # type: ignore[attr-defined]
    opts = {
        "endpoint_url": endpoint,
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"region_name": "us-east-1"},
    }
    return sorted(read_committed(storage.url, storage_options=opts).column("id").to_pylist())


# The epoch committer -----------------------------------------------------------------------------


def test_commit_records_the_epoch_and_its_checkpoint(storage: Storage) -> None:
    committer = EpochCommitter(storage, query_id="q1", checkpoint_interval=2)
    for epoch in range(3):
        files = [
            task(storage, epoch, p, f"{epoch}{p}".ljust(16, "a"), start=epoch * 100 + p * 10)
            for p in range(2)
        ]
        outcome = committer.commit(epoch, files, source_offsets=[{"offset": epoch}])
        assert outcome.status == "committed" and outcome.record.files == tuple(files)
    assert ids(storage) == sorted(e * 100 + p * 10 + i for e in range(3) for p in range(2) for i in range(10))
    assert storage.exists(epoch_checkpoint_name(2))
    assert EpochLog(storage).record(1).source_offsets == [{"offset": 1}]  # type: ignore[union-attr]


def test_a_replay_is_skipped_whole_its_files_deleted_and_a_lost_checkpoint_rewritten(
    storage: Storage,
) -> None:
    committer = EpochCommitter(storage, query_id="q1", checkpoint_interval=1)
    first = task(storage, 1, 0, "a" * 16)
    committer.commit(0, [task(storage, 0, 0, "0" * 16)])
    committer.commit(1, [first])
    storage.delete(epoch_checkpoint_name(1))  # the process died between record and checkpoint
    replay = [task(storage, 1, p, f"{p:x}".rjust(16, "b"), start=500) for p in range(3)]  # other partitioning
    outcome = committer.commit(1, replay)
    assert outcome.status == "replayed" and outcome.record.files == (first,)
    assert first.name in data_files(storage) and not set(f.name for f in replay) & set(data_files(storage))
    assert storage.exists(epoch_checkpoint_name(1))
    assert 500 not in ids(storage)


def test_another_query_is_refused_at_a_recorded_epoch_and_after_one(storage: Storage) -> None:
    EpochCommitter(storage, query_id="q1").commit(0, [task(storage, 0, 0, "a" * 16)])
    intruder = EpochCommitter(storage, query_id="q2")
    mine = task(storage, 0, 0, "b" * 16, start=100)
    with pytest.raises(CommitError, match=r"epoch 0 .* committed by streaming query q1, but query q2"):
        intruder.commit(0, [mine])
    later = task(storage, 1, 0, "c" * 16, start=200)
    with pytest.raises(CommitError, match=r"q1.*q2"):  # the lake is q1's: epoch 1 is refused too
        intruder.commit(1, [later])
    assert data_files(storage) == [data_file_name(0, 0, "a" * 16)]  # the refused files are gone
    assert ids(storage) == list(range(10)) and not EpochLog(storage).has(1)


def test_a_hole_in_the_log_is_refused_but_a_first_epoch_need_not_be_zero(storage: Storage) -> None:
    committer = EpochCommitter(storage, query_id="q1")
    assert committer.commit(5, [task(storage, 5, 0, "a" * 16)]).status == "committed"
    hole = task(storage, 7, 0, "b" * 16, start=70)
    with pytest.raises(CommitError, match=r"epoch 6 .* has no record, so epoch 7 cannot be committed"):
        committer.commit(7, [hole])
    assert hole.name not in data_files(storage)
    with pytest.raises(CommitError, match=r"file .* of epoch 5 handed to the commit of epoch 6"):
        committer.commit(6, [task(storage, 5, 1, "c" * 16)])


def test_a_twin_that_records_first_wins_and_the_loser_deletes_only_its_own_files(storage: Storage) -> None:
    twin = EpochCommitter(storage, query_id="q1")
    theirs = task(storage, 0, 0, "a" * 16)
    raced: list[str] = []

    def twin_commits_first(point: str, epoch: int, partition: int | None) -> None:
        if point == "before_record" and not raced:  # between our checks and our record
            raced.append(twin.commit(epoch, [theirs]).status)

    ours = task(storage, 0, 0, "b" * 16, start=100)
    outcome = EpochCommitter(storage, query_id="q1", observer=twin_commits_first).commit(0, [ours])
    assert raced == ["committed"] and outcome.status == "lost_race" and outcome.record.files == (theirs,)
    assert data_files(storage) == [theirs.name] and ids(storage) == list(range(10))


def test_a_foreign_query_recording_first_is_refused_after_the_race(storage: Storage) -> None:
    foreign = EpochCommitter(storage, query_id="q2")
    theirs = task(storage, 0, 0, "a" * 16)

    def foreign_commits_first(point: str, epoch: int, partition: int | None) -> None:
        if point == "before_record" and not EpochLog(storage).has(epoch):
            foreign.commit(epoch, [theirs])

    ours = task(storage, 0, 0, "b" * 16, start=100)
    committer = EpochCommitter(storage, query_id="q1", observer=foreign_commits_first)
    with pytest.raises(CommitError, match="q2"):
        committer.commit(0, [ours])
    assert data_files(storage) == [theirs.name]


def test_abort_deletes_what_is_not_committed_and_never_what_the_log_lists(storage: Storage) -> None:
    committer = EpochCommitter(storage, query_id="q1")
    recorded = task(storage, 0, 0, "a" * 16)
    committer.commit(0, [recorded])
    straggler = task(storage, 0, 1, "b" * 16)
    # Spark aborts an epoch whose commit raised -- also one whose record landed (a lost answer).
    committer.abort(0, [recorded, straggler])
    assert data_files(storage) == [recorded.name] and ids(storage) == list(range(10))
    uncommitted = [task(storage, 1, p, f"{p}".rjust(16, "c")) for p in range(2)]
    committer.abort(1, uncommitted)
    assert data_files(storage) == [recorded.name] and not EpochLog(storage).has(1)


def test_the_sweep_after_a_commit_removes_only_settled_garbage(storage: Storage) -> None:
    committer = EpochCommitter(storage, query_id="q1")
    dead = task(storage, 0, 1, "d" * 16)  # a task killed after publishing: its message never arrived
    next_epoch = task(storage, 1, 0, "e" * 16)  # already published for the next epoch
    kept = task(storage, 0, 0, "a" * 16)
    committer.commit(0, [kept], sweep_older_than=0)
    assert data_files(storage) == sorted([kept.name, next_epoch.name])
    assert dead.name not in data_files(storage)


@pytest.mark.s3
def test_a_lost_answer_to_the_record_is_our_commit_not_a_lost_race(s3: Any) -> None:
    from s3server import BUCKET

    with FaultProxy(s3.endpoint_url) as proxy:
        options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url}
        storage = open_storage(f"s3://{BUCKET}/lake", options)
        ensure_table(storage, SCHEMA, "epoch", format_version=2)
        files = [task(storage, 0, p, f"{p}".rjust(16, "a"), start=p * 10) for p in range(2)]
        lost = proxy.add_rule(
            Rule(Action.LOSE_RESPONSE, operation="PutObject", key=r"epochs/0+\.json$", times=1)
        )
        outcome = EpochCommitter(storage, query_id="q1").commit(0, files)
        assert lost.fired == 1 and outcome.status == "committed"
        # Before the fix, the retry's 412 read as "committed concurrently": the files were deleted
        # and the recorded epoch pointed at nothing.
        assert data_files(storage) == sorted(f.name for f in files)
        assert ids(storage) == list(range(20))


@pytest.mark.s3
def test_derived_work_that_fails_never_fails_a_committed_epoch(s3: Any) -> None:
    from s3server import BUCKET

    with FaultProxy(s3.endpoint_url) as proxy:
        options = {
            **s3.storage_options,
            "endpoint_url": proxy.endpoint_url,
            "config_kwargs": {"retries": {"max_attempts": 1}},
        }
        storage = open_storage(f"s3://{BUCKET}/lake", options)
        ensure_table(storage, SCHEMA, "epoch", format_version=2)
        committer = EpochCommitter(storage, query_id="q1", checkpoint_interval=1)
        committer.commit(0, [task(storage, 0, 0, "a" * 16)])
        proxy.add_rule(Rule(Action.ERROR_500, key="checkpoint"))
        outcome = committer.commit(1, [task(storage, 1, 0, "b" * 16, start=10)], sweep_older_than=0)
        assert outcome.status == "committed" and proxy.fired(Action.ERROR_500) > 0
        proxy.clear_rules()
        assert not storage.exists(epoch_checkpoint_name(1)) and storage.exists(epoch_record_name(1))
        assert ids(storage) == list(range(20))


# The file writer --------------------------------------------------------------------------------


def staged_left(storage: Storage) -> list[str]:
    return [s.name for s in storage.staged("")]


def test_a_batch_of_another_schema_is_refused_naming_the_columns(storage: Storage) -> None:
    file = FileWriter(storage, data_file_name(0, 0), SCHEMA, WriteOptions(row_group_bytes=1024))
    file.write(rows(0, 500))
    other = pa.record_batch(
        [pa.array(["x"]), pa.array([1], pa.int32()), pa.array(["y"])], names=["id", "bucket", "label"]
    )
    with pytest.raises(SchemaMismatchError, match="does not fit the table schema"):
        file.write(other)
    extra = pa.record_batch([pa.array([1], pa.int64()), pa.array([1.0])], names=["id", "score"])
    with pytest.raises(SchemaMismatchError, match=r"'score' \(double\) is new"):
        file.write(extra)
    file.discard()
    assert staged_left(storage) == [] and data_files(storage) == []


def test_a_failing_publish_discards_the_staged_file_and_raises_its_own_error(storage: Storage) -> None:
    name = data_file_name(0, 0, "a" * 16)
    file = FileWriter(storage, name, SCHEMA, WriteOptions(row_group_bytes=1024))
    file.write(rows(0, 1_000))
    for staged in storage.staged(""):  # a sweep with too short an age takes the file away
        storage.drop_staged(staged)
    with pytest.raises((FileNotFoundError, CommitError, StorageError)):
        file.publish()
    assert staged_left(storage) == [] and data_files(storage) == []


def test_options_of_the_wrong_type_are_named() -> None:
    with pytest.raises(TypeError, match="row_group_bytes must be int, got '64MiB'"):
        WriteOptions(row_group_bytes="64MiB")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        WriteOptions(compression="zip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1 KiB"):
        WriteOptions(dictionary_page_bytes=10)
    # A level the codec has not: refused where the writer is configured, not in every task.
    with pytest.raises(ValueError, match=r"compression_level 23 is out of zstd's range -\d+\.\.22"):
        WriteOptions(compression_level=23)
    with pytest.raises(ValueError, match=r"compression_level 0 is out of gzip's range 1\.\.9"):
        SinkConfig.from_options({"path": "/tmp/lake", "compression": "gzip", "compression_level": "0"})
    assert WriteOptions(compression="snappy").compression_level == 1  # ignored by codecs without levels


FULL_DISK = textwrap.dedent(
    """
    import json, os, sys
    import pyarrow as pa
    from lakesink.commit import FileWriter, WriteOptions
    from lakesink_reader.storage import open_storage
    lake = sys.argv[1]
    storage = open_storage(lake)
    schema = pa.schema([("blob", pa.binary())])
    try:
        with FileWriter(storage, "part-00000-epoch-000000000000.parquet", schema,
                        WriteOptions(row_group_bytes=1 << 20, compression="none")) as file:
            for _ in range(8):
                blobs = pa.array([os.urandom(100_000) for _ in range(10)])
                file.write(pa.record_batch([blobs], schema=schema))
        error = None
    except OSError as exc:
        error = exc.errno
    print(json.dumps({"errno": error, "left": sorted(os.listdir(lake))}))
    """
)


def test_a_full_disk_leaves_no_staged_file_behind(tmp_path: Path) -> None:
    """ENOSPC from a real 256 KiB tmpfs (or EFBIG from a file-size limit where mounting is not allowed)."""
    import errno
    import resource

    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                             capture_output=True, check=False).returncode == 0  # fmt: skip
    lake = mount / "lake"
    lake.mkdir()
    code = FULL_DISK
    if not mounted:  # the same path through the file-size limit: writes fail with EFBIG
        limit = (
            "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, {resource.RLIM_INFINITY}))\n"
        )
        code = limit + code
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(lake)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=False)
    assert result["errno"] == (errno.ENOSPC if mounted else errno.EFBIG)
    assert result["left"] == []  # the staged file went, although closing it failed again
