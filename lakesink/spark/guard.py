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
from lakesink.format.table import check_compatible, find_table
from lakesink.spark.rows import arrow_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink"
_installed = False


def check_worker_python(spark: SparkSession) -> None:
    """Warn when Spark will start its Python workers with another interpreter than this one.

    Spark runs ``python3`` from PATH unless ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``)
    says otherwise; outside an activated virtualenv that Python usually has no lakesink and
    no pyarrow, and the query fails at its first micro-batch with "No module named ...".
    """
    import os
    import sys

    executable = getattr(spark.sparkContext, "pythonExec", None) or "python3"
    if os.path.isabs(executable) or os.environ.get("PYSPARK_PYTHON"):
        return
    import shutil
    import warnings

    found = shutil.which(executable)
    if found is not None and os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    warnings.warn(
        f"Spark will start its Python workers with {executable!r} from PATH"
        f"{f' ({found})' if found else ''}, not with this Python ({sys.executable}), which has lakesink: "
        f"set PYSPARK_PYTHON={sys.executable} before the SparkSession starts, or activate the virtualenv",
        RuntimeWarning,
        stacklevel=3,
    )


def install() -> None:
    """Wrap pyspark's classic ``DataStreamWriter.start`` and ``DataFrameWriter.save`` (once)."""
    global _installed
    if _installed:
        return
    from pyspark.sql.readwriter import DataFrameWriter
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    DataStreamWriter.start = _checked_start(DataStreamWriter.start)  # type: ignore[method-assign]
    DataFrameWriter.save = _checked_save(DataFrameWriter.save)  # type: ignore[method-assign]
    _installed = True


def _field(obj: Any, name: str) -> Any:
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
    extra = _field(jwriter, "extraOptions")
    if extra is None:
        return found
    entries = extra.originalMap().iterator()
    while entries.hasNext():
        entry = entries.next()
        found[str(entry._1())] = str(entry._2())
    return found


def _is_lakesink(jwriter: Any) -> bool:
    try:
        source = _field(jwriter, "source")
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
        if not _is_lakesink(self._jwrite):
            return start(self, path, queryName=queryName)
        check_stream(self, path)
        with query_conf(self._df.sparkSession, STREAM_CONF):
            return start(self, path, queryName=queryName)

    return checked


def check_stream(writer: Any, path: str | None) -> None:
    """Refuse, before it starts, a lakesink streaming write that would fail or do the wrong thing."""
    jwrite = writer._jwrite
    partitioning = _field(jwrite, "partitioningColumns")
    if partitioning is not None and partitioning.isDefined():
        columns = str(partitioning.get().mkString("\x00")).split("\x00")  # a Scala Seq of names
        raise ValueError(
            f'format("lakesink") does not partition files (yet): remove .partitionBy({columns}); '
            "every file holds all columns, and readers filter on them (filters are pushed down)"
        )
    mode = _field(jwrite, "outputMode")
    if mode is not None and str(mode).lower() != "append":
        raise ValueError(
            f'format("lakesink") appends every epoch: output mode {str(mode).lower()!r} would write the '
            "whole result again each time; use outputMode('append')"
        )
    options = _options(jwrite)
    if path is not None:
        options["path"] = path
    config = SinkConfig.from_options(options)  # unknown or bad options fail here, by name
    existing = find_table(config.storage())
    if existing is not None:
        check_compatible(existing, arrow_schema(writer._df.schema), "epoch", config.storage().url)


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
