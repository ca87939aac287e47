"""A throwaway Spark standalone cluster on 127.0.0.1 that runs lakesink jobs, and stops what it started.

    python scripts/cluster.py demo            # master + 2 workers, local and S3 (moto) lakes
    python scripts/cluster.py demo --no-s3

Module use (tests/test_cluster.py)::

    with StandaloneCluster(workdir) as cluster:
        result = cluster.submit(app, [...args...])

How lakesink reaches the executors, and why this way
----------------------------------------------------
lakesink and reader are pure Python, so they ship as one zip via ``--py-files`` (the same
files the wheel holds; Spark puts ``.zip``/``.egg`` on the executors' ``sys.path`` but not a
``.whl``). Their binary dependencies (pyarrow, s3fs/boto3) must match the executors' OS,
CPU and Python: on a real cluster they come with the executors' image or a packed
environment (``spark.archives=env.tar.gz#env`` + ``PYSPARK_PYTHON=./env/bin/python``).
Shipping only our own code per job keeps the heavy environment a cluster concern and lets a
new lakesink version go out with a job, not with an image rebuild.

Here all processes share one host, so the executors' Python is a small venv ("the image")
that sees the project's site-packages for pyarrow/s3fs/pyspark but NOT the project's
editable install of lakesink (a ``.pth`` path entry does not run the site-packages' own
``.pth`` hooks). It is checked before the cluster starts: in that Python ``import lakesink``
must fail. So a job that works on this cluster got lakesink from the shipped zip. What this
does NOT prove: that pyarrow/s3fs install on another OS/architecture, or that a packed
environment unpacks -- those are the cluster image's business.

Every process started here (master, workers, spark-submit, moto) is tracked by PID and stopped
by PID -- also when a job fails, on SIGINT/SIGTERM/SIGHUP and at interpreter exit -- and the
executor JVMs and Python workers the workers spawned are swept by PID after them.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "stream_to_lake.py"
#: Packages shipped to the executors; must match setup.cfg's [options.packages.find].
SHIPPED_PACKAGES = ("lakesink", "reader")
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

# Settings every submit gets. Why each:
#  - task.maxFailures: a lost executor fails its running task; the retry is what recovers.
#  - speculation off: a speculative copy is one more concurrent attempt -- lakesink fences it
#    (attempt-unique staging, no-clobber publish), but it doubles the writes for nothing here.
#  - driver on loopback: nothing leaves 127.0.0.1.
BASE_CONF: dict[str, str] = {
    "spark.task.maxFailures": "4",
    "spark.speculation": "false",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.driver.memory": "768m",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "60s",
}


def spark_home() -> Path:
    """SPARK_HOME, or the installed pyspark package (its wheel carries bin/ and jars/)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


# -- processes ------------------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: parse after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie -- exited, not yet reaped -- counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree, children first (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = _ppid(int(entry.name))
            if ppid is not None:
                parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ancestors(pid: int) -> list[int]:
    chain: list[int] = []
    current = _ppid(pid)
    while current and current > 1:
        chain.append(current)
        current = _ppid(current)
    return chain


def kill_pids(pids: Iterable[tuple[int, str]], sig: int = signal.SIGKILL) -> None:
    """Signal each (pid, cmdline-when-seen) still running the same command (no PID-reuse victims)."""
    for pid, cmdline in pids:
        if alive(pid) and _cmdline(pid) == cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


@dataclass
class Started:
    """One process this module started: its Popen, a name for messages and its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


_REGISTRY: dict[int, Started] = {}


def launch(
    name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> Started:
    """Start ``cmd`` in its own session (a terminal's Ctrl-C reaches us, and we stop it in order)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    started = Started(name, proc, log)
    _REGISTRY[proc.pid] = started
    return started


def stop(started: Started, timeout: float = 20.0) -> None:
    """SIGTERM (JVMs run their shutdown hooks: a worker kills its executors), then SIGKILL;
    then SIGKILL whatever the process had spawned and left running (executors, Python workers)."""
    spawned = [(pid, _cmdline(pid)) for pid in descendants(started.pid)]
    if started.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            started.proc.terminate()
        try:
            started.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            started.proc.kill()
            started.proc.wait()
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid, _ in spawned) and time.monotonic() < deadline:
        time.sleep(0.2)
    kill_pids(spawned)
    _REGISTRY.pop(started.pid, None)


