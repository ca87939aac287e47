"""``format("lakesink")``: the epoch-mode sink -- PySpark's Python Data Source API on the commit protocol.

Who does what (docs/FORMAT.md, "epoch mode"):

- executors (``write``): one task attempt stages one Parquet file from Spark's Arrow batches
  (no per-row Python objects) under ``committed_name(partition, epoch, <attempt id>)``, seals
  it, and returns a small picklable :class:`EpochCommitMessage` holding the sealed token;
- the driver (``commit``): if the epoch already has its record, this is a replay and the new
  files are discarded whole; otherwise it publishes every file (no clobber) and then writes
  the epoch record, create-if-absent. The record is the commit point: readers see the epoch's
  files only through it, so a crash anywhere before it leaves nothing visible, and a crash
  after it makes the replay a no-op;
- ``abort``: discards the staged files of the failed epoch.

Spark runs ``commit`` in a fresh Python worker with a new writer object, built from the
options: everything the commit needs travels in the options or in the messages.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from lakesink.commit import ParquetStage, WriteOptions, discard_quietly
from lakesink.epochlog import DEFAULT_CHECKPOINT_INTERVAL, CommittedFile, EpochLog
from lakesink.errors import CommitError
from lakesink.layout import committed_name, new_attempt_id
from lakesink.metadata import ensure_table
from lakesink.pyworkers import freeze_heap_once
from lakesink.recovery import DEFAULT_STAGED_AGE, recover
from lakesink.rows import arrow_schema
from lakesink.storage import Sealed, Storage, open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

SOURCE_NAME = "lakesink"

#: Options understood by ``format("lakesink")`` besides ``path`` and ``checkpointLocation``.
STORAGE_OPTIONS_KEY = "storage_options"  # a JSON object: fsspec-style options (may hold secrets)
_WRITE_OPTION_TYPES: dict[str, type] = {
    "row_group_bytes": int,
    "compression": str,
    "compression_level": int,
    "use_dictionary": bool,
}
_OTHER_OPTIONS = ("checkpoint_interval", "staged_cleanup_age")


@dataclass(frozen=True)
class EpochCommitMessage(WriterCommitMessage):
    """What one task attempt hands to the driver: its sealed (unpublished) files and counts.

    ``skipped`` is True when the task saw that its epoch was already committed (a replay) and
    wrote nothing.
    """

    partition: int
    epoch: int
    attempt: str
    query_id: str | None
    files: tuple[Sealed, ...]
    rows: int
    bytes: int
    skipped: bool = False


@dataclass(frozen=True)
class SinkConfig:
    """The parsed data source options; picklable, and its repr never shows storage options."""

    path: str
    storage_options: Mapping[str, Any]
    write_options: WriteOptions
    checkpoint_location: str | None
    checkpoint_interval: int
    staged_cleanup_age: float

    def __repr__(self) -> str:
        return f"SinkConfig(path={self.path!r}, checkpoint_location={self.checkpoint_location!r})"

    def storage(self) -> Storage:
        return open_storage(self.path, self.storage_options)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkConfig:
        """Parse Spark's (string, case-insensitive) options; errors name the option, never a secret."""
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise ValueError('format("lakesink") needs the table path: .option("path", ...) or .start(path)')
        storage_options: dict[str, Any] = {}
        raw = opts.get(STORAGE_OPTIONS_KEY)
        if raw:
            try:
                storage_options = json.loads(raw)
            except ValueError:
                storage_options = None  # type: ignore[assignment]
            if not isinstance(storage_options, dict):
                # The value is not shown: it may hold credentials.
                raise ValueError(f"option {STORAGE_OPTIONS_KEY!r} must be a JSON object (value not shown)")
        write_kwargs: dict[str, Any] = {}
        for key, kind in _WRITE_OPTION_TYPES.items():
            if key in opts:
                write_kwargs[key] = _parse_option(key, opts[key], kind)
        checkpoint_interval = int(
            _parse_option("checkpoint_interval", opts.get("checkpoint_interval"), int) or 0
        )
        age = _parse_option("staged_cleanup_age", opts.get("staged_cleanup_age"), float)
        return cls(
            path=path,
            storage_options=storage_options,
            write_options=WriteOptions(**write_kwargs),
            checkpoint_location=opts.get("checkpointlocation") or None,
            checkpoint_interval=checkpoint_interval or DEFAULT_CHECKPOINT_INTERVAL,
            staged_cleanup_age=DEFAULT_STAGED_AGE if age is None else float(age),
        )


