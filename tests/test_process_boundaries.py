"""Commit and abort in different processes, as Spark makes them (issue 50, item 1).

pyspark 4.3 ends the Python worker whose ``commit`` raised, so Spark's ``abort`` of that batch
runs in a fresh interpreter that remembers nothing of the commit. When the commit's log entry
create went unanswered (CommitStateUnknownError), that create may still land: an abort that
deleted the batch's files then would leave a version listing deleted files -- the lake
unreadable, and the batch lost (the restarted query takes it for a replay).

Each Spark call runs here in a process of its own (``tests/spark_calls.py``), with the data
source instance pickled between them; the lake is real local disk, or S3 (a moto server behind
the fault proxy, which holds the create's requests). A held create is applied by the test
after the abort, as a request that lands after its client gave up.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netfaults import Action, FaultProxy, Rule
from s3server import BUCKET, S3Server

from lakesink.cli import main as lakesink_main
from lakesink.spark.datasource import LakeSinkDataSource
from lakesink_reader import Lake, read_committed
from lakesink_reader.format.v3.logfiles import LOG_DIR, parse_commit_name
from lakesink_reader.storage import open_storage
from lakesink_reader.storage.local import LocalStorage

CALLS = Path(__file__).with_name("spark_calls.py")
ROWS = 5  # per task, two tasks a batch (spark_calls.py)


def batch_ids(batch: int) -> list[int]:
    return [1000 * batch + 100 * p + r for p in (0, 1) for r in range(ROWS)]


class Query:
    """One run of a streaming query into a lake: its data source instance, pickled as Spark
    ships it, and its checkpoint's ``metadata`` (the query id)."""

    def __init__(
        self, tmp: Path, lake: str, checkpoint: Path, query: str, run: int, storage_options: Any = None
    ) -> None:
        self.state = tmp / f"run{run}"
        self.state.mkdir()
        checkpoint.mkdir(exist_ok=True)
        (checkpoint / "metadata").write_text(f'{{"id":"{query}"}}\n')
        options = {"path": lake, "checkpointLocation": str(checkpoint)}
        if storage_options:
            options["storage_options"] = json.dumps(storage_options)
        source = LakeSinkDataSource(options)
        (self.state / "source.pickle").write_bytes(pickle.dumps(source))
        (self.state / "query").write_text(query)

    def call(self, call: str, batch: int, *flags: str) -> subprocess.CompletedProcess[str]:
        """One Spark call in a fresh process; its exception's last line in ``stdout``."""
        return subprocess.run(
            [sys.executable, str(CALLS), call, str(self.state), str(batch), *flags],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def run_batch(self, batch: int) -> None:
        for call in ("write", "commit"):
            done = self.call(call, batch)
            assert done.returncode == 0, done.stdout + done.stderr

    def messages(self, batch: int) -> list[object]:
        return pickle.loads((self.state / f"messages-{batch}.pickle").read_bytes())  # type: ignore[no-any-return]

    def hold_log_creates(self, target: Target) -> list[str]:
        """The flags that make this run's log creates go unanswered (held for later)."""
        if target.proxy is None:
            return ["--hold-log-creates"]  # spark_calls.py holds them in the calling process
        target.proxy.add_rule(Rule(Action.HOLD, operation="PutObject", key=rf"{LOG_DIR}/\d{{20}}\.json$"))
        return []

    def land_held_creates(self, target: Target) -> list[str]:
        """Apply the held creates' first requests, late; the names that landed."""
        if target.proxy is not None:
            target.proxy.clear_rules()
            landed = target.proxy.release_held()
            return [path.split("/lake/", 1)[1] for path, status in landed if status == 200]
        landed = []
        for queued in sorted((self.state / "held").iterdir()):
            name = queued.name.replace("%", "/")
            if LocalStorage(target.lake).put_if_absent(name, queued.read_bytes()):
                landed.append(name)
        return landed


class Target:
    """The lake under test: local disk, or S3 through the fault proxy (``options``: the
    writers', through the proxy; ``direct``: the test's own, straight to moto)."""

    def __init__(self, lake: str, options: Any = None, direct: Any = None, proxy: FaultProxy | None = None):
        self.lake, self.options, self.direct, self.proxy = lake, options, direct, proxy

    def storage(self) -> Any:
        return open_storage(self.lake, self.direct)

    def versions(self) -> list[int]:
        names = [f.name.rsplit("/", 1)[-1] for f in self.storage().list(LOG_DIR)]
        return sorted(v for v in (parse_commit_name(n) for n in names) if v is not None)

    def exists(self, name: str) -> bool:
        return bool(self.storage().exists(name))

    def ids(self) -> list[int]:
        return sorted(read_committed(self.lake, storage_options=self.direct).column("id").to_pylist())

    def rows(self) -> int:
        return int(Lake(self.lake, self.direct).to_table().num_rows)

    def verify_exit(self, capsys: pytest.CaptureFixture[str]) -> int:
        pairs = [] if not self.direct else [
            "--storage-option", f"endpoint_url={self.direct['endpoint_url']}",
            "--storage-option", f"key={self.direct['key']}",
            "--storage-option", f"secret={self.direct['secret']}",
            "--storage-option", "client_kwargs.region_name=us-east-1",
        ]  # fmt: skip
        code = lakesink_main(["verify", self.lake, *pairs])
        capsys.readouterr()
        return code


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    if request.param == "local":
        yield Target(str(tmp_path / "lake"))
        return
    s3: S3Server = request.getfixturevalue("s3")
    with FaultProxy(s3.endpoint_url) as proxy:
        through = {**s3.storage_options, "endpoint_url": proxy.endpoint_url,
                   "config_kwargs": {"retries": {"max_attempts": 2}}}  # fmt: skip
        yield Target(f"s3://{BUCKET}/lake", through, s3.storage_options, proxy)


def files_of(messages: list[object]) -> list[str]:
    return [f.name for m in messages for f in m.files]  # type: ignore[attr-defined]


def test_data_source_abort_in_a_fresh_worker_keeps_the_files_a_late_create_commits(
    tmp_path: Path, target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, query = tmp_path / "checkpoint", str(uuid.uuid4())
    first = Query(tmp_path, target.lake, checkpoint, query, 0, target.options)
    first.run_batch(0)
    assert target.versions() == [0]

    assert first.call("write", 1).returncode == 0
    committed = first.call("commit", 1, *first.hold_log_creates(target))
    assert committed.returncode == 3 and "CommitStateUnknownError" in committed.stdout, committed.stdout
    published = files_of(first.messages(1))
    # The race: the abort runs in a fresh process while the log does not hold batch 1 and its
    # create is still in flight.
    assert target.versions() == [0] and all(target.exists(f) for f in published)
    aborted = first.call("abort", 1)
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert all(target.exists(f) for f in published), "abort deleted a batch in doubt"
    assert "its log entry may still land, so nothing is deleted" in aborted.stderr  # said, in doubt

    assert first.land_held_creates(target) == [f"{LOG_DIR}/{1:020d}.json"]  # the create lands late
    assert target.versions() == [0, 1]
    assert target.rows() == 4 * ROWS and target.ids() == sorted(batch_ids(0) + batch_ids(1))
    assert target.verify_exit(capsys) == 0

    # The restarted query (a new run) replays batch 1: skipped whole; then goes on.
    second = Query(tmp_path, target.lake, checkpoint, query, 1, target.options)
    second.run_batch(1)
    second.run_batch(2)
    assert target.versions() == [0, 1, 2]
    assert target.ids() == sorted(batch_ids(0) + batch_ids(1) + batch_ids(2))
    assert target.verify_exit(capsys) == 0


def test_data_source_abort_after_a_failed_task_deletes_what_the_others_published(tmp_path: Path) -> None:
    target = Target(str(tmp_path / "lake"))
    run = Query(tmp_path, target.lake, tmp_path / "checkpoint", str(uuid.uuid4()), 0)
    run.run_batch(0)
    assert run.call("write", 1).returncode == 0
    kept, lost = files_of(run.messages(1)[:1]), files_of(run.messages(1)[1:])
    # Task 1 failed (its slot empty): Spark never calls commit, and aborts in a fresh worker.
    aborted = run.call("abort", 1, "--lost-task")
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert not any(target.exists(f) for f in kept)
    assert all(target.exists(f) for f in lost)  # a failed task's: the sweep's
    assert target.versions() == [0] and target.ids() == batch_ids(0)


def test_data_source_abort_after_a_commit_that_stood_is_quiet(tmp_path: Path) -> None:
    """A query stopped right after its commit (issue 53, item 2): Spark, interrupted, aborts the
    batch in a fresh worker. The log holds it: the abort deletes nothing and says nothing at the
    worker's default log level (a worker's WARNING reaches the console; its INFO does not)."""
    target = Target(str(tmp_path / "lake"))
    run = Query(tmp_path, target.lake, tmp_path / "checkpoint", str(uuid.uuid4()), 0)
    run.run_batch(0)
    run.run_batch(1)
    aborted = run.call("abort", 1)
    assert aborted.returncode == 0 and aborted.stderr == "", aborted.stdout + aborted.stderr
    assert all(target.exists(f) for f in files_of(run.messages(1)))
    assert target.versions() == [0, 1] and target.ids() == sorted(batch_ids(0) + batch_ids(1))


def test_data_source_commit_into_a_recreated_lake_refuses_what_its_tasks_wrote_for_the_old_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FORMAT.md's fault 12: the lake is deleted and created again between a batch's tasks and
    its commit (another query makes the new one). The commit, in a fresh worker, reads the new
    table.json: the tasks' files were written for the old table (and deleted with it), so the
    batch is refused with the way out; the new lake holds the other query's rows alone."""
    target = Target(str(tmp_path / "lake"))
    ours = Query(tmp_path, target.lake, tmp_path / "ours", str(uuid.uuid4()), 0)
    assert ours.call("write", 0).returncode == 0
    shutil.rmtree(target.lake)
    theirs = Query(tmp_path, target.lake, tmp_path / "theirs", str(uuid.uuid4()), 1)
    assert theirs.call("write", 0).returncode == 0  # the new lake: its table.json, an empty log
    committed = ours.call("commit", 0)
    assert committed.returncode == 3, committed.stdout + committed.stderr
    assert "deleted and recreated while the batch ran" in committed.stdout
    assert "new checkpoint location" in committed.stdout
    assert target.versions() == []
    assert theirs.call("commit", 0).returncode == 0
    assert target.versions() == [0] and target.ids() == batch_ids(0)
    assert target.verify_exit(capsys) == 0


@pytest.mark.parametrize("lands", ["before the restart", "after the replay"])
def test_foreach_batch_commit_in_doubt_then_a_restart_in_a_new_process_keeps_every_row_once(
    tmp_path: Path, target: Target, capsys: pytest.CaptureFixture[str], lands: str
) -> None:
    checkpoint, query = tmp_path / "checkpoint", str(uuid.uuid4())
    first = Query(tmp_path, target.lake, checkpoint, query, 0, target.options)
    assert first.call("batch-write", 0).returncode == 0
    failed = first.call("batch-write", 1, *first.hold_log_creates(target))  # the user's process: its commit
    assert failed.returncode == 3 and "CommitStateUnknownError" in failed.stdout, failed.stdout
    published = files_of(first.messages(1))
    assert target.versions() == [0] and all(target.exists(f) for f in published)

    second = Query(tmp_path, target.lake, checkpoint, query, 1, target.options)  # restarted, a new process
    if lands == "before the restart":
        assert first.land_held_creates(target)
        assert second.call("batch-write", 1).returncode == 0  # a replay: skipped whole
    else:
        if target.proxy is not None:
            target.proxy.clear_rules()  # the restarted process's creates go through
        assert second.call("batch-write", 1).returncode == 0  # commits batch 1 with its own files
        assert first.land_held_creates(target) == []  # the late create finds its version taken
    assert second.call("batch-write", 2).returncode == 0
    assert target.versions() == [0, 1, 2]
    assert target.ids() == sorted(batch_ids(0) + batch_ids(1) + batch_ids(2))
    assert target.verify_exit(capsys) == 0
