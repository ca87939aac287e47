"""What happens on the driver (or the Connect client) when pyspark's writers start a lakesink write.

A Python data source sees its options only when its query's first micro-batch runs, never sees
``partitionBy``, and cannot set SQL options for its query: so a misspelt option, a
``partitionBy`` it would ignore, a non-append output mode or a batch ``df.write`` would fail
late, or silently do the wrong thing. ``install()`` (called by ``lakesink.register``) wraps
``DataStreamWriter.start``/``foreach`` and ``DataFrameWriter.save`` so that, for a lakesink
write -- ``format("lakesink")`` or ``foreach(LakeForeachWriter(...))``, and nothing else -- the
wrapper reads what the writer was told (:class:`PendingWrite`), refuses before anything starts
what lakesink would refuse or ignore (``lakesink.spark.preflight`` checks the lake and the
workers' Python), and starts the query with lakesink's per-query settings (``STREAM_CONF``
below, applied only around ``start()``); the query it returns raises lakesink's own error when
lakesink ends it (``lakesink.spark.failures``).

Both of pyspark's APIs are covered. The classic one keeps a writer's settings in its JVM
object, read by reflection (private fields; if they are not laid out as expected -- another
Spark -- the wrapper steps aside and the data source's own checks apply at the first
micro-batch). Spark Connect keeps them in the client's plan (``_write_proto``), and its
server runs the query: there the lake is checked from the client where the client can reach
it, and the workers' Python is the server's business.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from lakesink.config import SinkConfig, parse_columns
from lakesink.spark import batch_log, preflight
from lakesink.spark.failures import raising_lakesink_errors
from lakesink.spark.foreach import LakeForeachWriter
from lakesink.spark.rows import arrow_schema
from lakesink_reader.errors import StorageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink"
#: The option ``.partitionBy(...)`` becomes (``lakesink.config.SinkOptions.partition_by``).
PARTITION_BY_OPTION = "partition_by"
_installed: set[str] = set()


def install(*, connect: bool = False) -> None:
    """Wrap the writers of pyspark's classic API, or of its Connect client (once each).

    The wrappers are process-wide, as pyspark's classes are, and stateless: whatever they
    learn about a write lives on that writer object. The Connect classes are wrapped only for
    a Connect session: importing them needs the ``connect`` extra.
    """
    api = "connect" if connect else "classic"
    if api in _installed:
        return
    if connect:
        # Here, not at the top: the Connect API's classes need the connect extra (and load pandas).
        from pyspark.sql.connect.readwriter import DataFrameWriter
        from pyspark.sql.connect.streaming.readwriter import DataStreamWriter

        read: Callable[[Any], PendingWrite | None] = _connect_pending
        source_of: Callable[[Any], str | None] = lambda writer: writer._write.source or None  # noqa: E731
    else:
        # Here, not at the top: the classic API's classes, for its sessions only (as above).
        from pyspark.sql.readwriter import DataFrameWriter  # type: ignore[assignment]
        from pyspark.sql.streaming.readwriter import DataStreamWriter  # type: ignore[assignment]

        read = _classic_pending
        source_of = lambda writer: _jvm_source(writer._jwrite)  # noqa: E731
    DataStreamWriter.start = _checked_start(DataStreamWriter.start, read)  # type: ignore[method-assign]
    DataStreamWriter.foreach = _remembered_foreach(DataStreamWriter.foreach)  # type: ignore[method-assign]
    DataFrameWriter.save = _checked_save(DataFrameWriter.save, source_of)  # type: ignore[method-assign]
    if not connect:
        # Here, not at the top: the classic reader's class, for its sessions only (as above).
        from pyspark.sql.readwriter import DataFrameReader
        from pyspark.sql.streaming.readwriter import DataStreamReader

        DataFrameReader.load = _scanned_load(DataFrameReader.load)  # type: ignore[method-assign]
        DataStreamReader.load = _checked_stream_load(DataStreamReader.load)  # type: ignore[method-assign]
    _installed.add(api)


def _scanned_load(load: Any) -> Any:
    """``spark.read.format("lakesink").load(...)`` as Spark's own Parquet scan of the pinned
    version's files where Spark reaches them (``lakesink.spark.scan``); every other read as it was."""

    @functools.wraps(load)
    def scanned(
        self: Any, path: str | list[str] | None = None, format: str | None = None, schema: Any = None,
        **options: Any,
    ) -> Any:  # fmt: skip
        if format is not None:
            self.format(format)
        if schema is None and not isinstance(path, list) and _reads_lakesink(self):
            # Here, not at the top: the scan's module is the lakesink reads' alone.
            from lakesink.spark.scan import parquet_scan

            given = {**_reader_options(self), **{k: str(v) for k, v in options.items()}}
            if path is not None:
                given["path"] = path
            frame = parquet_scan(self._spark, given)
            if frame is not None:
                return frame
        return load(self, path, None, schema, **options)

    return scanned


