"""``LakeForeachWriter``: Spark's row-at-a-time ``foreach`` hooks mapped onto the commit protocol.

Semantics (docs/FORMAT.md, "foreach mode"): each (partition, epoch) is committed on its own,
as one file whose name is deterministic per (query, partition, epoch) -- the query id survives
restarts from the same checkpoint, so a replay of a committed (partition, epoch) finds its
file and is skipped, while another query writing to the same lake never collides with it.
This is exactly-once as long as Spark replays the same rows under the same partition ids --
true for a deterministic query over a replayable source without a change of partitioning
(SPARK-28650). The epoch mode (``format("lakesink")``) has no such caveat.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from lakesink.commit import ParquetStage, WriteOptions, discard_quietly, publish
from lakesink.layout import committed_name
from lakesink.metadata import ensure_table
from lakesink.pyworkers import freeze_heap_once
from lakesink.rows import arrow_schema, infer_schema, rows_to_batch
from lakesink.storage import Storage, open_storage

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
        fsspec-style options for the storage (S3: ``endpoint_url``, ``key``, ``secret``, ...).
    batch_rows
        Rows gathered in Python before they become one Arrow batch.
    write_options
        Parquet layout and memory bound, see :class:`lakesink.commit.WriteOptions`.
    """

    def __init__(
        self,
        path: str,
        *,
        schema: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        batch_rows: int = 10_000,
        write_options: WriteOptions | None = None,
    ) -> None:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        self.path = path
        self.schema: pa.Schema | None = arrow_schema(schema) if schema is not None else None
        self.storage_options = dict(storage_options or {})
        self.batch_rows = batch_rows
        self.write_options = write_options or WriteOptions()
        open_storage(path, self.storage_options)  # fail on the driver for a bad URL, not in tasks
        self._reset()

    def __repr__(self) -> str:  # never shows storage_options: they may hold secrets
        return f"LakeForeachWriter({self.path!r})"

    def _reset(self) -> None:
        self._storage: Storage | None = None
        self._stage: ParquetStage | None = None
        self._rows: list[Any] = []
        self._table_checked = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for transient in ("_storage", "_stage", "_rows", "_table_checked"):
            state.pop(transient, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # Spark hooks -------------------------------------------------------------------------

    def open(self, partition_id: int, epoch_id: int) -> bool:
        """Stage this (partition, epoch); False (skip it) when it is already committed."""
        freeze_heap_once()
        storage = self._storage or open_storage(self.path, self.storage_options)
        self._storage = storage
        self._rows = []
        name = committed_name(partition_id, epoch_id, _query_tag())
        if storage.exists(name):
            log.info("%s/%s already committed: skipping the replay", self.path, name)
            return False
        self._name = name
        self._stage = None
        return True

    def process(self, row: Any) -> None:
        # Called once per row: keep it to an append and a length check (~0.2 us). By the time
        # it runs, pyspark has spent ~5x our whole per-row cost building the Row (the profile
        # is in lakesink/rows.py); converting a batch of rows at once is what stays cheap.
        rows = self._rows
        rows.append(row)
        if len(rows) >= self.batch_rows:
            self._flush_rows()

    def close(self, error: BaseException | None) -> None:
        """Publish on success; on error discard (the error itself is re-raised by Spark)."""
        stage = self._stage
        if error is not None:
            self._rows = []
            if stage is not None:
                discard_quietly(stage.discard, f"staged file for {self._name}")
            return
        try:
            self._flush_rows()
            stage = self._stage
            sealed = stage.seal() if stage is not None else None
            if sealed is not None:
                assert self._storage is not None
                publish(self._storage, sealed)
        except BaseException:
            if stage is not None:
                discard_quietly(stage.discard, f"staged file for {self._name}")
            raise
        finally:
            self._stage = None

    # -------------------------------------------------------------------------------------

    def _flush_rows(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        if self.schema is None:
            self.schema = infer_schema(rows)
        if not self._table_checked:
            assert self._storage is not None
            ensure_table(self._storage, self.schema, "foreach")
            self._table_checked = True
        if self._stage is None:
            assert self._storage is not None
            self._stage = ParquetStage(self._storage, self._name, self.schema, self.write_options)
        self._stage.write(rows_to_batch(rows, self.schema))


def _query_tag() -> str | None:
    """The streaming query's id (stable across restarts from its checkpoint), shortened."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the hooks only run inside Spark tasks
        return None
    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    return query_id.replace("-", "")[:16] if query_id else None
