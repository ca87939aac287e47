"""``write_stream(..., via="foreach_batch")``: the epoch-mode sink through ``foreachBatch`` and
``mapInArrow`` instead of the Python Data Source API (issue 38).

The data source door (``format("lakesink")``) makes Spark start five kinds of Python worker,
each under a daemon of its own that lives as long as the session: one to look data sources
up, one to create the source, one to plan the write, the tasks' workers, and one that runs the
commit (``pyspark.sql.worker.python_streaming_sink_runner``). This door starts one kind: the
tasks run lakesink's writer in ``mapInArrow`` (the same workers as any Arrow UDF), and the
commit runs in the user's own Python process, where ``foreachBatch`` calls back.

The protocol is the same objects' (``lakesink.writer.run``): a :class:`LakeStreamWriter` made once
per run, as the data source's ``streamWriter`` makes it (the run's start: the lake checked or
created, the replays' bound, a continuation checked), whose ``write_partition`` each task
calls with the batch id and query id this function hands it (Spark's local properties do not
reach a ``foreachBatch`` job), and whose ``commit_batch`` commits the messages the tasks
return. ``foreachBatch`` is at least once: a batch Spark runs again is a replay the log
recognises (the writer is the query id, read from the checkpoint's ``metadata``), as on the
data source door.

What differs: when a task fails, what the others published is left to the sweep (Spark hands
the data source door's ``abort`` every task's message; ``collect`` returns none). A failed
commit's files are deleted at once on both doors when its failure was definitive, by the commit
itself (``WriterRun.commit``), and kept when its outcome is unknown (the log entry may still
land): there is no abort to call. The commit runs in the user's process, whose heap lakesink
does not freeze. Classic sessions only: under Spark Connect,
``foreachBatch`` runs the function on the server, and the data source door is the one to use
there.
"""

from __future__ import annotations

import importlib
import logging
import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.types import BinaryType, StructField, StructType

from lakesink.spark.datasource import EpochCommitMessage, LakeSinkDataSource, LakeStreamWriter

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.config import SinkConfig

log = logging.getLogger(__name__)

#: What the first commit imports in the user's process: ~0.3 s, imported while Spark plans the
#: first batch instead of after its tasks (:func:`import_commit_modules`).
COMMIT_MODULES = (
    "pyarrow",
    "lakesink.commit.batches",
    "lakesink.commit.continuation",
    "lakesink.views.derived",
)

#: What each task returns: its pickled ``EpochCommitMessage``. A StructType, not the DDL string
#: "message binary": a string is parsed by the JVM at every batch's ``mapInArrow`` (a py4j round
#: trip, ~1.5 ms of a 5,000-row micro-batch's ~200 ms).
MESSAGE_SCHEMA = StructType([StructField("message", BinaryType())])


