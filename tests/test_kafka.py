"""Kafka end to end with a real broker: ``format("kafka")`` into a lake, exactly once, under faults.

A producer feeds a topic of 3 partitions while jobs/stream_to_lake.py (``--source kafka``, in a
subprocess of its own with the connector on ``spark.jars``) writes a lake, in epoch mode
(``format("lakesink")``) and in foreach mode. Meanwhile:

- the job is killed with -9 (driver, JVM and Python workers: its process group) mid-epoch --
  an epoch whose offsets Spark has written and whose commit it has not -- and restarted from
  its checkpoint;
- the broker is killed (or stopped) mid-epoch and started again on the same port;
- a task fails once upstream of the sink (``--fail-once-after-rows``) and Spark retries it.

In the end the lake holds every record of the topic exactly once, counted by Kafka's
(partition, offset), which the job writes into the lake. ``make test`` runs one driver kill and
one broker kill per mode; ``make chaos`` (``LAKESINK_CHAOS_KILLS``) many more, in a longer run.

Upstream transactions: with ``kafka.isolation.level=read_committed`` no record of an aborted
transaction reaches the lake.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafkaserver import KafkaBroker

from devtools.kafka import create_topic, topic_records
from lakesink_reader import read_committed

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "stream_to_lake.py"
KILLS = int(os.environ.get("LAKESINK_CHAOS_KILLS", "0"))
RUN_TIMEOUT = 240.0

pytestmark = [
    pytest.mark.kafka,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy calls.
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]


# -- the producer ---------------------------------------------------------------------------


class Producer(threading.Thread):
    """Sends ``r<n>`` records round-robin over the topic's partitions, about ``rate`` a second,
    until ``finish()``; keeps the values Kafka acknowledged. Idempotent, acks=all: its retries
    across a broker restart write no duplicates."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int = 300) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate
        self.stopping = threading.Event()
        self.acked: set[str] = set()
        self.failed: list[str] = []
        self.sent = 0

    def run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
            retries=1_000_000, delivery_timeout_ms=120_000, request_timeout_ms=10_000,
        )  # fmt: skip
        burst = max(1, self.rate // 20)
        try:
            while not self.stopping.is_set():
                for _ in range(burst):
                    value = f"r{self.sent}"
                    future = producer.send(self.topic, value.encode(), partition=self.sent % self.partitions)
                    future.add_callback(lambda _md, v=value: self.acked.add(v))
                    future.add_errback(lambda exc, v=value: self.failed.append(f"{v}: {exc}"))
                    self.sent += 1
                time.sleep(0.05)
            producer.flush(120)
        finally:
            producer.close(30)

    def finish(self) -> None:
        self.stopping.set()
        self.join(180)
        assert not self.is_alive(), "the producer did not flush in 180 s"


# -- the job --------------------------------------------------------------------------------


def job_cmd(kafka: KafkaBroker, topic: str, lake: Path, chk: Path, mode: str, *extra: str) -> list[str]:
    return [
        sys.executable, str(JOB), "--source", "kafka", "--bootstrap", kafka.bootstrap, "--topic", topic,
        "--lake", str(lake), "--checkpoint", str(chk), "--mode", mode, "--verbose", *extra,
    ]  # fmt: skip


class Job:
    """One run of the job in its own process group (killed whole with -9)."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 the whole process group (driver, JVM, Python workers) and reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not finish in {timeout:.0f} s:\n{self.tail()}") from None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def epochs(chk: Path, kind: str) -> set[int]:
    """The epochs with a file in the checkpoint's ``offsets`` (planned) or ``commits`` (done)."""
    try:
        return {int(n) for n in os.listdir(chk / kind) if n.isdigit()}
    except FileNotFoundError:
        return set()


def published(lake: Path, epoch: int) -> bool:
    """Whether a data file of ``epoch`` is published in ``lake`` (staged files are hidden)."""
    try:
        return any(f"-epoch-{epoch:012d}-" in n and n.endswith(".parquet") for n in os.listdir(lake))
    except FileNotFoundError:
        return False


def wait_mid_epoch(
    job: Job, chk: Path, after: int, lake: Path | None = None, timeout: float = 120.0
) -> int | None:
    """Wait until an epoch is in flight (its offsets written, its commit not) after more than
    ``after`` commits -- with ``lake``, until a file of it is published there too (the moment a
    replay under another partitioning would duplicate rows); return the epoch, or None when
    the job exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not job.running():
            return None
        done = epochs(chk, "commits")
        if len(done) > after:
            flying = epochs(chk, "offsets") - done
            if flying and min(flying) > max(done) and (lake is None or published(lake, min(flying))):
                return min(flying)
        time.sleep(0.005)
    raise AssertionError(f"no epoch in flight after {after} commits within {timeout:.0f} s:\n{job.tail()}")


def lake_records(lake: Path) -> list[tuple[int, int, str]]:
    table = read_committed(str(lake), columns=["partition", "offset", "value"])
    return list(zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "value")), strict=True))


def check_exactly_once(lake: Path, kafka: KafkaBroker, topic: str) -> list[tuple[int, int, str]]:
    """The lake holds each record of ``topic`` once: same (partition, offset) set, same values."""
    truth = topic_records(kafka.bootstrap, topic)
    got = lake_records(lake)
    duplicated = {k: n for k, n in Counter((p, o) for p, o, _ in got).items() if n > 1}
    assert not duplicated, f"{len(duplicated)} (partition, offset) pairs in the lake more than once"
    assert {(p, o) for p, o, _ in got} == {(p, o) for p, o, _ in truth}, (
        f"lake {len(got)} records, topic {len(truth)}: "
        f"missing {sorted({(p, o) for p, o, _ in truth} - {(p, o) for p, o, _ in got})[:10]}"
    )
    assert sorted(got) == sorted(truth)
    return got


# -- the pipeline under faults --------------------------------------------------------------


def run_pipeline(kafka: KafkaBroker, tmp_path: Path, mode: str, plan: list[str]) -> None:
    """Stream while a producer produces; apply each fault of ``plan`` mid-epoch (``driver``:
    kill -9 the job, restart it from its checkpoint; ``broker-kill`` / ``broker-stop``: the
    broker, started again); then drain with an availableNow run and check exactly-once."""
    topic = f"ev-{mode}-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 3)
    lake, chk = tmp_path / "lake", tmp_path / "chk"
    # In foreach mode the job reads Kafka through a repartition by (topic, partition), into
    # the same 4 partitions in every run (a replay must see the same partitioning).
    streaming = ["--trigger-seconds", "1", "--max-offsets-per-trigger", "400", "--fail-once-after-rows", "60"]
    producer = Producer(kafka.bootstrap, topic, 3)
    producer.start()
    job: Job | None = None
    runs = 0
    outcomes: list[str] = []
    pending = list(plan)
    try:
        while pending:
            if job is None or not job.running():
                if job is not None:
                    outcomes.append(f"run {runs - 1} exited {job.proc.returncode}")
                assert runs <= len(plan) + 2, f"the job keeps exiting: {outcomes}\n{job and job.tail()}"
                job = Job(job_cmd(kafka, topic, lake, chk, mode, *streaming), tmp_path / f"run-{runs}.log")
                runs += 1
            # A driver is killed once a file of the epoch is published (in either mode).
            at_publish = lake if pending[0] == "driver" else None
            epoch = wait_mid_epoch(job, chk, after=len(epochs(chk, "commits")), lake=at_publish)
            if epoch is None:
                continue  # the job exited (a broker fault it did not outlive): restarted above
            fault = pending.pop(0)
            began = time.monotonic()
            if fault == "driver":
                job.kill()
                outcomes.append(f"driver killed mid-epoch {epoch}, a file of it published")
            else:
                kafka.kill() if fault == "broker-kill" else kafka.stop()
                time.sleep(1.0)
                kafka.start()
                outcomes.append(f"{fault} mid-epoch {epoch}, back in {time.monotonic() - began:.1f} s")
    finally:
        producer.finish()
        if job is not None and job.running():
            job.kill()  # one more kill -9, wherever it is
            outcomes.append("driver killed after the faults")
        kafka.start()
    final = Job(job_cmd(kafka, topic, lake, chk, mode, "--available-now"), tmp_path / f"run-{runs}.log")
    code = final.wait()
    print(f"\n{mode}: " + "; ".join(outcomes) + f"; final run exited {code}")
    assert code == 0, final.tail()
    assert (chk / "_fault_injected").exists(), "the injected task failure did not fire"
    assert not producer.failed, producer.failed[:5]
    got = check_exactly_once(lake, kafka, topic)
    assert {v for _, _, v in got} >= producer.acked
    done = len(epochs(chk, "commits"))
    print(f"  {producer.sent} produced, {len(got)} in the lake once each, over {done} epochs")


@pytest.mark.spark
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["epoch", "foreach"])
def test_kafka_to_lake_exactly_once_through_kills_and_a_broker_restart(
    kafka: KafkaBroker, tmp_path: Path, mode: str
) -> None:
    run_pipeline(kafka, tmp_path, mode, ["driver", "broker-kill"])


@pytest.mark.spark
@pytest.mark.long
@pytest.mark.chaos
@pytest.mark.timeout(300 + 60 * max(KILLS, 9))
@pytest.mark.parametrize("mode", ["epoch", "foreach"])
def test_kafka_to_lake_exactly_once_long(kafka: KafkaBroker, tmp_path: Path, mode: str) -> None:
    faults = ("driver", "broker-kill", "driver", "broker-stop")
    run_pipeline(kafka, tmp_path, mode, [faults[i % len(faults)] for i in range(max(KILLS, 8))])


# -- transactions upstream ------------------------------------------------------------------


def produce_transactions(
    bootstrap: str, topic: str, transactions: int, per: int
) -> tuple[set[str], set[str]]:
    """``transactions`` transactions of ``per`` records over 3 partitions, every third aborted;
    returns the values committed and the values aborted."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"lakesink-test-{topic}")
    committed: set[str] = set()
    aborted: set[str] = set()
    try:
        producer.init_transactions()
        for t in range(transactions):
            producer.begin_transaction()
            values = [f"t{t}-{i}" for i in range(per)]
            for i, value in enumerate(values):
                producer.send(topic, value.encode(), partition=i % 3)
            producer.flush()
            if t % 3 == 1:
                producer.abort_transaction()
                aborted.update(values)
            else:
                producer.commit_transaction()
                committed.update(values)
    finally:
        producer.close(30)
    return committed, aborted


@pytest.mark.spark
def test_read_committed_keeps_aborted_transactions_out_of_the_lake(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    topic = f"tx-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 3)
    committed, aborted = produce_transactions(kafka.bootstrap, topic, transactions=9, per=30)
    # The aborted records are in the log: a read_uncommitted consumer sees them.
    assert {v for _, _, v in topic_records(kafka.bootstrap, topic, isolation_level="read_uncommitted")} == (
        committed | aborted
    )
    lake, chk = tmp_path / "lake", tmp_path / "chk"
    job = Job(
        job_cmd(kafka, topic, lake, chk, "epoch", "--available-now", "--max-offsets-per-trigger", "50",
                "--isolation-level", "read_committed"),
        tmp_path / "run.log",
    )  # fmt: skip
    assert job.wait() == 0, job.tail()
    got = check_exactly_once(lake, kafka, topic)
    values = [v for _, _, v in got]
    assert not set(values) & aborted, f"{len(set(values) & aborted)} aborted records reached the lake"
    assert sorted(values) == sorted(committed)


# -- the job's arguments (no Spark) ---------------------------------------------------------


def load_job() -> Any:
    spec = importlib.util.spec_from_file_location("stream_to_lake_under_test", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        ([], "--source kafka needs --bootstrap HOST:PORT and --topic T"),
        (["--bootstrap", "h:1", "--topic", "t", "--starting-offsets", "lake"], "is not there yet"),
        (["--bootstrap", "h:1", "--topic", "t", "--starting-offsets", "[1]"], "a JSON object"),
        (["--bootstrap", "h:1", "--topic", "t", "--max-offsets-per-trigger", "-1"], "must be >= 0"),
        (["--bootstrap", "h:1", "--topic", "t", "--kafka-option", "novalue"], "takes KEY=VALUE"),
    ],
)
def test_kafka_arguments_are_checked(
    tmp_path: Path, args: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = load_job()
    with pytest.raises(SystemExit):
        job.parse_args(
            ["--lake", str(tmp_path / "l"), "--checkpoint", str(tmp_path / "c"), "--source", "kafka", *args]
        )
    assert complaint in capsys.readouterr().err


def test_missing_connector_jars_name_make(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(JOB), "--lake", str(tmp_path / "l"), "--checkpoint", str(tmp_path / "c"),
         "--source", "kafka", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--kafka-jars", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "make kafka-jars" in out.stdout and "spark-sql-kafka-0-10" in out.stdout
