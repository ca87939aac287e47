"""lakesink on a real Spark standalone cluster (master + 2 workers on 127.0.0.1), with executor loss.

Each run submits tests/cluster_job.py (the demo job plus a "hang once" stage) with
spark-submit, waits until one task hangs with a staged file in the lake, then kill -9's that
task's executor JVM -- or its whole worker (worker JVM and executor: the host is gone) -- and
checks that Spark reran the task elsewhere, that ``read_committed`` has every input row
exactly once, and that after the orphan sweep (the ``lakesink orphans`` command) no staged
file and no open multipart upload is left.

``make test`` runs a bounded set: foreach/local/executor-kill and epoch/S3/worker-kill (each
mode, each storage and each kind of loss once). ``LAKESINK_CLUSTER_ALL=1`` runs all eight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from s3server import BUCKET, S3Server

from reader import Lake, read_committed

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import cluster as standalone  # noqa: E402 - scripts/ is not a package

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

APP = Path(__file__).resolve().parent / "cluster_job.py"
FILES, ROWS_PER_FILE = 4, 10_000  # 2 epochs of 2 files, 2 partitions: ~10,000 rows per task
HANG_AFTER_ROWS = 5_000
#: Rows reach a Python sink in batches, through buffered pipes: Arrow batches of up to
#: maxRecordsPerBatch rows (epoch mode), pickled batches doubling from 1 row (foreach), both
#: written through spark.buffer.size bytes of buffer. Rows held back in a half-filled batch
#: or buffer never reach the sink while its task hangs, so both are shrunk: the sink really
#: has staged data when the executor dies.
SUBMIT_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "500", "spark.buffer.size": "8192"}
ALL = os.environ.get("LAKESINK_CLUSTER_ALL") == "1"
BOUNDED = {("foreach", "local", "executor"), ("epoch", "s3", "worker")}
#: Any sign in the driver's log that it lost an executor and failed the task that ran there.
LOSS_SIGNS = ("ExecutorLostFailure", "Lost executor", "Executor lost", "exited caused by")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[standalone.StandaloneCluster]:
    c = standalone.StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2, memory="1g")
    seen: set[int] = set()
    with c:
        yield c
        seen.update(c.pids())
    left = [pid for pid in seen if standalone.alive(pid)]
    assert left == [], f"cluster processes left running after stop: {left}"


def test_executor_python_imports_lakesink_only_from_the_shipped_zip(
    cluster: standalone.StandaloneCluster,
) -> None:
    probe = "import lakesink, reader; print(lakesink.__file__)"
    env = standalone.clean_env()
    # cwd outside the checkout, as an executor's (its worker's app dir): "python -c" puts the
    # cwd on sys.path, and /work/main would hand it lakesink.
    run = {"capture_output": True, "text": True, "cwd": cluster.workdir}
    without = subprocess.run([str(cluster.python), "-c", probe], env=env, **run)
    assert without.returncode != 0 and "No module named 'lakesink'" in without.stderr
    with_zip = subprocess.run(
        [str(cluster.python), "-c", probe], env={**env, "PYTHONPATH": str(cluster.pyfiles)}, **run
    )
    assert with_zip.returncode == 0, with_zip.stderr
    assert with_zip.stdout.strip().startswith(str(cluster.pyfiles)), with_zip.stdout


def wait_for(what: str, check: Any, timeout: float, running: standalone.Started) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if running.proc.poll() is not None:
            pytest.fail(f"job exited ({running.proc.returncode}) before {what}:\n{running.tail(6000)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f}s:\n{running.tail(6000)}")
        time.sleep(0.3)


def staged_in(lake: str, s3: S3Server | None) -> list[str]:
    """Staged files (local) or open multipart uploads (S3) under the lake, from storage itself."""
    if s3 is None:
        root = Path(lake)
        return [p.name for p in root.rglob("*.uncommitted")] if root.exists() else []
    client = s3.client()
    uploads = [u["Key"] for u in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]
    objects = client.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return uploads + [o["Key"] for o in objects if o["Key"].endswith(".uncommitted")]


def kill_host_of(cluster: standalone.StandaloneCluster, task_pid: int, kill: str) -> list[int]:
    """kill -9 the executor running ``task_pid`` (``kill="executor"``), or its worker and the
    executor together (``"worker"``: a lost host). Returns the killed PIDs."""
    executor = cluster.executor_of(task_pid)
    victims = [executor]
    if kill == "worker":
        victims.insert(0, cluster.worker_of(executor).pid)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims


def sweep(lake: str, s3: S3Server | None) -> subprocess.CompletedProcess[str]:
    """The orphan sweep as an operator runs it: the ``lakesink`` CLI, credentials in the env."""
    cmd = [sys.executable, "-m", "lakesink.cli", "orphans", lake, "--older-than", "0", "--delete"]
    env = dict(os.environ)
    if s3 is not None:
        cmd += ["--storage-option", f"endpoint_url={s3.endpoint_url}"]
        cmd += ["--storage-option", "client_kwargs.region_name=us-east-1"]
        env.update(AWS_ACCESS_KEY_ID="testing-key", AWS_SECRET_ACCESS_KEY="testing-secret-do-not-log")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


CASES = [
    pytest.param(mode, storage, kill, id=f"{mode}-{storage}-{kill}-kill")
    for kill in ("executor", "worker")
    for mode in ("foreach", "epoch")
    for storage in ("local", "s3")
]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("mode", "storage", "kill"), CASES)
def test_task_rescheduled_after_executor_loss_lands_every_row_once(
    cluster: standalone.StandaloneCluster,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    mode: str,
    storage: str,
    kill: str,
) -> None:
    if not ALL and (mode, storage, kill) not in BOUNDED:
        pytest.skip("bounded run: LAKESINK_CLUSTER_ALL=1 runs every combination")
    cluster.ensure_workers(2)  # a surviving worker must be there to run the retry
    s3: S3Server | None = request.getfixturevalue("s3") if storage == "s3" else None
    source = tmp_path / "in"
    expected = standalone.write_input(source, files=FILES, rows_per_file=ROWS_PER_FILE)
    if s3 is None:
        lake, options, reader_options = str(tmp_path / "lake"), {}, {}
    else:
        # Credentials as storage options: they travel pickled with the writer (foreach) or in
        # the data source's options (epoch) -- never in the executors' environment here.
        lake = f"s3://{BUCKET}/events"
        reader_options = s3.storage_options
        options = {
            "endpoint_url": s3.endpoint_url,
            "key": "testing-key",
            "secret": "testing-secret-do-not-log",
            "region_name": "us-east-1",
        }
    marker = tmp_path / "hang-marker"
    args = [
        "--hang-marker", str(marker),
        "--hang-after-rows", str(HANG_AFTER_ROWS),
        *standalone.job_args(lake, tmp_path / "chk", source, options, mode, fail_once_after_rows=0),
    ]  # fmt: skip
    name = f"{mode}-{storage}-{kill}"
    running = cluster.submit(APP, args, name=name, conf=SUBMIT_CONF, wait=False)
    assert isinstance(running, standalone.Started)
    try:
        task_pid = int(wait_for("hanging task", lambda: marker.exists() and marker.read_text(), 400, running))
        # The sink of that task holds staged data in storage: the kill lands mid-write.
        staged_before = wait_for("staged file", lambda: staged_in(lake, s3), 120, running)
        killed = kill_host_of(cluster, task_pid, kill)
        returncode = running.proc.wait(600)
    finally:
        standalone.stop(running)
    log = running.log.read_text(errors="replace")
    assert returncode == 0, log[-6000:]
    assert any(sign in log for sign in LOSS_SIGNS), (
        f"driver never saw the executor loss ({killed}):\n{log[-6000:]}"
    )
    deadline = time.monotonic() + 30
    while standalone.alive(task_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if standalone.alive(task_pid):
        os.kill(task_pid, signal.SIGKILL)  # leave nothing behind, then fail
        pytest.fail(f"the hung Python worker {task_pid} outlived its executor by 30 s")

    ids = read_committed(lake, storage_options=reader_options).column("id").to_pylist()
    assert len(ids) == expected, f"{len(ids) - len(set(ids))} duplicated rows" if len(ids) > expected else ""
    assert sorted(ids) == list(range(expected))
    assert staged_before, "precondition: the killed attempt had staged data"

    result = sweep(lake, s3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert staged_in(lake, s3) == []
    assert all(f.state == "committed" for f in Lake(lake, reader_options).files("read_all"))
    assert sorted(read_committed(lake, storage_options=reader_options).column("id").to_pylist()) == list(
        range(expected)
    )
    if s3 is not None:
        assert s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
        # The secret travelled to the executors; it must not appear in any Spark log (driver,
        # master, workers, executors' stdout/stderr) nor in the query's checkpoint.
        for path in [*cluster.workdir.rglob("*"), *(tmp_path / "chk").rglob("*")]:
            if path.is_file() and path.suffix not in (".zip", ".pyc") and "executor-env" not in path.parts:
                assert "testing-secret-do-not-log" not in path.read_text(errors="replace"), path
