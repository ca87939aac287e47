"""Shared fixtures: one local SparkSession for the whole run, and lake invariants."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent

# Spark's Python workers must run this interpreter (the venv's), and must be able to import
# the test helpers that tests hand to them (fault-injecting writers live in tests/faults.py).
# The checkout's root goes on their path too, as site-packages would be for an installed
# lakesink: that is where pyspark's discovery of Python data sources finds pyspark_lakesink
# (the editable install maps packages through an import hook that discovery cannot see).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(TESTS_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

pytest_plugins = ["s3server", "kafkaserver", "hdfsserver"]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession (starting one costs ~8 s): 2 threads, up to 4 task attempts."""
    from devtools.kafka import CONNECTOR_JARS, KafkaJarsMissing, jars
    from devtools.spark import local_session

    conf = {}
    try:
        # Spark's Kafka connector (make kafka-jars, a prerequisite of make test): test_kafka.py's
        # drivers that need format("kafka") run on this session rather than start a JVM each.
        conf["spark__jars"] = ",".join(str(j) for j in jars(CONNECTOR_JARS))
    except KafkaJarsMissing:
        pass  # those tests say so (kafka_session); every other test runs without it
    session = local_session("lakesink-tests", master="local[2,4]", **conf)
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> str:
    return str(tmp_path / "lake")
