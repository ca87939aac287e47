"""``Lake``: which files of a lakesink table a reader may see, and reading them with pyarrow.

Isolation levels:

- ``read_committed``: exactly the committed data, each committed file once. In foreach mode
  that is every published file; in epoch mode, every file listed by an epoch record (files
  published by an epoch that has no record yet are not committed).
- ``read_all``: everything -- committed, published and staged files. Files that cannot be read
  (being written, truncated by a crash, an S3 upload in flight, gone since they were listed,
  damaged) are skipped and reported, never a crash.

A committed file that cannot be read is an error (``CorruptFileError``, naming the file) for
``read_committed``, unless ``on_error="skip"`` asks to read around it and report it.
Which committed data a ``Lake`` reads is the object itself, as a Delta table's version is: a
``Lake`` reads the newest snapshot; ``Lake(path, version=v)`` or ``lake.at(version=v)`` (and
``epoch=``) one in the past; ``lake.since(version=a)`` only the rows appends added after ``a``
(an incremental read; ``changes`` is the follower's form of it). Every read method reads what
its lake object selects, so no read method takes selection keywords.
Format-3 (epoch-mode) lakes are read through a pinned snapshot of their versioned log
(``lakesink_reader.v3``): versions, writers and their offsets; format 1 and 2 lakes keep the
epoch log's code path.
This module never imports pyspark, nor any writer module of lakesink.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from lakesink_reader.datafiles import dataset_of, open_read
from lakesink_reader.errors import (
    CorruptFileError,
    DataFileError,
    DecodeBudgetError,
    LakeSinkError,
    VersionNotRetainedError,
    missing_extra,
    one_line,
)
from lakesink_reader.format.log import EpochInfo, EpochLog
from lakesink_reader.format.partitions import partition_folders, partition_texts
from lakesink_reader.format.schemas import fit_problems
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.format.v3.state import WriterState
from lakesink_reader.names import DATA_SUFFIX, TABLE_FILE, DataFileName, parse_data_file
from lakesink_reader.names import FileState as FileState
from lakesink_reader.storage import StagedEntry, Storage, StoredFile, open_storage
from lakesink_reader.v3 import LogView, VersionInfo, vacuumed_while_read

if TYPE_CHECKING:
    import pandas
    import pyarrow.dataset as ds

Isolation = Literal["read_committed", "read_all"]
OnError = Literal["raise", "skip"]
#: Attempts to read around files that vanish while a read is under way (a staged file that was
#: published or swept): each attempt drops the files found gone.
_READ_ATTEMPTS = 3


@dataclass(frozen=True)
class LakeFile:
    """A data file of the table as a reader sees it.

    Format 3 (epoch mode): ``version`` is the version that added the file, ``writer`` and
    ``batch`` the writer and batch of that append; ``epoch`` is the batch; compaction output
    has neither (None), nor a ``partition``. Files that are not committed have none of them
    unless their name says.
    """

    name: str  # relative to the table root; for staged data, the name it would publish as
    path: str  # full path / URL
    partition: int | None
    epoch: int | None
    state: FileState
    size: int | None
    rows: int | None = None  # known from the log in epoch mode
    version: int | None = None
    writer: str | None = None
    batch: int | None = None


@dataclass(frozen=True)
class SkippedFile:
    """A file a read left out, and why."""

    path: str
    state: FileState
    reason: str


class SkippedFilesWarning(UserWarning):
    """A read skipped unreadable files; ``.skipped`` lists them."""

    def __init__(self, skipped: Sequence[SkippedFile]) -> None:
        self.skipped = list(skipped)
        names = ", ".join(f"{s.path} ({s.state})" for s in self.skipped[:5])
        more = f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        super().__init__(f"skipped {len(self.skipped)} unreadable file(s): {names}{more}")


@dataclass(frozen=True)
class ReadResult:
    """What a read returned and what it had to skip."""

    table: pa.Table
    skipped: list[SkippedFile]


@dataclass(frozen=True)
class _Pick:
    """One end of what a ``Lake`` selects: a version (format 3) or an epoch (epoch mode)."""

    by: Literal["version", "epoch"]
    value: int

    def __str__(self) -> str:
        return f"{self.by}={self.value}"


def _pick(what: str, version: int | None, epoch: int | None, *, lowest: int) -> _Pick | None:
    """The one of ``version``/``epoch`` given (None when neither), checked to be an integer."""
    given = [_Pick(by, value) for by, value in (("version", version), ("epoch", epoch)) if value is not None]  # type: ignore[arg-type]
    if len(given) > 1:
        raise ValueError(f"{what}: version={version!r} and epoch={epoch!r}: select by one of them")
    if not given:
        return None
    value = given[0].value
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ValueError(f"{what}: {given[0].by} must be an integer >= {lowest}, got {value!r}")
    return given[0]


@dataclass(frozen=True)
class Changes:
    """What :meth:`Lake.changes` read: the rows, and the version it read up to (the
    ``since_version`` of the next call)."""

    table: pa.Table
    version: int


class Lake:
    """A lakesink table at ``path`` (local path, ``file://``, ``s3://`` or ``hdfs://``), and which
    of its committed data this object reads: the newest snapshot; with ``version=`` (format 3)
    or ``epoch=`` (epoch mode) the table as it was then (time travel, as ``DeltaTable(path,
    version=)``). ``at()`` and ``since()`` give other selections of the same lake without
    opening it again.

    Raises TableNotFoundError when nothing is at ``path`` and NotALakeError when the path
    holds no lakesink table (or is a file).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        *,
        version: int | None = None,
        epoch: int | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._storage: Storage = open_storage(self.path, storage_options)
        self.metadata = read_table_metadata(self._storage)  # the errors name the path
        self._fs, self._base = self._storage.arrow_filesystem()
        #: Format-3 epoch-mode lakes: the pinned snapshot of the versioned log.
        self._v3: LogView | None = None
        self._log: EpochLog | None = None
        if self.metadata.has_log:
            self._v3 = LogView(self._storage, self.metadata, _where(self._storage))
        elif self.metadata.mode == "epoch":
            self._log = EpochLog(self._storage)
        #: What this object selects (``at``, ``since``): None -- the newest snapshot, every row.
        self._at: _Pick | None = None
        self._since: _Pick | None = None
        if (at := _pick("Lake()", version, epoch, lowest=0)) is not None:
            self._at = self._checked(at, "Lake()")

    def __repr__(self) -> str:
        selected = "".join(
            f", {word}{pick}" for word, pick in (("", self._at), ("since ", self._since)) if pick
        )
        return f"Lake({self.path!r}, mode={self.metadata.mode!r}{selected})"

    # What this object reads -----------------------------------------------------------------

    def at(self, *, version: int | None = None, epoch: int | None = None) -> Lake:
        """This lake as of ``version`` (format 3) or ``epoch`` (epoch mode): time travel. The
        same lake, not opened again; ``at()`` with neither is the newest snapshot again."""
        other = self._copy()
        at = _pick("Lake.at()", version, epoch, lowest=0)
        other._at = None if at is None else self._checked(at, "Lake.at()")
        return other

    def since(self, *, version: int | None = None, epoch: int | None = None) -> Lake:
        """Only the rows that appends added after ``version`` (format 3) or ``epoch`` (epoch
        mode), up to this object's snapshot: an incremental read (``-1``: from the first). A
        compaction rewrites rows and adds none, so it is no change; nor is a vacuum."""
        other = self._copy()
        since = _pick("Lake.since()", version, epoch, lowest=-1)
        other._since = None if since is None else self._checked(since, "Lake.since()")
        return other

    def _copy(self) -> Lake:
        other = copy.copy(self)
        if self._v3 is not None:
            other._v3 = copy.copy(self._v3)  # its own snapshot: refresh() moves one object only
        return other

    def _checked(self, pick: _Pick, what: str) -> _Pick:
        if pick.by == "version":
            self._view(f"{what} with {pick}")
        elif self._v3 is None and self._log is None:
            # Selecting the files by the epoch in their names would look like time travel but
            # is not: nothing says that every partition of an epoch is there.
            raise ValueError(
                f"{what} with {pick} selects committed epochs, but {self.path} is a foreach-mode lake, "
                "which has no epoch log: each (partition, epoch) file commits on its own, so no record "
                "says which files make up an epoch (Lake.epochs() is empty). Read it without an epoch, "
                'or write the stream in epoch mode (lakesink.write_stream or format("lakesink")), whose '
                "lakes can be read as of an epoch"
            )
        return pick

    @property
    def schema(self) -> pa.Schema:
        """The lake's schema: a format-3 lake's as its newest version (of the pinned snapshot) has
        it -- table.json's, or the last one a commit recorded (schema evolution). Reads of any
        version return it: files written before a column was added read it as nulls."""
        if self._v3 is not None:
            return self._v3.schema(self.metadata.schema)
        return self.metadata.schema

    def _data_schema(self) -> pa.Schema:
        """The columns data files hold: the schema without the partition columns."""
        columns = self.metadata.partition_columns
        return pa.schema([f for f in self.schema if f.name not in columns])

    @property
    def mode(self) -> str:
        return self.metadata.mode

    # The versioned log (format 3) -----------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The version this object reads (format-3 epoch-mode lakes; -1 before the first commit):
        the newest of its snapshot, or the one it was pinned at. None for other lakes, which have
        no versioned log."""
        if self._v3 is None:
            return None
        if self._at is None:
            return self._v3.version
        return self._at.value if self._at.by == "version" else self._epoch_version(self._at.value)

    def _epoch_version(self, epoch: int) -> int:
        """The version of a format-3 lake's ``epoch`` (the append of that batch of its lineage)."""
        view = self._view(f"epoch={epoch}")
        lineage = view.epochs(f"epoch={epoch}")
        at = [h.version for e, h in lineage if e == epoch]
        if not at:
            newest = lineage[-1][0] if lineage else None
            if newest is None or epoch > newest:
                self._check_as_of(epoch, newest)
            raise VersionNotRetainedError(
                f"epoch={epoch} is below the retained range of {self.path}: its epochs "
                f"are {lineage[0][0]}..{newest} (versions {view.oldest()}..{view.version})"
            )
        return at[0]

    def refresh(self) -> None:
        """Move a format-3 lake's snapshot to the newest version (other lakes: nothing to do). A
        lake pinned by ``version=``/``epoch=`` refuses: ``at()`` returns it unpinned."""
        if self._at is not None:
            raise ValueError(f"{self!r} is pinned at {self._at}: lake.at() is the same lake, unpinned")
        if self._v3 is not None:
            self._v3.refresh()

    def _view(self, what: str) -> LogView:
        if self._v3 is None:
            raise ValueError(
                f"{what} needs a versioned log, which {self.path} has not: it is a format-"
                f"{self.metadata.format_version} {self.metadata.mode}-mode lake"
                + (" (its history is in epochs: Lake.epochs())" if self._log is not None else "")
            )
        return self._v3

    def versions(self) -> list[VersionInfo]:
        """The retained versions of a format-3 lake, oldest first (from commit headers)."""
        return self._view("Lake.versions()").versions()

    def history(self, limit: int | None = None) -> list[VersionInfo]:
        """What happened to a format-3 lake, newest first: one entry per retained version -- when,
        the operation (:attr:`VersionInfo.operation`: append, continuation, schema change,
        compaction, abandon, vacuum, upgrade), the writer and its batch, the files, rows and bytes
        added and removed. ``limit``: the newest ``limit`` versions only. Up to this object's
        version (``refresh()`` for newer ones; a pinned lake's history ends at its pin);
        ``lakesink history`` prints it."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be a number of versions >= 0 (or None), got {limit!r}")
        view = self._view("Lake.history()")
        last = self.version
        assert last is not None
        return view.history(last, limit)

    def writers(self) -> list[WriterState]:
        """The writers (streaming queries) of a format-3 lake, in the order they first committed."""
        return self._view("Lake.writers()").writers()

    def offsets(self, writer: str | None = None) -> Any:
        """The source offsets of the end of ``writer``'s last batch (one entry per source, Spark's
        offset JSON; None when unknown). ``writer``: an id or 16-hex tag; None: the lake's one
        writer that is not retired (ValueError naming them when there are several)."""
        return self._view("Lake.offsets()").offsets(writer)

    # Which files --------------------------------------------------------------------------

    def epochs(self) -> list[EpochInfo]:
        """The committed epochs of an epoch-mode table, oldest first.

        Empty in foreach mode, which has no epoch log (and so refuses a selection by epoch).
        A format-3 lake has epochs when one writer lineage wrote it (ValueError naming its
        writers otherwise): the appends of that lineage.
        """
        if self._v3 is not None:
            return [
                EpochInfo(
                    epoch,
                    h.committed_at,
                    h.counts.add_files,
                    h.counts.add_rows,
                    h.counts.add_bytes,
                    h.source_offsets,
                )
                for epoch, h in self._v3.epochs("Lake.epochs()")
            ]
        return self._log.epochs() if self._log is not None else []

    def files(self, isolation: Isolation = "read_committed") -> list[LakeFile]:
        """The data files this object selects, visible at ``isolation``, ordered by (epoch,
        partition, name) -- format 3: by (version, partition, name). A selection by version or
        epoch (``at``, ``since``) is of committed data: ``read_committed`` only."""
        if isolation not in ("read_committed", "read_all"):
            raise ValueError(f"isolation must be 'read_committed' or 'read_all', got {isolation!r}")
        if (self._at or self._since) and isolation != "read_committed":
            raise ValueError(
                f"{self!r} selects committed data by version or epoch: use isolation='read_committed'"
            )
        as_of_epoch = as_of_version = None
        epochs = versions = None
        if self._since is None:
            if self._at is not None and self._at.by == "epoch":
                as_of_epoch = self._at.value
            elif self._at is not None:
                as_of_version = self._at.value
        else:
            span = self._span()
            if span is None:
                return []
            versions, epochs = (span, None) if self._since.by == "version" else (None, span)
        if self._v3 is not None:
            return self._v3_files(isolation, as_of_epoch, epochs, as_of_version, versions)
        # Epoch-mode read_committed needs no listing of the table root: the log names the files.
        listing = self._listing() if self._log is None or isolation == "read_all" else []
        listed = [
            (e.name, e.size, p)
            for e in listing
            if (p := parse_data_file(e.name.rpartition("/")[2])) is not None
        ]
        if self._log is not None:
            records = self._log.records(as_of_epoch=as_of_epoch, epochs=epochs)
            if as_of_epoch is not None:
                self._check_as_of(as_of_epoch, records[-1].epoch if records else None)
            found = [
                LakeFile(c.name, self._path(c.name), c.partition, c.epoch, "committed", c.size, c.rows)
                for r in records
                for c in r.files
            ]
        else:
            found = [
                LakeFile(name, self._path(name), p.partition, p.epoch, "committed", size)
                for name, size, p in listed
                if p.state == "published"
            ]
        if isolation == "read_all":
            # Everything else: files published by an epoch with no record (epoch mode), and
            # staged data (a selection by epoch is refused above, so ``found`` is complete).
            committed = {f.name for f in found}
            listed_names = {n for n, _, _ in listed}
            found += [
                LakeFile(n, self._path(n), p.partition, p.epoch, p.state, size)
                for n, size, p in listed
                if n not in committed and not (p.state == "staged" and _final_of(n, p) in listed_names)
            ]
            for staged in self._staged():
                parsed = parse_data_file(staged.name.rpartition("/")[2])
                # A staged file whose final name the listing shows too is the same attempt's file
                # mid-publish (a local publish is a link, then the unlink of the staged name):
                # read once, as published.
                published = staged.handle in listed_names or staged.name in listed_names
                if parsed is not None and not published:
                    found.append(
                        LakeFile(staged.name, self._path(staged.handle or staged.name), parsed.partition,
                                 parsed.epoch, "staged", staged.size)
                    )  # fmt: skip
        found.sort(key=lambda f: (f.epoch or 0, f.partition or 0, f.name))
        return found

    def _span(self) -> tuple[int, int] | None:
        """The (first, last) versions or epochs a ``since`` selection reads; None when empty."""
        since = self._since
        assert since is not None
        if self._at is not None and self._at.by != since.by:
            raise ValueError(
                f"{self!r}: since {since} reads up to a pinned {since.by}; "
                f"pin it by {since.by} (at({since.by}=))"
            )
        first = since.value + 1
        if since.by == "epoch":
            last = self._at.value if self._at is not None else 1 << 62  # every epoch there is
        else:
            view = self._view(f"Lake.since({since})")
            last = self._at.value if self._at is not None else view.version
            if first <= last and first < (oldest := view.oldest()):
                raise VersionNotRetainedError(
                    f"since {since}: the appends after it are not all retained by {self.path} (vacuum "
                    f"kept versions {oldest}..{view.version}); read the lake as it is (Lake(path), or "
                    "changes(since_version=None)) and follow it from the version that returns"
                )
        if self._at is not None and first > last + 1:
            raise ValueError(f"{self!r}: since {since} is after the pinned {self._at}")
        return (first, last) if first <= last else None

    def _v3_files(
        self,
        isolation: Isolation,
        as_of_epoch: int | None,
        epochs: tuple[int, int] | None,
        as_of_version: int | None,
        versions: tuple[int, int] | None,
    ) -> list[LakeFile]:
        view = self._v3
        assert view is not None
        if epochs is not None or versions is not None:
            if epochs is not None:
                lineage = view.epochs(f"{self!r}")
                picked = [h.version for e, h in lineage if epochs[0] <= e <= epochs[1]]
                commits = view.commits(picked)
            else:
                assert versions is not None
                commits = view.added_by_appends(versions[0], versions[1])
            found = [
                LakeFile(a.path, self._path(a.path), a.partition, a.batch, "committed", a.size, a.rows,
                         c.version, c.header.writer.id if c.header.writer else None, a.batch)
                for c in commits
                for a in c.adds
            ]  # fmt: skip
        else:
            if as_of_epoch is not None:
                as_of_version = self._epoch_version(as_of_epoch)
            version = view.version if as_of_version is None else as_of_version
            empty = version < 0 and as_of_version is None  # nothing committed yet
            found = [] if empty else self._from_list(view.live_files(version))
        if isolation == "read_all":
            committed = {f.name for f in found}
            for entry in self._listing():
                name = entry.name
                if name in committed or not name.endswith(DATA_SUFFIX) or name.startswith((".", "_")):
                    continue
                parsed = parse_data_file(name.rpartition("/")[2])
                found.append(
                    LakeFile(name, self._path(name), parsed.partition if parsed else None,
                             parsed.epoch if parsed else None, "published", entry.size)
                )  # fmt: skip
            listed = {f.name for f in found}
            for staged in self._staged():
                # Mid-publish (its final name listed too): the same attempt's file, read once.
                if staged.handle in listed or staged.name in listed or not staged.name.endswith(DATA_SUFFIX):
                    continue
                parsed = parse_data_file(staged.name.rpartition("/")[2])
                found.append(
                    LakeFile(staged.name, self._path(staged.handle or staged.name),
                             parsed.partition if parsed else None, parsed.epoch if parsed else None,
                             "staged", staged.size)
                )  # fmt: skip
        found.sort(key=_v3_order)
        return found

    def _folders(self) -> list[str]:
        """The folders ``read_all`` looks in: the root, and a partitioned lake's partition folders."""
        return ["", *partition_folders(self._storage, self.metadata.partition_columns)]

    def _listing(self) -> list[StoredFile]:
        return [e for folder in self._folders() for e in self._storage.list(folder)]

    def _staged(self) -> list[StagedEntry]:
        return [e for folder in self._folders() for e in self._storage.staged(folder)]

    def _from_list(self, table: pa.Table) -> list[LakeFile]:
        cols = table.select(["path", "bytes", "rows", "added_version", "writer", "batch", "partition"])
        found = []
        for row in cols.to_pylist():
            name = row["path"]
            found.append(
                LakeFile(name, self._path(name), row["partition"], row["batch"], "committed", row["bytes"],
                         row["rows"], row["added_version"], row["writer"], row["batch"])
            )  # fmt: skip
        return found

    def _check_as_of(self, epoch: int, newest: int | None) -> None:
        if newest is None or epoch > newest:
            raise ValueError(
                f"epoch={epoch} is beyond the newest committed epoch of {self.path} "
                f"({newest if newest is not None else 'none: nothing is committed yet'})"
            )

    def _path(self, name: str) -> str:
        return f"{self._storage.url.rstrip('/')}/{name}"

    def _relative(self, f: LakeFile) -> str:
        """The name ``f`` is stored under (a staged file's own, not the one it would publish as)."""
        return f.path[len(self._storage.url.rstrip("/")) + 1 :]

    def _arrow_path(self, f: LakeFile) -> str:
        return f"{self._base.rstrip('/')}/{self._relative(f)}"

    # Reading ------------------------------------------------------------------------------

    def dataset(self, isolation: Isolation = "read_committed") -> ds.Dataset:
        """A ``pyarrow.dataset.Dataset`` over the visible files this object selects (DuckDB and
        polars read it).

        Files that are not committed are checked first, and left out (and reported in a
        :class:`SkippedFilesWarning`) when they cannot be read.
        """
        files = self.files(isolation)
        readable, skipped = self._readable(files)
        if skipped:
            warnings.warn(SkippedFilesWarning(skipped), stacklevel=2)
        return self._dataset_of(readable)

    def _dataset_of(self, files: Sequence[LakeFile]) -> ds.Dataset:
        names = [self._relative(f) for f in files]
        return dataset_of(self._storage, self.schema, self.metadata.partition_columns, names)

    def _readable(self, files: Sequence[LakeFile]) -> tuple[list[LakeFile], list[SkippedFile]]:
        """Committed files, plus the other files whose footer and schema are fine."""
        readable: list[LakeFile] = []
        skipped: list[SkippedFile] = []
        for f in files:
            reason = None if f.state == "committed" else self._problem(f, deep=False)
            if reason is None:
                readable.append(f)
            else:
                skipped.append(SkippedFile(f.path, f.state, reason))
        return readable, skipped

    def _problem(self, f: LakeFile, *, deep: bool) -> str | None:
        """Why ``f`` cannot be read, or None. ``deep`` reads every page, not only the footer."""
        if f.state == "staged" and not f.path.endswith(".uncommitted"):
            return "multipart upload in flight: not readable until it is completed"
        name = self._relative(f)
        try:
            # bounded as a read is (lakesink_reader.datafiles): footer, then what it decodes to
            read = open_read(self._storage, self.schema, self.metadata.partition_columns, [name])
            meta = read.files[0].fragment.metadata
            if deep:
                for _ in read.batches():
                    pass
        except FileNotFoundError:
            if f.state == "committed":
                return "missing: the lake commits it, but it is not in storage"
            return "gone since it was listed (published or removed meanwhile)"
        except (OSError, pa.ArrowException, UnicodeDecodeError, CorruptFileError) as exc:
            said = one_line(exc)
            if f.state == "committed":
                return f"corrupt: {said}"
            return f"not a complete Parquet file (still being written, or truncated by a crash): {said}"
        if fit_problems(meta.schema.to_arrow_schema(), self._data_schema()):
            return "schema differs from the table's"
        if self.metadata.partition_columns:
            try:
                partition_texts(f.name, self.metadata.partition_columns)
            except ValueError as exc:
                return f"not in the lake's partition folders: {exc}"
        return None

    def read(
        self,
        isolation: Isolation = "read_committed",
        *,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
        on_error: OnError | None = None,
    ) -> ReadResult:
        """Read the visible data this object selects, and say which files were skipped.

        ``on_error``: what an unreadable *committed* file does -- ``"raise"`` a
        CorruptFileError naming it (the default of ``read_committed``), or ``"skip"`` it and
        report it (the default of ``read_all``). Unreadable files that are not committed are
        always skipped and reported.
        """
        if on_error is None:
            on_error = "raise" if isolation == "read_committed" else "skip"
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        _check_columns(columns, self.schema)
        files, skipped = self._readable(self.files(isolation))
        projection = list(columns) if columns is not None else None
        for _ in range(_READ_ATTEMPTS):
            try:
                return ReadResult(self._bounded_read(files, projection, filter, on_error, skipped), skipped)
            except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
                left_out = {s.path for s in skipped}  # reported by the bounded read already
                files = [f for f in files if f.path not in left_out]
                bad = [(f, reason) for f in files if (reason := self._problem(f, deep=True)) is not None]
                if not bad:
                    raise
                for f, reason in bad:
                    if f.state == "committed" and on_error == "raise":
                        vacuumed = self._vacuumed_meanwhile()
                        if vacuumed is not None:
                            raise vacuumed from exc
                        raise CorruptFileError(f"committed file {f.path!r} is {reason}") from exc
                skipped += [SkippedFile(f.path, f.state, reason) for f, reason in bad]
                gone = {f.path for f, _ in bad}
                files = [f for f in files if f.path not in gone]
        return ReadResult(self._bounded_read(files, projection, filter, on_error, skipped), skipped)

    def _bounded_read(
        self,
        files: Sequence[LakeFile],
        columns: Sequence[str] | None,
        filter: ds.Expression | None,
        on_error: OnError,
        skipped: list[SkippedFile],
    ) -> pa.Table:
        """The rows of ``files``, read within what their footers and sizes allow
        (``lakesink_reader.datafiles``): a file that does not fit is left out and reported in
        ``skipped``, unless it is committed and ``on_error`` is ``"raise"`` (DataFileError)."""
        by_name = {self._relative(f): f for f in files}
        left = list(by_name)
        partition_columns = self.metadata.partition_columns
        read = None  # the files' footers, read once: a file left out leaves the others' read
        while True:
            try:
                if read is None:
                    read = open_read(self._storage, self.schema, partition_columns, left, columns, filter)
                return read.table()
            except DataFileError as exc:
                f = by_name[exc.name]
                said = one_line(exc)
                if isinstance(exc, DecodeBudgetError):
                    reason = f"past the read's budget: {said}"
                elif f.state == "committed":
                    reason = f"corrupt: {said}"
                else:
                    reason = (
                        f"not a complete Parquet file (still being written, or truncated by a crash): {said}"
                    )
                if f.state == "committed" and on_error == "raise":
                    raise type(exc)(f"committed file {f.path!r} is {reason}", exc.name) from exc
                skipped.append(SkippedFile(f.path, f.state, reason))
                left.remove(exc.name)
                read = None if read is None else read.without(exc.name)

    def _vacuumed_meanwhile(self) -> VersionNotRetainedError | None:
        """The error for a read whose committed files went because vacuum gave its version up
        after this object pinned it (the read straddled a vacuum), rather than a damaged lake;
        None when the lake still retains the version (the files' own error stands)."""
        version = self.version
        if self._v3 is None or version is None:
            return None
        try:
            retained_from = self._v3.log.open().retained_from
        except (OSError, LakeSinkError):
            return None  # the log cannot tell: the file's own error stands
        if version >= retained_from:
            return None
        return vacuumed_while_read(version, self.path, f"retained versions now run from {retained_from}")

    def changes(
        self,
        since_version: int | None = None,
        *,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
    ) -> Changes:
        """The rows the lake's appends added after ``since_version``, up to this object's
        version, and that version: a job that follows a lake remembers one integer and asks again
        (``refresh()`` first to see new versions). ``since_version=None``: the lake as it is
        (every committed row). ``lake.since(version=v).to_table()`` reads the same rows; this is
        the follower's form of it. Format-3 epoch-mode lakes; ValueError naming the retained
        versions when ``since_version`` is below them (vacuumed: those versions' appends are gone).
        """
        self._view("Lake.changes()")
        latest = self.version
        assert latest is not None
        if since_version is None:
            return Changes(self.read(columns=columns, filter=filter).table, latest)
        if isinstance(since_version, bool) or not isinstance(since_version, int) or since_version < -1:
            raise ValueError(f"since_version must be a version >= -1 (or None), got {since_version!r}")
        since = self.since(version=since_version)
        if since_version >= latest:
            _check_columns(columns, self.schema)
            schema = self.schema if columns is None else pa.schema([self.schema.field(c) for c in columns])
            return Changes(schema.empty_table(), latest)
        return Changes(since.read(columns=columns, filter=filter).table, latest)

    def to_table(
        self,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
        *,
        isolation: Isolation = "read_committed",
        on_error: OnError | None = None,
    ) -> pa.Table:
        """The data this object selects as a pyarrow Table (skipped files: a warning)."""
        result = self.read(isolation, columns=columns, filter=filter, on_error=on_error)
        if result.skipped:
            warnings.warn(SkippedFilesWarning(result.skipped), stacklevel=2)
        return result.table

    def to_pandas(
        self,
        columns: Sequence[str] | None = None,
        filter: ds.Expression | None = None,
        *,
        isolation: Isolation = "read_committed",
        on_error: OnError | None = None,
    ) -> pandas.DataFrame:
        """The data as a pandas DataFrame (needs pandas: ``pip install 'lakesink[pandas]'``)."""
        try:
            import pandas  # noqa: F401 - pyarrow's to_pandas needs it; fail with the extra's name
        except ImportError as exc:
            raise missing_extra("pandas", "Lake.to_pandas") from exc
        return self.to_table(columns, filter, isolation=isolation, on_error=on_error).to_pandas()


