"""``spark.readStream.format("lakesink").load(path)``: a lake as a streaming source, so that the
next job (a cleaned lake, aggregates) follows it exactly once (issue 34; design and what is left:
docs/design/streaming-source.md).

The source's offset is a position in the lake's versions: ``{"version": v, "index": i}`` --
every file of the versions before ``v`` is read, and the first ``i`` files of version ``v``.
A version's files are those its append commit added (in the log's order: version, partition,
name): a compaction's outputs and a vacuum are no new data, and a continuation or an upgrade
adds none, so they are skipped. A query that starts without ``startingVersion`` first reads the
lake as it is at its oldest retained version (the live files there, compaction outputs
included: ``"snapshot": true`` in the offset), then each later version's appends. A limit
(``maxFilesPerTrigger``, ``maxBytesPerTrigger``) can end a micro-batch inside a version; Spark
keeps the offsets in its checkpoint, so a restarted query reads each file once.

A stream stopped for longer than the lake's retention may need a version vacuum removed (its
commit, which says what the version added, is gone). Its rows are still in the lake, and while no
compaction rewrote them they are still in the files that version added: the live file list of
the oldest retained version says, of each file, the version that added it. The stream then reads
on from there, exactly once (``_past_vacuum``). Once a compaction committed after the stream's
position, its output mixes rows the stream read with rows it did not, and the stream stops naming
the two ways back (every row once into a new lake, or the vacuumed versions' rows skipped).

The driver decides which files a micro-batch reads; its tasks read them with pyarrow
(``lakesink_reader.datafiles.open_read``, as the batch read's tasks do) and hand Spark Arrow batches.
With ``filesOnly`` the stream's rows are those files instead, one row each (:data:`FILES_SCHEMA`):
the same offsets, the same files per micro-batch, for a ``foreachBatch`` that reads them with
Spark's own Parquet scan (``lakesink.spark.follow``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from lakesink.spark.reading import FilesPartition, lake_location, option_millis, task_partitions
from lakesink_reader.errors import VersionNotRetainedError
from lakesink_reader.storage import open_storage

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink_reader.lake import Lake

#: The options of a streaming read (lower case, as Spark passes them), named as Delta's users know them.
STREAM_OPTIONS = (
    "path",
    "storage_options",
    "startingversion",
    "startingtimestamp",
    "maxfilespertrigger",
    "maxbytespertrigger",
    "filesonly",
)
#: Options only a streaming read takes: their presence tells a stream's ``schema()`` call apart.
STREAM_ONLY = STREAM_OPTIONS[2:]
#: Files per micro-batch when no limit is given (Delta's default).
DEFAULT_MAX_FILES = 1000
#: Versions whose commits one look at the log reads (a limit usually stops it earlier).
VERSIONS_PER_LOOK = 100
#: A ``filesOnly`` stream's rows: one per file, in the order the stream reads them -- its name
#: (relative to the lake's root), the version that added it, its bytes and rows (-1: unknown).
FILES_SCHEMA = "name string, version long, size long, rows long"


@dataclass(frozen=True)
class StreamOptions:
    """A streaming read's options, parsed: where it starts and how much a micro-batch reads."""

    path: str
    storage_options: Mapping[str, Any]
    starting_version: int | str | None  # a version, "latest", or None: the whole lake first
    starting_timestamp: str | None
    max_files: int
    max_bytes: int | None
    files_only: bool = False


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    """Parse a streaming read's options; errors name the option and the way out."""
    opts = {k.lower(): v for k, v in options.items()}
    batch_only = sorted({"versionasof", "timestampasof"} & set(opts))
    if batch_only:
        raise ValueError(
            f"{batch_only} select a version for spark.read (a batch read); a stream starts with "
            "startingVersion or startingTimestamp"
        )
    unknown = sorted(set(opts) - set(STREAM_OPTIONS))
    if unknown:
        raise ValueError(
            f'unknown option(s) {unknown} for spark.readStream.format("lakesink"); its options: '
            "['path', 'storage_options', 'startingVersion', 'startingTimestamp', 'maxFilesPerTrigger', "
            "'maxBytesPerTrigger', 'filesOnly']"
        )
    path, storage_options = lake_location(opts, 'spark.readStream.format("lakesink")')
    if "startingversion" in opts and "startingtimestamp" in opts:
        raise ValueError("startingVersion and startingTimestamp say the same thing: give one of them")
    starting: int | str | None = None
    if "startingversion" in opts:
        text = opts["startingversion"].strip()
        starting = "latest" if text.lower() == "latest" else _count("startingVersion", text, 0)
    max_files = DEFAULT_MAX_FILES
    if "maxfilespertrigger" in opts:
        max_files = _count("maxFilesPerTrigger", opts["maxfilespertrigger"], 1)
    max_bytes = None
    if "maxbytespertrigger" in opts:
        max_bytes = _count("maxBytesPerTrigger", opts["maxbytespertrigger"], 1)
    files_only = opts.get("filesonly", "false").strip().lower()
    if files_only not in ("true", "false"):
        raise ValueError(f"filesOnly must be true or false, got {opts['filesonly']!r}")
    return StreamOptions(
        path,
        storage_options,
        starting,
        opts.get("startingtimestamp"),
        max_files,
        max_bytes,
        files_only == "true",
    )


