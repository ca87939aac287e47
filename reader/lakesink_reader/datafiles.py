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
(``Lake.dataset()``, pyarrow's own dataset).

A text column chunk stored as a dictionary (or as ``DELTA_BYTE_ARRAY``'s shared prefixes) is
*open*: its uncompressed bytes count a value once however many rows use it (one 300 KB value in
120,000 rows: 36 GB). Its claim is first its values times its uncompressed bytes (no value is
longer), which small reads pass. A read that does not is *settled* before anything is decoded:
each open chunk's claim becomes what its footer's ``SizeStatistics`` say its text decodes to
(``format.sizestats``: ~0.1 ms a file; pyarrow writes them), or, for a dictionary chunk of a
writer that does not write them, its values times its longest dictionary value (a one-row read
of the chunk carries the whole dictionary). Not bounded before decoding: a footer that lies
(understated sizes, a plain encoding named for a dictionary one): it is stopped by the batch
count, after one row group.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink_reader.errors import CorruptFileError, DataFileError, DecodeBudgetError, one_line
from lakesink_reader.format import decoded, sizestats
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
#: The encodings of a text chunk whose values decode to at most its pages' bytes (the levels'
#: encodings among them). Any other (a dictionary, DELTA_BYTE_ARRAY, one unknown) makes it open.
_CLOSED_TEXT_ENCODINGS = frozenset(
    {"PLAIN", "RLE", "BIT_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "BYTE_STREAM_SPLIT"}
)
#: What a row group, and each column chunk of it that a read reads, cost beyond their values:
#: pyarrow's dataset scan holds ~6 KiB a column chunk (pyarrow 26; fuzzer cases: 50,000 row groups
#: of 3 columns under an 8 MiB footer took 900 MiB, case 52 of ``--template v3foreach --mutation
#: parquet_rewrite``; 33,334 of 6 columns in a 14 MB file, 1.2 GB, case 50,430), with margin.
ROW_GROUP_COST = 16 << 10
COLUMN_CHUNK_COST = 16 << 10
#: The largest footer whose ``SizeStatistics`` are walked (in Python: ~0.5 s a MiB when crafted);
#: lakesink's files' footers hold a few KB, a large compacted file's ~100 KB.
MAX_SIZESTATS_FOOTER = 1 << 20


@dataclass(frozen=True)
class OpenChunk:
    """A text column chunk whose encoding lets a value stand for many rows (module docstring)."""

    group: int  # its row group
    column: int  # its leaf's index in the footer
    path: str  # its leaf's dotted name
    values: int
    uncompressed: int
    dictionary: bool  # it has a dictionary page

    @property
    def least(self) -> int:
        """What it decodes to at the least: its pages' bytes, or an offset per value."""
        return max(self.uncompressed, self.values * _WIDTH["BYTE_ARRAY"])

    @property
    def most(self) -> int:
        """What it decodes to at the most, by its footer alone: no value is longer than the
        chunk's uncompressed bytes (the dictionary, or the suffixes of the prefixes, are among
        them)."""
        return self.values * (_WIDTH["BYTE_ARRAY"] + self.uncompressed)


@dataclass(frozen=True)
class Claims:
    """What a file's columns read decode to, as its footer tells: at most :attr:`most` (its
    closed chunks' claims and its open chunks' :attr:`OpenChunk.most`), at least :attr:`least`."""

    least: int
    most: int
    open: tuple[OpenChunk, ...] = ()


@dataclass(frozen=True)
class _LakeFiles:
    """Where the lake at a storage keeps its files, for pyarrow (one filesystem for all)."""

    fs: pyarrow.fs.FileSystem
    root: str  # the base path names are joined onto
    shown: str  # the lake's URL, redacted

    @classmethod
    def of(cls, storage: Storage) -> _LakeFiles:
        fs, base = storage.arrow_filesystem()
        return cls(fs, base.rstrip("/"), redacted(storage.url.rstrip("/")))

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"


@dataclass(frozen=True)
class Located:
    """A file of the lake as pyarrow opens it (``fs``, ``path``) and as messages name it
    (``where``: the lake's URL redacted, then ``name``). Its texts are made when asked: a read
    may locate a file for each of a commit's 200,000 names."""

    lake: _LakeFiles
    name: str  # relative to the lake

    @property
    def fs(self) -> pyarrow.fs.FileSystem:
        return self.lake.fs

    @property
    def path(self) -> str:
        return self.lake.path(self.name)

    @property
    def where(self) -> str:
        return f"{self.lake.shown}/{self.name}"

    def error(self, exc: BaseException) -> DataFileError:
        """The refusal of this file for ``exc`` (pyarrow's, or an OSError), on one line."""
        return DataFileError(f"{self.where}: {one_line(exc)}", self.name)


@dataclass(frozen=True)
class Footer:
    """A data file's footer, read and bounded: the file's length, its footer's, the bytes it
    holds on storage, and what the read's columns decode to as the footer tells."""

    at: Located
    size: int
    length: int
    stored: int  # a local sparse file: its allocated blocks
    metadata: pq.FileMetaData
    claims: Claims

    @property
    def claimed(self) -> int:
        return self.claims.most

    def settled(self) -> Footer:
        """This footer with each open chunk's claim what its text decodes to: by the footer's
        ``SizeStatistics`` (the footer read again: pyarrow does not show them), or by the
        chunk's longest dictionary value (a one-row read of its row group, the dictionary read
        whole), or, failing both (a nested column, DELTA_BYTE_ARRAY of a writer without them),
        its :attr:`OpenChunk.most`. DataFileError naming the file when it cannot be read."""
        if not self.claims.open:
            return self
        try:
            with self.at.fs.open_input_file(self.at.path) as handle:
                most, unsized = self._settled_by_sizes(handle)
                most += self._settled_by_dictionaries(handle, unsized)
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            raise self.at.error(exc) from exc
        return replace(self, claims=Claims(self.claims.least, most))

    def _settled_by_sizes(self, handle: pa.NativeFile) -> tuple[int, list[OpenChunk]]:
        """The claims' most with each open chunk the footer's ``SizeStatistics`` size settled,
        and the dictionary chunks they leave (:meth:`_settled_by_dictionaries`)."""
        metadata, claims = self.metadata, self.claims
        known = None
        if self.length <= MAX_SIZESTATS_FOOTER:
            handle.seek(self.size - 8 - self.length)
            known = sizestats.unencoded_text_bytes(handle.read(self.length))
            shape = [metadata.num_columns] * metadata.num_row_groups
            if known is not None and [len(g) for g in known] != shape:
                known = None  # not the footer pyarrow read: no claim is taken from it
        most = claims.most
        unsized = []
        for chunk in claims.open:
            unencoded = known[chunk.group][chunk.column] if known is not None else None
            if unencoded is not None:
                most += max(chunk.least, chunk.values * _WIDTH["BYTE_ARRAY"] + unencoded) - chunk.most
            elif chunk.dictionary and "." not in chunk.path:
                unsized.append(chunk)
        return most, unsized

    def _settled_by_dictionaries(self, handle: pa.NativeFile, chunks: Sequence[OpenChunk]) -> int:
        """What settling ``chunks`` by their longest dictionary value changes their claims by.

        A writer without SizeStatistics: the first row of the row group, its text columns read
        dictionary-encoded, carries their whole dictionaries; a chunk then decodes to at most
        its values times its longest value, plus its pages' bytes (pages that fell back to
        plain encoding hold their values)."""
        # Here, not at the top: only a read that must be settled needs them (the commit path's
        # row count and a small read never do).
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        by_group: dict[int, list[OpenChunk]] = {}
        for chunk in chunks:
            by_group.setdefault(chunk.group, []).append(chunk)
        change = 0
        for group, of_group in by_group.items():
            columns = sorted({c.path for c in of_group})
            parquet = pq.ParquetFile(handle, metadata=self.metadata, read_dictionary=columns)
            rows = parquet.iter_batches(batch_size=1, row_groups=[group], columns=columns)
            first = next(iter(rows), None)
            for chunk in of_group:
                change -= chunk.most
                column = first.column(chunk.path) if first is not None and len(first) else None
                if column is None:
                    change += chunk.least  # no rows
                elif not pa.types.is_dictionary(column.type):
                    change += chunk.most
                else:
                    values: Any = column.dictionary  # type: ignore[attr-defined]  # string or binary
                    longest = int(pc.max(pc.binary_length(values)).as_py() or 0)
                    change += chunk.values * (_WIDTH["BYTE_ARRAY"] + longest) + chunk.uncompressed
        return change


def _budget(footers: Sequence[Footer]) -> int:
    """The most bytes a read of the files of ``footers`` may decode to."""
    return FLOOR + EXPANSION * sum(f.stored for f in footers)


def _within_budget(footers: Sequence[Footer], threads: int) -> tuple[Footer, ...]:
    """``footers`` once what they say their files decode to is known within the budget: as
    they are when their claims pass it, else with their open chunks settled (module docstring;
    ``threads`` files at once). DecodeBudgetError naming the heaviest file when they pass it
    still -- before anything is decoded."""
    most = _budget(footers)
    least = sum(f.claims.least for f in footers)
    if least > most:
        raise _past_budget(footers, footers, least, "as their footers tell")
    if sum(f.claimed for f in footers) <= most:
        return tuple(footers)
    settled = tuple(parallel(Footer.settled, footers, threads))
    claimed = sum(f.claimed for f in settled)
    if claimed > most:
        raise _past_budget(settled, settled, claimed, "as their footers tell")
    return settled


class _Decoding:
    """What a read has decoded, file by file, counted against its budget as batches come: a
    footer that understates its pages is stopped one batch past the budget."""

    def __init__(self, footers: Sequence[Footer]) -> None:
        self._footers = {f.at.path: f for f in footers}
        self._most = _budget(footers)
        self._total = 0
        self._by_path: dict[str, int] = {}

    def count(self, path: str, batch: pa.RecordBatch) -> None:
        """Count ``batch``, of the file at ``path``: DecodeBudgetError naming the file whose
        decoded bytes pass its share the most, once the read passes its budget."""
        size = batch.nbytes
        self._total += size
        self._by_path[path] = self._by_path.get(path, 0) + size
        if self._total > self._most:
            by_path, footers = self._by_path, self._footers
            heaviest = max(by_path, key=lambda p: by_path[p] - EXPANSION * footers[p].stored)
            raise _past_budget(list(footers.values()), [footers[heaviest]], self._total, "as they were read")


def _past_budget(
    footers: Sequence[Footer], heaviest_of: Sequence[Footer], found: int, how: str
) -> DecodeBudgetError:
    """The refusal of a read of the files of ``footers``, which decode to ``found`` bytes
    (``how``: as the footers tell, or as they were read), naming the heaviest of
    ``heaviest_of``."""
    worst = max(heaviest_of, key=lambda f: f.claimed - EXPANSION * f.stored)
    stored = sum(f.stored for f in footers)
    return DecodeBudgetError(
        f"{worst.at.where}: the read's {len(footers)} data file(s) decode to {found:,} bytes {how}, "
        f"more than {EXPANSION} times the {stored:,} bytes they hold plus {FLOOR >> 20} MiB (this "
        f"file's footer: {worst.claimed:,} bytes from {worst.stored:,}): a crafted file, or data far "
        "more compressible than lakesink writes -- read fewer columns, or scan Lake.dataset() "
        "(pyarrow's own dataset, not bounded)",
        worst.at.name,
    )


@dataclass(frozen=True)
class DataFile:
    """A data file opened for a read: its fragment, its footer read and bounded."""

    fragment: ds.ParquetFileFragment
    footer: Footer

    @property
    def name(self) -> str:
        return self.footer.at.name


@dataclass(frozen=True)
class DataRead:
    """A read of some data files of a lake, their footers read: :meth:`batches` decodes them
    within their budget."""

    storage: Storage
    schema: pa.Schema  # the lake's
    columns: tuple[str, ...]  # read, in this order
    files: tuple[DataFile, ...]
    filter: ds.Expression | None = None

    @property
    def out_schema(self) -> pa.Schema:
        """The schema of the batches: the lake's types, the columns read."""
        return pa.schema([self.schema.field(n) for n in self.columns])

    def without(self, name: str) -> DataRead:
        """This read without the file ``name`` (one a ``read_all`` skips)."""
        return replace(self, files=tuple(f for f in self.files if f.name != name))

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows, file by file in order, as batches of :attr:`out_schema`: none when what the
        footers say the files decode to passes the budget, and no more once what was decoded
        passes it (a footer that understates its pages; DecodeBudgetError naming the heaviest
        file either way)."""
        import pyarrow.dataset as ds  # here: as open_read

        footers = _within_budget([f.footer for f in self.files], read_threads(self.storage))
        if not footers:
            return
        fragments: list[ds.Fragment] = [f.fragment for f in self.files]
        first = self.files[0].fragment
        dataset = ds.FileSystemDataset(fragments, self.schema, first.format, first.filesystem)
        decoding = _Decoding(footers)
        for tagged in dataset.scanner(columns=list(self.columns), filter=self.filter).scan_batches():
            path = str(tagged.fragment.path)  # type: ignore[attr-defined]  # a file's fragment
            decoding.count(path, tagged.record_batch)
            yield tagged.record_batch

    def table(self) -> pa.Table:
        """:meth:`batches` as one table (of :attr:`out_schema`, even with no rows)."""
        return pa.Table.from_batches(list(self.batches()), self.out_schema)


@dataclass(frozen=True)
class OneFile:
    """One data file opened with ``pyarrow.parquet`` alone, its footer bounded as a read's are:
    what compaction, ``verify`` and a writer's publish read. ``pyarrow.dataset`` imports pandas
    where it is installed (~27 MiB), which the commit path, run every micro-batch in the user's
    process and in Spark's workers, must not (tests/test_commit_imports.py)."""

    parquet: pq.ParquetFile
    footer: Footer  # of all its columns

    @property
    def metadata(self) -> pq.FileMetaData:
        return self.parquet.metadata

    def batches(self, batch_rows: int = 64 * 1024) -> Iterator[pa.RecordBatch]:
        """Every row, ``batch_rows`` at a time, in the file's own schema: none when its footer
        says it decodes past the budget, and no more once what was decoded passes it
        (DecodeBudgetError naming it)."""
        decoding = _Decoding(_within_budget([self.footer], threads=1))
        for batch in self.parquet.iter_batches(batch_size=batch_rows, use_threads=False):
            decoding.count(self.footer.at.path, batch)
            yield batch


@contextlib.contextmanager
def open_file(storage: Storage, name: str) -> Iterator[OneFile]:
    """The data file ``name`` opened (:class:`OneFile`): CorruptFileError naming it when it is a
    link, its footer is too large or it is no Parquet file; FileNotFoundError when it is gone."""
    import pyarrow.parquet as pq  # here: only the reads of data files need it

    storage.refuse_link(name)  # pyarrow follows links: nothing is read from outside the lake
    at = Located(_LakeFiles.of(storage), name)
    with at.fs.open_input_file(at.path) as handle:
        size, length = _checked_tail(handle, at)
        stored = _held(at, size)
        try:
            parquet = pq.ParquetFile(handle)
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            raise at.error(exc) from exc
        footer = Footer(at, size, length, stored, parquet.metadata, _claims(parquet.metadata, None))
        yield OneFile(parquet, footer)


def dataset_of(
    storage: Storage, schema: pa.Schema, partition_columns: Sequence[str], names: Sequence[str]
) -> ds.FileSystemDataset:
    """A ``pyarrow.dataset`` of the data files ``names`` (relative to the lake at ``storage``)
    read as ``schema``, none of them opened: what ``Lake.dataset()`` gives a user to scan with
    pyarrow, DuckDB or polars (pyarrow's own scan, not bounded). CorruptFileError naming a file
    that is a link (pyarrow would follow it) or not in the lake's partition folders."""
    return _dataset(storage, _LakeFiles.of(storage), schema, partition_columns, names)


def _dataset(
    storage: Storage,
    files: _LakeFiles,
    schema: pa.Schema,
    partition_columns: Sequence[str],
    names: Sequence[str],
) -> ds.FileSystemDataset:
    """:func:`dataset_of`, the lake's files located by ``files``. A partitioned lake's files
    have their partition values from their folders (the log lists the path) as partition
    expressions: they fill the columns, and a filter on them leaves a file out unopened."""
    # Here, not at the top: opening a lake or listing its files needs no pyarrow.dataset, which
    # imports pandas where it is installed (0.4 s).
    import pyarrow.dataset as ds

    for name in names:
        # pyarrow follows links: a committed name that is a link on local disk is refused
        # (CorruptFileError naming it), never read through (docs/FORMAT.md, "Trust").
        storage.refuse_link(name)
    parquet = ds.ParquetFileFormat()
    fragments: list[ds.Fragment] = [
        parquet.make_fragment(
            files.path(name),
            files.fs,
            partition_expression=(
                partition_expression(storage, schema, partition_columns, name) if partition_columns else None
            ),
        )
        for name in names
    ]
    return ds.FileSystemDataset(fragments, schema, parquet, files.fs)


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
    import pyarrow.dataset as ds  # here: as _dataset

    files = _LakeFiles.of(storage)
    dataset = _dataset(storage, files, schema, partition_columns, names)
    # a filter on partition columns leaves files out unopened, as pyarrow's own scan does
    kept = dataset.get_fragments(filter=filter if partition_columns else None)
    read = tuple(columns) if columns is not None else tuple(schema.names)
    wanted = set(read)
    by_path = {files.path(name): name for name in names}

    def open_one(fragment: ds.Fragment) -> DataFile:
        assert isinstance(fragment, ds.ParquetFileFragment)  # made by a ParquetFileFormat
        at = Located(files, by_path[fragment.path])
        try:
            with at.fs.open_input_file(at.path) as handle:
                size, length = _checked_tail(handle, at)
            stored = _held(at, size)
            fragment.ensure_complete_metadata()  # pyarrow keeps it: the scan reads it no more
            metadata = fragment.metadata
        except FileNotFoundError:
            raise
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            raise at.error(exc) from exc
        return DataFile(fragment, Footer(at, size, length, stored, metadata, _claims(metadata, wanted)))

    # A footer on S3 or HDFS is a request: several at once; on local disk, in turn (logfiles).
    opened = parallel(open_one, list(kept), read_threads(storage))
    return DataRead(storage, schema, read, tuple(opened), filter)


def _checked_tail(handle: pa.NativeFile, at: Located) -> tuple[int, int]:
    """The size of the open file and its footer's, once its last 8 bytes are ``PAR1`` after a
    footer of at most :data:`MAX_FOOTER` (``decoded.check_footer``; DataFileError naming it
    otherwise)."""
    size = handle.size()
    if size >= 8:
        handle.seek(size - 8)
    tail = handle.read(8) if size >= 8 else b""
    try:
        decoded.check_footer(tail, size, at.where, kind="a data file of a lake")
    except CorruptFileError as exc:
        raise DataFileError(str(exc), at.name) from exc
    return size, int.from_bytes(tail[:4], "little")


def _held(at: Located, size: int) -> int:
    """The bytes a file of ``size`` holds on storage: a hole in a local sparse file costs its
    writer nothing, so a local file holds its blocks (a small file whose bytes some file
    systems keep inline has none: its size counts)."""
    if type(at.fs).__name__ == "LocalFileSystem":
        blocks = os.stat(at.path).st_blocks
        if blocks:
            return min(size, blocks * 512)
    return size


def _claims(metadata: pq.FileMetaData, wanted: set[str] | None) -> Claims:
    """What the columns ``wanted`` (top-level names; None: all) decode to, as the footer tells:
    per column chunk, its uncompressed size, or its values times their width when that is more
    (a run-length or dictionary encoding of numbers decodes to a width per value); a text chunk
    whose encoding lets a value stand for many rows is open (:class:`OpenChunk`); and per row
    group, :data:`ROW_GROUP_COST` and :data:`COLUMN_CHUNK_COST` a chunk read."""
    schema = metadata.schema
    leaves = []
    for j in range(metadata.num_columns):
        column = schema.column(j)
        top = column.path.split(".", 1)[0]
        if wanted is None or top in wanted:
            width = _WIDTH.get(column.physical_type) or max(column.length or 1, _FIXED_WIDTH)
            leaves.append((j, column.path, width, column.physical_type == "BYTE_ARRAY"))
    least = most = (ROW_GROUP_COST + COLUMN_CHUNK_COST * len(leaves)) * metadata.num_row_groups
    open_chunks = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for j, path, width, text in leaves:
            chunk = row_group.column(j)
            if text and (chunk.has_dictionary_page or not _CLOSED_TEXT_ENCODINGS.issuperset(chunk.encodings)):
                found = OpenChunk(
                    group, j, path, chunk.num_values, chunk.total_uncompressed_size, chunk.has_dictionary_page
                )
                open_chunks.append(found)
                least += found.least
                most += found.most
            else:
                claim = max(chunk.total_uncompressed_size, chunk.num_values * width)
                least += claim
                most += claim
    return Claims(least, most, tuple(open_chunks))


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
