"""Checks a lakesink query gets on the driver before it starts, so that a mistake is one message.

Spark runs a streaming sink's code in tasks and in Python workers, after ``start()`` has
returned: a mistake found there reaches the user as a failed query, among tens of lines of
Spark's task errors, repeated once per task attempt. What can be known on the driver is
checked here instead, once, before anything starts:

- :func:`check_worker_python`: the interpreter Spark will start its Python workers with can
  import lakesink and pyarrow (local masters; on a cluster the executors' Python cannot be
  seen from the driver, so only a missing ``PYSPARK_PYTHON`` is warned about);
- :func:`check_epoch_start` and :func:`check_foreach_start`: the lake fits the stream (a folder,
  not a file; the same mode and schema; the store answers) and belongs to this query, which is
  known before it starts from the ``metadata`` file in its checkpoint folder (:class:`QueryIdentity`);
- :func:`check_foreach_partitioning`: a foreach write on Spark's Kafka source gets its partition
  ids from a hash of the rows, not straight from the source (which changes them on restart).

The writers keep their own checks (in tasks, at commit): these only move the usual failures
to the front.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pyarrow as pa

from lakesink.commit.start import LakeAtStart
from lakesink.spark import checkpoints
from lakesink_reader.errors import CommitRefusedError, OtherQueryError, WorkerPythonError
from lakesink_reader.format.partitions import check_partition_columns
from lakesink_reader.format.table import (
    check_compatible,
    check_partitioning,
    check_writable_format,
    find_table,
)
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config import SinkConfig

#: What the workers of a lakesink query import first (pyspark itself comes with Spark's own path).
WORKER_MODULES = ("lakesink", "pyarrow")

_PROBE = (
    "import importlib.util, sys\n"
    "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]\n"
    "print('%d.%d' % sys.version_info[:2], ' '.join(missing))\n"
)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client; the server runs the queries)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# The workers' Python ------------------------------------------------------------------------


def worker_executable(spark: SparkSession) -> str:
    """The interpreter Spark starts its Python workers with (``PYSPARK_PYTHON``, else python3)."""
    try:
        executable = spark.sparkContext.pythonExec
    except Exception:  # noqa: BLE001 - a Connect session has no SparkContext: the server decides
        executable = None
    return str(executable or os.environ.get("PYSPARK_PYTHON") or "python3")


def check_worker_python(spark: SparkSession) -> None:
    """Refuse (local master) or warn (cluster) when Spark's workers would run a Python without lakesink.

    Spark starts its Python workers with ``python3`` from PATH unless ``PYSPARK_PYTHON`` says
    otherwise; outside an activated virtualenv that Python has no lakesink, and every task of
    the query would fail with "No module named ...". In local mode the workers run on this
    machine, so the interpreter is asked (one ``python -c`` of ~30 ms, and only when it is not
    this interpreter). Raises :class:`lakesink.WorkerPythonError`. A Spark Connect session is
    not checked: its workers are the server's, whose Python the client cannot see.
    """
    if is_connect(spark):
        return
    executable = worker_executable(spark)
    if not _is_local(spark):
        if not os.path.isabs(executable) and not os.environ.get("PYSPARK_PYTHON"):
            warn_at_caller(
                f"Spark will start its Python workers with {executable!r} from each executor's PATH; "
                "if that Python has no lakesink and pyarrow, every task fails with 'No module named ...'. "
                "Set spark.pyspark.python (or PYSPARK_PYTHON) to the executors' Python that has them "
                "(docs/guide/clusters.md).",
                RuntimeWarning,
            )
        return
    problem = _local_worker_problem(executable, spark)
    if problem is not None:
        raise WorkerPythonError(
            f'{problem}. Every task of a lakesink query would fail with "No module named ...". '
            f"Set PYSPARK_PYTHON={sys.executable} before the SparkSession starts (in the script: "
            "os.environ['PYSPARK_PYTHON'] = sys.executable, before SparkSession.builder), or activate "
            "the virtualenv that has lakesink and run the script with its python."
        )


def _is_local(spark: SparkSession) -> bool:
    try:
        master = spark.conf.get("spark.master", "") or ""
    except Exception:  # noqa: BLE001 - no master to read: not ours to judge
        return False
    return master.startswith("local")


def _local_worker_problem(executable: str, spark: SparkSession) -> str | None:
    """What is wrong with ``executable`` as the workers' Python on this machine, or None."""
    why = "" if os.environ.get("PYSPARK_PYTHON") else " (from PATH: PYSPARK_PYTHON is not set)"
    found = executable if os.path.isabs(executable) else shutil.which(executable)
    if found is None:
        return f"Spark will start its Python workers with {executable!r}{why}, which is not on PATH"
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return None  # this very interpreter, which has imported lakesink
    prefix = f"Spark will start its Python workers with {found}{why}, which"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(_worker_paths(spark))}
    try:
        done = subprocess.run(
            [found, "-c", _PROBE, *WORKER_MODULES],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{prefix} cannot be run ({exc})"
    if done.returncode != 0:
        return f"{prefix} fails to start: {done.stderr.strip()[-300:]}"
    version, _, missing = done.stdout.strip().partition(" ")
    if missing:
        return f"{prefix} cannot import {', '.join(missing.split())}"
    ours = "{}.{}".format(*sys.version_info[:2])
    if version != ours:
        return f"{prefix} is Python {version}; the driver runs {ours}, and pyspark refuses other versions"
    return None


def _worker_paths(spark: SparkSession) -> list[str]:
    """What Spark adds to a local worker's import path that this process may not have: --py-files."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    try:
        # Here, in the try: a Connect-only pyspark has no SparkFiles (pyspark/__init__.py), and
        # preflight imports no pyspark (only the modules that subclass its classes do).
        from pyspark import SparkFiles

        context = spark.sparkContext
        root = SparkFiles.getRootDirectory()
        paths.append(root)
        paths.extend(os.path.join(root, name) for name in getattr(context, "_python_includes", []) or [])
        submitted = context.getConf().get("spark.submit.pyFiles", "") or ""
        paths.extend(p.split("://", 1)[-1] for p in submitted.split(",") if p)
    except Exception:  # noqa: BLE001 - best effort: a Connect session has none of these
        pass
    return paths


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first caller outside lakesink: the user's line."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 1, sys._getframe(0)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level)


# Which query is starting --------------------------------------------------------------------


@dataclass(frozen=True)
class QueryIdentity:
    """The streaming query about to start, as far as its checkpoint folder tells before it does.

    ``query_id`` is Spark's id, kept in ``<checkpoint>/metadata`` and stable across restarts
    from that checkpoint; ``new`` means the checkpoint has none yet (a new query, which will
    read its input from the start). Neither when the checkpoint cannot be read from here.
    """

    checkpoint: str | None
    query_id: str | None = None
    new: bool = False

    @property
    def known(self) -> bool:
        return self.new or self.query_id is not None

    def describe(self) -> str:
        if self.new:
            where = f"at {self.checkpoint}" if self.checkpoint else "(none given: a temporary one)"
            return f"this query is a new one: its checkpoint location {where} holds no query yet"
        return f"this query is {self.query_id} (checkpoint {self.checkpoint})"


def query_identity(
    spark: SparkSession,
    options: Mapping[str, str],
    storage_options: Mapping[str, Any] | None = None,
) -> QueryIdentity:
    """Find out, from its checkpoint folder, which query ``options`` (a stream writer's) will start."""
    lowered = {k.lower(): v for k, v in options.items()}
    location = lowered.get("checkpointlocation")
    if not location:
        default = spark.conf.get("spark.sql.streaming.checkpointLocation", None)
        name = lowered.get("queryname")
        if not default or not name:
            return QueryIdentity(None, new=True)  # Spark makes a fresh (temporary) checkpoint
        location = f"{default.rstrip('/')}/{name}"
    scheme = location.split("://", 1)[0].lower() if "://" in location else "file"
    if scheme not in ("file", "s3", "s3a", "hdfs", "viewfs"):
        return QueryIdentity(location)  # a store lakesink cannot read: the writers check later

    try:
        checkpoint = checkpoints.open_checkpoint(location, storage_options)
        text = checkpoint.read_bytes("metadata", first_contact=True).decode()
    except FileNotFoundError:
        return QueryIdentity(location, new=True)
    except Exception:  # noqa: BLE001 - unreadable from here: leave the judgement to the writers
        return QueryIdentity(location)

    try:
        query_id = json.loads(text.splitlines()[0])["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return QueryIdentity(location)
    return QueryIdentity(location, query_id=str(query_id))


# The lake -----------------------------------------------------------------------------------


def check_epoch_start(
    config: SinkConfig,
    schema: pa.Schema,
    query: QueryIdentity,
    source_start: Callable[[], list[Any] | None] | None = None,
) -> None:
    """Refuse an epoch-mode start on a lake of another mode or schema, or written by another query,
    or a continuation the log would refuse. ``source_start``: where the stream's sources start
    when that is known before the query starts (:func:`kafka_start_offsets`), read only for a
    continuation."""
    storage = config.storage()
    existing = find_table(storage)
    if existing is None:
        check_partition_columns(schema, config.sink.partition_by or (), "the stream")
        _check_checkpoint_has_its_lake(config, storage.url, None, query)
        return
    if existing.mode != "epoch":
        check_compatible(existing, schema, "epoch", storage.url)
    check_writable_format(existing, storage.url)
    lake = LakeAtStart.read(storage, existing)  # the log, read once for every check below
    lake.stream_schemas(schema, merge_schema=config.sink.merge_schema)  # the log's schema evolves
    check_partitioning(existing, config.sink.partition_by, storage.url)
    if config.sink.continue_writer:
        _check_continuation(config, lake, query, source_start)
        return
    if not query.known:
        return
    _check_checkpoint_has_its_lake(config, storage.url, lake.state, query)
    if not config.sink.allow_other_queries:
        _check_writers(storage.url, lake.state, query)


def _check_continuation(
    config: SinkConfig,
    lake: LakeAtStart,
    query: QueryIdentity,
    source_start: Callable[[], list[Any] | None] | None,
) -> None:
    """Refuse a continuation the log would refuse: of a writer the lake does not have or that was
    continued already, and -- when the start offsets are known now (the Kafka source's exact
    ``startingOffsets``, or ``continue_offsets``) -- one that overlaps or leaves a gap. Otherwise
    the offsets are known only when Spark plans the first batch, and judged then
    (``datasource.check_continuation``)."""
    assert config.sink.continue_writer is not None
    # A restart of the continuing query is in the log under its id: nothing left to judge. A new
    # one has no id yet (Spark draws it at start()): judged as a writer the log does not know.
    writer = query.query_id or f"new query at {query.checkpoint or 'a new checkpoint'}"
    declared = checkpoints.parse_declared_offsets(config.sink.continue_offsets, None)
    try:
        planned = source_start() if source_start is not None else None
    except Exception:  # noqa: BLE001 - another Spark's plan: judged at the first batch instead
        planned = None
    if planned is not None and declared is not None and planned != declared:
        raise ValueError(
            f"continue_offsets {json.dumps(declared)} differs from the offsets the source starts at, "
            f"{json.dumps(planned)} (its startingOffsets): make them the same, or drop continue_offsets"
        )
    start = planned if planned is not None else declared
    lake.check_continuation(writer, config.sink.continue_writer, None if start is None else (lambda: start))


def _check_checkpoint_has_its_lake(
    config: SinkConfig, url: str, state: TableState | None, query: QueryIdentity
) -> None:
    """Refuse a checkpoint that has committed batches of a query the lake does not know: the
    lake it wrote was deleted (and maybe recreated) since. Its first commit would be refused
    (a writer's first batch above 0), after its tasks wrote their files; here nothing is."""
    if query.query_id is None or query.checkpoint is None or config.sink.continue_writer:
        return
    if state is not None and query.query_id in state.writers:
        return

    last = checkpoints.last_committed_batch(
        checkpoints.open_checkpoint(query.checkpoint, config.storage_options)
    )
    if last is None:
        return  # the query committed nothing yet: it starts at batch 0, as a new writer does
    where = "does not exist" if state is None else "holds no batch of it"
    raise CommitRefusedError(
        f"the checkpoint {query.checkpoint} has committed batches 0..{last} of streaming query "
        f"{query.query_id}, but the lake at {url} {where}: the lake was deleted (or recreated) since "
        f"that query wrote it, and restarting would write its batches from {last + 1} on, without "
        "the rows before. Start the query with a new checkpoint location (it reads its input from the "
        "start into this lake), or point it at the lake it wrote."
    )


def _check_writers(url: str, state: TableState, query: QueryIdentity) -> None:
    """A format-3 lake: refuse a query that is none of its (unretired) writers."""
    writers = [w for w in state.writers.values() if not w.retired]
    if not writers or any(w.id == query.query_id for w in writers):
        return
    named = "; ".join(w.describe() for w in writers)
    raise OtherQueryError(
        f"the lake at {url} is written by streaming query {named}, and {query.describe()}. A new "
        "checkpoint re-reads its input from the start: every row would be written again. The way out "
        "depends on why the checkpoint is new: restart from the original checkpoint location if you "
        f"have it; if it is lost, continue the old writer from the lake (`lakesink offsets {url}` gives "
        "the offsets to start the source at, then continue_writer=<its id>: docs/guide/kafka.md, "
        "'Restart from the lake'); if this query writes different rows beside it, pass "
        "allow_other_queries=True; or write to a new lake path."
    )


class ForeachTarget(Protocol):
    """What :func:`check_foreach_start` reads of a ``LakeForeachWriter`` (its module imports this
    one: naming the class here would be an import circle)."""

    path: str
    partition_by: tuple[str, ...] | None
    allow_other_queries: bool

    @property
    def storage_options(self) -> dict[str, Any]: ...


def check_foreach_start(writer: ForeachTarget, schema: pa.Schema | None, query: QueryIdentity) -> None:
    """The foreach writer's table checks, made on the driver before the query starts.

    ``schema`` is the writer's own; None when it infers one from the rows (then only the mode
    and the owner are checked: an inferred schema is known only in the tasks).
    """
    storage = open_storage(writer.path, writer.storage_options)
    existing = find_table(storage)
    if existing is None:
        if schema is not None:
            check_partition_columns(schema, writer.partition_by or (), "the stream")
        return
    if schema is not None:
        check_compatible(existing, schema, "foreach", storage.url)
    elif existing.mode != "foreach":
        check_compatible(existing, existing.schema, "foreach", storage.url)  # raises the mode error
    check_partitioning(existing, writer.partition_by, storage.url)
    owner = existing.owner_query
    if writer.allow_other_queries or not owner or not query.known:
        return
    tag = query.query_id.replace("-", "")[:16] if query.query_id else None
    if owner != tag:
        raise OtherQueryError(
            f"the lake at {storage.url} belongs to streaming query {owner}, and {query.describe()}. "
            "A new checkpoint re-reads the input from the start: every row would be written again. "
            "Restart from the original checkpoint, or write to a new lake path; if this query writes "
            "different rows, pass LakeForeachWriter(..., allow_other_queries=True)."
        )


# Foreach mode and Kafka ---------------------------------------------------------------------

#: Logical operators under which a row stays in the Spark partition its input row was in, or is
#: placed by where its input rows were (round-robin, range and coalescing repartitions): what
#: the Kafka source decides about partition ids reaches the sink through them unchanged.
_FOLLOW_INPUT = frozenset(
    {
        "Project", "Filter", "Union", "SubqueryAlias", "EventTimeWatermark", "ResolvedHint",
        "MapInArrow", "MapInPandas", "PythonMapInArrow", "MapPartitions", "MapPartitionsInR",
        "MapPartitionsInRWithArrow", "MapElements", "TypedFilter", "AppendColumns", "Generate",
        "Expand", "SerializeFromObject", "DeserializeToObject", "Sample", "WithMetadata",
        "Repartition", "RepartitionByExpression", "RebalancePartitions",
    }
)  # fmt: skip

#: Stateful operators: Spark shuffles their input by their keys (a hash of each row's keys).
_KEYED = frozenset(
    {
        "Aggregate", "Deduplicate", "DeduplicateWithinWatermark", "FlatMapGroupsWithState",
        "FlatMapGroupsInPandasWithState", "TransformWithState", "TransformWithStateInPySpark",
        "TransformWithStateInPandas",
    }
)  # fmt: skip

#: What reaches a sink from a plan (or part of it): Kafka's partition ids ("kafka"), none of them
#: ("fixed": shuffled by the rows' own columns), cannot tell ("unknown"), or it reads no Kafka.
_Reach = Literal["kafka", "fixed", "unknown", "none"]


def kafka_partition_ids(plan: Any) -> _Reach:
    """Whether the Spark partition ids a sink sees come straight from a Kafka source in ``plan``
    (a streaming DataFrame's analyzed logical plan, a py4j object): "kafka"; "fixed" when a
    deterministic hash repartition (or a stateful operator's shuffle by keys) comes between;
    "unknown" when an operator lakesink does not know does; "none" without Kafka.
    """
    name = str(plan.getClass().getSimpleName())
    if name.startswith("StreamingRelation"):
        source = str(plan.sourceName()).lower()  # format("kafka"), or the provider's class name
        return "kafka" if source == "kafka" or source.endswith(".kafkasourceprovider") else "none"
    hashed = name == "RepartitionByExpression" and plan.deterministic()
    if hashed and str(plan.partitioning().getClass().getSimpleName()) == "HashPartitioning":
        return "fixed"  # each row's partition is a hash of its own columns
    if name in _KEYED and plan.deterministic():
        return "fixed"
    children = plan.children()
    found: set[_Reach] = {kafka_partition_ids(children.apply(i)) for i in range(children.size())}
    if name == "Join" and all(children.apply(i).isStreaming() for i in range(children.size())):
        return "fixed"  # a stream-stream join shuffles both sides by their keys
    if "kafka" in found and name not in _FOLLOW_INPUT:
        return "unknown"  # e.g. a stream-static join: broadcast keeps the stream's partitions
    return next((r for r in ("kafka", "unknown", "fixed") if r in found), "none")  # type: ignore[return-value]


def kafka_start_offsets(plan: Any) -> list[Any] | None:
    """Where a stream starts when its one source is Spark's Kafka source told exact offsets
    (``startingOffsets`` as JSON, every offset a number >= 0): one entry, as the lake records a
    writer's offsets (``{topic: {partition: offset}}``). None otherwise: -1/-2 (latest,
    earliest) are resolved by the source only when the query starts, and other sources record
    their start then; a continuation is judged on those when the first batch is planned."""
    leaves = plan.collectLeaves()
    streams = [
        leaf
        for leaf in (leaves.apply(i) for i in range(leaves.size()))
        if str(leaf.getClass().getSimpleName()).startswith("StreamingRelation")
    ]
    if len(streams) != 1 or kafka_partition_ids(streams[0]) != "kafka":
        return None
    if str(streams[0].getClass().getSimpleName()) != "StreamingRelationV2":
        return None
    options = streams[0].extraOptions()  # case-insensitive
    text = options.get("startingOffsets")
    if text is None or options.get("startingOffsetsByTimestamp") is not None:
        return None
    try:
        start = json.loads(str(text))
    except ValueError:
        return None  # "latest", "earliest"
    exact = isinstance(start, dict) and all(
        isinstance(parts, dict) and all(type(offset) is int and offset >= 0 for offset in parts.values())
        for parts in start.values()
    )
    return [start] if exact else None


def check_foreach_partitioning(plan: Any) -> None:
    """Refuse a foreach write whose partition ids come straight from Spark's Kafka source.

    The Kafka source does not keep which Spark partition reads which Kafka partition across a
    restart (it follows the order of the offsets: live from the broker in the first run, parsed
    from the checkpoint in a replay; SPARK-28650), and a foreach writer needs a replayed epoch
    to bring the same rows under the same partition id: killed after publishing part of an
    epoch, a restarted query duplicates one Kafka partition's records and loses another's.
    ``plan`` is a callable giving the stream's analyzed plan (the JVM's); a plan that cannot be
    read is not judged. Warns when an operator lakesink does not know stands between.
    """
    try:
        reach = kafka_partition_ids(plan())
    except Exception:  # noqa: BLE001 - another Spark's plan: the writer's own guarantees apply
        return
    fix = (
        'repartition the stream by the Kafka partition before the writer -- df.repartition(n, "topic", '
        '"partition"), with the same n at every restart -- or write in epoch mode (format("lakesink") '
        "or lakesink.write_stream), which needs nothing of the kind (docs/guide/kafka.md)"
    )
    if reach == "kafka":
        raise ValueError(
            "LakeForeachWriter on Spark's Kafka source without a repartition: which Spark partition reads "
            "which Kafka partition changes across a restart (SPARK-28650), and a foreach writer needs a "
            "replayed epoch to bring the same rows under the same partition id -- a query killed "
            "mid-epoch would, restarted, write one Kafka partition's records twice and lose another's. "
            f"To write exactly once, {fix}"
        )
    if reach == "unknown":
        warn_at_caller(
            "LakeForeachWriter on Spark's Kafka source: lakesink cannot tell whether the operators between "
            "the source and the writer keep each record under the same Spark partition id across a restart, "
            f"which a foreach writer needs for exactly once (SPARK-28650). If they do not, {fix}",
            RuntimeWarning,
        )