def _count(name: str, text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {text!r}")
    return value


@dataclass(frozen=True)
class Position:
    """Where a stream is: the files of versions before ``version`` read, and the first ``index``
    files of ``version`` (its live files when ``snapshot``: the stream's first version)."""

    version: int
    index: int = 0
    snapshot: bool = False

    def to_offset(self) -> dict[str, Any]:
        offset: dict[str, Any] = {"version": self.version, "index": self.index}
        if self.snapshot:
            offset["snapshot"] = True
        return offset

    @classmethod
    def of(cls, offset: Mapping[str, Any]) -> Position:
        try:
            return cls(
                int(offset["version"]), int(offset.get("index", 0)), bool(offset.get("snapshot", False))
            )
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"not an offset of a lakesink stream: {offset!r} (a checkpoint of another source? "
                "start the query with a new checkpoint location)"
            ) from None


class LakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """The driver's side of a lake stream: offsets and the files between two of them; the tasks
    read the files (:meth:`read`)."""

    def __init__(self, options: StreamOptions, schema: pa.Schema, partition_columns: tuple[str, ...]) -> None:
        self.options = options
        self.schema = schema  # the query's: fixed when it started
        self.partition_columns = partition_columns  # table.json's: the tasks take them from here
        self._lake: Lake | None = None
        self._target: int | None = None  # availableNow: the newest version when the query started
        self._floor: int | None = None  # the oldest retained version, once a vacuum was met

    # The lake ------------------------------------------------------------------------------

    def _opened(self) -> Lake:
        # Here, not at the top: the reader's Lake loads pyarrow; the data source's module imports this one.
        from lakesink_reader.lake import Lake

        if self._lake is None:
            self._lake = Lake(self.options.path, self.options.storage_options)
            if not self._lake.metadata.has_log:
                raise ValueError(
                    f"a stream reads a lake's versions, and {self.options.path} has none: it is a format-"
                    f"{self._lake.metadata.format_version} {self._lake.mode}-mode lake"
                    + (
                        f" (convert it with `lakesink upgrade {self.options.path}`)"
                        if self._lake.mode == "epoch"
                        else ""
                    )
                )
        else:
            self._lake.refresh()
        return self._lake

    def _newest(self, lake: Lake) -> int:
        newest = lake.version if lake.version is not None else -1
        return newest if self._target is None else min(newest, self._target)

    # Offsets -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        lake = self._opened()
        newest = lake.version if lake.version is not None else -1
        starting = self.options.starting_version
        if starting == "latest":
            return Position(newest + 1).to_offset()
        if isinstance(starting, int):
            return Position(starting).to_offset()
        if self.options.starting_timestamp is not None:
            return Position(_version_from(lake, self.options.starting_timestamp)).to_offset()
        if newest < 0:
            return Position(0).to_offset()  # nothing committed yet: from the first version on
        # The lake as it is at its oldest retained version (an upgrade's imported files, or what
        # compaction made of vacuumed versions' rows), then each later version's appends.
        return Position(lake.versions()[0].version, 0, snapshot=True).to_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        lake = self._opened()
        self._target = lake.version if lake.version is not None else -1

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadMaxFiles(self.options.max_files)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        lake = self._opened()
        max_files = max_bytes = None
        if isinstance(limit, ReadMaxFiles):
            max_files = limit.max_files
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        elif not isinstance(limit, ReadAllAvailable):
            raise ValueError(
                f"a lake stream honours maxFilesPerTrigger and maxBytesPerTrigger, not {limit!r}"
            )
        position = Position.of(start)
        self._check_schema(lake, position)
        end, _ = self._walk(lake, position, self._newest(lake), max_files, max_bytes)
        return end.to_offset()

    def _check_schema(self, lake: Lake, position: Position) -> None:
        """Stop the stream when the lake's schema is no longer the one it started with (a writer
        with merge_schema added columns): Spark fixes a stream's columns when it starts."""
        if lake.schema.equals(self.schema):
            return
        ours = {f.name: f for f in self.schema}
        changed = [f.name for f in lake.schema if f.name not in ours or not ours[f.name].equals(f)]
        raise ValueError(
            f"the schema of {self.options.path} changed after version {position.version - 1} (the newest "
            f"is {lake.version}): column(s) {changed} are new or changed, and a stream keeps the columns "
            "it started with. Restart the query: it reads the new schema (a lakesink sink downstream "
            "then needs merge_schema=True to take the new columns)"
        )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        lake = self._lake
        return None if lake is None or lake.version is None else Position(lake.version + 1).to_offset()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        # The lake as latestOffset last saw it, which holds ``end``: no second look at the log.
        lake = self._lake if self._lake is not None else self._opened()
        first, last = Position.of(start), Position.of(end)
        if (last.version, last.index) <= (first.version, first.index):
            return []
        _, files = self._walk(lake, first, last.version, None, None, stop=last)
        if self.options.files_only:
            # One task hands the list back: reading them is the caller's (Spark's scan).
            listed = tuple(
                (
                    f.name,
                    -1 if f.version is None else f.version,
                    f.size or 0,
                    -1 if f.rows is None else f.rows,
                )
                for f in files
            )
            return [FileListPartition(listed)] if listed else []
        return task_partitions([(f.name, f.size or 0) for f in files])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Here, not at the top: pyarrow, as in _opened.
        from lakesink_reader.datafiles import open_read

        if isinstance(partition, FileListPartition):
            yield _file_rows(partition.files)
            return
        assert isinstance(partition, FilesPartition)
        storage = open_storage(self.options.path, self.options.storage_options)
        yield from open_read(storage, self.schema, self.partition_columns, partition.names).batches()

    # Walking the versions ----------------------------------------------------------------------

    def _walk(
        self,
        lake: Lake,
        start: Position,
        newest: int,
        max_files: int | None,
        max_bytes: int | None,
        *,
        stop: Position | None = None,
    ) -> tuple[Position, list[Any]]:
        """From ``start``, the files in order up to version ``newest`` (or up to ``stop``), as
        many as the limits admit (at least one); and the position after them."""
        newest = min(newest, lake.version if lake.version is not None else -1)
        taken: list[Any] = []
        size = 0
        version, index, snapshot = start.version, start.index, start.snapshot
        while version <= newest:
            look = self._files_of(lake, Position(version, index, snapshot), newest)
            for v in sorted(look):
                for i in range(index if v == version else 0, len(look[v])):
                    if stop is not None and (v, i) >= (stop.version, stop.index):
                        return stop, taken
                    f = look[v][i]
                    over_files = max_files is not None and len(taken) >= max_files
                    over_bytes = max_bytes is not None and bool(taken) and size + (f.size or 0) > max_bytes
                    if over_files or over_bytes:
                        return Position(v, i, snapshot and v == version), taken
                    taken.append(f)
                    size += f.size or 0
            version, index, snapshot = max(look) + 1, 0, False
        return (stop if stop is not None else Position(version, index, snapshot)), taken

    def _files_of(self, lake: Lake, position: Position, newest: int) -> dict[int, list[Any]]:
        """Each version's files from ``position.version`` on (a look of at most
        VERSIONS_PER_LOOK versions): its live files for a snapshot, else what its appends added."""
        first = position.version
        last = min(newest, first + VERSIONS_PER_LOOK - 1)
        try:
            if position.snapshot:
                return {first: lake.at(version=first).files()}
            found: dict[int, list[Any]] = {v: [] for v in range(first, last + 1)}
            for f in lake.at(version=last).since(version=first - 1).files():
                assert f.version is not None  # a file an append added: the log says which version
                found[f.version].append(f)
            return found
        except VersionNotRetainedError as exc:
            return self._past_vacuum(lake, position, newest, exc)

    def _past_vacuum(
        self, lake: Lake, position: Position, newest: int, exc: VersionNotRetainedError
    ) -> dict[int, list[Any]]:
        """The files of versions ``position.version``..R-1, which vacuum removed (R: the oldest
        retained version), as the stream would have read them: from R's live files, each of which
        says the version that added it (its order within a version is the same: partition, name).

        Exact while no compaction committed after ``position.version``: files leave the live set
        only through a compaction, and its output (or a later compaction's of it) is live at R,
        added after that version. Such a file mixes rows the stream read with rows it did not:
        refused then, naming the ways back. A compaction *at* that version took only files added
        before it (read already: the stream's first version, read as a snapshot, included them)."""
        first = position.version
        floor = self._floor
        if floor is None or first >= floor:
            floor = lake.versions()[0].version
        try:
            live = lake.at(version=floor).files() if first < floor else []
        except VersionNotRetainedError:  # a vacuum moved the floor since it was looked up
            floor = lake.versions()[0].version
            live = lake.at(version=floor).files() if first < floor else []
        self._floor = floor
        if first >= floor:  # not a version vacuum removed: the error is another's
            raise exc
        added = [(f.version, f) for f in live if f.version is not None]  # every committed file's is set
        compacted = sorted({v for v, f in added if f.batch is None and v > first})
        if compacted:
            raise ValueError(
                f"the stream needs version {first} of {self.options.path}, which vacuum removed (the "
                f"lake keeps versions from {floor} on; `lakesink vacuum --retain`, 7 days by default), and "
                f"the compaction at version {compacted[0]} rewrote files of the versions between, so the "
                "rows the stream has not read cannot be told from those it has. Two ways back "
                "(docs/guide/operating.md, 'A stream behind a vacuum'): every row once -- restart with a "
                "new checkpoint location into a new output lake, without startingVersion (it reads this "
                f"lake as it is at version {floor}, then each later version); or keep the output lake and "
                f"skip the rows of versions {first}..{floor - 1} -- a new checkpoint location with "
                f"startingVersion={floor}, and on a lakesink sink allow_other_queries=True "
                "(continue_writer refuses it: the new query does not start where the old one ended)"
            ) from None
        last = min(newest, floor - 1)
        found: dict[int, list[Any]] = {v: [] for v in range(first, last + 1)}
        for v, f in added:  # sorted by (version, partition, name)
            # The snapshot's files (any, up to its version), or what an append added after it.
            if (position.snapshot and v <= first) or (f.batch is not None and first <= v <= last):
                found[max(v, first)].append(f)
        return found


