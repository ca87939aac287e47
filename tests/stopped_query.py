"""A ``write_stream`` query stopped while a batch runs (issue 53, item 1): run by
``tests/test_foreach_batch.py`` in a process of its own, whose stderr the test reads.

    python tests/stopped_query.py LAKE CHECKPOINT DRIVER_WRITE

Each micro-batch takes ~3 s (a sleeping ``mapInArrow``); the query is stopped 12 s after its
start. Prints ``INTERRUPTED`` when the stop landed inside a batch (the door raised its short
error), then ``STOPPED``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

import lakesink
from lakesink.spark import batches


def slow(parts: Iterator[Any]) -> Iterator[Any]:
    import time

    for part in parts:
        time.sleep(3)
        yield part


def main(lake: str, checkpoint: str, driver_write: str) -> None:
    door = batches.LakeBatchWrite.__call__

    def noted(self: Any, df: Any, batch_id: int) -> None:
        try:
            door(self, df, batch_id)
        except batches.BatchInterrupted:
            print("INTERRUPTED", flush=True)
            raise

    batches.LakeBatchWrite.__call__ = noted  # type: ignore[method-assign]
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    lakesink.register(spark, warm_up=False)
    df = spark.readStream.format("rate").option("rowsPerSecond", 100).load()
    query = lakesink.write_stream(
        df.mapInArrow(slow, "timestamp timestamp, value long"), lake, checkpoint_location=checkpoint,
        trigger={"processingTime": "1 second"}, driver_write=driver_write,
    )  # fmt: skip
    time.sleep(12)
    query.stop()
    print("STOPPED", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
