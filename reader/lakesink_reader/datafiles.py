"""Reading a lake's data files within a budget (docs/FORMAT.md, "Trust"; docs/design/trust.md,
"From issue 37", item 6).

A data file is the user's data, but its bytes are chosen by whoever can write the lake's
folder, and Parquet lets a few bytes stand for many: a footer of 200,000 one-row groups decodes
to ~10x its tens of MB; a column whose every row is one 300,000-character value, stored plain
and compressed, decodes to rows x 300 KB from a file of a few MB (the fuzzer's ledger, case
10083: a reader past 1.3 GiB). So, before pyarrow decodes the files of a read:

- each file's footer holds at most :data:`MAX_FOOTER` bytes (its last 8 bytes are read first);
- what the read's columns decode to as the footers tell it -- each column chunk's uncompressed
  size, or its values times their width when that is more -- is at most the read's budget:
  :data:`EXPANSION` times the bytes the files hold on storage, plus :data:`FLOOR`;

and while it decodes them, what was decoded is counted batch by batch against the same budget
(a footer that understates its pages is stopped one batch past it).

This is the zip-bomb rule: what a reader builds stays proportional to what was stored. Files
lakesink writes decode to ~2-10 times their size; a table whose columns are nearly constant
can decode to more, and is refused with an error that says so and names the unbounded way in
(``Lake.dataset()``, pyarrow's own dataset). Not bounded before decoding: a dictionary value
that many rows use (the footer counts it once; a batch of such rows is decoded, then counted:
docs/design/trust.md, item 6, has the design that closes it), and pages that decompress to more
than their footer says.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from lakesink_reader.errors import CorruptFileError, DataFileError, DecodeBudgetError
from lakesink_reader.format import decoded
from lakesink_reader.format.partitions import partition_texts, typed_values
from lakesink_reader.format.v3.logfiles import parallel, read_threads
from lakesink_reader.redact import redacted

if TYPE_CHECKING:
    import pyarrow.dataset as ds
    import pyarrow.fs
    import pyarrow.parquet as pq

    from lakesink_reader.storage import Storage

MiB = 1 << 20

#: The most bytes a data file's footer may hold, as a metadata file's (``format.decoded``):
#: pyarrow decodes the whole footer when it opens the file, to ~10 times its size; lakesink's
#: data files' footers hold a few KB to ~2 MB.
MAX_FOOTER = decoded.MAX_FOOTER
#: What a read may decode to, per byte its data files hold on storage. lakesink's own files
#: decode to ~2-10 times their size (zstd or snappy over Kafka-like rows).
EXPANSION = 64
#: What a read may decode to beyond :data:`EXPANSION`, whatever its files hold: small files of
#: nearly constant columns decode to many times their size and are still read.
FLOOR = 256 * MiB

#: The width in memory of one value of each Parquet physical type (a text value: its offset).
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 8, "FLOAT": 4, "DOUBLE": 8, "BYTE_ARRAY": 4}
#: A fixed-length value's width in memory is at least a decimal's (16 bytes).
_FIXED_WIDTH = 16


@dataclass(frozen=True)
class DataFile:
    """A data file opened for a read: its footer read and bounded."""

    name: str
    fragment: ds.ParquetFileFragment
    stored: int  # bytes it holds on storage (a local sparse file: its allocated blocks)
    claimed: int  # what the read's columns decode to, as its footer tells


@dataclass(frozen=True)
class DataRead:
    """A read of some data files of a lake, their footers read: :meth:`batches` decodes them
    within :meth:`budget`."""

    storage: Storage
    schema: pa.Schema  # the lake's
    columns: tuple[str, ...]  # read, in this order
    files: tuple[DataFile, ...]
    filter: ds.Expression | None = None

    @property
    def out_schema(self) -> pa.Schema:
        """The schema of the batches: the lake's types, the columns read."""
        return pa.schema([self.schema.field(n) for n in self.columns])

    def budget(self) -> int:
        """The most bytes this read may decode to."""
        return FLOOR + EXPANSION * sum(f.stored for f in self.files)

    def check_claims(self) -> None:
        """DecodeBudgetError naming the heaviest file when what the footers say the files
        decode to passes the budget -- before anything is decoded."""
        claimed = sum(f.claimed for f in self.files)
        if claimed > self.budget():
            self._over(self.files, claimed, "as their footers tell")

    def without(self, name: str) -> DataRead:
        """This read without the file ``name`` (one a ``read_all`` skips)."""
        return replace(self, files=tuple(f for f in self.files if f.name != name))

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows, file by file in order, as batches of :attr:`out_schema`: none when what the
        footers say the files decode to passes the budget, and no more once what was decoded
        passes it (a footer that understates its pages; DecodeBudgetError naming the heaviest
        file either way)."""
        import pyarrow.dataset as ds  # here: as open_read

        self.check_claims()
        if not self.files:
            return
        fragments: list[ds.Fragment] = [f.fragment for f in self.files]
        first = self.files[0].fragment
        dataset = ds.FileSystemDataset(fragments, self.schema, first.format, first.filesystem)
        by_path = {f.fragment.path: f for f in self.files}
        most = self.budget()
        decoded = 0
        by_file: dict[str, int] = {}
        for tagged in dataset.scanner(columns=list(self.columns), filter=self.filter).scan_batches():
            batch = tagged.record_batch
            size = batch.nbytes
            decoded += size
            path = str(tagged.fragment.path)  # type: ignore[attr-defined]  # a file's fragment
            by_file[path] = by_file.get(path, 0) + size
            if decoded > most:
                heaviest = max(by_file, key=lambda p: by_file[p] - EXPANSION * by_path[p].stored)
                self._over([by_path[heaviest]], decoded, "as they were read")
            yield batch

    def table(self) -> pa.Table:
        """:meth:`batches` as one table (of :attr:`out_schema`, even with no rows)."""
        return pa.Table.from_batches(list(self.batches()), self.out_schema)

    def _over(self, heaviest_of: Sequence[DataFile], found: int, how: str) -> None:
        worst = max(heaviest_of, key=lambda f: f.claimed - EXPANSION * f.stored)
        stored = sum(f.stored for f in self.files)
        raise _past_budget(
            self.storage, worst.name, worst.claimed, worst.stored, len(self.files), stored, found, how
        )


def _past_budget(
    storage: Storage, name: str, claimed: int, holds: int, count: int, stored: int, found: int, how: str
) -> DecodeBudgetError:
    """The refusal of a read of ``count`` files holding ``stored`` bytes that decode to ``found``,
    naming the heaviest, ``name`` (its footer claims ``claimed`` bytes from ``holds``)."""
    where = f"{redacted(storage.url.rstrip('/'))}/{name}"
    return DecodeBudgetError(
        f"{where}: the read's {count} data file(s) decode to {found:,} bytes {how}, more than "
        f"{EXPANSION} times the {stored:,} bytes they hold plus {FLOOR >> 20} MiB (this file's footer: "
        f"{claimed:,} bytes from {holds:,}): a crafted file, or data far more compressible than "
        "lakesink writes -- read fewer columns, or scan Lake.dataset() (pyarrow's own dataset, not bounded)",
        name,
    )


@dataclass(frozen=True)
class OneFile:
    """One data file opened with ``pyarrow.parquet`` alone, its footer bounded as a read's are:
    what compaction, ``verify`` and a writer's publish read. ``pyarrow.dataset`` imports pandas
    where it is installed (~27 MiB), which the commit path, run every micro-batch in the user's
    process and in Spark's workers, must not (tests/test_commit_imports.py)."""

    storage: Storage
    name: str
    parquet: pq.ParquetFile
    stored: int

    @property
    def metadata(self) -> pq.FileMetaData:
        return self.parquet.metadata

    def batches(self, batch_rows: int = 64 * 1024) -> Iterator[pa.RecordBatch]:
        """Every row, ``batch_rows`` at a time, in the file's own schema: none when its footer
        says it decodes past the budget, and no more once what was decoded passes it
        (DecodeBudgetError naming it)."""
        most = FLOOR + EXPANSION * self.stored
        claimed = _claimed(self.metadata, None)

        def refusal(found: int, how: str) -> DecodeBudgetError:
            return _past_budget(self.storage, self.name, claimed, self.stored, 1, self.stored, found, how)

        if claimed > most:
            raise refusal(claimed, "as its footer tells")
        decoded = 0
        for batch in self.parquet.iter_batches(batch_size=batch_rows, use_threads=False):
            decoded += batch.nbytes
            if decoded > most:
                raise refusal(decoded, "as it was read")
            yield batch