def _parse_option(key: str, value: str | None, kind: type) -> Any:
    if value is None:
        return None
    if kind is bool:
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"option {key!r} must be true or false, got {value!r}")
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"option {key!r} must be {kind.__name__}, got {value!r}") from None


class LakeSinkDataSource(DataSource):
    """The ``lakesink`` data source: ``df.writeStream.format("lakesink").option("path", p)``.

    Options
    -------
    path
        Table root (local path, ``file://`` or ``s3://bucket/prefix``).
    storage_options
        JSON object of fsspec-style storage options (S3 endpoint, credentials, ...).
    row_group_bytes, compression, compression_level, use_dictionary
        Parquet layout, see :class:`lakesink.WriteOptions`.
    checkpoint_interval
        Epochs between two checkpoints of the epoch log (default 100).
    staged_cleanup_age
        Seconds after which a staged file or upload left by a dead task is removed by the
        recovery sweep that runs on the first commit after a (re)start (default 3600).
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.config = SinkConfig.from_options(options)
        # One token per instance. Spark pickles the instance it created at query start and
        # unpickles it for every epoch commit, so the token names this run of the query.
        self.run_token = uuid.uuid4().hex

    def __repr__(self) -> str:
        return f"LakeSinkDataSource({self.config.path!r})"

    def streamWriter(self, schema: Any, overwrite: bool) -> LakeStreamWriter:
        """Driver side: check (or create) the table metadata, then hand out the writer."""
        if overwrite:
            raise ValueError(
                f"lakesink tables are append-only: output mode 'complete' cannot write {self.config.path!r}"
            )
        arrow = arrow_schema(schema)
        ensure_table(self.config.storage(), arrow, "epoch")
        return LakeStreamWriter(self.config, arrow, self.run_token)


class LakeStreamWriter(DataSourceStreamArrowWriter):
    """Stages files on executors (``write``) and commits whole epochs on the driver."""

    def __init__(self, config: SinkConfig, schema: pa.Schema, run_token: str) -> None:
        self.config = config
        self.schema = schema
        self.run_token = run_token

    def __repr__(self) -> str:
        return f"LakeStreamWriter({self.config.path!r})"

    # Executors ---------------------------------------------------------------------------

    # pyspark annotates the Arrow variant with its parent's Iterator[Row] signature, hence the ignore.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> EpochCommitMessage:  # type: ignore[override]
        """Stage this task's batches as one Parquet file and return its sealed token."""
        from pyspark import TaskContext

        freeze_heap_once()
        ctx = TaskContext.get()
        if ctx is None:  # pragma: no cover - Spark always runs write inside a task
            raise RuntimeError("LakeStreamWriter.write must run inside a Spark task")
        partition = ctx.partitionId()
        epoch = _batch_id(ctx)
        query_id = ctx.getLocalProperty("sql.streaming.queryId")
        attempt = new_attempt_id()
        storage = self.config.storage()
        if EpochLog(storage).has(epoch):
            # A replay of a committed epoch: the driver will skip it whole, so do not stage.
            for _ in iterator:
                pass
            return EpochCommitMessage(partition, epoch, attempt, query_id, (), 0, 0, skipped=True)
        stage = ParquetStage(
            storage, committed_name(partition, epoch, attempt), self.schema, self.config.write_options
        )
        try:
            for i, batch in enumerate(iterator):
                stage.write(batch)
                if i == 0:
                    _chaos_point("in_write", epoch)
            sealed = stage.seal()
        except BaseException:
            discard_quietly(stage.discard, f"staged file of partition {partition}, epoch {epoch}")
            raise
        files = (sealed,) if sealed is not None else ()
        return EpochCommitMessage(
            partition, epoch, attempt, query_id, files, stage.rows, sum(f.size for f in files)
        )

    # Driver ------------------------------------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Publish the epoch's files, then write its record (the commit point)."""
        freeze_heap_once()
        storage = self.config.storage()
        epoch_log = EpochLog(storage, checkpoint_interval=self.config.checkpoint_interval)
        ours = _messages(messages, batchId)
        sealed = [f for m in ours for f in m.files]
        query_id = next((m.query_id for m in ours if m.query_id), None)
        self._recover_once(storage, keep={f.name for f in sealed})

        existing = epoch_log.record(batchId)
        if existing is not None:
            self._check_same_query(existing.query_id, query_id, batchId)
            _discard_all(storage, sealed)
            log.info("epoch %d of %s is already committed: replay skipped whole", batchId, self.config.path)
            return

        if batchId > 0 and not epoch_log.has(batchId - 1) and epoch_log.latest_epoch() is not None:
            # Readers find the newest epochs by walking the records after the last checkpoint
            # (docs/FORMAT.md), so the log must not have holes. Spark commits epochs in order;
            # a hole means another query (another checkpoint) is writing to this lake.
            raise CommitError(
                f"epoch {batchId - 1} of {self.config.path} has no record, so epoch {batchId} cannot be "
                "committed: is another streaming query writing to this lake? Use one checkpoint per lake."
            )
        _chaos_point("before_publish", batchId)
        rows_of = {f.name: m.rows for m in ours for f in m.files}
        part_of = {f.name: m.partition for m in ours for f in m.files}
        published: list[Sealed] = []
        try:
            for f in sealed:
                if not storage.publish(f):
                    # Names carry a fresh attempt id: a taken name means a bug, not a race.
                    raise CommitError(
                        f"{self.config.path}/{f.name} already exists while committing epoch {batchId}"
                    )
                published.append(f)
        except BaseException:
            _discard_all(storage, [f for f in sealed if f not in published])
            _delete_quietly(storage, [f.name for f in published])
            raise
        _chaos_point("after_publish", batchId)

        files = [CommittedFile(f.name, part_of[f.name], batchId, rows_of[f.name], f.size) for f in published]
        created = epoch_log.commit(
            batchId, files, source_offsets=self._source_offsets(batchId), query_id=query_id
        )
        if not created:
            # Someone recorded the epoch between our check and our record: theirs is the truth.
            _delete_quietly(storage, [f.name for f in published])
            log.warning(
                "epoch %d of %s was committed concurrently; our files removed", batchId, self.config.path
            )
            return
        _chaos_point("after_record", batchId)
        log.info(
            "committed epoch %d of %s: %d file(s), %d row(s)",
            batchId,
            self.config.path,
            len(files),
            sum(f.rows for f in files),
        )

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """A task of the epoch failed for good: drop every file staged for it."""
        storage = self.config.storage()
        _discard_all(storage, [f for m in _messages(messages, batchId) for f in m.files])

    # -------------------------------------------------------------------------------------

    def _recover_once(self, storage: Storage, keep: set[str]) -> None:
        """Run the recovery sweep on the first commit of this run of the query.

        Here, inside the epoch commit, nothing else of this query is being committed (Spark
        commits one epoch at a time and refuses a second active run of one checkpoint), so
        every published file that no record lists is garbage. Commit workers are reused
        between epochs, so the module-level set usually keeps it to once per run; a fresh
        worker sweeps again, which costs a listing and is otherwise harmless. ``keep``: this
        epoch's sealed files, staged still (open multipart uploads on S3) until published.
        """
        if self.run_token in _RECOVERED:
            return
        recover(storage, nothing_in_flight=True, staged_older_than=self.config.staged_cleanup_age, keep=keep)
        _RECOVERED.add(self.run_token)

    def _check_same_query(self, recorded: str | None, ours: str | None, epoch: int) -> None:
        if recorded and ours and recorded != ours:
            raise CommitError(
                f"epoch {epoch} of {self.config.path} was committed by streaming query {recorded}, "
                f"but query {ours} is writing it now (a new checkpoint location?). Its data would be "
                "skipped as a replay; write to a new lake path, or restart from the original checkpoint."
            )

    def _source_offsets(self, epoch: int) -> Any:
        """The epoch's source offsets, read from Spark's offset log ``<checkpoint>/offsets/<epoch>``.

        The Python Data Source API does not hand offsets to the sink; Spark writes them to its
        offset log before the epoch runs, so the driver can read them there when it knows the
        checkpoint location (it travels as the ``checkpointLocation`` option). The log's
        format is Spark's: a version line, a metadata line, then one JSON offset per source.
        None when unavailable -- offsets are informational, never needed for correctness.
        """
        location = self.config.checkpoint_location
        if not location:
            return None
        try:
            text = open_storage(location, self.config.storage_options).read_bytes(f"offsets/{epoch}").decode()
        except Exception:  # informational only: a missing offset log must not fail the commit
            log.debug("no offset log for epoch %d under the checkpoint location", epoch, exc_info=True)
            return None
        offsets: list[Any] = []
        for line in text.splitlines()[2:]:
            try:
                offsets.append(None if line.strip() == "-" else json.loads(line))
            except ValueError:
                offsets.append(line)
        return offsets