def _v3_order(f: LakeFile) -> tuple[int, int, str]:
    return (-1 if f.version is None else f.version, -1 if f.partition is None else f.partition, f.name)


def _where(storage: Storage) -> str:
    return f"{storage.url.rstrip('/')}/{TABLE_FILE}"


def _check_columns(columns: Sequence[str] | None, schema: pa.Schema) -> None:
    if columns is None:
        return
    if isinstance(columns, str):
        raise TypeError(f"columns must be a list of names, got the string {columns!r}")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise KeyError(f"unknown column(s) {unknown}; the table has {schema.names}")


def read_committed(
    path: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    filter: ds.Expression | None = None,
    storage_options: Mapping[str, Any] | None = None,
    version: int | None = None,
    epoch: int | None = None,
    on_error: OnError = "raise",
) -> pa.Table:
    """Exactly the committed data of the lake at ``path``, each committed file once.

    ``filter`` is a ``pyarrow.compute`` expression, pushed down to row groups; ``columns``
    projects. ``version=v`` reads a format-3 lake as of version v, ``epoch=N`` an epoch-mode
    lake as of epoch N (a foreach-mode lake has no epoch log, and refuses it with a
    ValueError): ``Lake(path, version=v).to_table()``. Incremental reads: ``Lake.since``.
    ``on_error="skip"`` reads around committed files that are missing or damaged, reporting
    them in a :class:`SkippedFilesWarning` (``lakesink verify`` lists them too).
    """
    lake = Lake(path, storage_options, version=version, epoch=epoch)
    return lake.to_table(columns, filter, on_error=on_error)


def _final_of(name: str, parsed: DataFileName) -> str:
    """The published name (folder included) of the staged file ``name``: a listing that shows
    both is of the same attempt's file mid-publish (a local publish is a link, then the unlink
    of the staged name), read once, as published."""
    folder = name.rpartition("/")[0]
    return f"{folder}/{parsed.final_name}" if folder else parsed.final_name


def read_all(
    path: str | os.PathLike[str],
    *,
    columns: Sequence[str] | None = None,
    filter: ds.Expression | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> pa.Table:
    """Everything in the lake, staged and published files included; unreadable files are skipped.

    Skipped files are reported by a :class:`SkippedFilesWarning` whose ``skipped`` attribute
    lists them (``Lake(path).read("read_all")`` returns the list directly).
    """
    lake = Lake(path, storage_options)
    return lake.to_table(columns, filter, isolation="read_all")