@contextlib.contextmanager
def open_file(storage: Storage, name: str) -> Iterator[OneFile]:
    """The data file ``name`` opened (:class:`OneFile`): CorruptFileError naming it when it is a
    link, its footer is too large or it is no Parquet file; FileNotFoundError when it is gone."""
    import pyarrow.parquet as pq  # here: only the reads of data files need it

    storage.refuse_link(name)  # pyarrow follows links: nothing is read from outside the lake
    fs, base = storage.arrow_filesystem()
    path = f"{base.rstrip('/')}/{name}"
    where = f"{redacted(storage.url.rstrip('/'))}/{name}"
    with fs.open_input_file(path) as handle:
        stored = _held(fs, path, _checked_tail(handle, name, where))
        try:
            parquet = pq.ParquetFile(handle)
        except (OSError, pa.ArrowException) as exc:
            said = " ".join(str(exc).split())  # pyarrow's text may span lines: an error is one
            raise DataFileError(f"{where}: {said}", name) from exc
        yield OneFile(storage, name, parquet, stored)


def open_read(
    storage: Storage,
    schema: pa.Schema,
    partition_columns: Sequence[str],
    names: Sequence[str],
    columns: Sequence[str] | None = None,
    filter: ds.Expression | None = None,
) -> DataRead:
    """A read of the data files ``names`` (relative to the lake at ``storage``) as ``schema``'s
    ``columns`` (None: all), ``filter`` applied: the files a filter on partition columns leaves
    out are not opened; the others' footers are read and bounded. CorruptFileError naming a
    file that is a link (pyarrow would follow it), whose footer is too large, or that is no
    Parquet file; FileNotFoundError for a file that is gone."""
    # Here, not at the top: opening a lake or listing its files needs no pyarrow.dataset.
    import pyarrow.dataset as ds

    fs, base = storage.arrow_filesystem()
    for name in names:
        # pyarrow follows links: a committed name that is a link on local disk is refused
        # (CorruptFileError naming it), never read through (docs/FORMAT.md, "Trust").
        storage.refuse_link(name)
    read = tuple(columns) if columns is not None else tuple(schema.names)
    parquet = ds.ParquetFileFormat()
    paths = {f"{base.rstrip('/')}/{name}": name for name in names}
    fragments: list[ds.Fragment] = [
        parquet.make_fragment(
            path,
            fs,
            partition_expression=(
                partition_expression(storage, schema, partition_columns, name) if partition_columns else None
            ),
        )
        for path, name in paths.items()
    ]
    if filter is not None and partition_columns:
        # a filter on partition columns leaves files out unopened, as pyarrow's own scan does
        kept = ds.FileSystemDataset(fragments, schema, parquet, fs).get_fragments(filter=filter)
        fragments = list(kept)
    wanted = set(read)

    def open_one(fragment: ds.Fragment) -> DataFile:
        assert isinstance(fragment, ds.ParquetFileFragment)  # made by a ParquetFileFormat
        name = paths[fragment.path]
        where = f"{redacted(storage.url.rstrip('/'))}/{name}"
        try:
            with fs.open_input_file(fragment.path) as handle:
                size = _checked_tail(handle, name, where)
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as exc:
            said = " ".join(str(exc).split())
            raise DataFileError(f"{where}: {said}", name) from exc
        stored = _held(fs, fragment.path, size)
        try:
            fragment.ensure_complete_metadata()  # pyarrow keeps it: the scan reads it no more
            metadata = fragment.metadata
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException) as exc:
            said = " ".join(str(exc).split())  # pyarrow's text may span lines: an error is one
            raise DataFileError(f"{where}: {said}", name) from exc
        return DataFile(name, fragment, stored, _claimed(metadata, wanted))

    # A footer on S3 or HDFS is a request: several at once; on local disk, in turn (logfiles).
    files = parallel(open_one, fragments, read_threads(storage))
    return DataRead(storage, schema, read, tuple(files), filter)


