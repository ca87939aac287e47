"""Starting lakesink's driver-side Python workers before its first epoch needs them.

A Python data source's first epoch runs Python on the driver three times, one after another,
each in a Python worker of its own kind (pyspark 4.3, ``pyspark.sql.worker``):
``write_into_data_source`` to plan the write, then -- once every task is done --
``create_data_source`` and ``python_streaming_sink_runner`` for the epoch's commit. Spark
starts a daemon for each kind the first time it is needed, and the daemon and the worker it
forks each import pyspark (the worker also pyarrow and lakesink): 0.5 CPU-s a kind with the
pyspark installed in site-packages, 1.2 CPU-s when the workers compile pyspark from Spark's
``pyspark.zip``, as a plain ``SparkSession.builder`` session's do. Spark's own Parquet sink
runs no Python, so its first epoch is that much sooner (``make bench``, "First epoch").

:func:`start_driver_workers` (run by ``lakesink.register``, and so by ``write_stream``'s data
source door) runs each of the three once, for a data source that does nothing, on a
background thread. Spark keeps a finished worker for the next request of the same kind
(``spark.python.worker.reuse``) and pools workers by interpreter and environment, never by
the function they ran; the warm-up's function is wrapped exactly as
``spark.dataSource.register`` wraps lakesink's. So
the query's own requests find the workers started, with pyspark, pyarrow and lakesink
imported. ``make bench`` measured the first epoch 1.8 s sooner on a plain session (4.2 s
behind Spark's sink before, 2.4 s after) and 0.8 s sooner with ``write_stream``, whose
warm-up starts with the query.

Why this is safe for the user's session and data:

- Nothing is written and nothing is registered: :class:`WarmUpSource` has no path, and its
  writer's ``commit``/``abort`` do nothing.
- Nothing runs that the first lakesink query would not run a moment later: the same three
  kinds of worker, one each, on the driver, once per Spark application. No Spark job runs,
  so no executor slot is taken. Spark closes idle workers after a minute (their daemons
  stay, so a later query still skips the daemons' start). A query that asks for a kind
  while the warm-up is still running it gets a worker of its own: one more idle worker.
- It is best effort: it drives Spark's internal JVM classes, and any failure (another Spark
  version, a stopped session) only means no warm-up. It is logged at DEBUG and never reaches
  the query. Sessions that turn off worker reuse or the daemon get no warm-up: Spark would
  not keep the workers.
- ``register(spark, warm_up=False)`` turns it off.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.udf import _wrap_function  # what spark.dataSource.register wraps with

from lakesink.spark.datasource import import_hook_modules

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

WARM_UP_NAME = "lakesink-warm-up"
_PYTHON_SOURCES = "org.apache.spark.sql.execution.datasources.v2.python"


class WarmUpSource(DataSource):
    """A data source that writes nothing; a worker that runs it imports what lakesink's use."""

    @classmethod
    def name(cls) -> str:
        return WARM_UP_NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        import_hook_modules()  # the warm-up itself, in the worker that creates data sources

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        import_hook_modules()  # the same, in the workers that plan and commit
        return _NoWriter()


class _NoWriter(DataSourceStreamWriter):
    def write(self, iterator: Any) -> WriterCommitMessage:  # no task ever runs it
        raise RuntimeError("the lakesink warm-up source writes nothing")

    def commit(self, messages: Any, batchId: int) -> None:
        pass

    def abort(self, messages: Any, batchId: int) -> None:
        pass


@dataclass
class WarmUp:
    """One application's warm-up: ``done`` once it ended, ``error`` if it failed (None if not)."""

    application_id: str
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def run(self, spark: SparkSession) -> None:
        try:
            _run_driver_workers(spark)
        except Exception as exc:  # best effort by design: the query must not notice
            self.error = exc
            log.debug("lakesink: the driver's Python workers were not started ahead", exc_info=True)
        finally:
            self.done.set()


_warm_ups: dict[str, WarmUp] = {}  # by Spark application id: one warm-up each
_lock = threading.Lock()


def start_driver_workers(spark: SparkSession) -> WarmUp | None:
    """Start the warm-up on a daemon thread, once per Spark application; None if it does not run."""
    try:
        sc = spark.sparkContext
        conf, application_id = sc.getConf(), sc.applicationId
    except Exception:  # e.g. a Spark Connect session: no JVM of ours to warm
        log.debug("lakesink: no warm-up for this session", exc_info=True)
        return None
    for key in ("spark.python.worker.reuse", "spark.python.use.daemon"):
        if conf.get(key, "true").strip().lower() != "true":
            return None  # Spark would not keep the workers
    with _lock:
        if application_id in _warm_ups:
            return None
        warm_up = _warm_ups[application_id] = WarmUp(application_id)
    threading.Thread(target=warm_up.run, args=(spark,), name="lakesink-warm-up", daemon=True).start()
    return warm_up


def warm_up_of(spark: SparkSession) -> WarmUp | None:
    """The warm-up started for ``spark``'s application, if one was."""
    with _lock:
        return _warm_ups.get(spark.sparkContext.applicationId)


def _run_driver_workers(spark: SparkSession) -> None:
    sc = spark.sparkContext
    jvm, gateway = sc._jvm, sc._gateway
    assert jvm is not None and gateway is not None
    sources = getattr(jvm, _PYTHON_SOURCES)
    source = sources.UserDefinedPythonDataSource(_wrap_function(sc, WarmUpSource))
    options = jvm.org.apache.spark.sql.util.CaseInsensitiveStringMap(jvm.java.util.HashMap())
    schema = spark._jsparkSession.parseDataType('{"type":"struct","fields":[]}')
    # In the order the query needs them: the planner's kind of worker, then the commit's two.
    source.createWriteInfoInPython(WARM_UP_NAME, schema, options, False, True)
    created = source.createDataSourceInPython(WARM_UP_NAME, options, jvm.scala.Some(schema))
    no_messages = gateway.new_array(jvm.org.apache.spark.sql.connector.write.WriterCommitMessage, 0)
    commit = sources.PythonStreamingSinkCommitRunner(
        source.createPythonFunction(created.dataSource()), schema, no_messages, -1, False, True
    )
    commit.runInPython(True)  # abort of epoch -1 with no messages: _NoWriter.abort, a no-op
