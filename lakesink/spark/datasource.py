"""``format("lakesink")``: the epoch-mode sink -- PySpark's Python Data Source API mapped onto the
writer's run (``lakesink.writer.run``). Nothing here decides anything about a batch: what a
task writes, what a commit records and what an abort deletes are the run's.

Where each hook runs (pyspark 4.3):

- ``LakeSinkDataSource.__init__``: a Python worker on the driver, once per query start; the
  instance is then pickled to every other worker, so everything travels in ``config``.
- ``streamWriter``: a driver worker, at each micro-batch, twice (for planning, and again in
  the commit or abort worker): the run's start (``WriterRun.start``), then the writer.
- ``LakeStreamWriter.write``: executors, one task per partition: the run's ``TaskPlan``
  stages the task's Arrow batches (no per-row Python objects) and publishes them under names
  unique to the attempt; the task returns a small picklable :class:`EpochCommitMessage`.
- ``commit`` / ``abort``: a driver worker, reused between epochs -- but not after an
  exception: pyspark 4.3 ends the worker whose commit raised, so that batch's ``abort`` runs in
  a fresh one. ``WriterRun.commit`` commits the batch as a version of the lake's log;
  ``WriterRun.abort`` deletes what its tasks published when no commit of it can land.

Importing this module is cheap (no pyarrow, no commit protocol): Spark imports it in a worker of
its own just to find the class (``pyspark_lakesink``, at the first lookup of any Python data
source, on the way to the query's start). The hooks import pyarrow and the commit protocol
when they first run (each such import says so); ``HOOK_MODULES`` lists them, for the workers
that ``lakesink.spark.warmup`` starts early.
"""

from __future__ import annotations

import functools
import importlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import from_arrow_schema

from lakesink.spark import checkpoints
from lakesink.spark.workers import freeze_heap_once, release_arrow_memory
from lakesink.writer.run import TaskReport, WriterRun, every_report, reports_of

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.config import SinkConfig
    from lakesink.writer.run import TaskPlan

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink"

#: What the hooks import when they first run: pyarrow and the commit protocol, about 0.25 CPU-s.
HOOK_MODULES = (
    "pyarrow",
    "lakesink.config",
    "lakesink.commit",
    "lakesink.commit.tasks",
    "lakesink.writer.run",
    "lakesink_reader.format.table",
    "lakesink.spark.rows",
)


def import_hook_modules() -> None:
    """Import what the hooks use, ahead of their first call (see ``lakesink.spark.warmup``)."""
    for module in HOOK_MODULES:
        importlib.import_module(module)


@dataclass(frozen=True)
class EpochCommitMessage(TaskReport, WriterCommitMessage):
    """What one task attempt hands to the driver (``lakesink.writer.run.TaskReport``), as the
    commit message Spark carries (its runner checks the type)."""


