"""``follow_lake``: one lake streamed into the next through Spark's own Parquet scan (issue 52).

``spark.readStream.format("lakesink")`` is a Python streaming source: its tasks read the files
with pyarrow and hand Spark Arrow batches that Spark turns into rows one at a time, projects
again and meters every 100 rows (``PythonPartitionReaderFactory``: no setting removes it). This
route keeps that source's offsets -- the same positions in the lake's versions, the same files
per micro-batch, compactions skipped and vacuumed history read as the source reads it -- but
asks it for the files only (``filesOnly``: one row per file, from one small task), and reads them
in ``foreachBatch`` with ``spark.read.parquet(*files)`` (``lakesink.spark.scan.files_scan``:
``basePath`` for the partition folders, the lake's schema for every file), then writes the
frame through the foreachBatch door's writer (``lakesink.spark.batches``).

Why exactly once: Spark runs a micro-batch again from the offsets it checkpointed, and the
source's ``partitions(start, end)`` walks the same immutable log versions to the same files; the
destination's log knows the batch by (query id, batch id) and the run skips it before a file is
read (a replay needs none of its files: a compaction and vacuum upstream since then do not
matter). Local disk and HDFS only: Spark's Hadoop client must reach the files by itself.

The schema every batch is read with is the source lake's newest when the query starts, read
after ``load()``, where the source pinned its own (``LakeSinkDataSource.schema``): never older
than the source's, which stops the stream when the lake's schema changes (restart: the new
columns are read, and a lakesink sink downstream needs ``merge_schema=True``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lakesink.config import SinkConfig
from lakesink.spark.batches import LakeBatchWrite
from lakesink.spark.scan import file_root, files_scan
from lakesink_reader.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from lakesink_reader.storage.base import Storage

#: Source options ``follow_lake`` sets itself, or that Spark's scan cannot honour.
_NOT_SOURCE_OPTIONS = ("filesonly", "storage_options", "path")
#: Spark lists more than this many paths of one read with a Spark job of its own (a task per
#: path, by default past 32): the files of a batch are files the log names, whose status is one
#: call each on the driver. Measured (300 small local files, ``local[2]``, loaded): 1.0-2.1 s a
#: read with the job, 0.4-0.7 s without.
_LISTING = ("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000")


class LakeFilesBatchWrite(LakeBatchWrite):
    """The ``foreachBatch`` function of ``follow_lake``: each micro-batch's rows are the source
    lake's files (``filesOnly``), read here with Spark's scan, ``transform`` applied, written and
    committed as the foreachBatch door writes a batch."""

    def __init__(
        self,
        config: SinkConfig,
        source: str,
        schema: Any,
        transform: Callable[[DataFrame], DataFrame] | None = None,
    ) -> None:
        super().__init__(config)
        self.upstream = source  # the lake read (self.source is the sink's data source)
        root = file_root(source)
        if root is None:
            raise ValueError(
                f"{source!r} is not where Spark's Hadoop client reads by itself (local disk, HDFS)"
            )
        self.root: str = root  # the source lake's root, as Spark's Hadoop client names it
        self.schema = schema  # the source lake's, a StructType
        self.transform = transform
        #: the files the run's last batch read (None: a replay, or none yet)
        self.last_files: int | None = None
        self._storage: Storage | None = None

    def __repr__(self) -> str:
        return f"LakeFilesBatchWrite({self.root!r} -> {self.config.path!r})"

    def frame(self, spark: SparkSession, names: list[str]) -> DataFrame:
        """What a batch of these files writes: Spark's scan of them, transformed."""
        frame = files_scan(spark, self.schema, self.root, names)
        return frame if self.transform is None else self.transform(frame)

    def write_batch(self, df: Any, batch_id: int) -> None:
        # The query's own session (Spark runs a stream's batches in a clone of the session that
        # started it): the setting stays with this query.
        spark = df.sparkSession
        spark.conf.set(*_LISTING)
        if self.writer is None:
            # The writer's schema is what a batch of no files writes: Spark's scan makes every
            # column nullable (lakesink compares schemas without nullability).
            self.start_run(self.frame(spark, []).schema)
        if self.is_replay(batch_id):
            self.last_files = None
            self.commit_replay(batch_id)
            return
        files = df.select("name", "rows").collect()  # in the source's order
        names = [row[0] for row in files]
        if self._storage is None:
            self._storage = open_storage(self.upstream)
        for name in names:
            # Spark's scan follows links, which could lead out of the lake: a committed name that
            # is one is refused, as every lakesink read refuses it (docs/FORMAT.md, "Trust").
            self._storage.refuse_link(name)
        self.last_files = len(names)
        # The log counts each file's rows: a large batch goes to the tasks without a bounded
        # collect first (an upper bound when the transform drops rows; unknown when one is not).
        known = None if any(row[1] < 0 for row in files) else sum(row[1] for row in files)
        self.write_and_commit(self.frame(spark, names), batch_id, known)


