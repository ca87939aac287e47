"""lakesink on a real Spark standalone cluster (master + 2 workers on 127.0.0.1), with executor loss.

Each run submits tests/cluster_job.py (the demo job plus a "hang once" stage) with
spark-submit, waits until one task hangs with a staged file of its partition in the lake,
then kill -9's that task's executor JVM -- or its whole worker (worker JVM and executor: the
host is gone) -- and checks that Spark reran the task elsewhere, that ``read_committed`` has
every input row exactly once, that nothing the killed processes had spawned outlives them,
and that after the orphan sweep (the ``lakesink orphans`` command) no staged file and no open
multipart upload is left.

Selection (every test here is marked ``cluster``):
- ``pytest -m cluster`` runs all of them: both modes x both storages x both kinds of loss;
- ``make test`` (``-m "not bench and not long"``) runs a bounded set: the zip check,
  epoch/S3/worker-kill and foreach/HDFS/executor-kill (below) -- each mode and each kind of
  loss once, on the two stores that reach the executors over the network. The other eleven
  are marked ``long``, the local-lake ones too: foreach/HDFS/executor-kill takes the same way
  through Spark (the executor lost, its task rerun on the other worker, the killed processes'
  children gone, the sweep), and local disk under kill -9 is test_chaos.py's;
- HDFS lakes (``-m "cluster and hdfs"``): both modes x both kinds of loss, the lake and Spark's
  checkpoint on the session's MiniDFSCluster; ``make test`` runs foreach/executor-kill, the
  other three are marked ``long``;
- epoch mode takes ``write_stream``'s default door (``via="auto"``: the foreachBatch door in
  this classic session); ``epoch-s3-worker-kill-data-source`` (``long``) is the bounded case
  through the data source door.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from s3server import BUCKET, KEY, SECRET, S3Server

from devtools import procs
from devtools.shipping import clean_env, shipped_tops
from devtools.standalone import StandaloneCluster
from devtools.stream_job import job_args, option_pairs, write_input
from lakesink_reader import Lake, read_committed
from lakesink_reader.names import STAGING_DIR, parse_data_file
from lakesink_reader.storage import open_storage

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

APP = Path(__file__).resolve().parent / "cluster_job.py"
JOB = Path(__file__).resolve().parents[1] / "jobs" / "stream_to_lake.py"
FILES, ROWS_PER_FILE = 4, 10_000  # 2 epochs of 2 files, 2 partitions: ~10,000 rows per task
HANG_AFTER_ROWS = 5_000
#: Rows reach a Python sink in batches, through buffered pipes: Arrow batches of up to
#: maxRecordsPerBatch rows (epoch mode), pickled batches doubling from 1 row (foreach), both
#: written through spark.buffer.size bytes of buffer. Rows held back in a half-filled batch
#: or buffer never reach the sink while its task hangs, so both are shrunk: the sink really
#: has staged data when the executor dies.
SUBMIT_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "500", "spark.buffer.size": "8192"}
#: The bounded set; every other (mode, storage, kill) is marked ``long``. (foreach/local/
#: executor-kill is long since foreach/HDFS/executor-kill takes the same path through Spark:
#: one executor start and task rerun fewer in make test.)
BOUNDED = {("epoch", "s3", "worker")}
#: HDFS's bounded case (24 s on a quiet machine, ~70 s at a load average of 10).
BOUNDED_HDFS = {("foreach", "hdfs", "executor")}
#: Any sign in the driver's log that it lost an executor and failed the task that ran there.
LOSS_SIGNS = ("ExecutorLostFailure", "Lost executor", "Executor lost", "exited caused by")
#: Seconds the processes a killed executor had spawned (Python daemon and workers) get to exit.
ORPHAN_GRACE = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2, memory="1g")
    seen: list[procs.Seen] = []
    with c:
        yield c
        seen = procs.seen(c.pids())
    left = procs.kill_leftovers(seen, 0)
    assert left == [], f"cluster processes left running after stop (killed now): {left}"


def test_executor_python_imports_lakesink_only_from_the_shipped_zip(cluster: StandaloneCluster) -> None:
    tops = shipped_tops()
    assert {"lakesink", "lakesink_reader", "pyspark_lakesink"} <= set(tops) and "reader" not in tops
    probe = f"import importlib; print(*[importlib.import_module(m).__file__ for m in {tops!r}], sep='\\n')"
    # cwd outside the checkout, as an executor's (its worker's app dir): "python -c" puts the
    # cwd on sys.path, and the checkout would hand it lakesink.
    run: dict[str, Any] = {"capture_output": True, "text": True, "cwd": cluster.workdir}
    without = subprocess.run([str(cluster.python), "-c", probe], env=clean_env(), **run)
    assert without.returncode != 0 and "No module named 'lakesink'" in without.stderr, without.stderr
    with_zip = subprocess.run(
        [str(cluster.python), "-c", probe], env=clean_env({"PYTHONPATH": str(cluster.pyfiles)}), **run
    )
    assert with_zip.returncode == 0, with_zip.stderr
    files = with_zip.stdout.split()
    assert len(files) == len(tops) and all(f.startswith(f"{cluster.pyfiles}{os.sep}") for f in files), files


@dataclass(frozen=True)
class Hung:
    """The task that hung, from the marker cluster_job.py writes: its Python worker, its partition."""

    pid: int
    partition: int


def hung_task(marker: Path) -> Hung | None:
    if not marker.exists():
        return None
    pid, partition = marker.read_text().split()
    return Hung(int(pid), int(partition))


def staged_in(lake: str, s3: S3Server | None) -> list[str]:
    """What storage itself holds of staged data under the lake: ``.uncommitted`` files (local,
    HDFS); open multipart uploads and their staging markers (S3)."""
    if lake.startswith("hdfs://"):
        storage = open_storage(lake)
        if not storage.root_exists():
            return []
        return sorted(e.handle for f in ("", "_lakesink", "_lakesink/epochs") for e in storage.staged(f))
    if s3 is None:
        root = Path(lake)
        return sorted(p.name for p in root.rglob("*.uncommitted")) if root.exists() else []
    client = s3.client()
    objects = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    markers = [key for key in objects if f"/{STAGING_DIR}/" in key or key.endswith(".uncommitted")]
    return sorted(s3.open_uploads() + markers)


def staged_partitions(lake: str, s3: S3Server | None) -> set[int]:
    """The partitions that have a staged data file (or open upload) in the lake."""
    names = (parse_data_file(key.rsplit("/", 1)[-1]) for key in staged_in(lake, s3))
    return {name.partition for name in names if name is not None}


def wait_for(running: procs.Started, what: str, check: Any, timeout: float) -> Any:
    """``check()``'s first truthy value; the test fails if the job exits or ``timeout`` passes first."""
    value = procs.wait_until(check, timeout, interval=0.3, give_up=lambda: not running.running())
    if value:
        return value
    if not running.running():
        pytest.fail(f"job exited ({running.proc.returncode}) before {what}:\n{running.tail(6000)}")
    pytest.fail(f"no {what} within {timeout:.0f}s:\n{running.tail(6000)}")


