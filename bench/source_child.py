"""Streaming reads in a fresh JVM: a lake (``readStream.format("lakesink")``) or Spark's own
sink output (``readStream.parquet``, which follows its ``_spark_metadata/``) into Spark's
``noop`` sink with ``availableNow``; the child process of the bench's source phase (source.py).

    .venv/bin/python bench/source_child.py {lakesink|parquet} PATH RESULT.json

Two queries, one after the other, in the same session: the first pays the JVM's and the
Python workers' start (a new job's first read), the second reads as a running application does
(the JIT warm, workers kept). Writes, for each, rows (the query's input rows, from its
progress) and seconds from ``start()`` to its end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path[1:1] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

#: Files a micro-batch reads, the same for both sources (lakesink's default).
FILES_PER_TRIGGER = 1000


def main(argv: list[str]) -> int:
    kind, path, result = argv
    from devtools.spark import local_session

    spark = local_session(
        f"lakesink-bench-source-{kind}",
        master="local[2]",
        spark__sql__streaming__numRecentProgressUpdates="100000",
    )
    if kind == "lakesink":
        import lakesink

        lakesink.register(spark)  # as a user calls it: its warm-up starts Python workers meanwhile
    runs = {}
    for run in ("cold", "warm"):
        if kind == "lakesink":
            reader = spark.readStream.format("lakesink")
        else:
            schema = spark.read.parquet(path).schema  # Spark's file source needs it given
            reader = spark.readStream.format("parquet").schema(schema)
        df = reader.option("maxFilesPerTrigger", FILES_PER_TRIGGER).load(path)
        began = time.monotonic()
        query = df.writeStream.format("noop").trigger(availableNow=True).start()
        query.awaitTermination()
        seconds = time.monotonic() - began
        runs[run] = {"rows": sum(p["numInputRows"] for p in query.recentProgress), "seconds": seconds}
    spark.stop()
    Path(result).write_text(json.dumps({"source": kind, **runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
