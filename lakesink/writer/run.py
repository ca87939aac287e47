"""One run of an epoch writer (a streaming query's driver and its tasks) on one format-3 lake,
whatever engine calls it.

Two objects, split where an engine splits them:

- :class:`TaskPlan`, picklable, is what each task needs: it stages and publishes the task's
  batches (``lakesink.commit.tasks``) and reports them (:class:`TaskReport`), or writes nothing
  for a batch the log held when the run started (a replay, which the commit skips whole);
- :class:`WriterRun` is the driver: :meth:`~WriterRun.start` reads (or creates) the lake once
  per run and hands out the plan, :meth:`~WriterRun.commit` turns the tasks' reports into one
  version of the lake's log and runs the post-commit pipeline (the first sweep of the run,
  auto-compaction; the views follow each commit inside the committer), :meth:`~WriterRun.abort`
  deletes what a batch's tasks published when, and only when, no commit of them can land.

A ``WriterRun`` keeps nothing: an engine may build one per call, in any process (Spark does:
its commit and abort of one batch run in different Python workers when the commit raised).
What a run learns between calls is in its :class:`~lakesink.writer.memo.RunMemo`, which saves
time only: a lost memo means a read again, never another decision.

**Why an abort never deletes a file a create in flight may commit** (docs/design/format-v3.md,
"Abort after an unknown outcome"). The files a batch's tasks published can be committed only
by a commit call that was handed them. An engine calls commit only once every task reported:
Spark's write fills one message slot per task and calls commit after the job succeeded, and
hands ``abort`` the same slots, a missing task's empty. So an abort whose reports are all
there may follow a commit call -- one whose create may still land, if its answer was lost --
and it deletes nothing: that commit has already deleted the files itself on every definitive
failure (:meth:`WriterRun.commit`), and on an unknown outcome they must stay until the batch's
replay settles it (the sweep removes the loser's files then). An abort with a report missing
follows no commit call for these files (their names are unique to the attempt): it deletes
them, unless the log holds the batch. None of this needs memory across calls.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from lakesink.writer.memo import cursor_enabled
from lakesink_reader.errors import CommitError, CommitRefusedError
from lakesink_reader.format.log import CommittedFile
from lakesink_reader.format.v3.commits import AddFile, writer_tag

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.commit.batches import BatchCommitter
    from lakesink.commit.start import LakeAtStart
    from lakesink.commit.versions import CommitResult
    from lakesink.config import SinkConfig
    from lakesink.maintenance.auto_compact import AutoCompaction
    from lakesink.views.derived import Together
    from lakesink.writer.memo import RunMemo
    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.storage import Storage

log = logging.getLogger(__name__)

R = TypeVar("R", bound="TaskReport")


class QueryCheckpoint(Protocol):
    """What the engine knows of the query, from its own checkpoint (Spark's: ``metadata`` and
    the offset log, ``lakesink.spark.checkpoints``)."""

    def query_id(self) -> str | None:
        """The query's id, stable across its restarts: the writer's id in the log. None when
        unknown (no checkpoint)."""
        ...

    def end_offsets(self, batch: int) -> Any:
        """The sources' end offsets of ``batch`` (recorded with its commit); None when unknown."""
        ...

    def start_offsets(self) -> Any:
        """A continuing query's start offsets (where its first batch begins)."""
        ...


@dataclass(frozen=True)
class TaskReport:
    """What one task attempt hands to the driver: the files it published (if any) and counts.

    ``skipped`` is True when the task saw that its batch was already committed (a replay) and
    wrote nothing. ``stats``: per file of ``files``, its Delta stats (``lakesink.commit.stats``).
    ``table_id``: the table the task's plan was made for (table.json's id when the run read the
    lake): files written for one table are never committed into another (a lake deleted and
    recreated while the batch ran).
    """

    partition: int
    epoch: int
    query_id: str | None
    files: tuple[CommittedFile, ...]
    skipped: bool = False
    stats: tuple[Any, ...] = ()
    table_id: str | None = None

    @classmethod
    def of(cls: type[R], report: TaskReport) -> R:
        """``report`` as this class (an engine's message type that extends it)."""
        return cls(**{f.name: getattr(report, f.name) for f in fields(TaskReport)})