def stop_all() -> None:
    """Stop every process still registered, newest first (jobs before workers before master)."""
    for started in reversed(list(_REGISTRY.values())):
        try:
            stop(started)
        except Exception as exc:  # noqa: BLE001 - keep stopping the others
            print(f"cluster: could not stop {started.name} (pid {started.pid}): {exc}", file=sys.stderr)


atexit.register(stop_all)


def install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so ``finally`` blocks (and atexit) stop the cluster.
    SIGINT already raises KeyboardInterrupt. For the CLI only: a library must not take signals."""

    def _exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def _wait_for_log(started: Started, pattern: str, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while True:
        match = regex.search(started.tail(200_000))
        if match:
            return match
        if started.proc.poll() is not None:
            raise RuntimeError(
                f"{started.name} (pid {started.pid}) exited with {started.proc.returncode} before "
                f"logging /{pattern}/; its log {started.log} ends:\n{started.tail()}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{started.name} (pid {started.pid}) did not log /{pattern}/ within {timeout:.0f}s; "
                f"its log {started.log} ends:\n{started.tail()}"
            )
        time.sleep(0.2)


# -- what the executors get -----------------------------------------------------------------


def build_pyfiles_zip(dest: Path) -> Path:
    """Zip lakesink and reader (``.py`` and ``py.typed``) for ``--py-files``.

    The same files ``pip wheel --no-deps .`` puts in the wheel; built directly because it
    takes milliseconds and needs no build backend. Checked: every package directory (one with
    an ``__init__.py``) is included, so a new subpackage cannot be left behind silently.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in SHIPPED_PACKAGES:
            for path in sorted((ROOT / package).rglob("*")):
                if "__pycache__" in path.parts or not path.is_file():
                    continue
                if path.suffix == ".py" or path.name == "py.typed":
                    zf.write(path, path.relative_to(ROOT).as_posix())
        names = set(zf.namelist())
    for package in SHIPPED_PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            if init.relative_to(ROOT).as_posix() not in names:
                raise RuntimeError(f"{init} is missing from {dest}")
    tmp.replace(dest)
    return dest


def site_packages() -> Path:
    import pyarrow

    return Path(pyarrow.__file__).resolve().parent.parent


def executor_python(env_dir: Path) -> Path:
    """A Python for the executors that has the runtime dependencies but not lakesink.

    It stands in for the cluster's executor image: a venv whose only ``.pth`` entry is this
    project's site-packages (pyarrow, s3fs, pyspark...). The editable install of lakesink
    lives in a ``.pth`` hook inside that directory, which Python runs only for real site
    directories, so lakesink is importable only from what the job ships.
    """
    python = env_dir / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True)
        ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        (env_dir / "lib" / ver / "site-packages" / "runtime_deps.pth").write_text(f"{site_packages()}\n")
    probe = (
        "import importlib.util as u, sys\n"
        "missing = [m for m in ('pyarrow', 's3fs', 'boto3', 'pyspark') if u.find_spec(m) is None]\n"
        "leaked = [m for m in ('lakesink', 'reader') if u.find_spec(m) is not None]\n"
        "sys.exit(f'missing {missing}, importable without shipping {leaked}' if missing or leaked else 0)\n"
    )
    check = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=env_dir, env=clean_env()
    )
    if check.returncode != 0:
        raise RuntimeError(f"executor python {python} is not what it models: {check.stderr.strip()}")
    return python


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for cluster processes: ours minus Python/Spark settings that would leak
    this checkout (PYTHONPATH, PYSPARK_*) into executors -- they get only what a job ships."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYSPARK_GATEWAY_PORT")
        and not k.startswith(("PYSPARK_GATEWAY", "SPARK_"))
    }
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.update(extra or {})
    return env


# -- the cluster ----------------------------------------------------------------------------