_RECOVERED: set[str] = set()


def _batch_id(ctx: Any) -> int:
    # MicroBatchExecution sets this local property for every job of an epoch; the Python Data
    # Source API passes the batch id to commit/abort only, and the file name needs it here.
    value = ctx.getLocalProperty("streaming.sql.batchId")
    if value is None:
        raise RuntimeError(
            "no 'streaming.sql.batchId' in the task's local properties: format('lakesink') "
            "supports micro-batch streaming queries only"
        )
    return int(value)


def _messages(messages: Sequence[WriterCommitMessage | None], epoch: int) -> list[EpochCommitMessage]:
    found = []
    for m in messages:
        if m is None:
            continue
        if not isinstance(m, EpochCommitMessage):
            raise CommitError(f"unexpected commit message {type(m).__name__} for epoch {epoch}")
        if m.epoch != epoch:
            raise CommitError(f"commit message of epoch {m.epoch} handed to the commit of epoch {epoch}")
        found.append(m)
    return found


def _discard_all(storage: Storage, sealed: Sequence[Sealed]) -> None:
    for f in sealed:
        discard_quietly(lambda f=f: storage.discard(f), f"staged file for {f.name}")  # type: ignore[misc]


def _delete_quietly(storage: Storage, names: Sequence[str]) -> None:
    for name in names:
        discard_quietly(lambda name=name: storage.delete(name), f"unrecorded file {name}")  # type: ignore[misc]


