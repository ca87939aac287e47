"""One Parquet file through the protocol: stage -> write batches -> seal -> publish, or discard.

In the style of python-atomicwrites: a ``FileWriter`` stages its file beside the target (a
hidden ``.uncommitted`` file, or an S3 multipart upload to the final key), publishes it only
on success, without ever replacing another file, and discards it on any error -- the error
that caused it is the one the caller sees, whatever the cleanup does. Both writer modes use
it unchanged; they differ only in the name they give the file (docs/FORMAT.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.commit.observer import Observer, notify
from lakesink.commit.stats import count_nans, file_stats, nan_columns
from lakesink_reader.datafiles import open_file
from lakesink_reader.errors import SchemaMismatchError, quietly
from lakesink_reader.format.table import schema_differences
from lakesink_reader.storage import Sealed, StagedFile, Storage

log = logging.getLogger(__name__)

#: Staged data younger than this may belong to a task still writing: sweeps leave it (the
#: writers' own sweep after a run's first commit, and ``lakesink orphans``, by default).
DEFAULT_STAGED_AGE = 3600.0

Compression = Literal["zstd", "snappy", "gzip", "lz4", "none"]


@dataclass(frozen=True)
class WriteOptions:
    """How staged Parquet files are written.

    The defaults were measured by encoding 1M rows of the ``make bench`` stream (long,
    timestamp, unique 20-character string, random double) with pyarrow 26; CPU time and
    file size per 1M rows: zstd-1 with dictionaries 146 ms / 11.3 MiB, with the 256 KiB
    dictionary limit 111 ms / 10.7 MiB, without dictionaries 101 ms / 10.3 MiB; snappy
    without dictionaries 65 ms / 21.0 MiB. In the epoch path that encoding is a small share
    of the whole: ``make bench`` spends about 1.75 CPU-s per million rows on the query (reading
    the source, turning rows into Arrow in the JVM, moving batches to Python, encoding).

    Every field is also an option of ``format("lakesink")`` and a keyword of
    ``lakesink.write_stream`` (``lakesink.config`` derives those from these fields).

    Parameters
    ----------
    row_group_bytes
        Arrow bytes buffered before a row group is encoded and written out. This bounds the
        writer's memory (one row group of Arrow data plus its encoded pages) whatever the
        partition's size; 64 MiB gives row groups of the size Parquet readers like. 16 MiB
        and 128 MiB encode within 5% of the same speed: memory, not speed, sets this.
    compression
        Parquet codec. zstd level 1 writes half the bytes of snappy (Spark's default) for
        ~0.04 s more CPU per million rows: storage and S3 transfer cost more than that.
    compression_level
        The codec's level (zstd and gzip only); None for the codec's default.
    use_dictionary
        Dictionary-encode columns: it pays off for repetitive values (categories, codes),
        which is most of what streams carry besides ids and timestamps.
    dictionary_page_bytes
        Largest dictionary before a column chunk falls back to plain encoding. Parquet's
        default (1 MiB) lets unique columns (ids, timestamps, measures) fill a dictionary of
        128k entries before giving up -- a third of all encoding time, and a bigger file.
        256 KiB still holds ~10k distinct 20-character strings or 32k distinct longs.
    max_open_files
        Partitioned lakes: the most partition folders one task writes to at a time. Past it, the
        file of the folder written least recently is finished, and a later row for that folder
        starts another file. Each open file holds a Parquet writer (and on S3 a multipart
        upload's part buffer); the rows buffered across all of them stay within
        ``row_group_bytes``.
    max_records_per_file
        Epoch mode: the most rows in one data file (Spark's ``maxRecordsPerFile``). A task
        with more rows (an ``availableNow`` backfill's) finishes a file when it holds this many
        and starts another; its files are committed together, in the batch's one commit. None
        (the default): one file per task and partition folder. Foreach mode refuses it: there a
        published file is committed, and a replay must name the same one file.
    """

    row_group_bytes: int = 64 << 20
    compression: Compression = "zstd"
    compression_level: int | None = 1
    use_dictionary: bool = True
    dictionary_page_bytes: int = 256 << 10
    max_open_files: int = 32
    max_records_per_file: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            want = {"compression": str, "use_dictionary": bool}.get(f.name, int)
            if value is None and f.name in ("compression_level", "max_records_per_file"):
                continue
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise TypeError(f"WriteOptions {f.name} must be {want.__name__}, got {value!r}")
        if self.row_group_bytes < 1 << 10:
            raise ValueError(f"row_group_bytes must be at least 1 KiB (1024), got {self.row_group_bytes}")
        if self.dictionary_page_bytes < 1 << 10:
            raise ValueError(
                f"dictionary_page_bytes must be at least 1 KiB (1024), got {self.dictionary_page_bytes}"
            )
        if self.max_open_files < 1:
            raise ValueError(f"max_open_files must be at least 1, got {self.max_open_files}")
        if self.max_records_per_file is not None and self.max_records_per_file < 1:
            raise ValueError(
                "max_records_per_file must be at least 1 (or None: no limit), "
                f"got {self.max_records_per_file}"
            )
        if self.compression not in get_args(Compression):
            raise ValueError(
                f"unknown compression {self.compression!r}; use one of {list(get_args(Compression))}"
            )
        if self.compression_level is not None and self.compression in ("zstd", "gzip"):
            # Checked here, where the writer is configured (the driver), not by every task's
            # Parquet writer after the query started.
            low = pa.Codec.minimum_compression_level(self.compression)
            high = pa.Codec.maximum_compression_level(self.compression)
            if not low <= self.compression_level <= high:
                raise ValueError(
                    f"compression_level {self.compression_level} is out of {self.compression}'s range "
                    f"{low}..{high}; use a level in it, or None for the codec's default"
                )


@dataclass(frozen=True)
class Published:
    """A file that now stands under its name.

    ``won`` is False when another attempt's file, with as many rows or more, stood there
    (foreach mode: a replay, or a speculative or truncated attempt): ours was discarded.
    ``superseded`` is True when ours replaced a file with fewer rows (see ``FileWriter.publish``).
    ``stats`` is the file's Delta stats object (:mod:`lakesink.commit.stats`) when ours is the
    file that stands, else None (also when they could not be taken).
    """

    name: str
    size: int
    rows: int
    won: bool
    superseded: bool = False
    stats: dict[str, Any] | None = field(default=None, hash=False)


class FileWriter:
    """One task attempt's Parquet file.

    Batches are buffered up to ``row_group_bytes`` and then written as one row group, so the
    memory held is bounded by about one row group however many rows arrive. The staged file
    is created with the first row group: a writer that gets no rows leaves nothing behind.

    Use as a context manager (publish on a clean exit, discard on an exception) or call
    :meth:`publish` / :meth:`discard` yourself.

    Parameters
    ----------
    storage, name, schema, options
        Where, under which published name, with which Arrow schema, laid out how.
    observer, epoch, partition
        Told of the protocol steps (see :mod:`lakesink.commit.observer`).

    Once sealed, ``stats`` holds the file's Delta stats (:func:`lakesink.commit.stats.file_stats`
    of the footer just written, None if they could not be taken); ``nan_counts`` the NaNs
    counted while writing, per float column that gets statistics.
    """

    def __init__(
        self,
        storage: Storage,
        name: str,
        schema: pa.Schema,
        options: WriteOptions | None = None,
        *,
        observer: Observer | None = None,
        epoch: int = -1,
        partition: int | None = None,
    ) -> None:
        self.storage = storage
        self.name = name
        self.schema = schema
        self.options = options or WriteOptions()
        self.rows = 0
        self._observer, self._epoch, self._partition = observer, epoch, partition
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._staged: StagedFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._nan_columns = nan_columns(schema)
        self.nan_counts: dict[str, int] = {}
        self.stats: dict[str, Any] | None = None

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if error is None:
            self.publish()
        else:
            self.discard()

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if batch.schema != self.schema:
            batch = conform(batch, self.schema)
        count_nans(self.nan_counts, batch, self._nan_columns)
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self._pending_bytes >= self.options.row_group_bytes:
            self._flush_row_group()

    @property
    def pending_bytes(self) -> int:
        """Arrow bytes buffered for the next row group."""
        return self._pending_bytes

    def flush(self) -> None:
        """Write what is buffered as a row group now (a smaller one), freeing its memory."""
        self._flush_row_group()

    def _open(self) -> pq.ParquetWriter:
        self._staged = self.storage.stage(self.name)
        opts = self.options
        self._writer = pq.ParquetWriter(
            self._staged,  # type: ignore[arg-type]  # a file-like object: write/tell/flush/close
            self.schema,
            compression=opts.compression,
            compression_level=opts.compression_level if opts.compression in ("zstd", "gzip") else None,
            use_dictionary=opts.use_dictionary,
            dictionary_pagesize_limit=opts.dictionary_page_bytes,
        )
        return self._writer

    def _flush_row_group(self) -> None:
        if not self._pending:
            return
        first = self._writer is None
        writer = self._writer or self._open()
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, self._pending_bytes = [], 0
        # One big incoming batch still becomes row groups of about row_group_bytes each.
        rows_per_group = max(1, table.num_rows * self.options.row_group_bytes // max(1, table.nbytes))
        writer.write_table(table, row_group_size=rows_per_group)
        if first:
            notify(self._observer, "in_write", self._epoch, self._partition)

    def seal(self) -> Sealed | None:
        """Finish the file and make it durable; None when no rows were written (nothing to publish)."""
        if self.rows == 0:
            return None
        self._flush_row_group()
        assert self._writer is not None and self._staged is not None
        writer, self._writer = self._writer, None
        writer.close()
        self.stats = self._stats(writer)
        return self._staged.seal()

    def _stats(self, writer: pq.ParquetWriter) -> dict[str, Any] | None:
        """Stats of the footer ``writer`` has just written; None, logged, if taking them fails."""
        try:
            return file_stats(writer.writer.metadata, self.nan_counts)
        except Exception:  # stats are optional: never fail a file for them
            log.warning("no statistics for %s", self.name, exc_info=True)
            return None

    def publish(self) -> Published | None:
        """Seal and publish without clobbering; None when there were no rows. Discards on error.

        When the name is taken, the file with more rows stands: ours is discarded if the other
        has as many rows or more, and replaces it (atomically, only if it is still that file)
        if it has fewer. Attempts at one name hold the same rows, or a part of them: pyspark's
        foreach bridge (``PythonForeachWriter``) ends a writer's input as if complete when the
        task fails upstream of it, so a truncated file can be published before Spark retries
        the task, and the retry's complete file must then take its place.
        """
        try:
            sealed = self.seal()
            if sealed is None:
                return None
            notify(self._observer, "before_publish", self._epoch, self._partition)
            won = self.storage.publish(sealed)
            superseded = False
            while not won:
                version = self.storage.version(self.name)
                if version is None:  # it vanished since we looked: publish into the gap
                    won = self.storage.publish(sealed)
                    continue
                theirs = rows_in(self.storage, self.name)
                if theirs >= self.rows:
                    self.storage.discard(sealed)
                    log.info(
                        "%s stands with %d rows (ours: %d); discarded our copy", self.name, theirs, self.rows
                    )
                    break
                won = superseded = self.storage.supersede(sealed, version)
                if won:
                    log.warning(
                        "%s had %d rows, written by an attempt whose input was cut short; "
                        "replaced by this attempt's %d rows",
                        self.name,
                        theirs,
                        self.rows,
                    )
        except BaseException:
            self.discard()
            raise
        notify(self._observer, "after_publish", self._epoch, self._partition)
        return Published(self.name, sealed.size, self.rows, won, superseded, self.stats if won else None)

    def discard(self) -> None:
        """Drop the staged file. Safe at any point, and more than once; never raises."""
        self._pending = []
        if self._writer is not None:
            writer, self._writer = self._writer, None
            # Closing finishes a footer we are about to throw away; it releases pyarrow's
            # writer, which would otherwise try to finish the file when garbage-collected.
            quietly(writer.close, f"close the Parquet writer of {self.name}")
        if self._staged is not None:
            staged, self._staged = self._staged, None
            quietly(staged.discard, f"discard the staged file of {self.name}")


def rows_in(storage: Storage, name: str) -> int:
    """The row count of the published Parquet file ``name`` (read from its footer, bounded as a
    reader's read is: ``lakesink_reader.datafiles``)."""
    with open_file(storage, name) as opened:
        return int(opened.metadata.num_rows)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast ``batch`` to the table schema (same names, compatible types), or fail naming columns."""
    if batch.schema.names == schema.names:
        try:
            return batch.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise SchemaMismatchError(f"batch does not fit the table schema: {exc}") from exc
    diffs = schema_differences(schema, batch.schema)
    raise SchemaMismatchError("batch does not fit the table schema: " + "; ".join(diffs))


def fill_slices(
    batch: pa.RecordBatch, rows_so_far: int, limit: int | None
) -> Iterator[tuple[pa.RecordBatch, bool]]:
    """``batch`` in slices that fill files of at most ``limit`` rows, the current one holding
    ``rows_so_far``: each slice, and whether its file is full after it (None: one slice, never
    full). An empty batch gives nothing."""
    if limit is None:
        if batch.num_rows:
            yield batch, False
        return
    room = limit - rows_so_far
    start = 0
    while start < batch.num_rows:
        take = min(room, batch.num_rows - start)
        yield batch.slice(start, take), take == room
        start += take
        room = limit
