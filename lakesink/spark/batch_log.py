"""A line per micro-batch of each lakesink query: the lake's figures where streaming users look.

A Python data source cannot add metrics to Spark's ``StreamingQueryProgress`` (pyspark 4.3:
its sink reports ``numOutputRows`` only, and its description is Spark's ``PythonTable@...``,
which names no lake), so ``lakesink.register(spark, batch_log=True)`` installs a
:class:`LakeBatchLog`, a ``StreamingQueryListener`` of that session. For each progress event of a
lakesink query started after it (``format("lakesink")`` or ``write_stream``), it reads the
batch's commit header from the lake's log -- one small read, in Spark's listener thread, never
on the query's path -- and logs (logger ``lakesink.spark.batch_log``, INFO)::

    lakesink: query 1f0c... batch 7 -> /data/lake/events version 12: +2 files, +10,000 rows,
    +412,345 bytes; compacted at version 13 (31 files -> 1)

and keeps the last :class:`BatchFigures` of each query (``listener.last[query_id]``) for a
notebook or a monitoring hook. A version right after the batch's that is a compaction is named
(auto-compaction, or a manual one that ran then). The queries it watches are keyed by query id
on the listener, which lives on the session object: nothing is process-wide, and a query's entry
goes when it terminates. Classic sessions only (a Spark Connect client's listeners run on the
server).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.listener import StreamingQueryListener

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config import SinkConfig

log = logging.getLogger(__name__)

#: The session attribute that holds its listener (set by ``register(spark, batch_log=True)``).
_LISTENER_ATTR = "_lakesink_batch_log"


@dataclass(frozen=True)
class BatchFigures:
    """What a micro-batch did to its lake: the version of its commit and what it added; the
    compaction that followed it at once, if any (its version, files in and out)."""

    query_id: str
    batch: int
    lake: str
    version: int
    files: int
    rows: int
    bytes: int
    compaction: tuple[int, int, int] | None = None

    def line(self) -> str:
        done = ""
        if self.compaction:
            version, before, after = self.compaction
            done = f"; compacted at version {version} ({before} files -> {after})"
        return (
            f"lakesink: query {self.query_id} batch {self.batch} -> {self.lake} version {self.version}: "
            f"+{self.files:,} files, +{self.rows:,} rows, +{self.bytes:,} bytes{done}"
        )


class LakeBatchLog(StreamingQueryListener):  # type: ignore[misc]
    """Logs :meth:`BatchFigures.line` for each micro-batch of the lakesink queries it watches."""

    def __init__(self) -> None:
        self.lakes: dict[str, tuple[str, dict[str, Any]]] = {}  # query id -> (lake, storage options)
        self.last: dict[str, BatchFigures] = {}

    def watch(self, query_id: str, lake: str, storage_options: dict[str, Any]) -> None:
        self.lakes[query_id] = (lake, storage_options)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        query_id = str(progress.id)
        watched = self.lakes.get(query_id)
        if watched is None or not progress.numInputRows:
            return
        try:
            figures = batch_figures(query_id, progress.batchId, *watched)
        except Exception as exc:  # noqa: BLE001 -- a report, never the query's failure
            log.warning("lakesink: no figures for query %s batch %s: %s", query_id, progress.batchId, exc)
            return
        if figures is not None:
            self.last[query_id] = figures
            log.info("%s", figures.line())

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.lakes.pop(str(event.id), None)


def batch_figures(
    query_id: str, batch: int, lake: str, storage_options: dict[str, Any]
) -> BatchFigures | None:
    """The figures of ``batch`` of the writer ``query_id`` in ``lake``, from the log; None when
    the log does not (or no longer) hold that batch as the writer's last."""
    # Here, not at the top: the reader loads pyarrow, and this module is imported with guard's.
    from lakesink_reader import Lake

    opened = Lake(lake, storage_options)
    writer = next((w for w in opened.writers() if w.id == query_id), None)
    if writer is None or writer.last_batch != batch:
        return None
    [entry] = opened.at(version=writer.last_version).history(limit=1)
    # The version right after the batch's, if the log has one yet: its header alone.
    following = writer.last_version + 1
    after = opened.at(version=following).history(limit=1)[0] if following <= (opened.version or -1) else None
    # Its kind, not its operation: history names a writer's own compaction "auto-compaction".
    compaction = (
        (after.version, after.remove_files, after.add_files)
        if after is not None and after.kind == "compact"
        else None
    )
    return BatchFigures(
        query_id, batch, lake, entry.version, entry.add_files, entry.add_rows, entry.add_bytes, compaction
    )


def install(spark: SparkSession) -> LakeBatchLog:
    """The session's listener, added once (``register(spark, batch_log=True)``)."""
    listener: LakeBatchLog | None = getattr(spark, _LISTENER_ATTR, None)
    if listener is None:
        listener = LakeBatchLog()
        spark.streams.addListener(listener)
        setattr(spark, _LISTENER_ATTR, listener)
    return listener


def watch(spark: SparkSession, query: Any, config: SinkConfig) -> None:
    """Have the session's listener, if ``register`` installed one, watch ``query``'s lake."""
    listener: LakeBatchLog | None = getattr(spark, _LISTENER_ATTR, None)
    if listener is not None:
        listener.watch(str(query.id), config.path, dict(config.storage_options or {}))