@dataclass
class SubmitResult:
    returncode: int
    log: Path
    seconds: float

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class StandaloneCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1, started and stopped by PID.

    Parameters
    ----------
    workdir
        Logs, worker dirs (executors' stdout/stderr), the shipped zip, the executor Python.
    workers, cores, memory
        Workers to start, cores and memory each offers to executors.
    worker_env
        Extra environment for the workers, which their executors inherit: on a real cluster
        this is the node's environment (e.g. instance-role credentials). Never logged.
    """

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    worker_env: Mapping[str, str] = field(default_factory=dict)
    master: Started | None = None
    worker_procs: list[Started] = field(default_factory=list)
    master_url: str = ""
    ui_url: str = ""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cores < 1:
            raise ValueError(f"need workers >= 1 and cores >= 1, got {self.workers} and {self.cores}")
        self.workdir = Path(self.workdir).resolve()

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spark_class(self, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), *args]

    def start(self, timeout: float = 120.0) -> None:
        """Start the master, then the workers; return once every worker has registered."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pyfiles = build_pyfiles_zip(self.workdir / "dist" / "lakesink-pyfiles.zip")
        self.python = executor_python(self.workdir / "executor-env")
        env = clean_env(
            {
                # Port 0 for RPC and UI: free ports chosen by the master itself (read from its
                # log), so concurrent clusters never race for one. The REST submission server
                # (fixed port 6066 by default) is not needed and would collide.
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                "SPARK_DAEMON_MEMORY": "512m",
            }
        )
        cmd = self._spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
        )  # fmt: skip
        self.master = launch("master", cmd, self.workdir / "logs" / "master.log", env, cwd=self.workdir)
        port = _wait_for_log(self.master, r"Starting Spark master at spark://127\.0\.0\.1:(\d+)", timeout)[1]
        ui = _wait_for_log(self.master, r"Successfully started service 'MasterUI' on port (\d+)", timeout)[1]
        self.master_url = f"spark://127.0.0.1:{port}"
        self.ui_url = f"http://127.0.0.1:{ui}"
        for _ in range(self.workers):
            self.start_worker(wait=False)
        self.wait_for_workers(timeout)

    def start_worker(self, *, wait: bool = True, timeout: float = 120.0) -> Started:
        """Start one more worker (also: a replacement after a test killed one)."""
        if self.master is None:
            raise RuntimeError("start the master first")
        index = len(self.worker_procs)
        work_dir = self.workdir / f"worker-{index}"
        work_dir.mkdir(parents=True, exist_ok=True)
        cmd = self._spark_class(
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            "--host", "127.0.0.1",
            "--cores", str(self.cores),
            "--memory", self.memory,
            "--webui-port", "0",
            "--work-dir", str(work_dir),
        )  # fmt: skip
        worker = launch(
            f"worker-{index}",
            cmd,
            self.workdir / "logs" / f"worker-{index}.log",
            clean_env({"SPARK_DAEMON_MEMORY": "512m", **self.worker_env}),
            cwd=work_dir,
        )
        self.worker_procs.append(worker)
        if wait:
            _wait_for_log(worker, r"Successfully registered with master", timeout)
        return worker

    def ensure_workers(self, count: int, timeout: float = 120.0) -> None:
        """Start replacements until ``count`` of our workers run and are registered (after a kill)."""
        for worker in self.worker_procs:
            if worker.proc.poll() is not None:
                stop(worker)  # reap it; sweeps nothing (its orphans were re-parented), but harmless
        running = [w for w in self.worker_procs if w.proc.poll() is None]
        for _ in range(count - len(running)):
            self.start_worker(wait=False)
        self.wait_for_workers(timeout)

    def status(self) -> dict[str, Any]:
        """The master's JSON status page (workers, apps)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=10) as resp:
            return dict(json.load(resp))

    def wait_for_workers(self, timeout: float = 120.0) -> None:
        """Wait until every running worker of ours has logged its registration with the master.

        The worker's own log, not the master's list: the master keeps showing a killed worker
        as ALIVE until it notices, which would make a count-based wait pass too early.
        """
        for worker in self.worker_procs:
            if worker.proc.poll() is None:
                _wait_for_log(worker, r"Successfully registered with master", timeout)

    def executors(self, worker: Started | None = None) -> list[int]:
        """PIDs of the executor JVMs (CoarseGrainedExecutorBackend) under one or all workers."""
        roots = [worker] if worker else self.worker_procs
        return [
            pid
            for root in roots
            for pid in descendants(root.pid)
            if EXECUTOR_CLASS in _cmdline(pid) and alive(pid)
        ]

    def executor_of(self, pid: int) -> int:
        """The executor JVM that ``pid`` (a Python worker of a task) runs under."""
        for parent in ancestors(pid):
            if EXECUTOR_CLASS in _cmdline(parent):
                return parent
        raise LookupError(
            f"pid {pid} does not run under an executor of this cluster ({_cmdline(pid)[:200]!r})"
        )

    def worker_of(self, executor_pid: int) -> Started:
        for worker in self.worker_procs:
            if executor_pid in descendants(worker.pid):
                return worker
        raise LookupError(f"executor pid {executor_pid} belongs to no worker of this cluster")

    def submit(
        self,
        app: Path,
        app_args: Sequence[str],
        *,
        name: str = "job",
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        py_files: Sequence[Path] = (),
        timeout: float = 300.0,
        wait: bool = True,
    ) -> SubmitResult | Started:
        """``spark-submit --master spark://...`` of ``app`` (client mode: the driver runs here).

        The executors run :attr:`python` and import lakesink from the shipped zip. ``env`` is
        the driver's extra environment; with ``wait=False`` the running submit is returned
        (stop it with :func:`stop`), else its result once it ends (killed after ``timeout``).
        """
        if self.master is None:
            raise RuntimeError("the cluster is not started")
        settings = {
            **BASE_CONF,
            # Which Python the executors start: sent by the driver with every Python task.
            "spark.pyspark.python": str(self.python),
            "spark.pyspark.driver.python": sys.executable,
            **(conf or {}),
        }
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url, "--name", name]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += ["--py-files", ",".join(str(p) for p in (self.pyfiles, *py_files)), str(app), *app_args]
        log = self.workdir / "logs" / f"{name}.log"
        log.unlink(missing_ok=True)
        started = launch(f"spark-submit {name}", cmd, log, clean_env(env), cwd=self.workdir)
        if not wait:
            return started
        t0 = time.monotonic()
        try:
            returncode = started.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop(started)
            raise TimeoutError(
                f"{name} did not finish within {timeout:.0f}s; its log {log} ends:\n{started.tail()}"
            ) from None
        finally:
            if started.proc.poll() is not None:
                stop(started)  # reaps it and sweeps anything it left (its Python driver)
        return SubmitResult(returncode, log, time.monotonic() - t0)

    def stop(self) -> None:
        """Stop the workers (each kills its executors), then the master; sweep leftovers by PID."""
        for worker in reversed(self.worker_procs):
            stop(worker)
        if self.master is not None:
            stop(self.master)

    def pids(self) -> list[int]:
        """Every live process of this cluster: daemons and what they spawned."""
        roots = [p for p in (self.master, *self.worker_procs) if p is not None]
        return [pid for root in roots if alive(root.pid) for pid in (root.pid, *descendants(root.pid))]


# -- the demo -------------------------------------------------------------------------------


def write_input(folder: Path, files: int, rows_per_file: int) -> int:
    """Parquet files with unique ids 0..files*rows_per_file-1: a replayable, checkable source."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        ids = pa.array(range(i * rows_per_file, (i + 1) * rows_per_file), pa.int64())
        table = pa.table(
            {
                "id": ids,
                "bucket": pc.cast(pc.divide(ids, 7), pa.int32()),
                "label": pa.array([f"row-{n}" for n in ids.to_pylist()]),
            }
        )
        # Written under a hidden name, then renamed: the stream never lists a half-written file.
        tmp = folder / f".input-{i:04d}.parquet"
        pq.write_table(table, tmp)
        tmp.rename(folder / f"input-{i:04d}.parquet")
    return files * rows_per_file


