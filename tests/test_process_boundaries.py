"""Commit and abort in different processes, as Spark makes them (issue 50, item 1).

pyspark 4.3 ends the Python worker whose ``commit`` raised, so Spark's ``abort`` of that batch
runs in a fresh interpreter that remembers nothing of the commit. When the commit's log entry
create went unanswered (CommitStateUnknownError), that create may still land: an abort that
deleted the batch's files then would leave a version listing deleted files -- the lake
unreadable, and the batch lost (the restarted query takes it for a replay).

Each Spark call runs here in a process of its own (``tests/spark_calls.py``), with the data
source instance pickled between them; the lake is real local disk. A held create is applied
by the test after the abort, as a request that lands after its client gave up.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lakesink.cli import main as lakesink_main
from lakesink.spark.datasource import LakeSinkDataSource
from lakesink_reader import Lake, read_committed
from lakesink_reader.format.v3.logfiles import LOG_DIR, parse_commit_name
from lakesink_reader.storage.local import LocalStorage

CALLS = Path(__file__).with_name("spark_calls.py")
ROWS = 5  # per task, two tasks a batch (spark_calls.py)


def batch_ids(batch: int) -> list[int]:
    return [1000 * batch + 100 * p + r for p in (0, 1) for r in range(ROWS)]


class Query:
    """One run of a streaming query into a lake: its data source instance, pickled as Spark
    ships it, and its checkpoint's ``metadata`` (the query id)."""

    def __init__(self, tmp: Path, lake: str, checkpoint: Path, query: str, run: int) -> None:
        self.state = tmp / f"run{run}"
        self.state.mkdir()
        checkpoint.mkdir(exist_ok=True)
        (checkpoint / "metadata").write_text(f'{{"id":"{query}"}}\n')
        source = LakeSinkDataSource({"path": lake, "checkpointLocation": str(checkpoint)})
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

    def land_held_creates(self, lake: str) -> list[str]:
        """Apply the held creates' first requests, late; the names that landed."""
        landed = []
        for queued in sorted((self.state / "held").iterdir()):
            name = queued.name.replace("%", "/")
            if LocalStorage(lake).put_if_absent(name, queued.read_bytes()):
                landed.append(name)
        return landed


def versions(lake: str) -> list[int]:
    folder = os.path.join(lake, LOG_DIR)
    return sorted(v for v in (parse_commit_name(n) for n in os.listdir(folder)) if v is not None)


def files_of(messages: list[object]) -> list[str]:
    return [f.name for m in messages for f in m.files]  # type: ignore[attr-defined]


def ids(lake: str) -> list[int]:
    return sorted(read_committed(lake).column("id").to_pylist())


def verify_exit(lake: str, capsys: pytest.CaptureFixture[str]) -> int:
    code = lakesink_main(["verify", lake])
    capsys.readouterr()
    return code


def test_data_source_abort_in_a_fresh_worker_keeps_the_files_a_late_create_commits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake, checkpoint, query = str(tmp_path / "lake"), tmp_path / "checkpoint", str(uuid.uuid4())
    first = Query(tmp_path, lake, checkpoint, query, 0)
    first.run_batch(0)
    assert versions(lake) == [0]

    assert first.call("write", 1).returncode == 0
    committed = first.call("commit", 1, "--hold-log-creates")
    assert committed.returncode == 3 and "CommitStateUnknownError" in committed.stdout, committed.stdout
    published = files_of(first.messages(1))
    # The race: the abort runs in a fresh process while the log does not hold batch 1 and its
    # create is still in flight.
    assert versions(lake) == [0] and all(os.path.exists(os.path.join(lake, f)) for f in published)
    aborted = first.call("abort", 1)
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert all(os.path.exists(os.path.join(lake, f)) for f in published), "abort deleted a batch in doubt"

    assert first.land_held_creates(lake) == [f"{LOG_DIR}/{1:020d}.json"]  # the create lands late
    assert versions(lake) == [0, 1]
    assert Lake(lake).to_table().num_rows == 4 * ROWS and ids(lake) == sorted(batch_ids(0) + batch_ids(1))
    assert verify_exit(lake, capsys) == 0

    # The restarted query (a new run) replays batch 1: skipped whole; then goes on.
    second = Query(tmp_path, lake, checkpoint, query, 1)
    second.run_batch(1)
    second.run_batch(2)
    assert versions(lake) == [0, 1, 2]
    assert ids(lake) == sorted(batch_ids(0) + batch_ids(1) + batch_ids(2))
    assert verify_exit(lake, capsys) == 0


def test_data_source_abort_after_a_failed_task_deletes_what_the_others_published(tmp_path: Path) -> None:
    lake, checkpoint, query = str(tmp_path / "lake"), tmp_path / "checkpoint", str(uuid.uuid4())
    run = Query(tmp_path, lake, checkpoint, query, 0)
    run.run_batch(0)
    assert run.call("write", 1).returncode == 0
    kept, lost = files_of(run.messages(1)[:1]), files_of(run.messages(1)[1:])
    # Task 1 failed (its slot empty): Spark never calls commit, and aborts in a fresh worker.
    aborted = run.call("abort", 1, "--lost-task")
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert not any(os.path.exists(os.path.join(lake, f)) for f in kept)
    assert all(os.path.exists(os.path.join(lake, f)) for f in lost)  # a failed task's: the sweep's
    assert versions(lake) == [0] and ids(lake) == batch_ids(0)


@pytest.mark.parametrize("lands", ["before the restart", "after the replay"])
def test_foreach_batch_commit_in_doubt_then_a_restart_in_a_new_process_keeps_every_row_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lands: str
) -> None:
    lake, checkpoint, query = str(tmp_path / "lake"), tmp_path / "checkpoint", str(uuid.uuid4())
    first = Query(tmp_path, lake, checkpoint, query, 0)
    assert first.call("batch-write", 0).returncode == 0
    failed = first.call("batch-write", 1, "--hold-log-creates")  # the user's process: its commit
    assert failed.returncode == 3 and "CommitStateUnknownError" in failed.stdout, failed.stdout
    published = files_of(first.messages(1))
    assert versions(lake) == [0] and all(os.path.exists(os.path.join(lake, f)) for f in published)

    second = Query(tmp_path, lake, checkpoint, query, 1)  # the query restarted in a new process
    if lands == "before the restart":
        assert first.land_held_creates(lake)
        assert second.call("batch-write", 1).returncode == 0  # a replay: skipped whole
    else:
        assert second.call("batch-write", 1).returncode == 0  # commits batch 1 with its own files
        assert first.land_held_creates(lake) == []  # the late create finds its version taken
    assert second.call("batch-write", 2).returncode == 0
    assert versions(lake) == [0, 1, 2]
    assert ids(lake) == sorted(batch_ids(0) + batch_ids(1) + batch_ids(2))
    assert verify_exit(lake, capsys) == 0
