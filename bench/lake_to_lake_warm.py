"""Lake to lake in one warm session: each route's micro-batches, Spark's own timings.

    PYTHONPATH=.:reader .venv/bin/python bench/lake_to_lake_warm.py /tmp/l2l-bench/a-4000000 \\
        /tmp/l2l-bench 3 > /tmp/l2l-bench/breakdown.jsonl

The lake ``bench/lake_to_lake.py`` wrote (its ``--work``), streamed by the three routes of that
bench (the Python source, ``follow_lake``, Spark's file source over ``_spark_metadata``) into
fresh lakes, ``maxFilesPerTrigger`` 2, in ONE local[2] session, interleaved over ROUNDS rounds:
one JSON line per run with its seconds and each micro-batch's ``durationMs`` (the session's
first run pays the Python workers' start for every route after it: compare later batches).
"""

import json
import shutil
import sys
import time
from pathlib import Path

sys.path[1:1] = [
    str(Path(__file__).resolve().parent.parent),
    str(Path(__file__).resolve().parent.parent / "reader"),
]
import lakesink  # noqa: E402
from devtools.spark import local_session  # noqa: E402

A, WORK, ROUNDS = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = local_session(
    "l2l-breakdown", master="local[2]", spark__sql__streaming__numRecentProgressUpdates="1000"
)
lakesink.register(spark, warm_up=False)
schema = spark.read.parquet(A).schema


def run(route, i):
    out, chk = f"{WORK}/bd-{route}-{i}", f"{WORK}/bdchk-{route}-{i}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(chk, ignore_errors=True)
    trig = {"availableNow": True}
    began = time.monotonic()
    if route == "spark":
        q = lakesink.follow_lake(
            spark, A, out, checkpoint_location=chk, trigger=trig, source_options={"maxFilesPerTrigger": 2}
        )
    elif route == "python":
        q = lakesink.write_stream(
            spark.readStream.format("lakesink").option("maxFilesPerTrigger", 2).load(A),
            out,
            checkpoint_location=chk,
            trigger=trig,
        )
    else:
        q = lakesink.write_stream(
            spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).parquet(A),
            out,
            checkpoint_location=chk,
            trigger=trig,
        )
    q.awaitTermination()
    secs = time.monotonic() - began
    assert q.exception() is None, q.exception()
    prog = q.recentProgress
    keys = ("latestOffset", "addBatch", "queryPlanning", "walCommit", "commitOffsets", "triggerExecution")
    per = {k: [p["durationMs"].get(k, 0) for p in prog] for k in keys}
    print(
        json.dumps(
            {
                "route": route,
                "round": i,
                "seconds": round(secs, 2),
                **{k: v for k, v in per.items()},
            }
        ),
        flush=True,
    )
    shutil.rmtree(out, ignore_errors=True)


routes = ["python", "spark", "files"]
for i in range(ROUNDS):
    for r in routes if i % 2 == 0 else routes[::-1]:
        run(r, i)
spark.stop()