@dataclass(frozen=True)
class TaskPlan:
    """What every task of a run needs, picklable (an engine ships it to its executors)."""

    config: SinkConfig
    #: the schema the data files store: the stream's columns as the lake declares them
    schema: pa.Schema
    #: this writer's last batch in the log when the run began: a replay at or below it writes nothing
    committed_through: int | None
    #: table.json's: files go under their folders
    partition_columns: tuple[str, ...]
    #: table.json's ``table_id`` when the run read the lake (carried by the tasks' reports)
    table_id: str | None = None

    def write(
        self,
        batches: Iterator[pa.RecordBatch],
        partition: int,
        batch: int,
        query_id: str | None,
        *,
        storage: Storage | None = None,
    ) -> TaskReport:
        """Stage and publish this task's ``batches`` of ``batch`` (``lakesink.commit.tasks``),
        or drain them and write nothing for a replay. ``storage``: the lake's (the config's
        when None)."""
        # Here, not at the top: the commit protocol loads pyarrow (``HOOK_MODULES``).
        from lakesink.commit.tasks import write_task

        # A replay of a committed batch writes nothing: the driver will skip it whole.
        if self.committed_through is not None and batch <= self.committed_through:
            for _ in batches:
                pass
            return TaskReport(partition, batch, query_id, (), skipped=True, table_id=self.table_id)
        files = write_task(
            storage if storage is not None else self.config.storage(),
            self.schema,
            batches,
            tag=writer_tag(query_id) if query_id else None,
            batch=batch,
            partition=partition,
            options=self.config.write,
            observer=self.config.observer,
            partition_columns=self.partition_columns,
        )
        return TaskReport(
            partition,
            batch,
            query_id,
            tuple(CommittedFile(f.name, partition, batch, f.rows, f.size) for f in files),
            stats=tuple(f.stats for f in files),
            table_id=self.table_id,
        )


def require_pyiceberg(path: str) -> None:
    """ImportError with the way out when the Iceberg view is to be kept and pyiceberg is missing:
    at the run's start, before anything is written (the view's hook never fails a commit)."""
    import importlib.util  # here: only runs that keep an Iceberg view ask

    if importlib.util.find_spec("pyiceberg") is None:
        raise ImportError(
            f"{path} keeps an Iceberg view (the iceberg_view option, or the lake's table.json), which "
            "needs pyiceberg: pip install 'lakesink[iceberg]', or set iceberg_view=False for this query"
        )