def follow_lake(
    spark: SparkSession,
    source: str,
    sink: str,
    *,
    checkpoint_location: str,
    transform: Callable[[DataFrame], DataFrame] | None = None,
    source_options: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    **options: Any,
) -> StreamingQuery:
    """Stream the lake at ``source`` into the lake at ``sink`` exactly once, reading each
    micro-batch's files with Spark's own Parquet scan (the module says how, and why it is exact).

    What ``spark.readStream.format("lakesink").load(source)`` into
    ``write_stream(..., via="foreach_batch")`` does, faster: the rows never pass through a
    Python source. ``source`` must be on local disk or HDFS (Spark's Hadoop client reads it
    without storage options); an S3 lake takes the Python source.

    Parameters
    ----------
    source
        The upstream lake (a format-3 epoch-mode lake): its appends, once each; compactions are
        no new data.
    sink
        The downstream lake, written as :func:`lakesink.write_stream` writes it.
    checkpoint_location
        Spark's checkpoint folder for the query: restarting from it resumes exactly once.
    transform
        A function of a batch DataFrame (the source lake's rows) to what is written, e.g.
        ``lambda df: df.where("value IS NOT NULL")``; it must return the same columns for every
        batch (it is called once more, on no rows, to learn them).
    source_options
        Options of the lake stream: ``maxFilesPerTrigger``, ``maxBytesPerTrigger``,
        ``startingVersion``, ``startingTimestamp`` (docs/guide/reading.md).
    storage_options, trigger, query_name, **options
        As :func:`lakesink.write_stream`'s (the sink's).

    Raises
    ------
    ValueError
        The source is not where Spark's Hadoop client reaches it, or an option is bad.
    """
    # Here, not at the top: start loads the guard and the data source door.
    from pyspark.sql.pandas.types import from_arrow_schema

    from lakesink.spark import guard
    from lakesink.spark.start import register
    from lakesink_reader.lake import Lake

    root = file_root(source)
    if root is None:
        raise ValueError(
            f"follow_lake reads {source!r} with Spark's Parquet scan, whose Hadoop client reaches local "
            "disk and HDFS by itself, not S3 with lakesink's storage options: stream it with "
            'spark.readStream.format("lakesink") and lakesink.write_stream instead (the Python source)'
        )
    given = dict(source_options or {})
    refused = sorted(k for k in given if k.lower() in _NOT_SOURCE_OPTIONS)
    if refused:
        raise ValueError(
            f"source_options {refused}: follow_lake sets the path and filesOnly itself, and reads the "
            "source without storage options (local disk and HDFS)"
        )
    if not hasattr(spark, "_jsparkSession"):
        raise ValueError(
            "follow_lake runs in classic PySpark sessions only (its foreachBatch function reads and "
            'commits in this process); under Spark Connect stream the lake with readStream.format("lakesink")'
        )
    config = SinkConfig.from_keywords(
        sink, storage_options=storage_options, checkpoint_location=checkpoint_location, **options
    )
    register(spark, warm_up=False)  # the lake stream is a lakesink data source
    reader = spark.readStream.format("lakesink").option("filesOnly", "true")
    for key, value in given.items():
        reader = reader.option(key, value)
    files = reader.load(source)
    # After load(): the source read its schema there, and this one is never older.
    schema = from_arrow_schema(Lake(source).schema)
    batch_write = LakeFilesBatchWrite(config, source, schema, transform)
    return guard.start_foreach_batch(
        files,
        config,
        trigger=trigger,
        query_name=query_name,
        batch_write=batch_write,
        schema=batch_write.frame(spark, []).schema,
    )