def kill_host_of(cluster: StandaloneCluster, task_pid: int, kill: str) -> tuple[list[int], list[procs.Seen]]:
    """kill -9 the executor running ``task_pid`` (``kill="executor"``), or its worker and the
    executor together (``"worker"``: a lost host). Returns the killed PIDs, and what they had
    spawned (seen just before the kill), which must go away by itself."""
    executor = cluster.executor_of(task_pid)
    victims = [executor]
    if kill == "worker":
        victims.insert(0, cluster.worker_of(executor).pid)
    spawned = procs.seen(pid for victim in victims for pid in procs.descendants(victim) if pid not in victims)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims, spawned


def sweep(lake: str, s3: S3Server | None) -> subprocess.CompletedProcess[str]:
    """The orphan sweep as an operator runs it: the ``lakesink`` CLI, credentials in the env."""
    cmd = [sys.executable, "-m", "lakesink.cli", "orphans", lake, "--older-than", "0", "--delete"]
    env = dict(os.environ)
    if s3 is not None:
        cmd += ["--storage-option", f"endpoint_url={s3.endpoint_url}"]
        cmd += ["--storage-option", "client_kwargs.region_name=us-east-1"]
        env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


CASES = (
    [
        pytest.param(
            mode,
            storage,
            kill,
            None,
            id=f"{mode}-{storage}-{kill}-kill",
            marks=() if (mode, storage, kill) in BOUNDED else pytest.mark.long,
        )
        for kill in ("executor", "worker")
        for mode in ("foreach", "epoch")
        for storage in ("local", "s3")
    ]
    + [
        # HDFS (lake and Spark's checkpoint on the session's MiniDFSCluster).
        pytest.param(
            mode,
            "hdfs",
            kill,
            None,
            id=f"{mode}-hdfs-{kill}-kill",
            marks=(pytest.mark.hdfs,)
            if (mode, "hdfs", kill) in BOUNDED_HDFS
            else (pytest.mark.long, pytest.mark.hdfs),
        )
        for kill in ("executor", "worker")
        for mode in ("foreach", "epoch")
    ]
    + [
        # The epoch cases take write_stream's default door (foreachBatch here); the data source
        # door (format("lakesink")) through the bounded case's kill.
        pytest.param(
            "epoch",
            "s3",
            "worker",
            "data_source",
            id="epoch-s3-worker-kill-data-source",
            marks=pytest.mark.long,
        ),
    ]
)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("mode", "storage", "kill", "via"), CASES)
def test_task_rescheduled_after_executor_loss_lands_every_row_once(
    cluster: StandaloneCluster,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    mode: str,
    storage: str,
    kill: str,
    via: str | None,
) -> None:
    cluster.ensure_workers(2)  # a surviving worker must be there to run the retry
    s3: S3Server | None = request.getfixturevalue("s3") if storage == "s3" else None
    source = tmp_path / "in"
    expected = write_input(source, files=FILES, rows_per_file=ROWS_PER_FILE)
    checkpoint: Any = tmp_path / "chk"
    if storage == "hdfs":
        hdfs: str = request.getfixturevalue("hdfs")
        lake, options, checkpoint = f"{hdfs}/lake", {}, f"{hdfs}/chk"
    elif s3 is None:
        lake, options = str(tmp_path / "lake"), {}
    else:
        # Credentials as storage options: they travel pickled with the writer (foreach) or in
        # the data source's options (epoch) -- never in the executors' environment here.
        lake, options = f"s3://{BUCKET}/events", s3.storage_options
    marker = tmp_path / "hang-marker"
    args = [
        "--hang-marker", str(marker),
        "--hang-after-rows", str(HANG_AFTER_ROWS),
        *job_args(lake, checkpoint, source, options, mode, fail_once_after_rows=0),
        *(["--via", via] if via else []),
    ]  # fmt: skip
    running = cluster.start_submit(APP, args, name=f"{mode}-{storage}-{kill}", conf=SUBMIT_CONF)
    spawned: list[procs.Seen] = []
    try:
        hung: Hung = wait_for(running, "hanging task", lambda: hung_task(marker), 400)
        # The kill must land mid-write: the hung task's sink holds staged data in storage.
        wait_for(
            running,
            f"staged file of the hung task's partition {hung.partition}",
            lambda: hung.partition in staged_partitions(lake, s3),
            120,
        )
        killed, spawned = kill_host_of(cluster, hung.pid, kill)
        returncode = running.proc.wait(600)
    finally:
        procs.stop(running)
        outlived = procs.kill_leftovers(spawned, ORPHAN_GRACE)
    log = running.tail(10**9)
    assert returncode == 0, log[-6000:]
    assert any(sign in log for sign in LOSS_SIGNS), (
        f"driver never saw the executor loss ({killed}):\n{log[-6000:]}"
    )
    assert outlived == [], (
        f"processes of the killed {kill} outlived it by {ORPHAN_GRACE:.0f}s (killed now): "
        f"{[(pid, line[:160]) for pid, line in outlived]}"
    )

    ids = read_committed(lake, storage_options=options).column("id").to_pylist()
    assert len(ids) == expected, f"{len(ids) - len(set(ids))} duplicated rows" if len(ids) > expected else ""
    assert sorted(ids) == list(range(expected))

    result = sweep(lake, s3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert staged_in(lake, s3) == []
    assert all(f.state == "committed" for f in Lake(lake, options).files("read_all"))
    assert sorted(read_committed(lake, storage_options=options).column("id").to_pylist()) == list(
        range(expected)
    )
    if mode == "epoch":
        stream_into_the_next_lake(cluster, tmp_path, lake, options, expected)
    if s3 is not None:
        # The secret travelled to the executors; it must not appear in any Spark log (driver,
        # master, workers, executors' stdout/stderr) nor in the query's checkpoint.
        for path in [*cluster.workdir.rglob("*"), *(tmp_path / "chk").rglob("*")]:
            if path.is_file() and path.suffix not in (".zip", ".pyc") and "executor-env" not in path.parts:
                assert SECRET not in path.read_text(errors="replace"), path


def stream_into_the_next_lake(
    cluster: StandaloneCluster, tmp_path: Path, lake: str, options: dict[str, Any], expected: int
) -> None:
    """The lake just written as the source of the next job on the cluster
    (``readStream.format("lakesink")``, jobs/stream_to_lake.py ``--source lake``): the
    executors read its files (on S3 in make test's case), every row once, one file a
    micro-batch; the lake's appends wrote ``FILES`` files."""
    cleaned = lake.rstrip("/") + "-cleaned" if "://" in lake else str(tmp_path / "cleaned")
    args = [
        "--source", "lake", "--input", lake, "--max-files-per-trigger", "1", "--available-now",
        "--mode", "epoch", "--lake", cleaned, "--checkpoint", str(tmp_path / "chk-cleaned"),
    ]  # fmt: skip
    for pair in option_pairs(options):
        args += ["--storage-option", pair]
    running = cluster.start_submit(JOB, args, name="lake-source")
    try:
        returncode = running.proc.wait(600)
    finally:
        procs.stop(running)
    log = running.tail(10**9)
    assert returncode == 0, log[-6000:]
    ids = read_committed(cleaned, storage_options=options).column("id").to_pylist()
    assert len(ids) == expected and sorted(ids) == list(range(expected)), log[-3000:]
    appends = len(Lake(lake, options).files())
    assert len(re.findall(r"epoch \d+: rows=", log)) == appends, log[-3000:]  # one file a micro-batch