class WriterRun:
    """The driver of one run of one streaming query's writer on one lake (see the module docstring).

    Parameters
    ----------
    config
        The writer's options (``lakesink.config``).
    storage
        The lake's storage (the config's, or a test's).
    checkpoint
        The engine's knowledge of the query (:class:`QueryCheckpoint`).
    memo
        The run's memo (``lakesink.writer.memo``): a fresh one costs reads, nothing else.
    run_token
        A token of this run of the query (recorded with each commit, for ``status``).
    together
        How the views' post-commit hooks run: ``"threads"`` (the default), at once, in threads
        (``lakesink.views.derived.in_threads``); None, one after the other; or through the
        caller's function (the simulation's scheduler).
    compaction
        Keywords for auto-compaction's ``compact_if_due`` (sizes; the simulation's lakes are tiny).
    """

    def __init__(
        self,
        config: SinkConfig,
        storage: Storage,
        checkpoint: QueryCheckpoint,
        memo: RunMemo,
        run_token: str,
        *,
        together: Together | Literal["threads"] | None = "threads",
        compaction: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.storage = storage
        self.checkpoint = checkpoint
        self.memo = memo
        self.run_token = run_token
        self.together = together
        self.compaction = dict(compaction or {})
        #: what auto-compaction did after the last commit through this object (None: nothing)
        self.compacted: AutoCompaction | None = None

    def __repr__(self) -> str:
        return f"WriterRun({self.config.path!r})"

    # The run's start ------------------------------------------------------------------------

    def start(self, stream: pa.Schema) -> TaskPlan:
        """The lake as this run found it, read once per run (the table checked, or created with
        the store's check; the log's state), the continuation checked, and the tasks' plan."""
        start = self.lake_at_start(stream)
        if self.config.sink.continue_writer:
            self.check_continuation(start)
        writer = self.query_id()
        return TaskPlan(
            self.config,
            self.memo.file_schema or stream,
            None if writer is None else start.last_batch(writer),
            start.table.partition_columns,
            start.table.table_id,
        )

    def lake_at_start(self, stream: pa.Schema) -> LakeAtStart:
        """``lakesink.commit.start``'s reading of the lake, kept in the memo for the run."""
        # Here, not at the top: the commit protocol loads pyarrow.
        from lakesink.commit.start import open_for_writing

        key = stream.serialize().to_pybytes()
        memo = self.memo
        if memo.start is None or memo.table_schema != key:
            memo.table_schema = key
            memo.start = start = open_for_writing(
                self.storage,
                stream,
                checkpoint_interval=self.config.sink.checkpoint_interval,
                partition_by=self.config.sink.partition_by,
            )
            memo.schema_change, memo.file_schema = start.stream_schemas(
                stream, merge_schema=self.config.sink.merge_schema
            )
            # (Views are kept of format-3 epoch lakes only: a foreach lake has none.)
            if self.config.sink.iceberg_view and start.table.has_log and not start.table.iceberg_view:
                memo.start = self.remember_iceberg_view(start)
            if self.keeps_iceberg_view(start.table) and start.table.has_log:
                require_pyiceberg(self.config.path)
        return memo.start

    def remember_iceberg_view(self, start: LakeAtStart) -> LakeAtStart:
        """Record ``iceberg_view`` in the lake's table.json (a compare-and-swap, as ``lakesink
        config`` does), so that later queries, and ``sync-views``, keep the view without being
        told. A failure only costs the remembering: this run keeps the view either way."""
        # Here, not at the top: the lake defaults' module loads pyarrow.
        from lakesink.maintenance.lake_defaults import set_lake_defaults

        try:
            table = set_lake_defaults(self.storage, {"iceberg_view": True})
        except Exception:  # derived: the run keeps the view, and the next run tries again
            log.warning(
                "could not record iceberg_view in %s's table.json; this query keeps the view, and "
                "`lakesink config %s iceberg_view=true` records it",
                self.config.path,
                self.config.path,
                exc_info=True,
            )
            return start
        return dataclasses.replace(start, table=table)

    def keeps_iceberg_view(self, table: TableMetadata) -> bool:
        """The query's option, else the lake's setting (``table``, its table.json), else off."""
        option = self.config.sink.iceberg_view
        return option if option is not None else bool(table.iceberg_view)

    def check_continuation(self, start: LakeAtStart) -> None:
        """Refuse, before the first batch of a continuing query writes, a continuation that
        cannot be: against the lake as the run found it, for a writer the lake did not know then
        (the commit checks it again, against the state it commits on)."""
        writer = self.query_id()
        continue_writer = self.config.sink.continue_writer
        if writer is None or not continue_writer:
            return  # Spark writes metadata before planning batch 0: nothing to judge yet
        start.check_continuation(writer, continue_writer, self.checkpoint.start_offsets)

    @property
    def auto_compact(self) -> bool:
        """The query's option, else the lake's default (table.json), else off."""
        option = self.config.sink.auto_compact
        if option is not None:
            return option
        start = self.memo.start
        return bool(start is not None and start.table.auto_compact)

    # The commit -----------------------------------------------------------------------------

    def commit(self, batch: int, reports: Sequence[TaskReport]) -> CommitResult:
        """Commit ``batch`` as one version of the lake's log (the commit point; see
        ``lakesink.commit.batches``), from this run's cursor when it has one; then the run's
        first sweep and auto-compaction.

        Whatever fails before the log entry's create deletes this attempt's files (nothing can
        commit them); the committer does the same for every definitive failure of the commit, and
        keeps them when its outcome is unknown (CommitStateUnknownError): see :meth:`abort`.
        """
        adds = self.adds(reports)
        memo = self.memo
        try:
            committer = self.committer(reports)
            self.check_reports_table(reports, committer.log.table_id)
            continues = None
            if batch == 0:
                # Here, not at the top: the commit protocol loads pyarrow.
                from lakesink.commit.continuation import continuation_of

                continues = continuation_of(
                    committer.log.open(),
                    committer.writer_id,
                    self.config.sink.continue_writer,
                    self.checkpoint.start_offsets,
                    self.config.path,
                )
            offsets = self.checkpoint.end_offsets(batch)
        except Exception:
            # Here, not at the top: the commit protocol loads pyarrow.
            from lakesink.commit.batches import drop_files

            drop_files(self.storage, adds, f"the commit of batch {batch} failed before its log entry")
            raise
        cursor, memo.cursor = (memo.cursor if cursor_enabled() else None), None
        result = committer.commit(
            batch,
            adds,
            source_offsets=offsets,
            continues=continues,
            state=cursor,
            tasks_skipped=any(r.skipped for r in reports),
            schema=memo.schema_change,
        )
        memo.cursor = result.state
        self.after_commit(result)
        return result

    def check_reports_table(self, reports: Sequence[TaskReport], table_id: str) -> None:
        """CommitRefusedError when a task wrote its files for another table than the one this
        commit goes to: the lake was deleted and recreated while the batch ran, so those files
        were deleted with the old lake (or sit in the new one, unknown to it). A skipped task's
        report holds no file: nothing of it can be lost (the committer judges the skip)."""
        stale = {r.table_id for r in reports if r.files and r.table_id is not None and r.table_id != table_id}
        if stale:
            raise CommitRefusedError(
                f"{self.config.path}: tasks of this batch wrote their files for table "
                f"{', '.join(sorted(stale))}, but the lake's table is now {table_id}: the lake was "
                "deleted and recreated while the batch ran, and nothing of the batch is committed. "
                "Restart the query with a new checkpoint location (the new lake has none of its "
                "earlier batches)"
            )

    def after_commit(self, result: CommitResult) -> None:
        """The post-commit pipeline of a driver (the views ran inside the commit): the run's
        first sweep (what kills left) and auto-compaction. Neither undoes the commit."""
        memo = self.memo
        if not memo.swept:
            # Here, not at the top: the sweep loads pyarrow and the commit protocol.
            from lakesink.maintenance.sweep import sweep_after_commit

            sweep_after_commit(self.storage, older_than=self.config.sink.staged_cleanup_age)
            memo.swept = True
        if self.auto_compact:
            # Here, not at the top: compaction loads pyarrow and the maintenance modules.
            from lakesink.maintenance.auto_compact import compact_if_due

            done = compact_if_due(
                self.storage,
                result.state,
                write_options=self.config.write,
                due=memo.auto_compact_due,
                **self.compaction,
            )
            self.compacted = done
            if done is not None:
                memo.auto_compact_due = done.next_due

    # The abort ------------------------------------------------------------------------------

    def abort(self, batch: int, reports: Sequence[TaskReport | None]) -> None:
        """The engine gives ``batch`` up. ``reports``: one per task, None for a task that did not
        report (Spark's slots). Deletes the reported files only when a report is missing: an
        abort with every report there may follow a commit whose create may still land (see the
        module docstring), and that commit deleted them itself when its failure was definitive."""
        present = [r for r in reports if r is not None]
        if len(present) == len(reports):
            if not any(r.files for r in present):
                return
            held = self._held(batch, present)
            if held is not None:
                # The usual case: the query was stopped after the commit (Spark then aborts a batch
                # it cannot confirm). The restart replays the batch and the log skips it whole.
                log.info(
                    "abort of batch %d of %s: the log holds it (the writer's last batch is %d), so "
                    "there is nothing to abort; a restart skips it as committed",
                    batch,
                    self.config.path,
                    held,
                )
            else:
                log.warning(
                    "abort of batch %d of %s after every task reported: a commit of it may have been "
                    "tried, and its log entry may still land, so nothing is deleted; the batch's replay "
                    "settles it and the sweep removes the files no version lists",
                    batch,
                    self.config.path,
                )
            return
        self.committer(present).abort(batch, self.adds(present))

    def _held(self, batch: int, reports: Sequence[TaskReport]) -> int | None:
        """The writer's last batch when the log holds ``batch`` (one read of the log), else None
        -- also when the log cannot be read: then the abort says it does not know."""
        try:
            committer = self.committer(reports)
            writer = committer.log.open().writers.get(committer.writer_id)
        except Exception:  # noqa: BLE001 -- a look at the log for the message only
            return None
        return writer.last_batch if writer is not None and writer.last_batch >= batch else None

    # -----------------------------------------------------------------------------------------

    def committer(self, reports: Sequence[TaskReport]) -> BatchCommitter:
        """The batch committer of this writer, with the views it keeps after each commit."""
        # Here, not at the top: the commit protocol and the views load pyarrow.
        from lakesink.commit.batches import BatchCommitter
        from lakesink.views.derived import derived_views, in_threads

        table = self.memo.start.table if self.memo.start is not None else self.table()
        if not table.table_id:
            raise CommitError(f"{self.config.path}: a format-3 lake without a table id in its table.json")
        sink = self.config.sink
        return BatchCommitter(
            self.storage,
            table_id=table.table_id,
            writer_id=self.writer_id(reports),
            run=self.run_token,
            allow_other_queries=sink.allow_other_queries,
            checkpoint_interval=table.log_interval,
            observer=self.config.observer,
            # The views this query keeps, after each of its commits (the committer knows none).
            # Both at once by default: each waits on its own storage round trips (on HDFS with
            # one DataNode, up to 0.5 s in each file's close), and they share no file.
            after_commit=derived_views(
                self.storage,
                table.table_id,
                delta_log=sink.delta_log,
                spark_metadata=sink.spark_metadata,
                iceberg=self.keeps_iceberg_view(table),
                together=in_threads if self.together == "threads" else self.together,
            ),
        )

    def table(self) -> TableMetadata:
        """table.json as it is now (for a commit or abort in a worker that never saw the run start)."""
        # Here, not at the top: table.json's module loads pyarrow.
        from lakesink_reader.format.table import read_table_metadata

        return read_table_metadata(self.storage)

    def query_id(self) -> str | None:
        """The query's id from its checkpoint, read once per run (the memo keeps it)."""
        if self.memo.writer_id is None:
            self.memo.writer_id = self.checkpoint.query_id()
        return self.memo.writer_id

    def writer_id(self, reports: Sequence[TaskReport]) -> str:
        """The writer: the query's id from its checkpoint (or the tasks' reports).

        Every batch needs it, empty ones included (they keep the writer's batches contiguous):
        a commit without one would escape every ownership rule, so it is refused instead.
        """
        found = self.query_id() or next((r.query_id for r in reports if r.query_id), None)
        if found is None:
            raise CommitRefusedError(
                f"{self.config.path}: cannot tell which streaming query commits this batch (no "
                "checkpointLocation option to read its id from, and no task reported it): pass "
                ".option('checkpointLocation', ...) to the writer"
            )
        return found

    @staticmethod
    def adds(reports: Sequence[TaskReport]) -> list[AddFile]:
        """The files of a batch's reports, as the versioned log records them."""
        adds = []
        for r in reports:
            stats = r.stats if len(r.stats) == len(r.files) else (None,) * len(r.files)
            for f, s in zip(r.files, stats, strict=True):
                adds.append(AddFile(f.name, f.rows, f.size, partition=f.partition, batch=f.epoch, stats=s))
        return adds


def reports_of(
    messages: Sequence[Any], batch: int, kind: type[TaskReport] = TaskReport
) -> list[TaskReport | None]:
    """An engine's messages for ``batch`` as reports, None kept where a task did not report;
    CommitError for a message of another kind or batch."""
    found: list[TaskReport | None] = []
    for m in messages:
        if m is None:
            found.append(None)
            continue
        if not isinstance(m, kind):
            raise CommitError(f"unexpected commit message {type(m).__name__} for batch {batch}")
        if m.epoch != batch:
            raise CommitError(f"commit message of batch {m.epoch} handed to the commit of batch {batch}")
        found.append(m)
    return found


def every_report(reports: Sequence[TaskReport | None], batch: int) -> list[TaskReport]:
    """The reports of a commit: Spark calls commit once every task reported."""
    present = [r for r in reports if r is not None]
    if len(present) != len(reports):
        raise CommitError(
            f"the commit of batch {batch} lacks the report of {len(reports) - len(present)} task(s)"
        )
    return present