def check_lake(lake: str, options: Mapping[str, Any], expected_rows: int) -> str:
    """One line on what ``read_committed`` sees; raises when a row is missing or duplicated."""
    from reader import Lake, read_committed

    ids = read_committed(lake, storage_options=dict(options)).column("id").to_pylist()
    distinct = set(ids)
    missing = expected_rows - len(distinct & set(range(expected_rows)))
    duplicates = len(ids) - len(distinct)
    files = Lake(lake, dict(options)).files("read_all")
    staged = sum(1 for f in files if f.state != "committed")
    line = (
        f"{lake}: {len(ids)} rows committed in {len(files) - staged} files, "
        f"{missing} missing, {duplicates} duplicated, {staged} staged leftovers"
    )
    if missing or duplicates:
        raise AssertionError(line)
    return line


def job_args(
    lake: str,
    checkpoint: Path,
    source: Path,
    options: Mapping[str, str],
    mode: str,
    *,
    fail_once_after_rows: int = 500,
) -> list[str]:
    """Arguments of jobs/stream_to_lake.py: the files source, two files an epoch, two partitions.

    ``fail_once_after_rows`` injects one failed task attempt (0: none): partition 0's first
    attempt raises mid-partition and Spark retries it on the cluster. Its marker lives in the
    checkpoint folder -- a local path every executor sees only because they share this host.
    """
    args = [
        "--source", "files",
        "--input", str(source),
        "--max-files-per-trigger", "2",
        "--available-now",
        "--partitions", "2",
        "--mode", mode,
        "--lake", lake,
        "--checkpoint", str(checkpoint),
        "--fail-once-after-rows", str(fail_once_after_rows),
    ]  # fmt: skip
    for key, value in options.items():
        args += ["--storage-option", f"{key}={value}"]
    return args


