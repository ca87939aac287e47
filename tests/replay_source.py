"""A replayable streaming source with Kafka-shaped offsets, for tests of restarts from the lake.

Spark's workers import it by name (conftest puts tests/ on their path). It reads ids from
``start`` (option) up to the number in the file ``limit_file`` (read at each trigger), as one
topic ``ev`` with one partition: offsets ``{"ev": {"0": n}}``, the next id to read, as Kafka's
are. Like Kafka, a query started at an offset reads from there; unlike Kafka, it does not
record its initial offsets in the checkpoint, so a continuing query declares them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class ReplayReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.start = int(options.get("start", "0"))
        self.limit_file = options["limit_file"]

    def initialOffset(self) -> dict[str, Any]:
        return {"ev": {"0": self.start}}

    def latestOffset(self) -> dict[str, Any]:
        with open(self.limit_file) as f:
            return {"ev": {"0": max(self.start, int(f.read().strip()))}}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        low, high = start["ev"]["0"], end["ev"]["0"]
        middle = (low + high) // 2
        return [InputPartition((low, middle)), InputPartition((middle, high))]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, str]]:
        low, high = partition.value
        for i in range(low, high):
            yield (i, f"r{i}")


class ReplaySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "lakesink_test_replay"

    def schema(self) -> str:
        return "id long, label string"

    def streamReader(self, schema: Any) -> ReplayReader:
        return ReplayReader(self.options)