def _chaos_point(point: str, epoch: int) -> None:
    """Test hook for the chaos harness (tests/test_chaos.py); a no-op unless its variables are set.

    LAKESINK_CHAOS_MARKERS=<dir>: touch ``<dir>/<point>-<epoch>-<pid>`` on reaching ``point``
    (so the harness can ``kill -9`` exactly there); LAKESINK_CHAOS_PAUSE=<seconds>: then sleep
    that long (keep it tiny: it slows every epoch). Points: in_write (executor, after the first
    batch), before_publish, after_publish (files visible by name, no record yet), after_record
    (record written, Spark's own commit log not yet).
    """
    markers = os.environ.get("LAKESINK_CHAOS_MARKERS")
    pause = os.environ.get("LAKESINK_CHAOS_PAUSE")
    if not markers and not pause:
        return
    if markers:
        with open(os.path.join(markers, f"{point}-{epoch}-{os.getpid()}"), "w"):
            pass
    if pause:
        time.sleep(float(pause))


# Entry points ------------------------------------------------------------------------------


def register(spark: SparkSession) -> None:
    """Register the ``lakesink`` data source with ``spark`` (idempotent)."""
    spark.dataSource.register(LakeSinkDataSource)


def write_stream(
    df: DataFrame,
    path: str,
    *,
    checkpoint_location: str,
    storage_options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    **write_options: Any,
) -> StreamingQuery:
    """Start an epoch-mode streaming write of ``df`` into the lake at ``path``.

    Parameters
    ----------
    df
        A streaming DataFrame.
    path
        Table root: local path, ``file://`` URL or ``s3://bucket/prefix``.
    checkpoint_location
        Spark's checkpoint folder for the query: restarting from it resumes exactly once.
    storage_options
        fsspec-style storage options (S3 endpoint, credentials); sent to Spark as one JSON
        option and never shown in reprs or errors.
    trigger
        Keyword arguments of ``DataStreamWriter.trigger``, e.g. ``{"availableNow": True}`` or
        ``{"processingTime": "10 seconds"}``; Spark's default when None.
    query_name
        ``DataStreamWriter.queryName``.
    **write_options
        ``row_group_bytes``, ``compression``, ``compression_level``, ``use_dictionary``,
        ``checkpoint_interval``, ``staged_cleanup_age`` (see :class:`LakeSinkDataSource`).

    Returns
    -------
    pyspark.sql.streaming.StreamingQuery
        The started query.

    Raises
    ------
    SchemaMismatchError, ModeMismatchError
        Before the query starts, when the lake exists with another schema or in foreach mode.
    """
    unknown = sorted(set(write_options) - set(_WRITE_OPTION_TYPES) - set(_OTHER_OPTIONS))
    if unknown:
        raise TypeError(f"write_stream() got unknown option(s) {unknown}")
    options = {"path": path, **{k: _option_string(v) for k, v in write_options.items()}}
    if storage_options:
        options[STORAGE_OPTIONS_KEY] = json.dumps(dict(storage_options))
    config = SinkConfig.from_options(options)  # bad options fail here, on the driver
    # Fail before starting on a table of another schema or mode (the query would fail anyway).
    ensure_table(config.storage(), arrow_schema(df.schema), "epoch")
    register(df.sparkSession)
    writer = (
        df.writeStream.format(SOURCE_NAME)
        .options(**options)
        .option("checkpointLocation", checkpoint_location)
    )
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    with _query_conf(df.sparkSession, STREAM_CONF):
        return writer.start()


#: SQL settings ``write_stream`` gives the query it starts, unless the session sets them itself.
#:
#: ``maxBytesPerBatch``: since Spark 4.1 (SPARK-51316) each JVM-to-Python Arrow batch is capped
#: by bytes as well as by rows, and to apply the cap Spark re-measures the batch after every
#: row it appends. For the struct a ``mapInArrow`` input is wrapped in (which is how the Python
#: Data Source API feeds ``write``) that measuring is expensive: a Java Flight Recorder profile
#: of the ``make bench`` stream put 44% of the JVM's samples in ``ArrowWriter.sizeInBytes`` --
#: more than Spark's own Parquet sink spends writing the same rows. INT_MAX is the value that
#: switches the check off; batches are then bounded by ``maxRecordsPerBatch`` rows alone (10,000
#: by default), as before Spark 4.1. Sessions with very wide rows can set either option.
STREAM_CONF = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}


@contextlib.contextmanager
def _query_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
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


def _option_string(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
