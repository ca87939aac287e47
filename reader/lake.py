"""``Lake``: which files of a lakesink table a reader may see, and reading them with pyarrow.

Isolation levels:

- ``read_committed``: exactly the committed data, each committed file once. In foreach mode
  that is every file with a committed name; in epoch mode, every file listed by an epoch
  record (files published by an epoch that never got its record are not committed).
- ``read_all``: everything -- committed, published-but-unrecorded and staged files. Files that
  cannot be read (being written, truncated by a crash, an S3 upload still in flight) are
  skipped and reported, never a crash.

This module never imports pyspark.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from lakesink.epochlog import EpochInfo, EpochLog
from lakesink.errors import CorruptFileError
from lakesink.layout import DataFileName, parse_data_file
from lakesink.metadata import TableMetadata, read_table_metadata
from lakesink.storage import Storage, open_storage

if TYPE_CHECKING:
    import pandas

Isolation = Literal["read_committed", "read_all"]
FileState = Literal["committed", "staged", "pending"]


@dataclass(frozen=True)
class LakeFile:
    """A data file of the table as a reader sees it."""

    name: str  # relative to the table root
    path: str  # full path / URL
    partition: int
    epoch: int
    state: FileState
    size: int
    rows: int | None = None  # known from the epoch record in epoch mode


@dataclass(frozen=True)
class SkippedFile:
    """A file ``read_all`` could not read, and why."""

    path: str
    state: FileState
    reason: str


class SkippedFilesWarning(UserWarning):
    """``read_all`` skipped unreadable files; ``.skipped`` lists them."""

    def __init__(self, skipped: Sequence[SkippedFile]) -> None:
        self.skipped = list(skipped)
        names = ", ".join(s.path for s in self.skipped[:5])
        more = f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        super().__init__(f"read_all skipped {len(self.skipped)} unreadable file(s): {names}{more}")


@dataclass(frozen=True)
class ReadResult:
    """What a read returned and what it had to skip (only ``read_all`` skips)."""

    table: pa.Table
    skipped: list[SkippedFile]


class Lake:
    """A lakesink table at ``path`` (local path, ``file://`` or ``s3://``).

    Raises TableNotFoundError when nothing is at ``path`` and NotALakeError when the path
    holds no lakesink metadata.
    """

    def __init__(self, path: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self._storage: Storage = open_storage(path, storage_options)
        self.metadata: TableMetadata = read_table_metadata(self._storage)
        self._fs, self._base = self._storage.arrow_filesystem()
        self._log = EpochLog(self._storage) if self.metadata.mode == "epoch" else None

    def __repr__(self) -> str:
        return f"Lake({self.path!r}, mode={self.metadata.mode!r})"

    @property
    def schema(self) -> pa.Schema:
        return self.metadata.schema

    @property
    def mode(self) -> str:
        return self.metadata.mode

    # Which files --------------------------------------------------------------------------

    def epochs(self) -> list[EpochInfo]:
        """The committed epochs of an epoch-mode table, oldest first (empty in foreach mode)."""
        return self._log.epochs() if self._log is not None else []

    def files(
        self,
        isolation: Isolation = "read_committed",
        *,
        as_of_epoch: int | None = None,
        epochs: tuple[int, int] | None = None,
    ) -> list[LakeFile]:
        """The data files visible at ``isolation``, ordered by (epoch, partition, name).

        ``as_of_epoch`` (time travel) and ``epochs=(first, last)`` (incremental read, both
        ends included) select committed epochs; they apply to ``read_committed`` only.
        """
        if isolation not in ("read_committed", "read_all"):
            raise ValueError(f"isolation must be 'read_committed' or 'read_all', got {isolation!r}")
        if (as_of_epoch is not None or epochs is not None) and isolation != "read_committed":
            raise ValueError("as_of_epoch / epochs select committed epochs: use isolation='read_committed'")
        if epochs is not None and (len(epochs) != 2 or epochs[0] > epochs[1]):
            raise ValueError(f"epochs must be a (first, last) pair with first <= last, got {epochs!r}")
        # Epoch-mode read_committed needs no listing of the table root: the log names the files.
        listing = self._storage.list("") if self._log is None or isolation == "read_all" else []
        listed = [(e.name, e.size, p) for e in listing if (p := parse_data_file(e.name)) is not None]
        if self._log is not None:
            found = [
                LakeFile(c.name, self._path(c.name), c.partition, c.epoch, "committed", c.size, c.rows)
                for c in self._log.committed_files(as_of_epoch=as_of_epoch, epochs=epochs)
            ]
        else:
            found = [
                self._file(name, parsed, "committed", size)
                for name, size, parsed in listed
                if parsed.state == "committed"
                and (as_of_epoch is None or parsed.epoch <= as_of_epoch)
                and (epochs is None or epochs[0] <= parsed.epoch <= epochs[1])
            ]
        if isolation == "read_all":
            # Everything listed that is not committed: staged files, and in epoch mode also
            # files published by an epoch that has no record (as_of_epoch/epochs are refused
            # above, so every committed file is in ``found``).
            committed = {f.name for f in found}
            found += [self._file(n, p, "staged", size) for n, size, p in listed if n not in committed]
            for upload in self._storage.pending_uploads(""):
                parsed = parse_data_file(upload.name)
                if parsed is not None:
                    found.append(self._file(upload.name, parsed, "pending", upload.bytes))
        found.sort(key=lambda f: (f.epoch, f.partition, f.name))
        return found

    def _file(self, name: str, parsed: DataFileName, state: FileState, size: int) -> LakeFile:
        return LakeFile(name, self._path(name), parsed.partition, parsed.epoch, state, size)

    def _path(self, name: str) -> str:
        return f"{self._storage.url.rstrip('/')}/{name}"

    def _arrow_path(self, name: str) -> str:
        return f"{self._base.rstrip('/')}/{name}"

    # Reading ------------------------------------------------------------------------------

    def dataset(
        self,
        isolation: Isolation = "read_committed",
        *,
        as_of_epoch: int | None = None,
        epochs: tuple[int, int] | None = None,
    ) -> ds.Dataset:
        """A ``pyarrow.dataset.Dataset`` over the visible files (DuckDB and polars read it).

        With ``read_all``, unreadable files are left out and reported in a
        :class:`SkippedFilesWarning`.
        """
        dataset, skipped = self._dataset(isolation, as_of_epoch=as_of_epoch, epochs=epochs)
        if skipped:
            warnings.warn(SkippedFilesWarning(skipped), stacklevel=2)
        return dataset

    def _dataset(
        self, isolation: Isolation, *, as_of_epoch: int | None, epochs: tuple[int, int] | None
    ) -> tuple[ds.Dataset, list[SkippedFile]]:
        files = self.files(isolation, as_of_epoch=as_of_epoch, epochs=epochs)
        readable: list[LakeFile] = []
        skipped: list[SkippedFile] = []
        for f in files:
            if f.state == "committed":
                readable.append(f)
            elif f.state == "pending":
                skipped.append(
                    SkippedFile(f.path, f.state, "multipart upload in flight: not readable until completed")
                )
            else:
                reason = self._unreadable_reason(f)
                if reason is None:
                    readable.append(f)
                else:
                    skipped.append(SkippedFile(f.path, f.state, reason))
        dataset = ds.dataset(
            [self._arrow_path(f.name) for f in readable],
            schema=self.schema,
            format="parquet",
            filesystem=self._fs,
        )
        return dataset, skipped

    def _unreadable_reason(self, f: LakeFile) -> str | None:
        """Why a (non-committed) file cannot be read, or None when its footer and schema are fine."""
        try:
            meta = pq.read_metadata(self._arrow_path(f.name), filesystem=self._fs)
        except (OSError, pa.ArrowInvalid) as exc:
            return f"not a complete Parquet file (still being written, or truncated by a crash): {exc}"
        if not meta.schema.to_arrow_schema().equals(self.schema, check_metadata=False):
            return "schema differs from the table's"
        return None

    def read(
        self,
        isolation: Isolation = "read_committed",
        *,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
        as_of_epoch: int | None = None,
        epochs: tuple[int, int] | None = None,
    ) -> ReadResult:
        """Read the visible data; the result says which files were skipped (read_all only)."""
        _check_columns(columns, self.schema)
        dataset, skipped = self._dataset(isolation, as_of_epoch=as_of_epoch, epochs=epochs)
        try:
            table = dataset.to_table(columns=list(columns) if columns is not None else None, filter=filter)
        except (OSError, pa.ArrowInvalid) as exc:
            raise self._diagnose(dataset, exc) from exc
        return ReadResult(table, skipped)

    def _diagnose(self, dataset: ds.Dataset, exc: Exception) -> Exception:
        """Name the committed file that broke a read: committed data is never skipped silently."""
        for path in getattr(dataset, "files", []):
            try:
                pq.ParquetFile(path, filesystem=self._fs).read()
            except FileNotFoundError:
                return CorruptFileError(f"committed file {path!r} is missing from the lake: {exc}")
            except (OSError, pa.ArrowInvalid) as bad:
                return CorruptFileError(f"committed file {path!r} is corrupt: {bad}")
        return exc

    def to_table(
        self,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
        *,
        isolation: Isolation = "read_committed",
        as_of_epoch: int | None = None,
        epochs: tuple[int, int] | None = None,
    ) -> pa.Table:
        result = self.read(isolation, columns=columns, filter=filter, as_of_epoch=as_of_epoch, epochs=epochs)
        if result.skipped:
            warnings.warn(SkippedFilesWarning(result.skipped), stacklevel=2)
        return result.table

    def to_pandas(
        self,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
        *,
        isolation: Isolation = "read_committed",
        as_of_epoch: int | None = None,
        epochs: tuple[int, int] | None = None,
    ) -> pandas.DataFrame:
        table = self.to_table(columns, filter, isolation=isolation, as_of_epoch=as_of_epoch, epochs=epochs)
        return table.to_pandas()


def _check_columns(columns: Sequence[str] | None, schema: pa.Schema) -> None:
    if columns is None:
        return
    if isinstance(columns, str):
        raise TypeError(f"columns must be a list of names, got the string {columns!r}")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise KeyError(f"unknown column(s) {unknown}; the table has {schema.names}")


def read_committed(
    path: str,
    *,
    columns: Sequence[str] | None = None,
    filter: ds.Expression | None = None,
    storage_options: Mapping[str, Any] | None = None,
    as_of_epoch: int | None = None,
    epochs: tuple[int, int] | None = None,
) -> pa.Table:
    """Exactly the committed data of the lake at ``path``, each committed file once.

    ``filter`` is a ``pyarrow.compute`` expression, pushed down to row groups; ``columns``
    projects. ``as_of_epoch=N`` reads the table as of epoch N; ``epochs=(a, b)`` reads only
    epochs a..b (epoch-mode tables; on foreach tables they select files by epoch).
    """
    lake = Lake(path, storage_options)
    return lake.read(
        "read_committed", columns=columns, filter=filter, as_of_epoch=as_of_epoch, epochs=epochs
    ).table


def read_all(
    path: str,
    *,
    columns: Sequence[str] | None = None,
    filter: ds.Expression | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> pa.Table:
    """Everything in the lake, staged files included; unreadable files are skipped.

    Skipped files are reported by a :class:`SkippedFilesWarning` whose ``skipped`` attribute
    lists them (``Lake(path).read("read_all")`` returns the list directly).
    """
    lake = Lake(path, storage_options)
    result = lake.read("read_all", columns=columns, filter=filter)
    if result.skipped:
        warnings.warn(SkippedFilesWarning(result.skipped), stacklevel=2)
    return result.table
