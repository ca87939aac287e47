"""Chaos: kill -9 an epoch-mode streaming job at chosen and random moments, restart, check exactly-once.

The job (tests/chaos_job.py) runs in its own process group and is killed whole with
``os.killpg(SIGKILL)``: driver, JVM and Python workers. Kill points are reached through the
epoch commit's test hook (``lakesink.spark._chaos_point``: a marker file, then a short pause):

- ``in_write``: an executor has staged part of its file;
- ``after_publish``: the epoch's files are published, its record is not written;
- ``after_record``: the record is written, Spark's own commit log is not;
- ``random``: a random delay after the job started processing.

Every restart changes the partition count, so an epoch in flight at a kill is replayed under
another partitioning (SPARK-28650). Task failures are injected on first attempts throughout.
``LAKESINK_CHAOS_KILLS`` (default 3; 20 in ``make chaos``) sets the number of kills and
``LAKESINK_CHAOS_SEED`` replays a run's random choices (the seed is printed);
``LAKESINK_CHAOS_BACKENDS=local,s3`` picks the storage backends.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.recovery import recover
from lakesink.storage import open_storage
from reader import Lake, read_committed

TESTS_DIR = Path(__file__).resolve().parent
KILLS = int(os.environ.get("LAKESINK_CHAOS_KILLS", "3"))
# Every run starts a JVM and takes 30-60 s on this machine: the per-test limit grows with the
# number of kills (pytest's default of 600 s cut a 20-kill run short).
pytestmark = [pytest.mark.chaos, pytest.mark.spark, pytest.mark.timeout(300 + 120 * KILLS)]
TARGETS = ("after_publish", "after_record", "random", "in_write")
PARTITIONS = (2, 3, 4)
ROWS_PER_FILE = 200
RUN_TIMEOUT = 240.0


def make_input(folder: Path, files: int) -> dict[int, set[int]]:
    """``files`` Parquet files of unique ids; returns the ids of each file."""
    folder.mkdir(parents=True)
    by_file = {}
    for i in range(files):
        ids = list(range(i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE))
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "label": [f"r{v}" for v in ids]}),
            folder / f"in-{i:04d}.parquet",
        )
        # Distinct modification times: the file source takes files in that order.
        os.utime(folder / f"in-{i:04d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
        by_file[i] = set(ids)
    return by_file


def run_job(
    work: Path, lake: str, options: dict[str, Any], run: int, target: str | None, rng: random.Random
) -> str:
    """Run the job once; kill its process group at ``target`` (None: let it finish). Returns what happened."""
    markers = work / f"markers-{run}"
    markers.mkdir()
    env = dict(os.environ)
    if target is not None:
        env.update(LAKESINK_CHAOS_MARKERS=str(markers), LAKESINK_CHAOS_PAUSE="0.4")
    partitions = PARTITIONS[run % len(PARTITIONS)]
    cmd = [
        sys.executable,
        str(TESTS_DIR / "chaos_job.py"),
        "--input",
        str(work / "in"),
        "--lake",
        lake,
        "--checkpoint",
        str(work / "chk"),
        "--partitions",
        str(partitions),
        "--storage-options",
        json.dumps(options),
    ]
    with open(work / f"run-{run}.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            random_at: float | None = None
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    assert proc.returncode == 0, f"run {run} failed, see {work}/run-{run}.log"
                    return "finished"
                if target is not None:
                    seen = os.listdir(markers)
                    if target == "random" and seen and random_at is None:
                        random_at = time.monotonic() + rng.uniform(0.0, 3.0)
                    hit = random_at is not None and time.monotonic() >= random_at
                    if hit or any(m.startswith(f"{target}-") for m in seen):
                        kill_group(proc)
                        return f"killed at {target} ({partitions} partitions)"
                time.sleep(0.02)
            raise AssertionError(f"run {run} did not finish in {RUN_TIMEOUT} s, see {work}/run-{run}.log")
        finally:
            if proc.poll() is None:
                kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 the job's whole process group (driver, JVM, Python workers) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def committed_ids(lake: str, options: dict[str, Any]) -> list[int]:
    return read_committed(lake, columns=["id"], storage_options=options).column("id").to_pylist()


def check_whole_epochs(ids: list[int], by_file: dict[int, set[int]]) -> None:
    """Mid-chaos: no duplicates, and every input file (= one epoch) is visible whole or not at all."""
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated rows visible"
    seen = set(ids)
    for i, file_ids in by_file.items():
        assert file_ids <= seen or not (file_ids & seen), f"input file {i} is half visible"


# Each run starts a JVM (30-50 s per run on a loaded 2-core machine): the bounded run in
# `make test` (3 kills) and `make chaos` (20) both cover local disk and S3 (moto);
# LAKESINK_CHAOS_BACKENDS=local picks one.
BACKENDS = os.environ.get("LAKESINK_CHAOS_BACKENDS", "local,s3").split(",")


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param not in BACKENDS:
        pytest.skip(f"{request.param} chaos runs in make chaos (or LAKESINK_CHAOS_BACKENDS={request.param})")
    if request.param == "local":
        return str(tmp_path / "lake"), {}
    server = request.getfixturevalue("s3")
    from s3server import BUCKET

    return f"s3://{BUCKET}/chaos", dict(server.storage_options)


def test_kill_anywhere_and_restart_commits_every_row_exactly_once(
    backend: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    lake, options = backend
    seed = int(os.environ.get("LAKESINK_CHAOS_SEED", str(random.randrange(1 << 30))))
    print(
        f"\nchaos: {KILLS} kills on {lake.split(':')[0] if '://' in lake else 'local'}, "
        f"LAKESINK_CHAOS_SEED={seed}"
    )
    rng = random.Random(seed)
    by_file = make_input(tmp_path / "in", files=KILLS // 3 + 3)
    outcomes: list[str] = []
    run = 0
    kills = 0
    while kills < KILLS:
        target = TARGETS[kills % len(TARGETS)]
        started = time.monotonic()
        outcome = run_job(tmp_path, lake, options, run, target, rng)
        print(f"  run {run}: {outcome} after {time.monotonic() - started:.1f} s")
        outcomes.append(outcome)
        run += 1
        if outcome == "finished":
            break  # the input ran out before the kills did
        kills += 1
        if _has_table(lake, options):
            check_whole_epochs(committed_ids(lake, options), by_file)
    started = time.monotonic()
    assert run_job(tmp_path, lake, options, run, None, rng) == "finished"
    print(f"  run {run}: finished after {time.monotonic() - started:.1f} s")
    for outcome, count in sorted(Counter(outcomes).items()):
        print(f"  {count} x {outcome}")
    assert kills >= min(KILLS, 3), outcomes

    storage = open_storage(lake, options)
    report = recover(storage, nothing_in_flight=True, staged_older_than=0)
    print(f"  final recovery sweep removed {report.unrecorded} unrecorded, {report.staged} staged files")

    expected = set().union(*by_file.values())
    got = committed_ids(lake, options)
    counts = Counter(got)
    lost = len(expected - set(got))
    duplicated = sum(c - 1 for c in counts.values())
    print(f"  rows: expected {len(expected)}, read {len(got)}, lost {lost}, duplicated {duplicated}")
    assert lost == 0 and duplicated == 0 and set(got) == expected

    # An independent reader over the committed file list agrees.
    import duckdb

    lake_ = Lake(lake, options)
    paths = [f.path for f in lake_.files()]
    con = duckdb.connect()
    if options:
        # DuckDB's own S3 support (httpfs) is a download away, and this machine is offline: it
        # reads the listed objects through s3fs instead, still without our reader.
        import s3fs

        con.register_filesystem(s3fs.S3FileSystem(**options))
    duck = con.execute(
        "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM read_parquet(?)", [paths]
    ).fetchone()
    assert duck == (len(expected), len(expected), min(expected), max(expected))

    # Nothing left behind: every file is committed, no staged file, no open upload.
    assert {f.state for f in lake_.files("read_all")} == {"committed"}
    assert storage.pending_uploads("") == []
    assert [e.epoch for e in lake_.epochs()] == list(range(len(by_file)))


def _has_table(lake: str, options: dict[str, Any]) -> bool:
    from lakesink.layout import TABLE_FILE

    return open_storage(lake, options).exists(TABLE_FILE)
