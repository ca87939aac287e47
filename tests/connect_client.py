"""A user's Spark Connect client, run by tests/test_connect.py from a folder outside the checkout.

``python connect_client.py doors URL_OR_LOCAL WORKDIR``: writes one lake through each lakesink
door, then makes the usual mistakes, and prints one JSON line of what happened.
``python connect_client.py stream URL MODE LAKE CHECKPOINT INPUT TRIGGER``: one streaming run
(``TRIGGER`` is ``available-now`` or ``continuous``, which streams until killed).
``URL_OR_LOCAL`` is an ``sc://`` URL, or ``api-mode`` for ``spark.api.mode=connect`` (a local
server inside this process).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def session(url: str) -> Any:
    from pyspark.sql import SparkSession

    if url == "api-mode":
        return (
            SparkSession.builder.master("local[2,4]").config("spark.api.mode", "connect")
            .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )  # fmt: skip
    return SparkSession.builder.remote(url).getOrCreate()


def refused(fn: Any) -> str:
    """The error ``fn`` raised (type: message), or "started" when it did not refuse."""
    try:
        query = fn()
    except Exception as exc:  # noqa: BLE001 - the test judges the type and message
        return f"{type(exc).__name__}: {exc}"
    query.stop()
    return "started"


def doors(url: str, work: str) -> dict[str, Any]:
    import lakesink
    from lakesink import LakeForeachWriter
    from lakesink.spark.datasource import LakeSinkDataSource

    spark = session(url)
    source = os.path.join(work, "in")

    def stream() -> Any:
        return spark.readStream.schema("id long, label string").parquet(source)

    def run(query: Any) -> None:
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))

    def path(name: str) -> tuple[str, str]:
        return os.path.join(work, name), os.path.join(work, f"chk-{name}")

    seen: dict[str, Any] = {"session": type(spark).__module__}
    # 1. format("lakesink") found by the server with no register at all.
    lake, chk = path("format-no-register")
    run(stream().writeStream.format("lakesink").queryName("no-register").option("checkpointLocation", chk)
        .trigger(availableNow=True).start(lake))  # fmt: skip
    # 2. register, then format("lakesink").
    lakesink.register(spark)
    lake, chk = path("format-register")
    run(stream().writeStream.format("lakesink").option("checkpointLocation", chk)
        .trigger(availableNow=True).start(lake))  # fmt: skip
    # 3. write_stream.
    lake, chk = path("write-stream")
    run(lakesink.write_stream(stream(), lake, checkpoint_location=chk, query_name="ws",
                              trigger={"availableNow": True}))  # fmt: skip
    # 4. foreach.
    lake, chk = path("foreach")
    df = stream()
    run(df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema)).option("checkpointLocation", chk)
        .trigger(availableNow=True).start())  # fmt: skip
    # 6. format("lakesink").partitionBy(...): the client's wrapper passes it on as an option.
    lake, chk = path("format-partitioned")
    run(stream().writeStream.format("lakesink").partitionBy("label").option("checkpointLocation", chk)
        .trigger(availableNow=True).start(lake))  # fmt: skip
    # 5. pyspark's own registration.
    spark.dataSource.register(LakeSinkDataSource)
    lake, chk = path("datasource-register")
    run(stream().writeStream.format("lakesink").option("checkpointLocation", chk)
        .trigger(availableNow=True).start(lake))  # fmt: skip

    # 7. The lake's read doors: a batch read, and the lake as a stream into the next lake.
    written, _ = path("write-stream")
    seen["batch_read"] = sorted(r["id"] for r in spark.read.format("lakesink").load(written).collect())
    lake, chk = path("lake-source")
    source_stream = spark.readStream.format("lakesink").option("maxFilesPerTrigger", 1).load(written)
    run(lakesink.write_stream(source_stream, lake, checkpoint_location=chk, trigger={"availableNow": True}))

    # Mistakes, each refused before anything starts.
    lake, chk = path("format-register")
    writer = lambda: stream().writeStream.format("lakesink").option("checkpointLocation", chk)  # noqa: E731
    seen["unknown_option"] = refused(lambda: writer().option("compresion", "zstd").start(lake))
    seen["partition_by"] = refused(lambda: writer().partitionBy("label").start(lake))
    seen["complete_mode"] = refused(
        lambda: stream().groupBy("label").count().writeStream.format("lakesink")
        .option("checkpointLocation", chk + "-agg").outputMode("complete").start(lake + "-agg")
    )  # fmt: skip
    seen["other_schema"] = refused(
        lambda: stream().selectExpr("id", "label", "1.0 as extra").writeStream.format("lakesink")
        .option("checkpointLocation", chk).start(lake)
    )  # fmt: skip
    seen["second_query"] = refused(
        lambda: lakesink.write_stream(stream(), lake, checkpoint_location=chk + "-new")
    )
    seen["foreach_complete"] = refused(
        lambda: stream().groupBy("label").count().writeStream.outputMode("complete")
        .foreach(LakeForeachWriter(os.path.join(work, "agg-foreach"))).start()
    )  # fmt: skip
    seen["active_after_mistakes"] = len(spark.streams.active)
    spark.stop()
    return seen


def stream_once(url: str, mode: str, lake: str, checkpoint: str, source: str, trigger: str) -> dict[str, Any]:
    import lakesink
    from lakesink import LakeForeachWriter

    spark = session(url)
    lakesink.register(spark)
    df = spark.readStream.schema("id long, label string").option("maxFilesPerTrigger", 1).parquet(source)
    triggers = {"available-now": {"availableNow": True}, "continuous": {"processingTime": "1 second"}}
    if mode == "epoch":
        query = lakesink.write_stream(df, lake, checkpoint_location=checkpoint, trigger=triggers[trigger])
    else:
        query = (df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema))
                 .option("checkpointLocation", checkpoint).trigger(**triggers[trigger]).start())  # fmt: skip
    print(json.dumps({"started": query.id}), flush=True)
    query.awaitTermination()
    error = query.exception()
    return {"done": True, "error": None if error is None else str(error)}


def main() -> None:
    try:
        doors_run = sys.argv[1] == "doors"
        result = doors(sys.argv[2], sys.argv[3]) if doors_run else stream_once(*sys.argv[2:8])
    except Exception:  # noqa: BLE001 - the test reads the traceback
        result = {"crashed": traceback.format_exc()}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