def _checked_stream_load(load: Any) -> Any:
    """``spark.readStream.format("lakesink").load(...)``: its options parsed here first, so that a
    bad one is refused in one line, not inside Spark's ``PYTHON_DATA_SOURCE_ERROR`` and the
    worker's traceback (issue 53, item 3)."""

    @functools.wraps(load)
    def checked(
        self: Any, path: str | None = None, format: str | None = None, schema: Any = None, **options: Any
    ) -> Any:
        if format is not None:
            self.format(format)
        if _reads_lakesink(self):
            # Here, not at the top: the stream source's module is the lakesink streams' alone.
            from lakesink.spark.streaming import parse_stream_options

            given = {**_reader_options(self), **{k: str(v) for k, v in options.items()}}
            if path is not None:
                given["path"] = path
            parse_stream_options(given)
        return load(self, path, None, schema, **options)

    return checked


def _reads_lakesink(reader: Any) -> bool:
    """A classic batch or stream reader of ``format("lakesink")`` without a schema of the user's."""
    try:
        source = jvm_field(reader._jreader, "source")
        user_schema = jvm_field(reader._jreader, "userSpecifiedSchema")
    except Exception:  # noqa: BLE001 - a JVM object of another layout: not ours to judge
        return False
    no_schema = user_schema is None or not user_schema.isDefined()
    return source is not None and str(source).lower() == SOURCE_NAME and no_schema


def _reader_options(reader: Any) -> dict[str, str]:
    return jvm_options(reader._jreader)


def jvm_options(jobj: Any) -> dict[str, str]:
    """The options a JVM reader or writer was given (its ``extraOptions``, as set)."""
    options: dict[str, str] = {}
    extra = jvm_field(jobj, "extraOptions")
    if extra is not None:
        entries = extra.originalMap().iterator()
        while entries.hasNext():
            entry = entries.next()
            options[str(entry._1())] = str(entry._2())
    return options


@dataclass
class PendingWrite:
    """What a stream writer was told, read before it starts."""

    spark: Any
    source: str | None
    options: dict[str, str]
    partitioning: list[str]
    output_mode: str | None
    schema: Callable[[], Any] = field(repr=False)  # the stream's StructType, computed when needed
    connect: bool = False
    #: The stream's analyzed logical plan (a JVM object; classic API only), read when needed.
    plan: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def is_lakesink(self) -> bool:
        return (self.source or "").lower() == SOURCE_NAME


#: The attribute under which a DataStreamWriter keeps the LakeForeachWriter it was given.
_FOREACH_ATTR = "_lakesink_foreach_writer"
#: The attribute under which a DataStreamWriter that ``write_stream`` built keeps the SinkConfig
#: its options were made from: the check at start() takes it instead of parsing them again.
_CONFIG_ATTR = "_lakesink_config"
_Writer = TypeVar("_Writer")


def hand_config(writer: _Writer, config: SinkConfig) -> _Writer:
    """Give ``writer`` (a DataStreamWriter whose options are ``config.to_options()``) the parsed
    config, so that its start() checks the values ``write_stream`` parsed (one parse per door)."""
    setattr(writer, _CONFIG_ATTR, config)
    return writer


def _remembered_foreach(foreach: Any) -> Any:
    @functools.wraps(foreach)
    def remembered(self: Any, f: Any) -> Any:
        result = foreach(self, f)
        setattr(self, _FOREACH_ATTR, f if isinstance(f, LakeForeachWriter) else None)
        return result

    return remembered


# Reading a writer ---------------------------------------------------------------------------


def jvm_field(obj: Any, name: str) -> Any:
    """A private field of a JVM object (searched up its class hierarchy), or None."""
    cls = obj.getClass()
    while cls is not None:
        try:
            found = cls.getDeclaredField(name)
        except Exception:  # noqa: BLE001 - py4j wraps NoSuchFieldException: try the superclass
            cls = cls.getSuperclass()
            continue
        found.setAccessible(True)
        return found.get(obj)
    return None


def _jvm_source(jwriter: Any) -> str | None:
    try:
        source = jvm_field(jwriter, "source")
    except Exception:  # noqa: BLE001 - a JVM object of another layout: not ours to judge
        return None
    return None if source is None else str(source)


