"""spark-submit app for tests/test_cluster.py: jobs/stream_to_lake.py plus a "hang once" stage.

The first task that has passed ``--hang-after-rows`` rows downstream creates ``--hang-marker``
holding "PID PARTITION" (its Python worker's PID, the partition it writes) and sleeps, so the
test can kill -9 that task's executor (or its worker) once the sink holds a staged file of
that partition. The marker appears whole and only once (a hard link of a finished file:
only one task ever hangs); every retry finds it and runs through. The stage sits upstream of
the sink in the same task, so the sink code under test is the unmodified lakesink writer.

Sink settings are shrunk (tiny row groups, small foreach batches) so a staged file really
has bytes in storage by the time the task hangs. The marker is a local file: valid only
because this "cluster" shares one host (a test handshake, not a deployment pattern).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

import stream_to_lake as job

SMALL_ROW_GROUP = 1 << 10  # WriteOptions' minimum: every flushed batch becomes a row group


def hang_once(df: Any, after_rows: int, marker: str, slice_rows: int = 250) -> Any:
    """Pass batches through in slices of ``slice_rows``; hang once after ``after_rows`` rows."""

    def stage(batches: Any) -> Any:
        import os
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else -1
        seen = 0
        armed = True
        for batch in batches:
            for start in range(0, batch.num_rows, slice_rows):
                piece = batch.slice(start, slice_rows)
                yield piece
                seen += piece.num_rows
                if armed and seen >= after_rows:
                    armed = False
                    if claim(marker, f"{os.getpid()} {partition}\n"):
                        # Bounded, so a worker the test failed to kill still goes away by itself.
                        time.sleep(600)

    return df.mapInArrow(stage, df.schema)


def claim(marker: str, content: str) -> bool:
    """Create ``marker`` holding ``content``, whole, unless it exists: whether this call did."""
    import os

    draft = f"{marker}.{os.getpid()}.draft"
    with open(draft, "w") as f:
        f.write(content)
    try:
        os.link(draft, marker)  # atomic, and fails if the marker exists
    except FileExistsError:
        return False  # another task (or an earlier attempt) already hung
    finally:
        os.unlink(draft)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hang-marker", required=True)
    p.add_argument("--hang-after-rows", type=int, required=True)
    own, rest = p.parse_known_args(argv)
    if own.hang_after_rows < 1:
        p.error(f"--hang-after-rows must be >= 1, got {own.hang_after_rows}")

    build_stream = job.build_stream

    def build_with_hang(spark: Any, args: argparse.Namespace) -> Any:
        return hang_once(build_stream(spark, args), own.hang_after_rows, own.hang_marker)

    def start_small(df: Any, args: argparse.Namespace, options: dict[str, Any]) -> Any:
        trigger = {"availableNow": True}
        if args.mode == "epoch":
            from lakesink import write_stream

            door = {"via": args.via} if args.via else {}  # else write_stream's default door
            if args.via != "data_source":  # the tasks write, on the executors this test kills
                door["driver_write"] = "never"
            return write_stream(
                df,
                args.lake,
                checkpoint_location=args.checkpoint,
                storage_options=options,
                trigger=trigger,
                row_group_bytes=SMALL_ROW_GROUP,
                **door,
            )
        from lakesink import LakeForeachWriter, WriteOptions

        writer = LakeForeachWriter(
            args.lake,
            schema=df.schema,
            storage_options=options,
            batch_rows=100,
            write_options=WriteOptions(row_group_bytes=SMALL_ROW_GROUP),
        )
        return (
            df.writeStream.foreach(writer)
            .option("checkpointLocation", args.checkpoint)
            .trigger(**trigger)
            .start()
        )

    # run() looks both up as module globals at call time.
    job.build_stream = build_with_hang
    job.start_query = start_small
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    return int(job.run(job.parse_args(rest)))


if __name__ == "__main__":
    sys.exit(main())
