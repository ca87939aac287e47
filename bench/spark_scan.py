"""A batch read of a lake through Spark: ``spark.read.format("lakesink")`` against
``spark.read.parquet`` of the same files (issue 52, item 2: >= 0.95x).

    PYTHONPATH=.:reader .venv/bin/python bench/spark_scan.py --rows 20000000 --turns 3 \\
        --work /tmp/scan-bench --out bench/results/<date>-spark-scan.json

Lake A (``--rows`` rows of the bench's input stream, written once by the job in epoch mode and
kept in ``--work``, as ``lake_to_lake.py`` writes it) is read whole into Spark's ``noop`` sink,
in one ``local[2]`` session of a plain ``SparkSession.builder`` with ``lakesink.register``:

- ``lakesink``: ``spark.read.format("lakesink").load(A)`` (Spark's own Parquet scan of the
  pinned version's files, the default where Spark reaches the store);
- ``python``: the same with ``.option("scan", "python")`` (the Python data source: S3, Connect);
- ``parquet``: ``spark.read.option("basePath", A).parquet(*files)`` over the same files, the
  yardstick.

Each read runs once unmeasured (the JVM's first scan), then ``--turns`` times, the order turned
around every turn; the medians count. Every read must count exactly A's rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[1:1] = [str(BENCH_DIR), str(ROOT), str(ROOT / "reader")]

READS = ("lakesink", "python", "parquet")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20_000_000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--files-per-epoch", type=int, default=4, help="lake A's files per epoch")
    p.add_argument("--work", type=Path, default=Path("/tmp/scan-bench"))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from lake_to_lake import upstream
    from pyspark.sql import SparkSession

    import lakesink
    from lakesink_reader import Lake

    lake = upstream(args.work, args.rows, args.files_per_epoch)
    root = "file://" + str(lake.resolve())
    files = [f"{root}/{f.name}" for f in Lake(str(lake)).files()]
    spark = SparkSession.builder.master("local[2]").appName("spark-scan-bench").getOrCreate()
    lakesink.register(spark)

    def frame(read: str) -> Any:
        if read == "lakesink":
            return spark.read.format("lakesink").load(str(lake))
        if read == "python":
            return spark.read.format("lakesink").option("scan", "python").load(str(lake))
        schema = spark.read.format("lakesink").load(str(lake)).schema
        return spark.read.schema(schema).option("basePath", root).parquet(*files)

    for read in READS:
        counted = frame(read).count()
        if counted != args.rows:
            raise SystemExit(f"{read}: counted {counted:,} rows, lake A holds {args.rows:,}")
        frame(read).write.format("noop").mode("overwrite").save()  # unmeasured: the first scan
    seconds: dict[str, list[float]] = {read: [] for read in READS}
    for turn in range(args.turns):
        for read in READS if turn % 2 == 0 else tuple(reversed(READS)):
            began = time.perf_counter()
            frame(read).write.format("noop").mode("overwrite").save()
            seconds[read].append(time.perf_counter() - began)
            print(f"turn {turn + 1}: {read} {seconds[read][-1]:.2f} s", flush=True)
    spark.stop()
    medians = {read: statistics.median(s) for read, s in seconds.items()}
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "rows": args.rows,
        "files": len(files),
        "seconds": seconds,
        "median_seconds": medians,
        "rows_per_second": {read: args.rows / m for read, m in medians.items()},
        "vs_parquet": {read: medians["parquet"] / m for read, m in medians.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for read in READS:
        print(
            f"{read}: median {medians[read]:.2f} s, {result['vs_parquet'][read]:.2f}x of spark.read.parquet"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
