"""A streaming job that commits epoch 0, then hangs mid-write in epoch 1 (for kill -9 tests).

usage: python killed_job.py INPUT_DIR LAKE CHECKPOINT MARKER
"""

from __future__ import annotations

import sys

from faults import HangAfterRows

from devtools.spark import local_session


def main(source: str, lake: str, checkpoint: str, marker: str) -> None:
    spark = local_session("killed-job", master="local[2]")
    schema = spark.read.parquet(source).schema
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
    writer = HangAfterRows(
        lake, schema=df.schema, after_rows=300, marker=marker, from_epoch=1, batch_rows=100
    )
    query = df.writeStream.foreach(writer).option("checkpointLocation", checkpoint).start()
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
