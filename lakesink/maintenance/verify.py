"""``lakesink verify``: is every committed file of a table there, whole and readable? Read-only.

A lake damaged by something outside the fault model (a file deleted by hand or by a bucket
lifecycle rule, a disk error, a bug in an older lakesink) makes ``read_committed`` fail for the
whole table. This names every committed file that is missing or unreadable, so an operator
can restore it (from a backup, or from a bucket's earlier object version) or decide to read
around it (``read_committed(..., on_error="skip")``). docs/guide/maintenance.md ("lakesink
verify and repairing a lake") says more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lakesink.maintenance.compact import open_v3, stream_live_files
from lakesink.views.delta_view import delta_sync
from lakesink.views.derived import DELTA, ICEBERG, SPARK, view_problems
from lakesink.views.iceberg_layout import has_view
from lakesink.views.spark_metadata_view import spark_sync
from lakesink_reader.datafiles import OneFile, open_file
from lakesink_reader.errors import CorruptFileError, one_line
from lakesink_reader.format.log import CommittedFile, EpochLog
from lakesink_reader.format.partitions import partition_folders
from lakesink_reader.format.schemas import fit_problems, schema_at
from lakesink_reader.format.table import read_table_metadata, schema_differences
from lakesink_reader.names import parse_data_file
from lakesink_reader.storage import Storage, open_storage


@dataclass(frozen=True)
class Problem:
    """A committed file that a reader cannot use."""

    name: str
    epoch: int
    problem: str


@dataclass
class VerifyReport:
    path: str
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: Format-3 epoch lakes: the Delta view checked version by version (None: no view possible).
    #: A view a foreign writer touched is a problem (Delta readers may read other rows).
    delta_view: str | None = None
    delta_view_ok: bool = True
    #: Format-3 epoch lakes: what Spark reads of ``_spark_metadata/`` checked against the lake.
    #: A view a foreign writer touched is a problem (``spark.read`` may read other rows).
    spark_view: str | None = None
    spark_view_ok: bool = True
    #: Format-3 epoch lakes: the Iceberg view's newest snapshot checked against the lake. A view
    #: a foreign writer touched, or one that lists files that are gone, is a problem.
    iceberg_view: str | None = None
    iceberg_view_ok: bool = True
    #: Format-3 epoch lakes: the versions whose files were checked (the latest, or with
    #: ``all_versions`` every retained one); None for lakes without a versioned log.
    versions: tuple[int, int] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and self.delta_view_ok and self.spark_view_ok and self.iceberg_view_ok


def verify(
    path_or_storage: str | Storage,
    *,
    deep: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    all_versions: bool = False,
) -> VerifyReport:
    """Check every committed file: present, of the recorded size, a Parquet file of the table's schema.

    ``deep=True`` also reads every row (catches damaged pages that a footer check misses).
    ``all_versions=True`` (format 3): the files of every retained version, not only the latest's
    (what time travel reads). Raises TableNotFoundError / NotALakeError when there is no table
    at the path.
    """
    storage = (
        open_storage(path_or_storage, storage_options)
        if isinstance(path_or_storage, str)
        else path_or_storage
    )
    metadata = read_table_metadata(storage)
    listing = {entry.name: entry.size for entry in storage.list("")}
    schema, evolves = metadata.schema, False
    versions: tuple[int, int] | None = None
    if metadata.has_log:
        committed, schema, versions = _live_files(storage, metadata.table_id or "")
        if all_versions:
            committed, versions = _retained_files(storage, storage_options, committed, versions)
        evolves = True  # files of an older schema that fits the lake's are the lake's
        # A partitioned lake's files are in their folders: list each folder the log names.
        for folder in sorted({f.name.rpartition("/")[0] for f in committed} - {""}):
            listing.update((entry.name, entry.size) for entry in storage.list(folder))
    elif metadata.mode == "epoch":
        committed = EpochLog(storage).committed_files()
    else:  # foreach, any format: a file is committed by its published name
        for folder in partition_folders(storage, metadata.partition_columns):
            listing.update((entry.name, entry.size) for entry in storage.list(folder))
        committed = [
            CommittedFile(name, parsed.partition, parsed.epoch, -1, size)
            for name, size in listing.items()
            if (parsed := parse_data_file(name.rpartition("/")[2])) is not None
            and parsed.state == "published"
        ]
    report = VerifyReport(storage.url, versions=versions)
    for done, f in enumerate(committed, 1):
        report.checked += 1
        data_schema = pa.schema([c for c in schema if c.name not in metadata.partition_columns])
        try:
            storage.refuse_link(f.name)  # a link is reported, never followed (docs/FORMAT.md, "Trust")
            problem = _check(f, listing, storage, data_schema, deep, evolves)
        except CorruptFileError as exc:
            problem = f"refused: {exc}"
        if problem is not None:
            report.problems.append(Problem(f.name, f.epoch, problem))
        if progress is not None:
            progress(done, len(committed))
    if metadata.has_log:
        view = delta_sync(storage, write=False)
        report.delta_view, report.delta_view_ok = view.summary(), view.state != "foreign"
        spark = spark_sync(storage, write=False)
        report.spark_view, report.spark_view_ok = spark.summary(), spark.state != "foreign"
        if has_view(storage):
            # Here, not at the top: pyiceberg loads only for lakes that have an Iceberg view.
            from lakesink.views.iceberg_view import iceberg_sync

            iceberg = iceberg_sync(storage, write=False)
            report.iceberg_view, report.iceberg_view_ok = iceberg.summary(), iceberg.state != "foreign"
        # A view that lags is read at the version it holds: a failure when that version's files
        # are gone or the lake no longer retains it (issue 32, hole 4).
        retained_from = open_v3(storage, "verify")[1].open().retained_from
        lagging = view_problems(storage, retained_from, lambda name: name in listing or storage.exists(name))
        if DELTA in lagging:
            report.delta_view, report.delta_view_ok = f"{report.delta_view}; {lagging[DELTA]}", False
        if SPARK in lagging:
            report.spark_view, report.spark_view_ok = f"{report.spark_view}; {lagging[SPARK]}", False
        if ICEBERG in lagging:
            report.iceberg_view = f"{report.iceberg_view}; {lagging[ICEBERG]}"
            report.iceberg_view_ok = False
    return report


def _check(
    f: CommittedFile,
    listing: Mapping[str, int],
    storage: Storage,
    schema: pa.Schema,
    deep: bool,
    evolves: bool = False,
) -> str | None:
    if f.name not in listing:
        return "missing: the epoch record lists it, but it is not in storage"
    if f.rows >= 0 and listing[f.name] != f.size:
        return f"size differs: recorded {f.size} bytes, found {listing[f.name]}"
    try:
        # bounded as a reader's read is (lakesink_reader.datafiles): the footer, then the rows
        with open_file(storage, f.name) as opened:
            return _check_opened(f, opened, schema, deep, evolves)
    except (OSError, pa.ArrowException, UnicodeDecodeError, CorruptFileError) as exc:
        return f"unreadable: {one_line(exc)}"


def _check_opened(
    f: CommittedFile, opened: OneFile, schema: pa.Schema, deep: bool, evolves: bool
) -> str | None:
    meta = opened.metadata
    if f.rows >= 0 and meta.num_rows != f.rows:
        return f"row count differs: recorded {f.rows}, the file has {meta.num_rows}"
    found = meta.schema.to_arrow_schema()
    diffs = fit_problems(found, schema) if evolves else schema_differences(schema, found)
    if diffs:
        return "schema differs from the table's: " + "; ".join(diffs)
    if deep:
        for _ in opened.batches():
            pass
    return None


def _retained_files(
    storage: Storage,
    storage_options: Mapping[str, Any] | None,
    latest: list[CommittedFile],
    versions: tuple[int, int],
) -> tuple[list[CommittedFile], tuple[int, int]]:
    """The files of every retained version (each once), and the range of those versions."""
    # Here, not at the top: the reader's Lake, for this option alone.
    from lakesink_reader.lake import Lake

    found = {f.name: f for f in latest}
    retained = [v.version for v in Lake(storage.url, storage_options).versions() if v.version <= versions[1]]
    for version in retained:
        for f in Lake(storage.url, storage_options, version=version).files():
            if f.name not in found:
                rows, size = (f.rows if f.rows is not None else -1), (f.size or 0)
                found[f.name] = CommittedFile(f.name, f.partition or 0, f.epoch or 0, rows, size)
    return list(found.values()), ((retained[0] if retained else versions[0]), versions[1])


def _live_files(storage: Storage, table_id: str) -> tuple[list[CommittedFile], pa.Schema, tuple[int, int]]:
    """A format-3 lake's live files at its latest version: the newest usable checkpoint's list
    and the commits after it (a vacuumed log starts at a checkpoint, not at version 0); the
    lake's schema there, and that version (twice: the range checked)."""
    metadata, log = open_v3(storage, "verify")
    snapshot = log.snapshot()
    files: list[CommittedFile] = []

    def take(table: pa.Table) -> None:
        cols = table.select(["path", "partition", "batch", "rows", "bytes"]).to_pydict()
        for path, partition, batch, rows, size in zip(
            cols["path"], cols["partition"], cols["batch"], cols["rows"], cols["bytes"], strict=True
        ):
            files.append(CommittedFile(str(path), partition or 0, batch or 0, int(rows), int(size)))

    stream_live_files(storage, log, snapshot, take)
    schema = schema_at(metadata.schema, snapshot.state.schema_at(snapshot.version))
    return files, schema, (snapshot.version, snapshot.version)
