"""``format("lakesink")``: the epoch-mode sink -- PySpark's Python Data Source API mapped onto the
commit protocol (``lakesink.commit``). Nothing here decides what becomes visible.

Where each hook runs (pyspark 4.3):

- ``LakeSinkDataSource.__init__``: a Python worker on the driver, once per query start; the
  instance is then pickled to every other worker, so everything travels in ``config``.
- ``streamWriter``: a driver worker, at each micro-batch, twice (for planning, and again in
  the commit worker): checks (or creates) the table, hands out the writer.
- ``LakeStreamWriter.write``: executors, one task per partition: ``lakesink.commit.tasks``
  stages the task's Arrow batches (no per-row Python objects) and publishes them under names
  unique to the attempt; the task returns a small picklable :class:`EpochCommitMessage`.
- ``commit`` / ``abort``: a driver worker (reused between epochs): a ``BatchCommitter``
  commits the batch as a version of the lake's log, or deletes what its tasks published.

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
from lakesink.spark.runs import cursor_enabled, run_memo
from lakesink.spark.workers import freeze_heap_once, release_arrow_memory
from lakesink_reader.errors import CommitError, CommitRefusedError
from lakesink_reader.format.log import CommittedFile
from lakesink_reader.format.v3.commits import AddFile, writer_tag

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.commit.batches import BatchCommitter
    from lakesink.commit.start import LakeAtStart
    from lakesink.config import SinkConfig

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink"

#: What the hooks import when they first run: pyarrow and the commit protocol, about 0.25 CPU-s.
HOOK_MODULES = (
    "pyarrow",
    "lakesink.config",
    "lakesink.commit",
    "lakesink.commit.tasks",
    "lakesink_reader.format.table",
    "lakesink.spark.rows",
)


def import_hook_modules() -> None:
    """Import what the hooks use, ahead of their first call (see ``lakesink.spark.warmup``)."""
    for module in HOOK_MODULES:
        importlib.import_module(module)


@dataclass(frozen=True)
class EpochCommitMessage(WriterCommitMessage):
    """What one task attempt hands to the driver: the file it published (if any) and counts.

    ``skipped`` is True when the task saw that its epoch was already committed (a replay) and
    wrote nothing.
    """

    partition: int
    epoch: int
    query_id: str | None
    files: tuple[CommittedFile, ...]
    skipped: bool = False
    #: Per file of ``files``: its Delta stats (``lakesink.commit.stats``), for format-3 lakes.
    stats: tuple[Any, ...] = ()


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
        from lakesink.spark.streaming import STREAM_ONLY, STREAM_OPTIONS

        given = {k.lower() for k in self.options}
        if given & set(STREAM_ONLY):  # a stream's options
            return from_arrow_schema(self.stream_table[0])
        unknown = sorted(given - set(READ_OPTIONS) - set(STREAM_OPTIONS))
        if unknown:  # Spark does not say which read asks: name both doors' options
            raise ValueError(
                f'unknown option(s) {unknown} for reading format("lakesink"): spark.read takes path, '
                "storage_options, versionAsOf, timestampAsOf; spark.readStream takes path, storage_options, "
                "startingVersion, startingTimestamp, maxFilesPerTrigger, maxBytesPerTrigger"
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
        """Driver side: check (or create) the table metadata, then hand out the writer."""
        if overwrite:
            raise ValueError(
                f"lakesink tables are append-only: output mode 'complete' cannot write {self.config.path!r}; "
                "use outputMode('append')"
            )
        # Here, not at the top: rows loads pyarrow (HOOK_MODULES).
        from lakesink.spark.rows import arrow_schema

        arrow = arrow_schema(schema)
        start = run_start(self.config, arrow, self.run_token)
        # The tasks write the stream's columns as the lake declares them (types, nullability).
        files = run_memo(self.config.storage().url, self.run_token).file_schema or arrow
        if self.config.sink.continue_writer:
            check_continuation(self.config, start)
        table = start.table
        return LakeStreamWriter(
            self.config,
            files,
            self.run_token,
            table.table_id,
            table.log_interval,
            committed_through(self.config, start),
            table.partition_columns,
            # The query's option, else the lake's default (lakesink config), else off.
            self.config.sink.auto_compact
            if self.config.sink.auto_compact is not None
            else bool(table.auto_compact),
        )

    def writer(self, schema: Any, overwrite: bool) -> Any:
        raise NotImplementedError(
            f"lakesink tables take streaming writes only (df.writeStream.format('lakesink')): a batch "
            f"df.write cannot append to {self.config.path!r}. For a backfill, stream the data with "
            "trigger(availableNow=True) -- into its own lake, since one lake takes one streaming query."
        )


def run_start(config: SinkConfig, schema: pa.Schema, run_token: str) -> LakeAtStart:
    """The lake as this run found it (``lakesink.commit.start``), read once per run of the query
    in this Python worker, not once per micro-batch (``lakesink.spark.runs``: keyed by the run,
    so a lake deleted and written again by a fresh query in the same session is read again)."""
    # Here, not at the top: the commit protocol loads pyarrow (HOOK_MODULES).
    from lakesink.commit.start import open_for_writing

    memo = run_memo(config.storage().url, run_token)
    key = schema.serialize().to_pybytes()
    if memo.start is None or memo.table_schema != key:
        memo.table_schema = key
        memo.start = start = open_for_writing(
            config.storage(),
            schema,
            checkpoint_interval=config.sink.checkpoint_interval,
            partition_by=config.sink.partition_by,
        )
        memo.schema_change, memo.file_schema = start.stream_schemas(
            schema, merge_schema=config.sink.merge_schema
        )
    return memo.start


def committed_through(config: SinkConfig, start: LakeAtStart) -> int | None:
    """The last batch the log held of this query (from its checkpoint's id) when the run
    started; None when unknown (``LakeAtStart.last_batch``)."""
    if not config.checkpoint_location:
        return None
    checkpoint = checkpoints.open_checkpoint(config.checkpoint_location, config.storage_options)
    writer = checkpoints.query_id(checkpoint)
    return None if writer is None else start.last_batch(writer)


class LakeStreamWriter(DataSourceStreamArrowWriter):
    """Stages and publishes files on executors (``write``), commits whole epochs on the driver."""

    def __init__(
        self,
        config: SinkConfig,
        schema: pa.Schema,
        run_token: str,
        table_id: str | None,
        checkpoint_interval: int,
        committed_through: int | None,
        partition_columns: tuple[str, ...],
        auto_compact: bool = False,
    ) -> None:
        self.config = config
        self.schema = schema
        self.run_token = run_token
        self.table_id = table_id
        self.checkpoint_interval = checkpoint_interval  # table.json's
        # This writer's last batch in the log when the run began (replays write nothing).
        self.committed_through = committed_through
        self.partition_columns = partition_columns  # table.json's: files go under their folders
        self.auto_compact = auto_compact

    def __repr__(self) -> str:
        return f"LakeStreamWriter({self.config.path!r})"

    # Executors ---------------------------------------------------------------------------

    # pyspark annotates the Arrow variant with its parent's Iterator[Row] signature, hence the ignore.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> EpochCommitMessage:  # type: ignore[override]
        """Stage and publish this task's batches (``lakesink.commit.tasks``); report them to the driver."""
        ctx = TaskContext.get()
        if ctx is None:  # pragma: no cover - Spark always runs write inside a task
            raise RuntimeError("LakeStreamWriter.write must run inside a Spark task")
        return self.write_partition(
            iterator, ctx.partitionId(), batch_id(ctx), ctx.getLocalProperty("sql.streaming.queryId")
        )

    def write_partition(
        self, iterator: Iterator[pa.RecordBatch], partition: int, epoch: int, query_id: str | None
    ) -> EpochCommitMessage:
        """``write``'s work, told its partition, batch and query (``lakesink.spark.batches``'
        tasks know them from their closure, not from Spark's local properties)."""
        # Here, not at the top: the commit protocol loads pyarrow (HOOK_MODULES).
        from lakesink.commit.tasks import write_task

        freeze_heap_once()
        # A replay of a committed epoch writes nothing: the driver will skip it whole (it told
        # the tasks how far the log holds this query: ``committed_through``).
        if self.committed_through is not None and epoch <= self.committed_through:
            for _ in iterator:
                pass
            return EpochCommitMessage(partition, epoch, query_id, (), skipped=True)
        try:
            files = write_task(
                self.config.storage(),
                self.schema,
                iterator,
                tag=writer_tag(query_id) if query_id else None,
                batch=epoch,
                partition=partition,
                options=self.config.write,
                observer=self.config.observer,
                partition_columns=self.partition_columns,
            )
        finally:
            release_arrow_memory()  # the worker idles until its next task: without the writer's pages
        return EpochCommitMessage(
            partition,
            epoch,
            query_id,
            tuple(CommittedFile(f.name, partition, epoch, f.rows, f.size) for f in files),
            stats=tuple(f.stats for f in files),
        )

    # Driver ------------------------------------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Commit the batch as one version of the lake's log (the commit point; see
        ``lakesink.commit.batches``), from this run's cursor when it has one."""
        freeze_heap_once()  # a worker of Spark's: its heap is the commit's alone
        self.commit_batch(messages, batchId)

    def commit_batch(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """``commit``'s work, in any process (``lakesink.spark.batches`` commits in the user's
        own, whose heap is not lakesink's to freeze)."""
        try:
            self._commit_batch(_messages(messages, batchId), batchId)
        finally:
            release_arrow_memory()  # the process waits for the next batch: without the commit's pages

    def _commit_batch(self, ours: list[EpochCommitMessage], batch: int) -> None:
        memo = run_memo(self.config.storage().url, self.run_token)
        batches = self._batches(ours)
        cursor, memo.cursor = (memo.cursor if cursor_enabled() else None), None
        continues = None
        if batch == 0:
            # Here, not at the top: the commit protocol loads pyarrow (HOOK_MODULES).
            from lakesink.commit.continuation import continuation_of

            continues = continuation_of(
                batches.log.open(),
                batches.writer_id,
                self.config.sink.continue_writer,
                lambda: start_offsets(self.config),
                self.config.path,
            )
        result = batches.commit(
            batch,
            _adds(ours),
            source_offsets=self._source_offsets(batch),
            continues=continues,
            state=cursor,
            tasks_skipped=any(m.skipped for m in ours),
            schema=memo.schema_change,
        )
        memo.cursor = result.state
        if not memo.swept:  # once per run, after its first commit: what kills left
            # Here, not at the top: the sweep loads pyarrow and the commit protocol.
            from lakesink.maintenance.sweep import sweep_after_commit

            sweep_after_commit(self.config.storage(), older_than=self.config.sink.staged_cleanup_age)
            memo.swept = True
        if self.auto_compact:
            # Here, not at the top: compaction loads pyarrow and the maintenance modules.
            from lakesink.maintenance.auto_compact import compact_if_due

            done = compact_if_due(
                self.config.storage(),
                result.state,
                write_options=self.config.write,
                due=memo.auto_compact_due,
            )
            if done is not None:
                memo.auto_compact_due = done.next_due

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """The epoch will not be committed now: delete what its tasks published (never what the log lists)."""
        ours = _messages(messages, batchId)
        self._batches(ours).abort(batchId, _adds(ours))

    # -------------------------------------------------------------------------------------

    def _batches(self, messages: Sequence[EpochCommitMessage]) -> BatchCommitter:
        # Here, not at the top: the commit protocol and the views load pyarrow (HOOK_MODULES).
        from lakesink.commit.batches import BatchCommitter
        from lakesink.views.derived import derived_views, in_threads

        if not self.table_id:
            raise CommitError(f"{self.config.path}: a format-3 lake without a table id in its table.json")
        storage, sink = self.config.storage(), self.config.sink
        return BatchCommitter(
            storage,
            table_id=self.table_id,
            writer_id=self.writer_id(messages),
            run=self.run_token,
            allow_other_queries=sink.allow_other_queries,
            checkpoint_interval=self.checkpoint_interval,
            observer=self.config.observer,
            # The views this query keeps, after each of its commits (the committer knows none).
            # Both at once: each waits on its own storage round trips (on HDFS with one
            # DataNode, up to 0.5 s in each file's close), and they share no file.
            after_commit=derived_views(
                storage,
                self.table_id,
                delta_log=sink.delta_log,
                spark_metadata=sink.spark_metadata,
                together=in_threads,
            ),
            in_doubt=run_memo(storage.url, self.run_token).in_doubt,
        )

    def writer_id(self, messages: Sequence[EpochCommitMessage]) -> str:
        """The writer: Spark's query id, from the checkpoint's ``metadata`` (or the tasks' messages).

        Every batch needs it, empty ones included (they keep the writer's batches contiguous):
        a commit without one would escape every ownership rule, so it is refused instead.
        """
        location = self.config.checkpoint_location
        memo = run_memo(self.config.storage().url, self.run_token) if location else None
        if memo is not None and memo.writer_id is not None:
            return memo.writer_id
        found = (
            checkpoints.query_id(checkpoints.open_checkpoint(location, self.config.storage_options))
            if location
            else None
        )
        if memo is not None and found is not None:
            memo.writer_id = found  # one read per run, not one per commit
        found = found or next((m.query_id for m in messages if m.query_id), None)
        if found is None:
            raise CommitRefusedError(
                f"{self.config.path}: cannot tell which streaming query commits this batch (no "
                "checkpointLocation option to read its id from, and no task reported it): pass "
                ".option('checkpointLocation', ...) to the writer"
            )
        return found

    def _source_offsets(self, epoch: int) -> Any:
        """The epoch's source offsets, from Spark's offset log ``<checkpoint>/offsets/<epoch>``.

        The Python Data Source API does not hand offsets to the sink; Spark writes them to its
        offset log before the epoch runs (``lakesink.spark.checkpoints``). None when unavailable:
        they are needed only to continue a writer from the lake (``continue_writer``).
        """
        location = self.config.checkpoint_location
        if not location:
            return None
        return checkpoints.batch_end_offsets(
            checkpoints.open_checkpoint(location, self.config.storage_options), epoch
        )


def check_continuation(config: SinkConfig, start: LakeAtStart) -> None:
    """Refuse, before the first batch of a continuing query writes, a continuation that cannot be.

    Run when the driver plans each micro-batch, against the lake as the run found it: it
    decides only for a writer the lake did not know then (the continuing query's first batch),
    now with the offsets Spark starts the sources at. The commit checks it again, against the
    state it commits on.
    """
    if not config.checkpoint_location:
        raise ValueError("continue_writer needs the query's checkpointLocation option")
    writer = checkpoints.query_id(
        checkpoints.open_checkpoint(config.checkpoint_location, config.storage_options)
    )
    if writer is None or not config.sink.continue_writer:
        return  # Spark writes metadata before planning batch 0: nothing to judge yet
    start.check_continuation(writer, config.sink.continue_writer, lambda: start_offsets(config))


def start_offsets(config: SinkConfig) -> Any:
    """A continuing query's start offsets, from Spark's checkpoint (``continue_offsets`` must agree)."""
    assert config.checkpoint_location is not None
    checkpoint = checkpoints.open_checkpoint(config.checkpoint_location, config.storage_options)
    sources = checkpoints.batch_end_offsets(checkpoint, 0)
    start, _ = checkpoints.continuation_start(
        checkpoint, config.sink.continue_offsets, len(sources) if sources is not None else None
    )
    return start


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


def _adds(messages: Sequence[EpochCommitMessage]) -> list[AddFile]:
    """The files of a batch's messages, as the versioned log records them."""
    adds = []
    for m in messages:
        stats = m.stats if len(m.stats) == len(m.files) else (None,) * len(m.files)
        for f, s in zip(m.files, stats, strict=True):
            adds.append(AddFile(f.name, f.rows, f.size, partition=f.partition, batch=f.epoch, stats=s))
    return adds


def _messages(messages: Sequence[WriterCommitMessage | None], epoch: int) -> list[EpochCommitMessage]:
    found = []
    for m in messages:
        if m is None:
            continue
        if not isinstance(m, EpochCommitMessage):
            raise CommitError(f"unexpected commit message {type(m).__name__} for epoch {epoch}")
        if m.epoch != epoch:
            raise CommitError(f"commit message of epoch {m.epoch} handed to the commit of epoch {epoch}")
        found.append(m)
    return found
