"""A throwaway HDFS on 127.0.0.1 for tests and demos: a MiniDFSCluster, started, waited for, stopped by PID.

Hadoop's own ``MiniDFSCluster`` (a real NameNode and one DataNode in one JVM, replication 1,
NameNode RPC and HTTP ports chosen free by the kernel, a temporary base directory). The jars
come from ``java/hdfs/pom.xml``: ``make hdfs-jars`` copies them into ``java/hdfs/jars`` and
compiles the launcher ``java/hdfs/src/main/java/lakesink/devtools/MiniHdfs.java`` into
``java/hdfs/classes``. The launcher prints ``READY hdfs://127.0.0.1:PORT HTTP_PORT`` when the
DataNode has registered, and shuts the cluster down when its standard input closes: when we
close it, or when our process dies. Measured here: ready in ~6-7 s, ~280 MB RSS (``-Xmx768m``).

Fault tests drive it through :func:`hdfs_command` (a line on the launcher's stdin):
``stop-datanode``, ``start-datanode``, ``restart-namenode`` (same port, from what the NameNode
had persisted).

``python -m devtools.hdfs`` starts one, prints its URL and stops it on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.procs import Started, adopt, install_signal_handlers, serve_in_foreground, stop, wait_for_log

ROOT = Path(__file__).resolve().parent.parent
HDFS_DIR = ROOT / "java" / "hdfs"
JARS = HDFS_DIR / "jars"
CLASSES = HDFS_DIR / "classes"
MAIN = "lakesink.devtools.MiniHdfs"
READY = r"READY (hdfs://127\.0\.0\.1:\d+) (\d+)"

#: Hadoop's log4j 1.x (reload4j) configuration: warnings only, so that the log stays small.
LOG4J = """\
log4j.rootLogger=WARN, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=%d %p %c{1}: %m%n
"""


class HdfsJarsMissing(RuntimeError):
    """The MiniDFSCluster's jars or launcher are not built: ``make hdfs-jars`` builds them."""


def classpath() -> str:
    """The launcher's class path; HdfsJarsMissing naming ``make hdfs-jars`` when it is not built."""
    jars = sorted(JARS.glob("*.jar")) if JARS.is_dir() else []
    if not jars or not (CLASSES / "lakesink" / "devtools" / "MiniHdfs.class").is_file():
        raise HdfsJarsMissing(
            f"the MiniDFSCluster is not built ({JARS}, {CLASSES}): run `make hdfs-jars` "
            "(Maven copies the jars of java/hdfs/pom.xml, javac compiles the launcher)"
        )
    return os.pathsep.join([str(CLASSES), *(str(j) for j in jars)])


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("no java on PATH (the MiniDFSCluster needs Java 17 or 21)")
    return found


