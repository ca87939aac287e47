"""One sink run in a fresh JVM: the child process of the bench (``launch.py`` starts one per run).

    .venv/bin/python bench/child.py SPEC.json

It reads a :class:`ChildSpec`, builds the session -- the bench's
(``devtools.spark.local_session``: fast-starting workers), a plain
``SparkSession.builder.master(...)`` as any user's script would, or a Spark Connect client
(``SparkSession.builder.remote(...)``) --, streams the spec's input folder into the sink, and
writes what it measured to ``spec.result``: rows, seconds from ``start()`` to the end, the CPU
of its own process tree (this Python, the JVM, Spark's Python workers; a moto server is no
part of it; a Connect client's tree is this Python alone) and every progress event of the query.
A run in a process of its own has a JVM of its own: no JIT, cache or worker carries over
(a Connect server's do: ``connect_runs.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

BENCH_DIR = Path(__file__).resolve().parent
# devtools/ is not installed: it is imported from the checkout, like the tests do.
sys.path[1:1] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from procmem import tree_cpu_seconds  # noqa: E402 - bench/ is a folder of scripts, not a package

#: Storage options reach the child through the environment, not its command line or spec
#: file: they may hold credentials, and a command line is visible to every user (ps).
STORAGE_OPTIONS_ENV = "LAKESINK_BENCH_STORAGE_OPTIONS"

Sink = Literal["parquet", "foreach", "epoch", "format", "delta-peer"]
Session = Literal["bench", "plain", "connect"]


@dataclass(frozen=True)
class ChildSpec:
    """What one child runs.

    ``sink``: ``parquet`` (Spark's ``format("parquet")``), ``foreach`` (``LakeForeachWriter``),
    ``epoch`` (``lakesink.write_stream``), ``format`` (``format("lakesink")`` after
    ``lakesink.register``) or ``delta-peer`` (deltalake in ``foreachBatch``: ``delta_peer.py``;
    it takes no ``write_options``, as a user's would not). ``session``: ``bench``, ``plain`` or
    ``connect`` (a client of the Spark Connect server at ``remote``; see the module docstring;
    plain and Connect sessions take no ``spark_conf``).
    """

    name: str
    sink: Sink
    input: str
    output: str
    checkpoint: str
    result: str
    session: Session = "bench"
    master: str = "local[2]"
    max_files_per_trigger: int = 4
    partitions: int = 0  # repartition the stream into this many partitions (0: as read)
    #: With ``partitions``: partition by ranges of this column instead of round robin. Spark
    #: then makes at most one partition per distinct value, so a 1-row epoch is 1 task.
    range_column: str | None = None
    one_partition: bool = False  # one task reads each epoch's files whole (the memory runs)
    spark_conf: dict[str, str] = field(default_factory=dict)
    write_options: dict[str, Any] = field(default_factory=dict)
    observer_file: str | None = None  # lakesink sinks: CommitTimes writes the protocol's steps here
    remote: str | None = None  # session "connect": the server's sc:// URL
    #: A plain session's ``lakesink.register(spark)``; False: pyspark finds ``format("lakesink")``
    #: by itself (``pyspark_lakesink``), as for a user who never calls lakesink.
    register: bool = True
    #: Sink ``parquet`` only: an identity ``mapInArrow`` before Spark's sink -- what any Python
    #: step in the stream costs Spark, with no lakesink code in it (a floor for lakesink's runs).
    through_arrow: bool = False

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ChildSpec:
        return cls(**json.loads(path.read_text()))


def main(argv: list[str]) -> int:
    spec = ChildSpec.load(Path(argv[0]))
    raw_options = os.environ.get(STORAGE_OPTIONS_ENV)
    storage_options = json.loads(raw_options) if raw_options else None
    sessions = {"plain": plain_session, "connect": connect_session, "bench": bench_session}
    spark = sessions[spec.session](spec)
    # CPU is counted from here: lakesink.register (plain sessions) starts Python workers in
    # the background (lakesink.spark.warmup), and their CPU belongs to the query's.
    cpu_ready = tree_cpu_seconds(os.getpid())
    if spec.session == "plain" and spec.register:
        import lakesink

        lakesink.register(spark)
    df = input_stream(spark, spec)
    started_at, started = time.time(), time.monotonic()
    query = start_sink(df, spec, storage_options)
    progress = await_progress(query)
    query_seconds = time.monotonic() - started
    cpu_done = tree_cpu_seconds(os.getpid())
    result = measure(spec, progress, started_at, query_seconds, cpu_ready, cpu_done)
    spark.stop()
    Path(spec.result).write_text(json.dumps(result))
    return 0


# The session and the stream ----------------------------------------------------------------


def bench_session(spec: ChildSpec) -> Any:
    """The bench's session: ``devtools.spark.local_session`` (workers import the installed pyspark)."""
    from devtools.spark import local_session

    return local_session(f"lakesink-bench-{spec.name}", master=spec.master, **spec.spark_conf)


def plain_session(spec: ChildSpec) -> Any:
    """A session as a user builds one: a master and nothing else (``main`` then calls ``register``).

    The environment is a user's too (``launch.user_env``): no SPARK_HOME view, so Spark's
    Python workers compile pyspark.zip, and no session setting of the bench's.
    """
    if spec.spark_conf:
        raise SystemExit(f"{spec.name}: a plain session takes no Spark settings, got {spec.spark_conf}")
    from pyspark.sql import SparkSession

    return SparkSession.builder.master(spec.master).getOrCreate()


def connect_session(spec: ChildSpec) -> Any:
    """A Spark Connect client of ``spec.remote``, as a user builds one: the builder and the URL.

    No ``lakesink.register``: the server finds ``format("lakesink")`` by itself (lakesink is
    installed in its Python), and a plain ``format("lakesink")`` needs nothing of lakesink on
    the client (docs/guide/connect.md). The server has its own settings.
    """
    if spec.spark_conf or not spec.remote:
        raise SystemExit(f"{spec.name}: a Connect session takes a remote URL and no Spark settings")
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(spec.remote).getOrCreate()


def input_stream(spark: Any, spec: ChildSpec) -> Any:
    """The input folder as a streaming DataFrame (file source, ``maxFilesPerTrigger`` files an epoch)."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = pq.read_schema(next(Path(spec.input).glob("*.parquet")))
    df = (
        spark.readStream.schema(from_arrow_schema(schema))
        .option("maxFilesPerTrigger", spec.max_files_per_trigger)
        .parquet(spec.input)
    )
    if spec.one_partition:
        df = df.coalesce(1)
    if spec.partitions and spec.range_column:
        df = df.repartitionByRange(spec.partitions, spec.range_column)
    elif spec.partitions:
        df = df.repartition(spec.partitions)
    return df


def start_sink(df: Any, spec: ChildSpec, storage_options: dict[str, Any] | None) -> Any:
    """Start the streaming query of ``spec.sink`` (``trigger(availableNow=True)``: it ends by itself)."""
    from commit_times import CommitTimes

    observer = CommitTimes(spec.observer_file) if spec.observer_file else None
    out, chk = spec.output, spec.checkpoint
    if spec.sink == "parquet":
        if spec.through_arrow:
            df = df.mapInArrow(_identity, df.schema)
        writer = df.writeStream.format("parquet").option("path", out)
    elif spec.sink == "foreach":
        from lakesink import LakeForeachWriter, WriteOptions

        writer = df.writeStream.foreach(
            LakeForeachWriter(
                out,
                schema=df.schema,
                storage_options=storage_options,
                write_options=WriteOptions(**spec.write_options),
                observer=observer,
            )
        )
    elif spec.sink == "delta-peer":
        import delta_peer

        return delta_peer.start(df, out, chk)
    elif spec.sink == "format":
        writer = df.writeStream.format("lakesink").option("path", out)
        if storage_options:
            writer = writer.option("storage_options", json.dumps(storage_options))
        for key, value in spec.write_options.items():
            writer = writer.option(key, value)
    else:
        import lakesink

        return lakesink.write_stream(
            df,
            out,
            checkpoint_location=chk,
            storage_options=storage_options,
            trigger={"availableNow": True},
            observer=observer,
            # The bench's write_stream runs take the foreachBatch door unless a run names
            # another (epoch-source): via="auto" in a classic session (issue 38).
            **{"via": "auto", **spec.write_options},
        )
    return writer.option("checkpointLocation", chk).trigger(availableNow=True).start()


def _identity(batches: Any) -> Any:
    yield from batches


def await_progress(query: Any) -> list[dict[str, Any]]:
    """Wait for the query to end; every progress event of an epoch with rows, oldest first.

    Polled while the query runs: Spark keeps only the last 100 events by default, and a
    plain session must not be given a setting to keep more. Raises what the query raised.
    """
    seen: dict[int, dict[str, Any]] = {}

    def collect() -> None:
        for event in query.recentProgress:
            seen[int(event["batchId"])] = event

    while not query.awaitTermination(1.0):
        collect()
    collect()
    return [
        {
            "epoch": batch,
            "rows": _rows(event),
            # Spark's timestamp is the trigger's start, in UTC with milliseconds ("...T12:58:57.170Z").
            "start": dt.datetime.fromisoformat(event["timestamp"]).timestamp(),
            "durations_ms": {key: int(ms) for key, ms in event["durationMs"].items()},
        }
        for batch, event in sorted(seen.items())
        if _rows(event) > 0
    ]


def _rows(event: Any) -> int:
    """An event's input rows: a Connect client's has them in its sources only (the property sums them)."""
    rows = getattr(event, "numInputRows", None)
    return int(event["numInputRows"] if rows is None else rows)


# What the run measured -----------------------------------------------------------------------


def measure(
    spec: ChildSpec,
    progress: list[dict[str, Any]],
    started_at: float,
    query_seconds: float,
    cpu_ready: dict[str, float],
    cpu_done: dict[str, float],
) -> dict[str, Any]:
    """The run's figures: rates over the whole query and after its first epoch, CPU by kind."""
    cpu = {kind: cpu_done[kind] - cpu_ready[kind] for kind in cpu_done}
    rows = sum(p["rows"] for p in progress)
    # After the first epoch: the rate once every worker, daemon and JIT-compiled path is warm.
    steady = progress[1:]
    steady_seconds = sum(p["durations_ms"]["triggerExecution"] for p in steady) / 1000
    first = progress[0] if progress else None
    return {
        "name": spec.name,
        "sink": spec.sink,
        "session": spec.session,
        "rows": rows,
        "epochs": len(progress),
        "query_seconds": query_seconds,
        "rows_per_second": rows / query_seconds,
        "steady_rows_per_second": sum(p["rows"] for p in steady) / steady_seconds if steady_seconds else None,
        # From start() to the end of the first epoch (Spark reports an epoch once it is committed).
        "first_epoch_seconds": (
            first["start"] + first["durations_ms"]["triggerExecution"] / 1000 - started_at if first else None
        ),
        "first_epoch_trigger_seconds": first["durations_ms"]["triggerExecution"] / 1000 if first else None,
        "query_cpu_seconds": cpu["total"],
        "query_cpu_seconds_jvm": cpu["jvm"],
        "query_cpu_seconds_python_workers": cpu["python_workers"],
        "query_cpu_seconds_driver_python": cpu["other"],
        "rows_per_cpu_second": rows / cpu["total"] if cpu["total"] else None,
        "started_at": started_at,
        "progress": progress,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
