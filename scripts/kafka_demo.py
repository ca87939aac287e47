"""`make run-kafka`: Kafka -> Spark -> a lake, exactly once across a kill -9 of the job.

Starts a single-node Kafka broker on 127.0.0.1 (devtools/kafka.py; jars from `make
kafka-jars`), creates a topic of 3 partitions and produces records into it while
jobs/stream_to_lake.py (`--source kafka`) streams them into ./demo/kafka-lake. The job is
killed with -9 (its whole process group) after a few epochs, then restarted from its checkpoint
with availableNow once the producer is done. With ``--from-lake`` (epoch mode, a format-3
lake) the checkpoint is deleted after the kill instead, and the job restarts from the offsets
the lake recorded (``lakesink offsets``; ``--starting-offsets lake``): docs/guide/kafka.md's recovery
procedure. The reader then counts the lake's records by Kafka (partition, offset) against the
topic. The broker is stopped by PID whatever happens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # devtools/ is not installed: it is found from the checkout

from devtools.kafka import KafkaBroker, create_topic, topic_records  # noqa: E402
from devtools.stream_job import JOB  # noqa: E402

DEMO = ROOT / "demo"
TOPIC = "events"


def produce(bootstrap: str, records: int, rate: int, done: list[int]) -> None:
    """``records`` records over 3 partitions at about ``rate`` a second; idempotent, acks=all."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    try:
        burst = max(1, rate // 20)
        for start in range(0, records, burst):
            for n in range(start, min(start + burst, records)):
                producer.send(TOPIC, f"event-{n}".encode(), key=str(n % 97).encode(), partition=n % 3)
            time.sleep(0.05)
        producer.flush(60)
        done.append(records)
    finally:
        producer.close(30)


def job(
    broker: KafkaBroker, mode: str, log: Path, *extra: str, start: str = "earliest"
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, str(JOB), "--source", "kafka", "--bootstrap", broker.bootstrap, "--topic", TOPIC,
        "--starting-offsets", start, "--max-offsets-per-trigger", "2000", "--trigger-seconds", "1",
        "--mode", mode, "--lake", str(DEMO / "kafka-lake"), "--checkpoint", str(DEMO / "kafka-checkpoint"),
        "--fail-once-after-rows", "300", *extra,
    ]  # fmt: skip
    print("$", " ".join(cmd[1:]), f"> {log.relative_to(ROOT)}", flush=True)
    out = open(log, "wb")  # noqa: SIM115 - the child keeps its own descriptor
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


def commits() -> int:
    folder = DEMO / "kafka-checkpoint" / "commits"
    return sum(1 for n in os.listdir(folder) if n.isdigit()) if folder.is_dir() else 0


def report(broker: KafkaBroker, injected: str | None = None) -> int:
    from lakesink_reader import read_committed

    table = read_committed(str(DEMO / "kafka-lake"), columns=["partition", "offset"])
    pairs = list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    topic = {(p, o) for p, o, _ in topic_records(broker.bootstrap, TOPIC)}
    duplicated = sum(n - 1 for n in Counter(pairs).values())
    missing = len(topic - set(pairs))
    per_partition = Counter(p for p, _ in pairs)
    print(
        f"\nread_committed: {len(pairs)} records, by partition {dict(sorted(per_partition.items()))}; "
        f"topic {TOPIC} holds {len(topic)}: {missing} missing, {duplicated} duplicated "
        f"(counted by Kafka partition and offset)"
    )
    marker = DEMO / "kafka-checkpoint" / "_fault_injected"
    injected = injected or (marker.read_text().strip() if marker.exists() else None)
    print(f"injected task failure: {injected or 'did not fire'}")
    return 0 if missing == 0 and duplicated == 0 and len(pairs) == len(topic) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=("foreach", "epoch"), default="foreach")
    p.add_argument("--records", type=int, default=30_000)
    p.add_argument("--rate", type=int, default=2_000, help="records a second")
    p.add_argument(
        "--from-lake",
        action="store_true",
        help="epoch mode: delete the checkpoint after the kill and restart from the lake's offsets",
    )
    args = p.parse_args()
    if args.from_lake and args.mode != "epoch":
        p.error("--from-lake needs --mode epoch (a foreach lake records no offsets)")
    for stale in ("kafka", "kafka-lake", "kafka-checkpoint"):
        shutil.rmtree(DEMO / stale, ignore_errors=True)
    DEMO.mkdir(exist_ok=True)
    broker = KafkaBroker(DEMO / "kafka")
    broker.start()
    print(f"kafka broker on {broker.bootstrap} (pid {broker.process.pid if broker.process else '?'}): "
          f"started in {broker.started_in:.1f} s, {broker.rss_bytes() / 2**20:.0f} MiB RSS")  # fmt: skip
    running: subprocess.Popen[bytes] | None = None
    try:
        create_topic(broker.bootstrap, TOPIC, 3)
        done: list[int] = []
        producer = threading.Thread(target=produce, args=(broker.bootstrap, args.records, args.rate, done))
        producer.start()
        print(f"producing {args.records} records into {TOPIC} (3 partitions), ~{args.rate}/s; "
              f"streaming them in {args.mode} mode", flush=True)  # fmt: skip
        running = job(broker, args.mode, DEMO / "kafka-run-1.log")
        deadline = time.monotonic() + 180
        while commits() < 3 and running.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if running.poll() is not None:
            print(f"the job exited with {running.returncode} before it was killed: see demo/kafka-run-1.log")
            return 1
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
        print(
            f"killed the job with -9 after {commits()} committed epochs, while records kept coming",
            flush=True,
        )
        producer.join()
        restart: tuple[str, ...] = ("--available-now",)
        injected = None
        if args.from_lake:
            marker = DEMO / "kafka-checkpoint" / "_fault_injected"
            injected = marker.read_text().strip() if marker.exists() else None
            shutil.rmtree(DEMO / "kafka-checkpoint")
            offsets = subprocess.run(
                [sys.executable, "-m", "lakesink.cli", "offsets", str(DEMO / "kafka-lake")],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
            print(f"deleted the checkpoint; `lakesink offsets demo/kafka-lake` prints {offsets}", flush=True)
        where = "the lake's offsets" if args.from_lake else "its checkpoint"
        print(f"produced {done[0] if done else '?'} records; restarting the job from {where} "
              "(availableNow: it stops when it has caught up)", flush=True)  # fmt: skip
        start = "lake" if args.from_lake else "earliest"
        running = job(broker, args.mode, DEMO / "kafka-run-2.log", *restart, start=start)
        if running.wait(300) != 0:
            print(f"the restarted job failed ({running.returncode}): see demo/kafka-run-2.log")
            return 1
        print(f"the restarted job caught up: {commits()} epochs in {'its run' if args.from_lake else 'all'}")
        return report(broker, injected)
    finally:
        if running is not None and running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
            running.wait()
        pid = broker.process.pid if broker.process else None
        broker.stop()
        print(f"stopped the kafka broker (pid {pid})")


if __name__ == "__main__":
    sys.exit(main())
