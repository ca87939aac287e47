"""Starting an epoch-mode query: ``register`` (for ``format("lakesink")``) and ``write_stream``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lakesink.commit import Observer
from lakesink.config import SinkConfig
from lakesink.format.table import check_compatible, find_table
from lakesink.spark import guard, warmup
from lakesink.spark.datasource import SOURCE_NAME, LakeSinkDataSource
from lakesink.spark.rows import arrow_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


def register(spark: SparkSession, *, warm_up: bool = True) -> None:
    """Register the ``lakesink`` data source with ``spark``, and check its writes before they start.

    Where lakesink is installed (pip), pyspark finds ``format("lakesink")`` by itself (the
    top-level module ``pyspark_lakesink``); registering is for environments where lakesink is
    shipped with ``--py-files`` instead. Either way, after ``register`` a
    ``df.writeStream.format("lakesink")...start()`` is checked on the driver before it starts
    (unknown options, ``partitionBy``, output mode, schema) and gets lakesink's per-query
    settings, as ``write_stream`` does (``lakesink.spark.guard``). Idempotent.

    With ``warm_up`` (the default), the Python workers a lakesink query runs on the driver are
    started in the background, once per Spark application, so that the first query's first
    epoch does not wait for them (``lakesink.spark.warmup`` says what runs, and why it is safe).
    Call ``register`` right after building the session to give them the most time.
    """
    spark.dataSource.register(LakeSinkDataSource)
    guard.install()
    guard.check_worker_python(spark)
    if warm_up:
        warmup.start_driver_workers(spark)


def write_stream(
    df: DataFrame,
    path: str,
    *,
    checkpoint_location: str,
    storage_options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    observer: Observer | None = None,
    **options: Any,
) -> StreamingQuery:
    """Start an epoch-mode streaming write of ``df`` into the lake at ``path``.

    Every argument is checked before the query starts, and nothing is written to the lake
    until its first epoch runs.

    Parameters
    ----------
    df
        A streaming DataFrame.
    path
        Table root: local path, ``file://`` URL or ``s3://bucket/prefix``.
    checkpoint_location
        Spark's checkpoint folder for the query: restarting from it resumes exactly once.
    storage_options
        Storage options (S3 endpoint, credentials); sent to Spark as one JSON option and
        never shown in reprs or errors.
    trigger
        Keyword arguments of ``DataStreamWriter.trigger``, e.g. ``{"availableNow": True}`` or
        ``{"processingTime": "10 seconds"}``; Spark's default when None.
    query_name
        ``DataStreamWriter.queryName``.
    observer
        Told of each step of the commit protocol (``lakesink.commit.observer``); pickled.
    **options
        The fields of :class:`lakesink.WriteOptions` (``row_group_bytes``, ``compression``,
        ``compression_level``, ``use_dictionary``, ``dictionary_page_bytes``) and
        ``checkpoint_interval``, ``staged_cleanup_age`` (``lakesink.config.SinkOptions``).

    Returns
    -------
    pyspark.sql.streaming.StreamingQuery
        The started query.

    Raises
    ------
    TypeError, ValueError
        An unknown option, a bad value, a bad trigger: nothing is started or written.
    SchemaMismatchError, ModeMismatchError
        The lake exists with another schema, or in foreach mode.
    """
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise ValueError(f"checkpoint_location must be a non-empty path, got {checkpoint_location!r}")
    if trigger is not None and not isinstance(trigger, Mapping):
        raise TypeError(
            f"trigger must be a dict of DataStreamWriter.trigger keywords such as "
            f"{{'processingTime': '5 seconds'}} or {{'availableNow': True}}, got {trigger!r}"
        )
    config = SinkConfig.from_keywords(
        path,
        storage_options=storage_options,
        checkpoint_location=checkpoint_location,
        observer=observer,
        **options,
    )
    # Fail before starting on a table of another schema or mode; a new table is created by
    # the query's first epoch, so a query that never starts leaves no table behind.
    existing = find_table(config.storage())
    if existing is not None:
        check_compatible(existing, arrow_schema(df.schema), "epoch", config.storage().url)
    register(df.sparkSession)
    writer = df.writeStream.format(SOURCE_NAME).options(**config.to_options())
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()  # through lakesink.spark.guard: checked again, and STREAM_CONF applied
