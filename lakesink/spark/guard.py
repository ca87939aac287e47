"""What happens on the driver when pyspark's own writers start a ``format("lakesink")`` write.

A Python data source sees its options only when its query's first micro-batch runs, never sees
``partitionBy``, and cannot set SQL options for its query: so a misspelt option, a
``partitionBy`` it would ignore, a non-append output mode or a batch ``df.write`` would fail
late, or silently do the wrong thing. ``install()`` (called by ``lakesink.register``) wraps
``DataStreamWriter.start`` and ``DataFrameWriter.save`` of pyspark's classic API so that, for a
lakesink write -- and for nothing else -- the wrapper reads the writer's format, options and
partitioning from its JVM object (by reflection: they are private fields), refuses before
anything starts what lakesink would refuse or ignore, and starts the query with lakesink's
per-query settings (``STREAM_CONF`` below, applied only around ``start()``). Every other write
goes through unchanged; if the JVM object is not laid out as expected (another Spark), the
wrapper steps aside and the data source's own checks apply at the first micro-batch.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lakesink.config import SinkConfig
from lakesink.spark import preflight
from lakesink.spark.rows import arrow_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.spark.foreach import LakeForeachWriter

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink"
_installed = False


def install() -> None:
    """Wrap pyspark's classic ``DataStreamWriter.start``/``foreach`` and ``DataFrameWriter.save`` (once).

    The wrappers are process-wide, as pyspark's classes are, and stateless: whatever they
    learn about a write lives on that writer object.
    """
    global _installed
    if _installed:
        return
    from pyspark.sql.readwriter import DataFrameWriter
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    DataStreamWriter.start = _checked_start(DataStreamWriter.start)  # type: ignore[method-assign]
    DataStreamWriter.foreach = _remembered_foreach(DataStreamWriter.foreach)  # type: ignore[method-assign]
    DataFrameWriter.save = _checked_save(DataFrameWriter.save)  # type: ignore[method-assign]
    _installed = True


#: The attribute under which a DataStreamWriter keeps the LakeForeachWriter it was given.
_FOREACH_ATTR = "_lakesink_foreach_writer"


def _remembered_foreach(foreach: Any) -> Any:
    @functools.wraps(foreach)
    def remembered(self: Any, f: Any) -> Any:
        from lakesink.spark.foreach import LakeForeachWriter

        result = foreach(self, f)
        setattr(self, _FOREACH_ATTR, f if isinstance(f, LakeForeachWriter) else None)
        return result

    return remembered


def jvm_field(obj: Any, name: str) -> Any:
    """A private field of a JVM object (searched up its class hierarchy), or None."""
    cls = obj.getClass()
    while cls is not None:
        try:
            field = cls.getDeclaredField(name)
        except Exception:  # noqa: BLE001 - py4j wraps NoSuchFieldException: try the superclass
            cls = cls.getSuperclass()
            continue
        field.setAccessible(True)
        return field.get(obj)
    return None


def _options(jwriter: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    extra = jvm_field(jwriter, "extraOptions")
    if extra is None:
        return found
    entries = extra.originalMap().iterator()
    while entries.hasNext():
        entry = entries.next()
        found[str(entry._1())] = str(entry._2())
    return found


def _is_lakesink(jwriter: Any) -> bool:
    try:
        source = jvm_field(jwriter, "source")
    except Exception:  # noqa: BLE001 - a JVM object of another layout: not ours to judge
        return False
    return source is not None and str(source).lower() == SOURCE_NAME


def _checked_start(start: Any) -> Any:
    @functools.wraps(start)
    def checked(self: Any, path: str | None = None, format: str | None = None, outputMode: str | None = None,
                partitionBy: Any = None, queryName: str | None = None, **options: Any) -> Any:  # fmt: skip
        # pyspark's start() applies these first, as below; then lakesink can judge the writer.
        if format is not None:
            self.format(format)
        if partitionBy is not None:
            self.partitionBy(partitionBy)
        if options:
            self.options(**options)
        if outputMode is not None:
            self.outputMode(outputMode)
        foreach_writer = getattr(self, _FOREACH_ATTR, None)
        if foreach_writer is not None:
            check_foreach_stream(self, foreach_writer, queryName)
            return start(self, path, queryName=queryName)
        if not _is_lakesink(self._jwrite):
            return start(self, path, queryName=queryName)
        check_stream(self, path, queryName)
        with query_conf(self._df.sparkSession, STREAM_CONF):
            return start(self, path, queryName=queryName)

    return checked


def check_stream(writer: Any, path: str | None, query_name: str | None = None) -> None:
    """Refuse, before it starts, a lakesink streaming write that would fail or do the wrong thing."""
    jwrite = writer._jwrite
    spark = writer._df.sparkSession
    preflight.check_worker_python(spark)
    partitioning = jvm_field(jwrite, "partitioningColumns")
    if partitioning is not None and partitioning.isDefined():
        columns = str(partitioning.get().mkString("\x00")).split("\x00")  # a Scala Seq of names
        raise ValueError(
            f'format("lakesink") does not partition files (yet): remove .partitionBy({columns}); '
            "every file holds all columns, and readers filter on them (filters are pushed down)"
        )
    _check_append(jwrite, 'format("lakesink")')
    options = _options(jwrite)
    if path is not None:
        options["path"] = path
    if query_name:
        options["queryName"] = query_name
    config = SinkConfig.from_options(options)  # unknown or bad options fail here, by name
    query = preflight.query_identity(spark, options, config.storage_options)
    preflight.check_epoch_start(config, arrow_schema(writer._df.schema), query)


def check_foreach_stream(writer: Any, foreach_writer: LakeForeachWriter, query_name: str | None) -> None:
    """What :func:`check_stream` checks, for a ``foreach(LakeForeachWriter(...))`` write."""
    jwrite = writer._jwrite
    spark = writer._df.sparkSession
    preflight.check_worker_python(spark)
    _check_append(jwrite, "LakeForeachWriter")
    options = _options(jwrite)
    if query_name:
        options["queryName"] = query_name
    query = preflight.query_identity(spark, options, foreach_writer.storage_options)
    preflight.check_foreach_start(foreach_writer, foreach_writer.schema, query)


def _check_append(jwrite: Any, what: str) -> None:
    mode = jvm_field(jwrite, "outputMode")
    if mode is not None and str(mode).lower() != "append":
        raise ValueError(
            f"{what} appends every epoch: output mode {str(mode).lower()!r} would write the "
            "whole result again each time; use outputMode('append')"
        )


def _checked_save(save: Any) -> Any:
    @functools.wraps(save)
    def checked(
        self: Any, path: str | None = None, format: str | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        if format is not None:
            self.format(format)
        if _is_lakesink(self._jwrite):
            raise NotImplementedError(
                "lakesink tables take streaming writes only (df.writeStream.format('lakesink')): a batch "
                "df.write cannot append to one. For a backfill, stream the data with "
                "trigger(availableNow=True) -- into its own lake, since one lake takes one streaming query."
            )
        return save(self, path, *args, **kwargs)

    return checked


#: SQL settings a lakesink query starts with, unless the session sets them itself.
#:
#: ``maxBytesPerBatch``: since Spark 4.1 (SPARK-51316) each JVM-to-Python Arrow batch is capped
#: by bytes as well as by rows, and to apply the cap Spark re-measures the batch after every
#: row it appends (``BasicPythonArrowInput.writeSizedBatch``). For the struct a Python data
#: source's input is wrapped in, that measuring is expensive: a Java Flight Recorder profile of
#: the ``make bench`` stream put 44% of the JVM's samples in ``ArrowWriter.sizeInBytes`` -- more
#: than Spark's own Parquet sink spends writing the same rows. INT_MAX is the only value that
#: switches the check off; batches are then bounded by ``maxRecordsPerBatch`` rows alone (10,000
#: by default), as before Spark 4.1. Sessions with very wide rows can set either option.
STREAM_CONF = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}


@contextlib.contextmanager
def query_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Apply ``settings`` to the query started inside, not to the session.

    A streaming query copies its session's SQL conf when it starts, so the values are set
    just around ``start()`` and then restored; a key the session sets itself is left alone.
    """
    applied = {key: value for key, value in settings.items() if spark.conf.get(key, None) is None}
    for key, value in applied.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in applied:
            spark.conf.unset(key)
