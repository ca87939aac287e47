"""``LakeForeachWriter``: Spark's row-at-a-time ``foreach`` hooks mapped onto the commit protocol.

Semantics (docs/FORMAT.md, "foreach mode"): each (partition, epoch) is committed on its own,
as one file whose name is deterministic per (query, partition, epoch) -- the query id survives
restarts from the same checkpoint, so a replay of a committed (partition, epoch) finds its
file and is skipped. This is exactly-once as long as Spark replays the same rows under the
same partition ids -- true for a deterministic query over a replayable source without a
change of partitioning (SPARK-28650) -- and only within one query: a new checkpoint is a new
query, which would write the same input again. So a lake belongs to the query that created
it, and another query is refused unless ``allow_other_queries=True`` says its rows are
different. The epoch mode (``format("lakesink")``) has none of these caveats.

Where each hook runs: ``__init__`` on the driver (the object is then pickled to every task),
``open`` / ``process`` / ``close`` in an executor's Python worker, once per (partition, epoch).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from lakesink.commit import FileWriter, Observer, WriteOptions
from lakesink.commit.partitioned import PartitionedWriter
from lakesink.spark.rows import arrow_schema, infer_schema, rows_to_batch
from lakesink.spark.workers import freeze_heap_once
from lakesink_reader.errors import CommitError, StorageError
from lakesink_reader.format.partitions import check_partition_columns
from lakesink_reader.format.schemas import file_schema
from lakesink_reader.format.table import (
    TableMetadata,
    check_partitioning,
    check_writable_format,
    ensure_table,
    find_table,
    probe_store,
)
from lakesink_reader.names import data_file_name
from lakesink_reader.storage import Storage, open_storage
from lakesink_reader.storage.options import Redacted, check_storage_options

log = logging.getLogger(__name__)


class LakeForeachWriter:
    """A Spark ``foreach`` writer that commits each (partition, epoch) as one Parquet file.

    Use as ``df.writeStream.foreach(LakeForeachWriter(path, schema=df.schema))``.

    Parameters
    ----------
    path
        Table root: a local path, ``file://`` URL or ``s3://bucket/prefix``.
    schema
        ``df.schema`` (a pyspark StructType) or a pyarrow Schema. Without it the schema is
        inferred from the first rows of each partition (an all-null column cannot be inferred).
    storage_options
        Options for the storage (S3: ``endpoint_url``, ``key``, ``secret``, ...), checked here
        on the driver.
    batch_rows
        Rows gathered in Python before they become one Arrow batch.
    write_options
        Parquet layout and memory bound, see :class:`lakesink.WriteOptions`.
    allow_other_queries
        Let this query write to a lake that another streaming query (another checkpoint)
        created. Only for queries that write *different* rows: restarting the same input under
        a new checkpoint writes every row again.
    observer
        Told of each step of the commit protocol (see ``lakesink.commit.observer``).
    partition_by
        The columns whose values name the folders a new lake's files go in, Hive-style (see
        ``lakesink.config.SinkOptions.partition_by``): each (partition, epoch) then writes one
        file per folder it meets, all under the same name, and each commits on its own as the
        single file does. A task holds them open until it closes: one whose rows fall into more
        than ``write_options.max_open_files`` folders fails, naming the option. None: an
        existing lake's partitioning (a new lake's files in its root).
    """

    def __init__(
        self,
        path: str,
        *,
        schema: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        batch_rows: int = 10_000,
        write_options: WriteOptions | None = None,
        allow_other_queries: bool = False,
        observer: Observer | None = None,
        partition_by: Sequence[str] | None = None,
    ) -> None:
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise ValueError(f"batch_rows must be an int >= 1, got {batch_rows!r}")
        if write_options is not None and not isinstance(write_options, WriteOptions):
            raise TypeError(
                f"write_options must be a lakesink.WriteOptions, got {type(write_options).__name__}"
            )
        self.path = path
        self.schema: pa.Schema | None = arrow_schema(schema) if schema is not None else None
        # Held redacted: the writer is pickled to every task, and vars(writer) must not show secrets.
        self._options = Redacted(check_storage_options(storage_options, path))
        self.batch_rows = batch_rows
        self.write_options = write_options or WriteOptions()
        if self.write_options.max_records_per_file is not None:
            raise ValueError(
                "max_records_per_file rolls a task's rows into several files, which the foreach "
                "writer cannot: each of its files commits when published, and a replay must name the "
                'same one. Write in epoch mode (lakesink.write_stream or format("lakesink")) to roll files'
            )
        self.allow_other_queries = allow_other_queries
        self.observer = observer
        if partition_by is not None and (
            isinstance(partition_by, str) or not all(isinstance(c, str) for c in partition_by)
        ):
            raise TypeError(f"partition_by must be a list of column names, got {partition_by!r}")
        self.partition_by = tuple(partition_by) if partition_by is not None else None
        if self.schema is not None and self.partition_by:
            check_partition_columns(self.schema, self.partition_by, "the stream")
        # Fail on the driver for a bad URL or bad storage options, not in every task; and for
        # workers that cannot import lakesink, which would fail every task with a module error.
        storage = open_storage(path, self.storage_options)
        connect = _check_active_session()
        # Each run of a query builds its writer here, on the driver: the one place to check,
        # once per run, that the store of an existing lake still refuses to overwrite (a new
        # lake is checked when its first task creates it).
        try:
            existing = find_table(storage)
        except (StorageError, PermissionError):
            if not connect:
                raise
            existing = None  # a Spark Connect client need not reach the lake: its server's tasks check it
        if existing is not None:
            check_writable_format(existing, storage.url)
            check_partitioning(existing, self.partition_by, storage.url)
            probe_store(storage)
        self._reset()

    def __repr__(self) -> str:  # never shows storage_options: they may hold secrets
        return f"LakeForeachWriter({self.path!r})"

    @property
    def storage_options(self) -> dict[str, Any]:
        return dict(self._options.value)

    def _reset(self) -> None:
        self._storage: Storage | None = None
        self._file: FileWriter | PartitionedWriter | None = None
        self._rows: list[Any] = []
        self._name = ""
        self._partition = self._epoch = -1
        self._tag: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for transient in ("_storage", "_file", "_rows", "_name", "_partition", "_epoch", "_tag"):
            state.pop(transient, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # Spark hooks -------------------------------------------------------------------------

    def open(self, partition_id: int, epoch_id: int) -> bool:
        """Prepare this (partition, epoch). Always True: a replay is written again.

        A replayed (partition, epoch) whose file exists cannot be skipped: that file may be
        truncated (see ``FileWriter.publish``), and only the replay's row count can tell. The
        replay's file is then discarded (as many rows: the usual case) or replaces it (more).
        """
        freeze_heap_once()
        self._storage = self._storage or open_storage(self.path, self.storage_options)
        self._rows, self._file = [], None
        self._partition, self._epoch, self._tag = partition_id, epoch_id, query_tag()
        self._name = data_file_name(partition_id, epoch_id, self._tag)
        return True

    def process(self, row: Any) -> None:
        # Called once per row: keep it to an append and a length check (~0.2 us). By the time
        # it runs, pyspark has spent ~5x our whole per-row cost building the Row (the profile
        # is in lakesink/spark/rows.py); converting a batch of rows at once is what stays cheap.
        rows = self._rows
        rows.append(row)
        if len(rows) >= self.batch_rows:
            self._flush_rows()

    def close(self, error: BaseException | None) -> None:
        """Publish on success; on error discard (the error itself is re-raised by Spark)."""
        if error is None:
            try:
                self._flush_rows()
            except BaseException:
                self._discard()
                raise
        else:
            self._discard()
        file, self._file = self._file, None
        if file is not None:
            file.publish()  # discards the staged file itself if publishing fails

    def _discard(self) -> None:
        self._rows = []
        file, self._file = self._file, None
        if file is not None:
            file.discard()

    # -------------------------------------------------------------------------------------

    def _flush_rows(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        if self.schema is None:
            self.schema = infer_schema(rows)
        if self._file is None:
            assert self._storage is not None
            table = self._check_table(self._storage, self.schema)
            # The file stores the stream's columns as the lake declares them (nullability): what
            # engines reading the files' own schemas see is then what table.json says.
            stored = file_schema(self.schema, table.schema)
            if table.partition_columns:
                # One file per folder, all of the (partition, epoch)'s name: a replay finds them.
                name = self._name
                self._file = PartitionedWriter(
                    self._storage,
                    stored,
                    table.partition_columns,
                    lambda: name,
                    self.write_options,
                    observer=self.observer,
                    epoch=self._epoch,
                    partition=self._partition,
                    evict=False,
                )
            else:
                self._file = FileWriter(
                    self._storage,
                    self._name,
                    stored,
                    self.write_options,
                    observer=self.observer,
                    epoch=self._epoch,
                    partition=self._partition,
                )
        self._file.write(rows_to_batch(rows, self.schema))

    def _check_table(self, storage: Storage, schema: pa.Schema) -> TableMetadata:
        # Every task reads table.json (one small read per (partition, epoch) file): remembering
        # it in the worker process is a cache that a lake deleted and recreated, or another
        # query in the same reused worker, could trip over.
        table = ensure_table(
            storage, schema, "foreach", owner_query=self._tag, partition_by=self.partition_by
        )
        owner = table.owner_query
        if owner and self._tag and owner != self._tag and not self.allow_other_queries:
            raise CommitError(
                f"the lake at {self.path} belongs to streaming query {owner}, and query {self._tag} is "
                "a different one (a new checkpoint location?). A new checkpoint re-reads the input from "
                "the start: every row would be written again. Restart from the original checkpoint, or "
                "write to a new lake path; if this query writes different rows, pass "
                "LakeForeachWriter(..., allow_other_queries=True)."
            )
        return table


def _check_active_session() -> bool:
    """Check the workers' Python of the session this writer is built in; True for a Connect client.

    ``__init__`` runs on the driver (or a Spark Connect client), before the query starts;
    pyspark is not imported for it. (After ``lakesink.register``, ``start()`` also checks the
    lake: ``lakesink.spark.guard``.)
    """
    if "pyspark.sql" not in sys.modules:
        return False
    # Here, not at the top: executors import this module for every task, and need neither pyspark
    # (not imported for it) nor preflight (the driver's checks: subprocess, shutil; 0.05 s).
    from pyspark.sql import SparkSession

    from lakesink.spark.preflight import check_worker_python, is_connect

    spark = SparkSession.getActiveSession()
    if spark is None:
        return False
    check_worker_python(spark)
    return is_connect(spark)


def query_tag() -> str | None:
    """The streaming query's id (stable across restarts from its checkpoint), shortened."""
    try:
        # Here, not at the top: foreach imports no pyspark (lakesink.spark's docstring); its tasks have it.
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the hooks only run inside Spark tasks
        return None
    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    return query_id.replace("-", "")[:16] if query_id else None