def _checked_tail(handle: pa.NativeFile, name: str, where: str) -> int:
    """The size of the open file, once its last 8 bytes are ``PAR1`` after a footer of at most
    :data:`MAX_FOOTER` (``decoded.check_footer``; DataFileError naming it otherwise)."""
    size = handle.size()
    if size >= 8:
        handle.seek(size - 8)
    tail = handle.read(8) if size >= 8 else b""
    try:
        decoded.check_footer(tail, size, where, kind="a data file of a lake")
    except CorruptFileError as exc:
        raise DataFileError(str(exc), name) from exc
    return size


def _held(fs: pyarrow.fs.FileSystem, path: str, size: int) -> int:
    """The bytes a file of ``size`` holds on storage: a hole in a local sparse file costs its
    writer nothing, so a local file holds its blocks (a small file whose bytes some file
    systems keep inline has none: its size counts)."""
    if type(fs).__name__ == "LocalFileSystem":
        blocks = os.stat(path).st_blocks
        if blocks:
            return min(size, blocks * 512)
    return size


def _claimed(metadata: pq.FileMetaData, wanted: set[str] | None) -> int:
    """What the columns ``wanted`` (top-level names; None: all) decode to, as the footer tells:
    per column chunk, its uncompressed size, or its values times their width when that is more
    (a run-length or dictionary encoding of numbers decodes to a width per value)."""
    schema = metadata.schema
    leaves = []
    for j in range(metadata.num_columns):
        column = schema.column(j)
        top = column.path.split(".", 1)[0]
        if wanted is None or top in wanted:
            width = _WIDTH.get(column.physical_type) or max(column.length or 1, _FIXED_WIDTH)
            leaves.append((j, width))
    total = 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for j, width in leaves:
            chunk = row_group.column(j)
            total += max(chunk.total_uncompressed_size, chunk.num_values * width)
    return total


def partition_expression(
    storage: Storage, schema: pa.Schema, columns: Sequence[str], name: str
) -> ds.Expression:
    # Here, not at the top: pyarrow.compute (40 ms) only when a partitioned lake's files are read.
    import pyarrow.compute as pc

    try:
        values = typed_values(partition_texts(name, tuple(columns)), schema)
    except (ValueError, pa.ArrowInvalid) as exc:
        raise CorruptFileError(
            f"{storage.url.rstrip('/')}/{name}: not in the lake's partition folders: {exc}"
        ) from exc
    expression = None
    for column, value in values.items():
        term = pc.field(column).is_null() if not value.is_valid else pc.field(column) == value
        expression = term if expression is None else expression & term
    assert expression is not None  # a partitioned lake has at least one partition column
    return expression