def _classic_pending(writer: Any) -> PendingWrite | None:
    """From the writer's JVM object; None when it is not laid out as expected."""
    jwrite = writer._jwrite
    try:
        options = jvm_options(jwrite)
        partitioning = jvm_field(jwrite, "partitioningColumns")
        columns = (
            str(partitioning.get().mkString("\x00")).split("\x00")  # a Scala Seq of names
            if partitioning is not None and partitioning.isDefined()
            else []
        )
        mode = jvm_field(jwrite, "outputMode")
    except Exception:  # noqa: BLE001 - another Spark's layout: step aside
        return None
    df = writer._df
    return PendingWrite(
        df.sparkSession,
        _jvm_source(jwrite),
        options,
        columns,
        None if mode is None else str(mode).lower(),
        lambda: df.schema,
        plan=lambda: df._jdf.queryExecution().analyzed(),
    )


def _connect_pending(writer: Any) -> PendingWrite:
    """From the Connect client's plan of the write (what the server will be sent)."""
    proto = writer._write_proto
    session = writer._session

    def schema() -> Any:
        # Here, not at the top: the connect extra (and pandas), for a Connect session only.
        from pyspark.sql.connect.dataframe import DataFrame

        return DataFrame(writer._write_stream._child, session).schema  # one analyze round trip

    options = dict(proto.options)
    if proto.query_name:
        options["queryName"] = proto.query_name
    return PendingWrite(
        session,
        proto.format or None,
        options,
        list(proto.partitioning_column_names),
        proto.output_mode.lower() or None,
        schema,
        connect=True,
    )


# Judging it ---------------------------------------------------------------------------------


def _checked_start(start: Any, read: Callable[[Any], PendingWrite | None]) -> Any:
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
        if queryName is not None:
            self.queryName(queryName)
        foreach_writer = getattr(self, _FOREACH_ATTR, None)
        if foreach_writer is None and not _may_be_lakesink(self):
            return start(self, path)
        pending = read(self)
        if pending is None:
            return start(self, path)
        if foreach_writer is not None:
            check_foreach_stream(pending, foreach_writer)
            return raising_lakesink_errors(start(self, path))
        if not pending.is_lakesink:
            return start(self, path)
        config = check_stream(pending, path, getattr(self, _CONFIG_ATTR, None))
        if pending.partitioning:
            self.option(PARTITION_BY_OPTION, partition_option(pending.partitioning, pending.options))
        return _start_checked(pending.spark, lambda: start(self, path), config)

    return checked


def _start_checked(spark: Any, start: Callable[[], Any], config: SinkConfig) -> Any:
    """Start a checked lakesink query: lakesink's per-query settings around ``start``, its
    refusals raised as themselves, and ``register(spark, batch_log=True)``'s line per batch."""
    with query_conf(spark, STREAM_CONF):
        query = raising_lakesink_errors(start())
    batch_log.watch(spark, query, config)
    return query