class LakeBatchWrite:
    """The ``foreachBatch`` function of one run of a lakesink query (made anew at each start)."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config
        # A run token of its own, as the data source door's instance has per query start.
        self.source = LakeSinkDataSource(config.to_options())
        self.source.batch_door = True
        self.writer: LakeStreamWriter | None = None
        self.query_id: str | None = None
        #: the rows of the run's last batch (None: none yet): ``driver_write="auto"``'s guide
        self.last_rows: int | None = None

    def __repr__(self) -> str:
        return f"LakeBatchWrite({self.config.path!r})"

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            self.write_batch(df, batch_id)
        except Exception as exc:
            interrupted = interruption(exc)
            if interrupted is None:
                raise
            # Spark stops the query by interrupting its thread; the Py4J error that reaches it
            # carries the whole Java stack (8 KB), against which Spark 4.3 runs a recursive regex
            # to tell a stop from a failure -- a StackOverflowError and 1,000 lines of log for a
            # clean stop (issue 53). The same finding in a few lines: a quiet stop.
            raise BatchInterrupted(
                f"batch {batch_id} of {self.config.path} was interrupted ({interrupted})"
            ) from None

    def write_batch(self, df: Any, batch_id: int) -> None:
        """The batch's files written (on the driver or in tasks) and committed."""
        self.start_run(df.schema)
        self.write_and_commit(df, batch_id)

    def start_run(self, schema: Any) -> None:
        """The run's start, at its first batch: the lake checked or created (for ``schema``, a
        StructType), the replays' bound read."""
        if self.writer is None:
            self.writer = self.source.streamWriter(schema, False)
            self.query_id = self.writer.writer_id()

    def is_replay(self, batch_id: int) -> bool:
        """Whether the lake holds batch ``batch_id`` of this query already (after :meth:`start_run`)."""
        assert self.writer is not None
        through = self.writer.plan.committed_through
        return through is not None and batch_id <= through

    def commit_replay(self, batch_id: int) -> None:
        """A replay committed as what it is, without reading the batch: one empty report, which
        the run's commit skips (as a replay's tasks would report nothing)."""
        assert self.writer is not None
        self.writer.commit_batch([self.writer.write_on_driver(iter(()), batch_id, self.query_id)], batch_id)

    def write_and_commit(self, df: Any, batch_id: int, rows: int | None = None) -> None:
        """``df``'s rows written as batch ``batch_id`` and committed (after :meth:`start_run`);
        ``rows``: at most this many, when known before ``df`` is read (:meth:`write_on_driver`)."""
        assert self.writer is not None
        messages = self.write_on_driver(df, batch_id, rows)
        if messages is None:
            messages = self.write_in_tasks(df, batch_id)
        self.last_rows = sum(f.rows for m in messages for f in m.files)
        # Every task reported: a failed commit deleted its files itself when nothing can commit
        # them, and an abort would delete nothing more (``WriterRun.abort``).
        self.writer.commit_batch(messages, batch_id)

    def write_on_driver(
        self, df: Any, batch_id: int, rows: int | None = None
    ) -> list[EpochCommitMessage] | None:
        """The batch written as one task on the driver (``driver_write``), or None: in tasks.

        ``auto``: when the run's last batch had at most ``driver_write_max_rows`` rows (or there
        was none), this one is collected with a limit of one row more; within the bound it is
        written here, else its rows are dropped and it goes to the tasks. ``rows``, the batch's
        rows at most when known before it is read (``lakesink.spark.follow``: the log's count of
        its files'), decides instead of the last batch: over the bound, nothing is collected. A
        replay the log holds is not collected at all (its task would write nothing)."""
        writer, sink = self.writer, self.config.sink
        assert writer is not None
        if sink.driver_write == "never":
            return None
        through = writer.plan.committed_through
        if through is not None and batch_id <= through:
            return [writer.write_on_driver(iter(()), batch_id, self.query_id)]
        if sink.driver_write == "always":
            table = df.toArrow()
        else:
            bound = sink.driver_write_max_rows
            guide = self.last_rows if rows is None else rows
            if guide is not None and guide > bound:
                return None
            table = df.limit(bound + 1).toArrow()
            if table.num_rows > bound:
                log.info(
                    "batch %d of %s has more than %d rows: written in tasks",
                    batch_id,
                    self.config.path,
                    bound,
                )
                return None
        return [writer.write_on_driver(iter(table.to_batches()), batch_id, self.query_id)]

    def write_in_tasks(self, df: Any, batch_id: int) -> list[EpochCommitMessage]:
        """The batch written by Spark's tasks (``mapInArrow``), their messages collected."""
        writer, query_id = self.writer, self.query_id
        assert writer is not None

        def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            # Here, not at the top: pyarrow loads in the task's worker, not at the import.
            import pyarrow as pa

            # Built from buffers: pa.array of a list imports pandas in the worker (arrays.py).
            from lakesink_reader.arrays import array

            ctx = TaskContext.get()
            if ctx is None:  # pragma: no cover - mapInArrow runs inside a task
                raise RuntimeError("lakesink's foreachBatch task must run inside a Spark task")
            message = writer.write_partition(batches, ctx.partitionId(), batch_id, query_id)
            yield pa.record_batch([array([pickle.dumps(message)], pa.binary())], names=["message"])

        return [pickle.loads(row.message) for row in df.mapInArrow(task, MESSAGE_SCHEMA).collect()]


class BatchInterrupted(RuntimeError):
    """The query's thread was interrupted while its batch ran (``query.stop()``)."""


#: The Java exceptions Spark takes for an interruption by ``stop()`` (``StreamExecution``).
INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


def interruption(exc: BaseException) -> str | None:
    """For a Py4J error whose Java cause is an interruption, the line Spark recognises a stop by
    (``py4j.protocol.Py4JJavaError: An error occurred while calling ...: <the exception>``)."""
    # Here, not at the top: py4j is pyspark's, loaded already; the name is for this check alone.
    from py4j.protocol import Py4JJavaError

    if not isinstance(exc, Py4JJavaError):
        return None
    try:
        cause, depth = exc.java_exception, 0
        while cause is not None and depth < 16:
            name = str(cause.getClass().getName())
            if name in INTERRUPTIONS:
                return f"py4j.protocol.Py4JJavaError: {exc.errmsg.strip()}\n: {name}"
            if name == "org.apache.spark.SparkException" and "SPARK_JOB_CANCELLED" in str(cause.getMessage()):
                # The batch's job cancelled by the stop (a collect waits on it, not interrupted):
                # what Spark takes for a stop without Py4J between (``isInterruptionException``),
                # said the way it recognises through Py4J.
                return (
                    f"py4j.protocol.Py4JJavaError: {exc.errmsg.strip()}\n: {INTERRUPTIONS[0]} "
                    "(its job was cancelled: the query was stopped)"
                )
            cause, depth = cause.getCause(), depth + 1
    except Exception:  # noqa: BLE001 - the JVM is going away: not ours to judge
        return None
    return None


def import_commit_modules() -> None:
    """Import :data:`COMMIT_MODULES` (the door's start runs this on a thread of its own, so the
    first batch's commit finds them loaded). Best effort: the commit imports them anyway."""
    try:
        for module in COMMIT_MODULES:
            importlib.import_module(module)
    except Exception:  # the commit's own import will raise it where it matters
        log.debug("lakesink: the commit's modules were not imported ahead", exc_info=True)