class LakeSinkDataSource(DataSource):
    """The ``lakesink`` data source: ``df.writeStream.format("lakesink").option("path", p)``,
    and ``spark.read.format("lakesink").load(p)`` (``lakesink.spark.reading``).

    A write's options are the keywords of :func:`lakesink.write_stream` (``lakesink.config``
    lists them), a read's those of ``lakesink.spark.reading``; unknown ones are refused by name
    when Spark first asks for a writer or a reader (one class serves both: Spark looks a Python
    source up by its name).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # One token per instance: Spark creates it once per query start and unpickles it for
        # every epoch commit, so the token names this run of the query.
        self.run_token = uuid.uuid4().hex
        #: the foreachBatch door's instance (``lakesink.spark.batches``), which may write on the driver
        self.batch_door = False

    @functools.cached_property
    def config(self) -> SinkConfig:
        """A write's options, parsed (on the instance: it travels with it to every worker)."""
        # Here, not at the top: the options' module loads pyarrow and the commit protocol (HOOK_MODULES).
        from lakesink.config import SinkConfig

        return SinkConfig.from_options(self.options)

    @functools.cached_property
    def read_plan(self) -> Any:
        """A read's options, parsed, and the version and files it reads, pinned."""
        # The read doors, here: a write's workers (every task of every epoch) never load them.
        from lakesink.spark.reading import plan_read

        return plan_read(self.options)

    def __repr__(self) -> str:
        path = next((v for k, v in self.options.items() if k.lower() == "path"), None)
        return f"LakeSinkDataSource({path!r})"

    @functools.cached_property
    def stream_options(self) -> Any:
        """A streaming read's options, parsed (``lakesink.spark.streaming``)."""
        # The read doors, here: a write's workers (every task of every epoch) never load them.
        from lakesink.spark.streaming import parse_stream_options

        return parse_stream_options(self.options)

    @functools.cached_property
    def stream_table(self) -> tuple[Any, tuple[str, ...]]:
        """A streaming read's schema (the lake's newest, when the query starts) and its partition
        columns, read once: the tasks get them with the reader."""
        # Here, not at the top: the reader's Lake loads pyarrow.
        from lakesink_reader.lake import Lake

        lake = Lake(self.stream_options.path, self.stream_options.storage_options)
        return lake.schema, lake.metadata.partition_columns

    def schema(self) -> Any:
        """A read's schema: the lake's (Spark asks for it when the read names none)."""
        # The read doors, here: a write's workers (every task of every epoch) never load them.
        from lakesink.spark.reading import READ_OPTIONS
        from lakesink.spark.streaming import FILES_SCHEMA, STREAM_ONLY, STREAM_OPTIONS

        given = {k.lower() for k in self.options}
        if given & set(STREAM_ONLY):  # a stream's options
            lake_schema = from_arrow_schema(self.stream_table[0])  # pinned here, at load(), for both
            if self.stream_options.files_only:  # its rows are the files (lakesink.spark.follow)
                # The lake's schema is still the stream's, pinned with the instance Spark pickles:
                # follow_lake reads its own after load(), so it is never older than this one.
                return FILES_SCHEMA
            return lake_schema
        unknown = sorted(given - set(READ_OPTIONS) - set(STREAM_OPTIONS))
        if unknown:  # Spark does not say which read asks: name both doors' options
            raise ValueError(
                f'unknown option(s) {unknown} for reading format("lakesink"): spark.read takes path, '
                "storage_options, versionAsOf, timestampAsOf, scan; spark.readStream takes path, "
                "storage_options, startingVersion, startingTimestamp, maxFilesPerTrigger, "
                "maxBytesPerTrigger, filesOnly"
            )
        return from_arrow_schema(self.read_plan.schema)

    def reader(self, schema: Any) -> Any:
        # The read doors, here: a write's workers (every task of every epoch) never load them.
        from lakesink.spark.reading import LakeBatchReader

        return LakeBatchReader(self.read_plan)

    def streamReader(self, schema: Any) -> Any:
        """``spark.readStream.format("lakesink")``: the lake's versions as a stream."""
        # The read doors, here: a write's workers (every task of every epoch) never load them.
        from lakesink.spark.streaming import LakeStreamReader

        return LakeStreamReader(self.stream_options, *self.stream_table)

    def streamWriter(self, schema: Any, overwrite: bool) -> LakeStreamWriter:
        """Driver side: the run's start (``lakesink.writer.run``: the table checked or created,
        once per run in this worker), then the writer."""
        if overwrite:
            raise ValueError(
                f"lakesink tables are append-only: output mode 'complete' cannot write {self.config.path!r}; "
                "use outputMode('append')"
            )
        if self.config.sink.driver_write == "always" and not self.batch_door:
            # The start's guard refuses it first (``guard.check_stream``); a session without it here.
            raise ValueError(self.config.driver_write_refusal())
        # Here, not at the top: rows loads pyarrow (HOOK_MODULES).
        from lakesink.spark.rows import arrow_schema

        plan = writer_run(self.config, self.run_token).start(arrow_schema(schema))
        return LakeStreamWriter(self.config, self.run_token, plan)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        raise NotImplementedError(
            f"lakesink tables take streaming writes only (df.writeStream.format('lakesink')): a batch "
            f"df.write cannot append to {self.config.path!r}. For a backfill, stream the data with "
            "trigger(availableNow=True) -- into its own lake, since one lake takes one streaming query."
        )


def writer_run(config: SinkConfig, run_token: str) -> WriterRun:
    """The driver of this run (``lakesink.writer.run``), over the run's memo in this process."""
    # Here, not at the top: the memo's module is the run's, a driver worker's (not a task's).
    from lakesink.writer.memo import run_memo

    if config.sink.continue_writer and not config.checkpoint_location:
        raise ValueError("continue_writer needs the query's checkpointLocation option")
    storage = config.storage()
    checkpoint = checkpoints.SparkCheckpoint(
        config.checkpoint_location, config.storage_options, config.sink.continue_offsets
    )
    return WriterRun(config, storage, checkpoint, run_memo(storage.url, run_token), run_token)