@dataclass(frozen=True)
class FileListPartition(InputPartition):  # type: ignore[misc]
    """A ``filesOnly`` micro-batch's files: (name, version, size, rows) each, in the stream's order."""

    files: tuple[tuple[str, int, int, int], ...]


def _file_rows(files: Sequence[tuple[str, int, int, int]]) -> pa.RecordBatch:
    """:data:`FILES_SCHEMA`'s rows of ``files``."""
    # Here, not at the top: pyarrow, as in _opened. Built from buffers: pa.array of a list
    # imports pandas in the worker (lakesink_reader.arrays).
    import pyarrow as pa

    from lakesink_reader.arrays import array

    names, versions, sizes, rows = zip(*files, strict=True) if files else ((), (), (), ())
    return pa.record_batch(
        [
            array(names, pa.string()),
            array(versions, pa.int64()),
            array(sizes, pa.int64()),
            array(rows, pa.int64()),
        ],
        names=["name", "version", "size", "rows"],
    )


def _version_from(lake: Lake, text: str) -> int:
    """The first version committed at or after ``text`` (``reading.option_millis``)."""
    millis = option_millis("startingTimestamp", text)
    after = [v.version for v in lake.versions() if int(v.committed_at * 1000) >= millis]
    if after:
        return min(after)
    return (lake.version if lake.version is not None else -1) + 1  # none yet: from the next one
