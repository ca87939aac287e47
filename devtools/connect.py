"""A Spark Connect server on 127.0.0.1 for tests and demos: started, waited for, killed by PID.

pyspark ships the server (``jars/spark-connect_*.jar``); ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` runs it in local mode. Its Python
workers run this interpreter (``PYSPARK_PYTHON``), which has lakesink: that is where
``format("lakesink")`` is found and where a Connect query's lakesink code runs. Clients
connect with ``SparkSession.builder.remote(server.url)``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.moto import free_port
from devtools.procs import Started, launch
from devtools.spark import installed_spark_home, prepare_environment

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    """One Connect server process; ``start()`` again after ``kill()`` reuses its port and log."""

    workdir: Path
    master: str = "local[2,4]"
    port: int = field(default_factory=free_port)
    process: Started | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "connect-server.log"

    def start(self, timeout: float = 120.0) -> ConnectServer:
        prepare_environment()  # PYSPARK_PYTHON, SPARK_LOCAL_IP, a SPARK_HOME view
        home = Path(os.environ.get("SPARK_HOME") or installed_spark_home() or "")
        submit = home / "bin" / "spark-submit"
        if not submit.is_file():
            raise RuntimeError(f"no spark-submit under {home}: is pyspark installed?")
        # No PYTHONPATH: the server's workers import lakesink as installed, as a user's server does.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        cmd = [
            str(submit), "--class", SERVER_CLASS, "--master", self.master,
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.sql.session.timeZone=UTC",
            "--driver-memory", "1g",
            "spark-internal",
        ]  # fmt: skip
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = launch("connect-server", cmd, self.log, env, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while not self._listening():
            if not self.process.running():
                raise RuntimeError(f"the Spark Connect server exited:\n{self.process.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the Spark Connect server did not listen in {timeout:.0f} s:\n{self.log}")
            time.sleep(0.2)
        return self

    def _listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        """SIGKILL the server and whatever it started (its Python workers): its process group."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.process.proc.wait(timeout=30)
        self.process = None

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM (the server stops its queries), then SIGKILL what is left."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            self.process.proc.wait(timeout=grace)
        self.kill()

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    """``python -m devtools.connect``: a Spark Connect server in the foreground until Ctrl-C (or
    SIGTERM); clients connect with ``SparkSession.builder.remote(URL)`` (docs/guide/connect.md)."""
    import tempfile

    from devtools.procs import install_signal_handlers, serve_in_foreground

    install_signal_handlers()
    workdir = Path(tempfile.mkdtemp(prefix="lakesink-connect-"))
    began = time.monotonic()
    server = ConnectServer(workdir).start()
    print(
        f"Spark Connect server {server.url} (pid {server.process.pid if server.process else '?'}, log "
        f"{server.log}) ready in {time.monotonic() - began:.1f} s; "
        f'SparkSession.builder.remote("{server.url}").getOrCreate() reaches it; Ctrl-C stops it',
        flush=True,
    )
    serve_in_foreground(lambda: server.process is not None and server.process.running(), server.stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