@dataclass
class HdfsServer:
    """A running MiniDFSCluster: its NameNode URL, web UI port, base directory and process."""

    url: str  # hdfs://127.0.0.1:PORT
    http_port: int
    base_dir: Path
    process: Started
    started_in: float
    owns_base_dir: bool = True

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def rss_bytes(self) -> int:
        """Resident memory of the cluster's JVM now (0 once it has exited)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0


def start_hdfs(
    base_dir: Path | None = None,
    *,
    heap: str = "768m",
    timeout: float = 90.0,
    datanodes: int = 1,
    conf: dict[str, str] | None = None,
) -> HdfsServer:
    """Start a MiniDFSCluster on 127.0.0.1 and wait until its DataNode has registered.

    Parameters
    ----------
    base_dir
        Where the NameNode and DataNode keep their data and the log goes; a fresh temporary
        directory (removed by :func:`stop_hdfs`) when None.
    heap
        The JVM's ``-Xmx``.
    timeout
        Seconds to wait for the READY line.
    datanodes
        How many DataNodes; ``dfs.replication`` is set to the same number.
    conf
        Hadoop keys for the NameNode and DataNodes, set over the launcher's own (for example
        ``{"dfs.namenode.file.close.num-committed-allowed": "1"}``).

    Raises
    ------
    HdfsJarsMissing
        When ``make hdfs-jars`` has not run.
    RuntimeError, TimeoutError
        When the cluster exits or is not ready in time (with the end of its log).
    """
    cp = classpath()
    owns = base_dir is None
    base = Path(tempfile.mkdtemp(prefix="lakesink-minihdfs-")) if base_dir is None else base_dir
    base.mkdir(parents=True, exist_ok=True)
    (base / "log4j.properties").write_text(LOG4J)
    log = base / "minihdfs.log"
    cmd = [java(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
           f"-Dlog4j.configuration=file:{base / 'log4j.properties'}",
           "-cp", cp, MAIN, str(base / "data"), "--datanodes", str(datanodes)]  # fmt: skip
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    # The environment of a Hadoop client (HADOOP_CONF_DIR, a CLASSPATH) must not configure the cluster.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOOP_") and k != "CLASSPATH"}
    began = time.monotonic()
    with open(log, "ab") as out:
        # stdin is a pipe that only we hold: the launcher stops when it closes (we stop it, or die).
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    started = adopt("minihdfs", proc, log)
    try:
        match = wait_for_log(started, READY, timeout)
    except BaseException:
        stop(started, timeout=5)
        if owns:
            shutil.rmtree(base, ignore_errors=True)
        raise
    return HdfsServer(match.group(1), int(match.group(2)), base, started, time.monotonic() - began, owns)


#: What the launcher takes on stdin (see MiniHdfs.java).
COMMANDS = ("stop-datanode", "start-datanode", "restart-namenode")


def hdfs_command(server: HdfsServer, command: str, timeout: float = 60.0) -> float:
    """Send ``command`` to the running cluster and wait until it took effect; returns the seconds.

    RuntimeError when the launcher reports it FAILED (with its reason) or exits, TimeoutError
    when it does not answer within ``timeout``.
    """
    if command not in COMMANDS:
        raise ValueError(f"unknown MiniDFSCluster command {command!r}; known: {list(COMMANDS)}")
    answer = re.compile(rf"^(DONE|FAILED) {re.escape(command)}(: .*)?$", re.MULTILINE)
    before = len(answer.findall(server.process.tail(10**9)))
    stdin = server.process.proc.stdin
    if stdin is None or stdin.closed:
        raise RuntimeError(f"the MiniDFSCluster (pid {server.pid}) takes no more commands: stopped")
    began = time.monotonic()
    stdin.write(f"{command}\n".encode())
    stdin.flush()
    while True:
        answers = answer.findall(server.process.tail(10**9))
        if len(answers) > before:
            status, reason = answers[-1]
            if status == "FAILED":
                raise RuntimeError(f"MiniDFSCluster {command} failed{reason}")
            return time.monotonic() - began
        if not server.process.running():
            raise RuntimeError(f"the MiniDFSCluster (pid {server.pid}) exited during {command}")
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"MiniDFSCluster {command} did not finish within {timeout:.0f} s")
        time.sleep(0.05)


def stop_hdfs(server: HdfsServer, timeout: float = 20.0) -> None:
    """Stop the cluster by PID: close its stdin (it shuts down), then SIGTERM/SIGKILL if it lingers."""
    proc = server.process.proc
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except OSError:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    stop(server.process, timeout=5)
    if server.owns_base_dir:
        shutil.rmtree(server.base_dir, ignore_errors=True)


def main() -> int:
    install_signal_handlers()
    server = start_hdfs()
    print(f"MiniDFSCluster {server.url} (web UI http://127.0.0.1:{server.http_port}, pid {server.pid}) "
          f"ready in {server.started_in:.1f} s, RSS {server.rss_bytes() / 2**20:.0f} MiB; Ctrl-C stops it",
          flush=True)  # fmt: skip
    serve_in_foreground(server.process.running, lambda: stop_hdfs(server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