def demo(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    source = workdir / "input"
    expected = write_input(source, files=args.files, rows_per_file=args.rows_per_file)
    worker_env: dict[str, str] = {}
    moto: subprocess.Popen[bytes] | None = None
    lakes: list[tuple[str, dict[str, str], dict[str, Any]]] = [(str(workdir / "lake"), {}, {})]
    try:
        if args.s3:
            from lakesink.devserver import (
                DEV_KEY,
                DEV_REGION,
                DEV_SECRET,
                create_bucket,
                dev_storage_options,
                start_moto,
                stop_moto,
            )

            moto, endpoint = start_moto()
            _REGISTRY[moto.pid] = Started("moto", moto, workdir / "logs" / "moto.log")
            create_bucket(endpoint, "cluster-demo")
            # Credentials reach the executors the way an instance role or node secret would:
            # in the workers' environment (boto3's default chain), never on a command line.
            creds = {
                "AWS_ACCESS_KEY_ID": DEV_KEY,
                "AWS_SECRET_ACCESS_KEY": DEV_SECRET,
                "AWS_DEFAULT_REGION": DEV_REGION,
            }
            worker_env.update(creds)
            job_options = {"endpoint_url": endpoint, "region_name": DEV_REGION}
            reader_options: dict[str, Any] = dev_storage_options(endpoint)
            lakes.append(("s3://cluster-demo/events", job_options, reader_options))
        with StandaloneCluster(workdir / "cluster", workers=2, worker_env=worker_env) as cluster:
            print(
                f"cluster: {cluster.master_url}, workers: {[w.pid for w in cluster.worker_procs]}", flush=True
            )
            failures = 0
            for i, (lake, job_options, reader_options) in enumerate(lakes):
                result = cluster.submit(
                    JOB,
                    job_args(lake, workdir / f"checkpoint-{i}", source, job_options, args.mode),
                    name=f"stream-to-lake-{i}",
                    env=worker_env,  # the driver reads the lake's metadata too
                    timeout=args.timeout,
                )
                assert isinstance(result, SubmitResult)
                print(
                    f"job {i} ({lake}): exit {result.returncode} in {result.seconds:.0f}s, log {result.log}"
                )
                if result.returncode != 0:
                    print(result.output()[-4000:], file=sys.stderr)
                    failures += 1
                    continue
                try:
                    print("  " + check_lake(lake, reader_options, expected), flush=True)
                except AssertionError as exc:
                    print(f"  FAILED: {exc}", file=sys.stderr)
                    failures += 1
        return 1 if failures else 0
    finally:
        if moto is not None:
            stop_moto(moto)
            _REGISTRY.pop(moto.pid, None)
        stop_all()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo", help="standalone cluster; stream a local and an S3 (moto) lake; read both back"
    )
    d.add_argument("--workdir", default=str(ROOT / "demo" / "cluster"), help="wiped and rewritten")
    d.add_argument("--mode", choices=("foreach", "epoch"), default="foreach")
    d.add_argument("--files", type=int, default=4, help="input files (2 per epoch)")
    d.add_argument("--rows-per-file", type=int, default=5_000)
    d.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    d.add_argument("--no-s3", dest="s3", action="store_false", help="local lake only")
    args = p.parse_args(argv)
    if args.files < 1 or args.rows_per_file < 1:
        p.error(f"--files and --rows-per-file must be >= 1, got {args.files} and {args.rows_per_file}")
    install_signal_handlers()
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
