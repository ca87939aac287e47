"""A real Kafka broker (single node, KRaft, plaintext) on free 127.0.0.1 ports, one per test session.

The launcher is ``devtools.kafka`` (``make run-kafka`` uses it too); its jars come from
``make kafka-jars``, a prerequisite of ``make test``. A test may stop or kill the broker: the
``kafka`` fixture brings it back before the next test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devtools.kafka import BROKER_JARS, KafkaBroker, KafkaJarsMissing, jars

__all__ = ["KafkaBroker", "kafka", "kafka_broker"]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    try:
        jars(BROKER_JARS)
    except KafkaJarsMissing as exc:
        pytest.fail(f"{exc} (make test does so first)", pytrace=False)
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    print(f"\nkafka broker on {broker.bootstrap}: started in {broker.started_in:.1f} s, "
          f"{broker.rss_bytes() / 2**20:.0f} MiB RSS")  # fmt: skip
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def kafka(kafka_broker: KafkaBroker) -> Iterator[KafkaBroker]:
    """The session's broker, running; restarted after a test that left it stopped."""
    kafka_broker.start()
    yield kafka_broker
    kafka_broker.start()
