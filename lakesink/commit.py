"""The commit protocol: how one (partition, epoch) of a stream becomes a visible Parquet file.

    stage  -> rows stream into an invisible staged file (".uncommitted" / open multipart upload)
    seal   -> every byte durable, still invisible
    publish-> atomic, no-clobber: the file appears whole under its committed name, or not at all
    discard-> on any error, the staged bytes go away; the error that caused it propagates

Every Spark adapter (foreach writer, data source, Arrow path) maps Spark's hooks onto this
module and nothing else decides when data becomes visible.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.storage import Sealed, StagedFile, Storage

log = logging.getLogger(__name__)

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
    use_dictionary
        Dictionary-encode columns: it pays off for repetitive values (categories, codes),
        which is most of what streams carry besides ids and timestamps.
    dictionary_page_bytes
        Largest dictionary before a column chunk falls back to plain encoding. Parquet's
        default (1 MiB) lets unique columns (ids, timestamps, measures) fill a dictionary of
        128k entries before giving up -- a third of all encoding time, and a bigger file.
        256 KiB still holds ~10k distinct 20-character strings or 32k distinct longs.
    """

    row_group_bytes: int = 64 << 20
    compression: Compression = "zstd"
    compression_level: int | None = 1
    use_dictionary: bool = True
    dictionary_page_bytes: int = 256 << 10

    def __post_init__(self) -> None:
        if self.row_group_bytes < 1 << 10:
            raise ValueError(f"row_group_bytes must be at least 1 KiB, got {self.row_group_bytes}")
        if self.dictionary_page_bytes < 1 << 10:
            raise ValueError(
                f"dictionary_page_bytes must be at least 1 KiB, got {self.dictionary_page_bytes}"
            )
        if self.compression not in ("zstd", "snappy", "gzip", "lz4", "none"):
            raise ValueError(f"unknown compression {self.compression!r}")


class ParquetStage:
    """One task attempt's staged Parquet file for one (partition, epoch) (or epoch-mode file).

    Batches are buffered up to ``row_group_bytes`` and then written as one row group, so the
    memory held is bounded by about one row group however many rows arrive.
    """

    def __init__(
        self, storage: Storage, name: str, schema: pa.Schema, options: WriteOptions | None = None
    ) -> None:
        self.storage = storage
        self.name = name
        self.schema = schema
        self.options = options or WriteOptions()
        self.rows = 0
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._staged: StagedFile | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if batch.schema != self.schema:
            batch = _conform(batch, self.schema)
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self._pending_bytes >= self.options.row_group_bytes:
            self._flush_row_group()

    def _open(self) -> pq.ParquetWriter:
        self._staged = self.storage.stage(self.name)
        opts = self.options
        self._writer = pq.ParquetWriter(
            self._staged,  # type: ignore[arg-type]  # a file-like object: write/tell/flush/close
            self.schema,
            compression=opts.compression,
            compression_level=opts.compression_level if opts.compression == "zstd" else None,
            use_dictionary=opts.use_dictionary,
            dictionary_pagesize_limit=opts.dictionary_page_bytes,
        )
        return self._writer

    def _flush_row_group(self) -> None:
        if not self._pending:
            return
        writer = self._writer or self._open()
        table = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, self._pending_bytes = [], 0
        # One big incoming batch still becomes row groups of about row_group_bytes each.
        rows_per_group = max(1, table.num_rows * self.options.row_group_bytes // max(1, table.nbytes))
        writer.write_table(table, row_group_size=rows_per_group)

    def seal(self) -> Sealed | None:
        """Finish the file and make it durable; None when no rows were written (nothing to publish)."""
        if self.rows == 0:
            return None
        self._flush_row_group()
        assert self._writer is not None and self._staged is not None
        writer, self._writer = self._writer, None
        writer.close()
        return self._staged.seal()

    def discard(self) -> None:
        """Drop the staged file. Safe at any point, and more than once."""
        self._pending = []
        if self._writer is not None:
            writer, self._writer = self._writer, None
            # Closing finishes a footer we are about to throw away; it releases pyarrow's
            # writer, which would otherwise try to finish the file when garbage-collected.
            discard_quietly(writer.close, f"Parquet writer of {self.name}")
        if self._staged is not None:
            self._staged.discard()


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast ``batch`` to the table schema (same names, compatible types), or fail naming columns."""
    from lakesink.errors import SchemaMismatchError
    from lakesink.metadata import schema_differences

    if batch.schema.names == schema.names:
        try:
            return batch.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise SchemaMismatchError(f"batch does not fit the table schema: {exc}") from exc
    diffs = schema_differences(schema, batch.schema)
    raise SchemaMismatchError("batch does not fit the table schema: " + "; ".join(diffs))


def publish(storage: Storage, sealed: Sealed) -> bool:
    """Publish a sealed file without clobbering. False: another attempt already published it."""
    won = storage.publish(sealed)
    if not won:
        log.info("%s was already committed by another attempt; discarded our copy", sealed.name)
    return won


def discard_quietly(discard: Callable[[], None], what: str) -> None:
    """Run a cleanup callable, logging (never raising) its failure: the caller's error wins."""
    try:
        discard()
    except Exception:
        log.warning("could not discard %s; the orphan sweep will remove it", what, exc_info=True)
