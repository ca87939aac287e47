"""The streaming job the chaos harness (tests/test_chaos.py) runs, kills with -9 and restarts.

It reads a folder of Parquet files (replayable, one file per epoch), injects task failures on
first attempts of some (epoch, partition) pairs, and writes a lake through a public entry
point: ``write_stream`` (epoch mode; the partition count may change between runs) or
``LakeForeachWriter`` (foreach mode; the partitioning must stay, SPARK-28650), until the input
is consumed (availableNow). The observer marks each protocol step for the harness.

    python tests/chaos_job.py --mode epoch --input DIR --lake PATH --checkpoint DIR --partitions 3
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def fail_some_first_attempts(df: Any, every: int) -> Any:
    """Pass batches through; raise mid-partition on attempt 0 of (epoch + partition) % every == 0."""

    def fn(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        epoch = int(ctx.getLocalProperty("streaming.sql.batchId") or 0) if ctx is not None else 0
        armed = (
            every > 0
            and ctx is not None
            and ctx.attemptNumber() == 0
            and (epoch + ctx.partitionId()) % every == 0
        )
        for i, batch in enumerate(batches):
            if armed and i >= 1:
                raise RuntimeError("chaos: injected task failure")
            yield batch

    return df.mapInArrow(fn, df.schema)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=("epoch", "foreach"), default="epoch")
    p.add_argument("--input", required=True)
    p.add_argument("--lake", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--fail-every", type=int, default=3, help="inject task failures (0: none)")
    p.add_argument("--storage-options", default="{}", help="JSON object")
    p.add_argument("--markers", help="folder for the kill-point observer's markers")
    p.add_argument("--pause", type=float, default=0.0, help="seconds the observer pauses at each step")
    args = p.parse_args(argv)

    from chaos_hooks import KillPoints

    from devtools.spark import local_session
    from lakesink import LakeForeachWriter, WriteOptions, write_stream

    # Small Arrow batches so that a task sees several batches (failures land mid-partition).
    spark = local_session(
        "lakesink-chaos", master="local[2,4]", spark__sql__execution__arrow__maxRecordsPerBatch="50"
    )
    df = spark.readStream.schema("id long, label string").option("maxFilesPerTrigger", 1).parquet(args.input)
    df = fail_some_first_attempts(df.repartition(args.partitions), args.fail_every)
    observer = KillPoints(args.markers, args.pause) if args.markers else None
    options = json.loads(args.storage_options)
    if args.mode == "epoch":
        query = write_stream(
            df,
            args.lake,
            checkpoint_location=args.checkpoint,
            storage_options=options,
            trigger={"availableNow": True},
            row_group_bytes=1 << 10,
            observer=observer,
        )
    else:
        writer = LakeForeachWriter(
            args.lake,
            schema=df.schema,
            storage_options=options,
            batch_rows=50,
            write_options=WriteOptions(row_group_bytes=1 << 10),
            observer=observer,
        )
        query = (
            df.writeStream.foreach(writer)
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    try:
        query.awaitTermination()
    except Exception:  # noqa: BLE001 - reported below
        pass
    error = query.exception()
    spark.stop()
    if error is not None:
        print(f"chaos job failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
