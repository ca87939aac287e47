"""jobs/stream_to_lake.py with Spark's ``format("parquet")``: the baseline of the job's launch-to-exit runs.

    spark-submit --master local[2] bench/parquet_job.py --source files --input IN --available-now \\
        --max-files-per-trigger 4 --lake OUT --checkpoint CHK
    python bench/parquet_job.py --master local[2] ...          # the same, with plain python
    python bench/parquet_job.py --through-arrow ...             # behind an identity mapInArrow

It takes the job's arguments (``--mode`` and ``--via`` aside: they choose lakesink's writer)
and runs the job's own ``run``: the same session (spark-submit's, or a plain local one built
as the job builds it), the same input stream, the same line per epoch and the same
"stopping Spark" line before ``spark.stop()`` (its epoch lines count 0 files: the job counts a
lake's, and there is none). Only the sink differs, so the bench's
``submit``/``submit-parquet`` and ``python``/``python-parquet`` runs compare like with like.

``--through-arrow`` puts an identity ``mapInArrow`` between the stream and Spark's sink
(``python-parquet-arrow``): what any Python step in a stream costs Spark from launch to exit
-- a Python worker daemon, task workers that import pyarrow after they fork, the
accumulator server's shutdown in ``spark.stop()`` -- with no lakesink code in it. The gap
between ``python-parquet`` and it is Spark's price for Python; the gap between it and
``python`` is lakesink's own.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The job is a script, not a module of a package: import it from its folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

import stream_to_lake


def identity(batches: Iterator[Any]) -> Iterator[Any]:
    """Each Arrow record batch as it came: a Python step that does nothing."""
    yield from batches


def start_parquet(df: Any, args: argparse.Namespace, options: dict[str, Any]) -> Any:
    """Spark's parquet sink into ``--lake``, with the job's checkpoint and trigger."""
    if options:
        raise ValueError("the parquet baseline writes a local folder: it takes no --storage-option")
    if args.through_arrow:
        df = df.mapInArrow(identity, df.schema)
    return (
        df.writeStream.format("parquet")
        .option("path", args.lake)
        .option("checkpointLocation", args.checkpoint)
        .trigger(**stream_to_lake.trigger_of(args))
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--through-arrow", action="store_true")
    mine, rest = own.parse_known_args(argv)
    args = stream_to_lake.parse_args(rest)
    args.through_arrow = mine.through_arrow
    if args.mode != "foreach" or args.via:
        raise SystemExit("--mode and --via choose lakesink's writer: the parquet baseline takes neither")
    return stream_to_lake.run(args, start=start_parquet)


if __name__ == "__main__":
    sys.exit(main())