def start_foreach_batch(
    df: DataFrame,
    config: SinkConfig,
    *,
    trigger: Mapping[str, Any] | None,
    query_name: str | None,
    batch_write: Any = None,
    schema: Any = None,
) -> StreamingQuery:
    """``write_stream(..., via="foreach_batch")``: the checks a ``format("lakesink")`` start
    makes, then the query through ``foreachBatch`` (``lakesink.spark.batches``).

    ``batch_write``: the ``foreachBatch`` function (default: a ``LakeBatchWrite`` of ``config``),
    and ``schema`` what it writes when that is not ``df``'s (``lakesink.spark.follow``: ``df``'s
    rows are files, its batches write what they hold)."""
    # Here, not at the top: the door's module is write_stream's alone.
    from lakesink.spark.batches import LakeBatchWrite, import_commit_modules

    if not hasattr(df, "_jdf"):  # a Spark Connect DataFrame has no JVM object
        raise ValueError(
            "via='foreach_batch' runs in classic PySpark sessions only: under Spark Connect the "
            "server runs foreachBatch's function; use via='data_source' there (what the default, "
            "via='auto', picks under Spark Connect)"
        )
    writer = df.writeStream.foreachBatch(batch_write or LakeBatchWrite(config))
    writer = writer.option("checkpointLocation", config.checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    pending = _classic_pending(writer)
    if pending is not None:
        if schema is not None:
            pending = replace(pending, schema=lambda: schema)
        check_stream(pending, config.path, config, batch_door=True)
    # While Spark plans the first batch, not after its tasks: what its commit imports here.
    threading.Thread(target=import_commit_modules, name="lakesink-commit-imports", daemon=True).start()
    return _start_checked(df.sparkSession, writer.start, config)  # type: ignore[no-any-return]


def _may_be_lakesink(writer: Any) -> bool:
    """A cheap first look, so that other formats' starts pay for no reflection."""
    proto = getattr(writer, "_write_proto", None)
    if proto is not None:
        return bool(proto.format) and proto.format.lower() == SOURCE_NAME
    return (_jvm_source(writer._jwrite) or "").lower() == SOURCE_NAME


def check_stream(
    pending: PendingWrite, path: str | None, config: SinkConfig | None = None, *, batch_door: bool = False
) -> SinkConfig:
    """Refuse, before it starts, a lakesink streaming write that would fail or do the wrong thing;
    the write's parsed options.

    ``config``: what ``write_stream`` parsed its keywords into (the writer's options are made from
    it); None for a ``format("lakesink")`` write, whose options are parsed here. ``batch_door``:
    the write goes through ``foreachBatch`` (``lakesink.spark.batches``), not the data source."""
    if not pending.connect:
        preflight.check_worker_python(pending.spark)
    _check_append(pending, 'format("lakesink")')
    if config is None:
        options = dict(pending.options)
        if path is not None:
            options["path"] = path
        if pending.partitioning:
            options[PARTITION_BY_OPTION] = partition_option(pending.partitioning, options)
        config = SinkConfig.from_options(options)  # unknown or bad options fail here, by name
    if config.sink.driver_write == "always" and not batch_door:
        raise ValueError(config.driver_write_refusal())
    query = _query_identity(pending, config.storage_options)
    plan = pending.plan
    start = None if plan is None else lambda: preflight.kafka_start_offsets(plan())
    _lake_check(
        pending, lambda: preflight.check_epoch_start(config, arrow_schema(pending.schema()), query, start)
    )
    return config


def partition_option(columns: list[str], options: Mapping[str, Any]) -> str:
    """``.partitionBy(...)`` as the ``partition_by`` option: Spark never hands a Python data source
    its ``partitionBy``, so the wrapper passes it on as an option (ValueError when the option says
    otherwise)."""
    text = json.dumps(list(columns))
    given = next((v for k, v in options.items() if k.lower() == PARTITION_BY_OPTION), None)
    if given is not None and list(parse_columns(PARTITION_BY_OPTION, str(given))) != list(columns):
        raise ValueError(
            f".partitionBy({list(columns)}) and .option('partition_by', {given!r}) disagree: give one of them"
        )
    return text


def check_foreach_stream(pending: PendingWrite, foreach_writer: LakeForeachWriter) -> None:
    """What :func:`check_stream` checks, for a ``foreach(LakeForeachWriter(...))`` write."""
    if not pending.connect:
        preflight.check_worker_python(pending.spark)
    if pending.partitioning:
        raise ValueError(
            f"foreach sinks are not handed .partitionBy({pending.partitioning}) by Spark: pass it to the "
            f"writer instead, LakeForeachWriter(path, partition_by={pending.partitioning})"
        )
    _check_append(pending, "LakeForeachWriter")
    if pending.plan is not None:  # over Connect the plan is the server's: not judged
        preflight.check_foreach_partitioning(pending.plan)
    query = _query_identity(pending, foreach_writer.storage_options)
    _lake_check(pending, lambda: preflight.check_foreach_start(foreach_writer, foreach_writer.schema, query))


def _query_identity(pending: PendingWrite, storage_options: Mapping[str, Any]) -> preflight.QueryIdentity:
    query = preflight.query_identity(pending.spark, pending.options, storage_options)
    unseen = query.checkpoint is not None and not _shared_folder(query.checkpoint)
    if pending.connect and query.new and unseen:
        # The server writes the checkpoint: a client that does not see the server's disk cannot
        # tell a new query from one whose checkpoint it cannot see. The commit checks it then.
        return preflight.QueryIdentity(query.checkpoint)
    return query


def _shared_folder(location: str) -> bool:
    """Whether a Connect client sees the folder a checkpoint is (to be) in: a store, or a local parent."""
    if "://" in location and not location.lower().startswith("file://"):
        return True
    local = location.split("://", 1)[-1]
    return os.path.isdir(os.path.dirname(os.path.abspath(local.rstrip("/"))))


def _lake_check(pending: PendingWrite, check: Callable[[], None]) -> None:
    """Run a lake check; over Connect a lake the client cannot reach is left to the server's writer."""
    try:
        check()
    except (StorageError, PermissionError) as exc:
        if not pending.connect:
            raise
        log.info("the lake is not reachable from this Spark Connect client (%s): the server checks it", exc)


def _check_append(pending: PendingWrite, what: str) -> None:
    mode = pending.output_mode
    if mode is not None and mode != "append":
        raise ValueError(
            f"{what} appends every epoch: output mode {mode!r} would write the "
            "whole result again each time; use outputMode('append')"
        )


def _checked_save(save: Any, source_of: Callable[[Any], str | None]) -> Any:
    @functools.wraps(save)
    def checked(
        self: Any, path: str | None = None, format: str | None = None, *args: Any, **kwargs: Any
    ) -> Any:
        if format is not None:
            self.format(format)
        if (source_of(self) or "").lower() == SOURCE_NAME:
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
