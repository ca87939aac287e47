"""A throwaway single-node Kafka broker on 127.0.0.1 for tests and demos: started, waited for, stopped by PID.

KRaft (no ZooKeeper), one process that is both broker and controller, plaintext, replication
factors 1, free ports. Its storage is formatted once in ``workdir`` (``StorageTool format
--standalone``); ``stop()`` / ``kill()`` then ``start()`` again brings the same broker back on
the same ports with its data, as a restarted broker would.

The jars come from ``java/kafka/pom.xml`` (``make kafka-jars`` copies them into
``java/kafka/broker-jars``); Spark's Kafka connector, which the jobs put on ``spark.jars``, is
copied beside them into ``java/kafka/connector-jars``. Measured here: listening in ~3 s,
~320 MB RSS (``-Xmx512m``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from devtools.moto import free_port
from devtools.procs import Started, launch, stop, wait_for_log, wait_until

ROOT = Path(__file__).resolve().parent.parent
BROKER_JARS = ROOT / "java" / "kafka" / "broker-jars"
CONNECTOR_JARS = ROOT / "java" / "kafka" / "connector-jars"
#: The log line of a broker that serves clients.
READY = r"Kafka Server started"

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.noisy.name = org.apache.kafka.common.config
logger.noisy.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
"""


class KafkaJarsMissing(RuntimeError):
    """The broker's (or the connector's) jars are not in the cache: ``make kafka-jars`` fills it."""


def jars(folder: Path) -> list[Path]:
    """The jars in ``folder``; KafkaJarsMissing naming ``make kafka-jars`` when there are none."""
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not found:
        raise KafkaJarsMissing(
            f"no jars in {folder}: run `make kafka-jars` (Maven copies them from java/kafka/pom.xml)"
        )
    return found


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("no java on PATH (Kafka needs Java 17 or 21)")
    return found


def cluster_id() -> str:
    """A random KRaft cluster id, as ``kafka-storage random-uuid`` makes them."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass
class KafkaBroker:
    """One KRaft broker+controller process on 127.0.0.1 (see the module docstring)."""

    workdir: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    heap: str = "512m"
    process: Started | None = None
    #: Seconds the last ``start()`` took until the broker logged that it serves clients.
    started_in: float = 0.0
    #: How many times it was started: each start logs to a file of its own.
    starts: int = 0

    @property
    def bootstrap(self) -> str:
        """``HOST:PORT`` for clients (``bootstrap_servers``, Spark's ``kafka.bootstrap.servers``)."""
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """The log of the current (or last) start."""
        return self.workdir / f"broker-{max(self.starts, 1)}.log"

    @property
    def config(self) -> Path:
        return self.workdir / "server.properties"

    def _write_config(self) -> None:
        data = self.workdir / "data"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # After a kill -9 the controller refuses the restarted broker's registration until
            # the old one's session expires (9 s by default): a restart waits for that.
            "broker.session.timeout.ms": "2000",
            "broker.heartbeat.interval.ms": "500",
        }
        self.config.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        (self.workdir / "log4j2.properties").write_text(LOG4J2)

    def _java(self, main: str, *args: str) -> list[str]:
        classpath = os.pathsep.join(str(j) for j in jars(BROKER_JARS))
        return [
            java(), f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp", classpath, main, *args,
        ]  # fmt: skip

    def _format(self) -> None:
        """Format the storage once (a restart keeps it)."""
        if (self.workdir / "data" / "meta.properties").exists():
            return
        self._write_config()
        cmd = self._java("kafka.tools.StorageTool", "format", "--standalone", f"--cluster-id={cluster_id()}",
                         "-c", str(self.config))  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=self._env())
        if done.returncode != 0:
            raise RuntimeError(
                f"formatting Kafka's storage failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            )

    def _env(self) -> dict[str, str]:
        # A CLASSPATH or KAFKA_OPTS from the caller's shell must not leak into the broker.
        return {
            k: v for k, v in os.environ.items() if k not in ("CLASSPATH", "KAFKA_OPTS", "JAVA_TOOL_OPTIONS")
        }

    def start(self, timeout: float = 60.0) -> KafkaBroker:
        """Start the broker (formatting its storage the first time) and wait until it serves."""
        if self.process is not None and self.process.running():
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._format()
        began = time.monotonic()
        self.starts += 1
        self.process = launch(
            "kafka-broker", self._java("kafka.Kafka", str(self.config)), self.log, self._env()
        )
        try:
            wait_for_log(self.process, READY, timeout)
            if not wait_until(self._listening, 10.0):
                raise TimeoutError(f"the broker logged that it started, but {self.bootstrap} does not answer")
        except BaseException:
            self.kill()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def rss_bytes(self) -> int:
        """Resident memory of the broker's JVM now (0 when it does not run)."""
        if self.process is None:
            return 0
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after ``timeout``; by PID."""
        if self.process is not None:
            stop(self.process, timeout)
            self.process = None

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would (its data stays; ``start()`` recovers it)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        stop(self.process, 10.0)  # reaps it and unregisters it
        self.process = None

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Create ``topic`` with ``partitions`` partitions (replication 1) and wait until every
    partition has a leader. Needs ``kafka-python`` (the ``test`` extra)."""
    from kafka import KafkaConsumer  # type: ignore[import-untyped]
    from kafka.admin import KafkaAdminClient, NewTopic  # type: ignore[import-untyped]

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="lakesink-devtools")
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ready = wait_until(lambda: len(consumer.partitions_for_topic(topic) or ()) == partitions, timeout)
        if not ready:
            raise TimeoutError(f"topic {topic} has no {partitions} partitions after {timeout:.0f} s")
    finally:
        consumer.close()


def topic_records(
    bootstrap: str, topic: str, *, isolation_level: str = "read_committed"
) -> list[tuple[int, int, str]]:
    """Every record of ``topic`` from its start to its end now, as (partition, offset, value)."""
    from kafka import KafkaConsumer, TopicPartition  # type: ignore[import-untyped]

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level,
        consumer_timeout_ms=5000,
    )  # fmt: skip
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        found: list[tuple[int, int, str]] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < end[tp] for tp in parts) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                found.extend((tp.partition, r.offset, r.value.decode()) for r in records)
        return found
    finally:
        consumer.close()


def main() -> int:
    """``python -m devtools.kafka``: a broker in the foreground until Ctrl-C (or SIGTERM), for
    the manual restart-from-the-lake steps of docs/guide/kafka.md. Needs ``make kafka-jars``."""
    import sys
    import tempfile

    from devtools.procs import install_signal_handlers, serve_in_foreground

    install_signal_handlers()
    workdir = Path(tempfile.mkdtemp(prefix="lakesink-kafka-"))
    try:
        broker = KafkaBroker(workdir).start()
    except KafkaJarsMissing as exc:
        print(f"{exc}", file=sys.stderr)
        return 2
    print(
        f"Kafka broker {broker.bootstrap} (pid {broker.process.pid if broker.process else '?'}, data "
        f"{workdir}) ready in {broker.started_in:.1f} s, RSS {broker.rss_bytes() / 2**20:.0f} MiB; "
        "Ctrl-C stops it",
        flush=True,
    )
    serve_in_foreground(lambda: broker.process is not None and broker.process.running(), broker.stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
