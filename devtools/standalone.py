"""A throwaway Spark standalone cluster on 127.0.0.1: master, workers, their executors, spark-submit.

    with StandaloneCluster(workdir) as cluster:
        result = cluster.submit(app, [...args...])

Every process is started through ``devtools.procs`` and stopped by PID (also when a job
fails, and at interpreter exit); the executor JVMs and Python workers the workers spawned are
swept by PID after them. Jobs get lakesink only from the shipped zip (``devtools.shipping``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devtools.procs import Started, alive, ancestors, cmdline, descendants, launch, stop, wait_for_log
from devtools.shipping import build_pyfiles_zip, clean_env, executor_python, spark_home

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
REGISTERED = r"Successfully registered with master"

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


@dataclass(frozen=True)
class SubmitResult:
    """A finished spark-submit: its exit code, its log (driver output) and how long it ran."""

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
    master: Started | None = field(default=None, init=False)
    worker_procs: list[Started] = field(default_factory=list, init=False)
    master_url: str = field(default="", init=False)
    ui_url: str = field(default="", init=False)
    #: The ``--py-files`` zip and the executors' Python; set by :meth:`start`.
    pyfiles: Path = field(default=Path(), init=False)
    python: Path = field(default=Path(), init=False)

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

    # -- daemons -------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Build the zip and the executor Python, start the master, then the workers; return once
        every worker has registered."""
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
        cmd = _spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
        )  # fmt: skip
        self.master = launch("master", cmd, self.workdir / "logs" / "master.log", env, cwd=self.workdir)
        port = wait_for_log(self.master, r"Starting Spark master at spark://127\.0\.0\.1:(\d+)", timeout)[1]
        ui = wait_for_log(self.master, r"Successfully started service 'MasterUI' on port (\d+)", timeout)[1]
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
        cmd = _spark_class(
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
            wait_for_log(worker, REGISTERED, timeout)
        return worker

    def ensure_workers(self, count: int, timeout: float = 120.0) -> None:
        """Start replacements until ``count`` of our workers run and are registered (after a kill)."""
        for worker in self.worker_procs:
            if not worker.running():
                stop(worker)  # reaps and unregisters it (what it spawned was re-parented: not ours)
        running = [w for w in self.worker_procs if w.running()]
        for _ in range(count - len(running)):
            self.start_worker(wait=False)
        self.wait_for_workers(timeout)

    def wait_for_workers(self, timeout: float = 120.0) -> None:
        """Wait until every running worker of ours has logged its registration with the master.

        The worker's own log, not the master's list: the master keeps showing a killed worker
        as ALIVE until it notices, which would make a count-based wait pass too early.
        """
        for worker in self.worker_procs:
            if worker.running():
                wait_for_log(worker, REGISTERED, timeout)

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

    # -- executors -----------------------------------------------------------------------------

    def executor_of(self, pid: int) -> int:
        """The executor JVM that ``pid`` (a Python worker of a task) runs under."""
        for parent in ancestors(pid):
            if EXECUTOR_CLASS in cmdline(parent):
                return parent
        raise LookupError(
            f"pid {pid} does not run under an executor of this cluster ({cmdline(pid)[:200]!r})"
        )

    def worker_of(self, executor_pid: int) -> Started:
        """The worker of ours that started ``executor_pid``."""
        for worker in self.worker_procs:
            if executor_pid in descendants(worker.pid):
                return worker
        raise LookupError(f"executor pid {executor_pid} belongs to no worker of this cluster")

    # -- jobs ----------------------------------------------------------------------------------

    def start_submit(
        self,
        app: Path,
        app_args: Sequence[str],
        *,
        name: str = "job",
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        py_files: Sequence[Path] = (),
    ) -> Started:
        """Start ``spark-submit --master spark://...`` of ``app`` in client mode (the driver runs
        here); stop it with ``devtools.procs.stop``.

        The executors run :attr:`python` and import lakesink from the shipped zip. ``env`` is
        the driver's extra environment; its output goes to :meth:`log_of` ``name``.
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
        log = self.log_of(name)
        log.unlink(missing_ok=True)
        return launch(f"spark-submit {name}", cmd, log, clean_env(env), cwd=self.workdir)

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
    ) -> SubmitResult:
        """:meth:`start_submit`, then wait for it to end: its result (TimeoutError, with the end
        of its log, after ``timeout`` seconds; it is stopped either way)."""
        started = self.start_submit(app, app_args, name=name, conf=conf, env=env, py_files=py_files)
        t0 = time.monotonic()
        try:
            returncode = started.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{name} did not finish within {timeout:.0f}s; its log {started.log} ends:\n{started.tail()}"
            ) from None
        finally:
            stop(started)  # reaps it and sweeps anything it left (its Python driver)
        return SubmitResult(returncode, self.log_of(name), time.monotonic() - t0)

    def log_of(self, name: str) -> Path:
        """The log of the job submitted as ``name``: spark-submit's and the driver's output."""
        return self.workdir / "logs" / f"{name}.log"


def _spark_class(*args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), *args]
