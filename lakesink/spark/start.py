"""Starting an epoch-mode query: ``register`` (for ``format("lakesink")``) and ``write_stream``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lakesink.commit import Observer
from lakesink.config import SinkConfig
from lakesink.spark import batch_log as batch_log_module
from lakesink.spark import guard, preflight, pyfiles, warmup
from lakesink.spark.datasource import SOURCE_NAME, LakeSinkDataSource

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


def register(spark: SparkSession, *, warm_up: bool = True, batch_log: bool = False) -> None:
    """Register the ``lakesink`` data source with ``spark``, and check its writes before they start.

    Where lakesink is installed (pip), pyspark finds ``format("lakesink")`` by itself (the
    top-level module ``pyspark_lakesink``); registering is for environments where lakesink is
    shipped with ``--py-files`` instead. Either way, after ``register`` a
    ``df.writeStream.format("lakesink")...start()`` is checked on the driver before it starts
    (unknown options, ``partitionBy``, output mode, schema, another query's lake) and gets
    lakesink's per-query settings, as ``write_stream`` does (``lakesink.spark.guard``); so is a
    ``foreach(LakeForeachWriter(...))`` write. Idempotent.

    Raises :class:`lakesink.WorkerPythonError`, before registering anything, when Spark would
    start its Python workers with an interpreter that cannot import lakesink (local masters;
    on a cluster it warns when ``PYSPARK_PYTHON`` is not set).

    On a Spark Connect session (``SparkSession.builder.remote(...)``, ``spark.api.mode=connect``)
    the data source is registered on the server and writes are checked from the client (the
    lake where the client can reach it); the workers' Python and their warm-up are the
    server's (docs/guide/connect.md).

    With ``warm_up`` (the default), the Python workers a lakesink query runs on the driver are
    started in the background, once per Spark application, so that the first query's first
    epoch does not wait for them (``lakesink.spark.warmup`` says what runs, and why it is safe).
    Call ``register`` right after building the session to give them the most time.

    With ``batch_log``, a listener of the session logs a line per micro-batch of each lakesink
    query started afterwards -- the lake, its version, the files, rows and bytes the batch added,
    a compaction right after it -- and keeps the last figures per query
    (``lakesink.spark.batch_log``). Classic sessions only.
    """
    if preflight.is_connect(spark):
        # The server runs the queries, and the client has no JVM: register the data source
        # there (the server's Python imports lakesink by name), check writes from the client.
        # Once per session: the session object remembers it (nothing process-wide).
        if getattr(spark, _REGISTERED_ATTR, False):
            return
        spark.dataSource.register(LakeSinkDataSource)
        guard.install(connect=True)
        setattr(spark, _REGISTERED_ATTR, True)
        log.info(
            "Spark Connect session: lakesink checks its writes here and leaves two things to the "
            "server: its Python workers' lakesink (not checked from the client) and their warm-up "
            "(skipped: the first epoch starts them)"
        )
        return
    preflight.check_worker_python(spark)  # before anything of lakesink reaches Spark
    _register_data_source(spark)
    pyfiles.link_for_streaming_sources(spark)  # readStream's planner finds a shipped lakesink
    guard.install()
    if batch_log:
        batch_log_module.install(spark)
    if warm_up:
        warmup.start_driver_workers(spark)


#: Set on a Spark Connect session that ``register`` has seen.
_REGISTERED_ATTR = "_lakesink_registered"


def _register_data_source(spark: SparkSession) -> None:
    """Register lakesink's data source with ``spark``, once per session, without Spark's WARN.

    Registered even where pyspark found it installed (``pyspark_lakesink``): Spark runs a
    registered source's Python in the environment of this session's SparkContext -- the one
    the warm-up's workers are started in (``lakesink.spark.warmup``) -- and an installed one
    in another, so the query would start workers of its own. Spark logs a WARN when a
    registration replaces another ("replaced a statically registered data source"), which is
    what is meant here: that logger is quieted around the call, and a second ``register``
    in the same session registers nothing.
    """
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        registered = guard.jvm_field(manager, "runtimeDataSourceBuilders")
        if registered is not None and registered.containsKey(SOURCE_NAME):
            return
    except Exception:  # noqa: BLE001 - another Spark, or no JVM here: register, as always
        pass
    with _quiet_jvm_logger(spark, "org.apache.spark.sql.execution.datasources.DataSourceManager"):
        spark.dataSource.register(LakeSinkDataSource)


@contextlib.contextmanager
def _quiet_jvm_logger(spark: SparkSession, name: str) -> Iterator[None]:
    """Only errors from the JVM logger ``name`` inside (log4j 2, as Spark 4 has); best effort."""
    try:
        jvm: Any = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel()
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception:  # noqa: BLE001 - another logging setup: leave it as it is
        yield
        return
    try:
        yield
    finally:
        configurator.setLevel(name, level)


#: ``write_stream``'s ``via``: which door into Spark (lakesink.spark.batches, lakesink.spark.datasource).
DOORS = ("auto", "foreach_batch", "data_source")


def write_stream(
    df: DataFrame,
    path: str,
    *,
    checkpoint_location: str,
    storage_options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    observer: Observer | None = None,
    via: str = "auto",
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
        ``DataStreamWriter.queryName``: the name Spark shows for the query (and, with
        ``spark.sql.streaming.checkpointLocation`` set, the folder of its checkpoint).
    observer
        Told of each step of the commit protocol (``lakesink.commit.observer``); pickled.
    via
        The door into Spark. ``"foreach_batch"``: through ``foreachBatch`` and ``mapInArrow``,
        which start one kind of Python worker instead of five and commit in this process
        (``lakesink.spark.batches``; classic sessions only). ``"data_source"``: through
        ``format("lakesink")``, the Python Data Source API. ``"auto"`` (the default): the
        first in a classic session, the second under Spark Connect. The lake, the protocol
        and every guarantee are the same.
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
    OtherQueryError
        Another streaming query (another checkpoint) writes the lake.
    WorkerPythonError
        Spark's Python workers would run an interpreter without lakesink.
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
    if via not in DOORS:
        raise ValueError(f"via must be one of {', '.join(map(repr, DOORS))}, got {via!r}")
    if via == "auto":
        # A Spark Connect DataFrame has no JVM object; there foreachBatch's function would run
        # on the server, so the data source door is the one that works.
        via = "foreach_batch" if hasattr(df, "_jdf") else "data_source"
    if via == "foreach_batch":
        # No register: the foreachBatch door uses no data source, and registering one makes
        # Spark start its lookup worker (a daemon that lives as long as the session). Its
        # start makes the checks register's would (the workers' Python among them).
        return guard.start_foreach_batch(df, config, trigger=trigger, query_name=query_name)
    # register's start() refuses a table of another schema, mode or query before the query
    # starts, judging the config parsed here (handed on, not parsed again from the strings); a
    # new table is created by the query's first epoch, so a query that never starts leaves none.
    register(df.sparkSession)
    writer = guard.hand_config(df.writeStream.format(SOURCE_NAME).options(**config.to_options()), config)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()  # through lakesink.spark.guard: checked again, and STREAM_CONF applied