class LakeStreamWriter(DataSourceStreamArrowWriter):
    """Spark's side of the writer's run: ``write`` on executors (the run's :class:`TaskPlan`),
    ``commit`` and ``abort`` on the driver (a :class:`WriterRun` over the run's memo). Spark
    pickles it to every task and builds it again for each commit and abort."""

    def __init__(self, config: SinkConfig, run_token: str, plan: TaskPlan) -> None:
        self.config = config
        self.run_token = run_token
        self.plan = plan

    def __repr__(self) -> str:
        return f"LakeStreamWriter({self.config.path!r})"

    @property
    def schema(self) -> pa.Schema:
        """The schema the tasks' files store."""
        return self.plan.schema

    # Executors ---------------------------------------------------------------------------

    # pyspark annotates the Arrow variant with its parent's Iterator[Row] signature, hence the ignore.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> EpochCommitMessage:  # type: ignore[override]
        """Stage and publish this task's batches; report them to the driver."""
        ctx = TaskContext.get()
        if ctx is None:  # pragma: no cover - Spark always runs write inside a task
            raise RuntimeError("LakeStreamWriter.write must run inside a Spark task")
        return self.write_partition(
            iterator, ctx.partitionId(), batch_id(ctx), ctx.getLocalProperty("sql.streaming.queryId")
        )

    def write_on_driver(
        self, batches: Iterator[pa.RecordBatch], epoch: int, query_id: str | None
    ) -> EpochCommitMessage:
        """A whole batch written as one task on the driver (``driver_write``): no heap freeze,
        which is for Spark's workers, not the user's process."""
        return self._written(batches, 0, epoch, query_id)

    def write_partition(
        self, iterator: Iterator[pa.RecordBatch], partition: int, epoch: int, query_id: str | None
    ) -> EpochCommitMessage:
        """``write``'s work, told its partition, batch and query (``lakesink.spark.batches``'
        tasks know them from their closure, not from Spark's local properties)."""
        freeze_heap_once()
        return self._written(iterator, partition, epoch, query_id)

    def _written(
        self, batches: Iterator[pa.RecordBatch], partition: int, epoch: int, query_id: str | None
    ) -> EpochCommitMessage:
        try:
            return EpochCommitMessage.of(self.plan.write(batches, partition, epoch, query_id))
        finally:
            release_arrow_memory()  # the process idles until its next batch: without the writer's pages

    # Driver ------------------------------------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Commit the batch as one version of the lake's log (``WriterRun.commit``)."""
        freeze_heap_once()  # a worker of Spark's: its heap is the commit's alone
        self.commit_batch(messages, batchId)

    def commit_batch(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """``commit``'s work, in any process (``lakesink.spark.batches`` commits in the user's
        own, whose heap is not lakesink's to freeze)."""
        try:
            reports = every_report(reports_of(messages, batchId, EpochCommitMessage), batchId)
            self.run().commit(batchId, reports)
        finally:
            release_arrow_memory()  # the process waits for the next batch: without the commit's pages

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Spark gives the batch up: ``WriterRun.abort`` deletes what its tasks published only
        when no commit of them can land (a task's message is missing)."""
        self.run().abort(batchId, reports_of(messages, batchId, EpochCommitMessage))

    def run(self) -> WriterRun:
        return writer_run(self.config, self.run_token)

    @property
    def auto_compact(self) -> bool:
        """Whether the run compacts after its commits (``WriterRun.auto_compact``)."""
        return self.run().auto_compact

    def writer_id(self) -> str:
        """The query id the commits are made under (``WriterRun.writer_id``)."""
        return self.run().writer_id(())


def batch_id(ctx: Any) -> int:
    # MicroBatchExecution sets this local property for every job of an epoch; the Python Data
    # Source API passes the batch id to commit/abort only, and the file name needs it here.
    value = ctx.getLocalProperty("streaming.sql.batchId")
    if value is None:
        raise RuntimeError(
            "no 'streaming.sql.batchId' in the task's local properties: format('lakesink') "
            "supports micro-batch streaming queries only"
        )
    return int(value)
