"""The reader side: ``read_committed`` against ``pyarrow.dataset``, and the time to open big tables.

- ``bench_reader``: both read the same committed files (a table the writers just wrote);
- ``time_open``: opening a table and listing what ``read_committed`` would read, no data
  read, for a foreach-mode table of N files and an epoch-mode table of N epochs. Those
  tables are built through lakesink's own format code (``lakesink_reader.format``) without Spark,
  and kept beside the input files for later runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from inputs import input_schema, make_chunk


def bench_reader(root: str, repeats: int) -> dict[str, Any]:
    """``read_committed`` vs ``pyarrow.dataset(root).to_table()`` over the same committed files.

    One untimed read each first (the files are then in the page cache, so both measure the
    reading, not the disk); then ``repeats`` timed rounds, the order alternating between
    rounds, and the medians count.
    """
    import pyarrow.dataset as ds

    from lakesink_reader import read_committed

    def ours() -> Any:
        return read_committed(root)

    def plain() -> Any:
        return ds.dataset(root, format="parquet").to_table()

    seconds: dict[Any, list[float]] = {ours: [], plain: []}
    rows: dict[Any, int] = {ours: ours().num_rows, plain: plain().num_rows}
    if rows[ours] != rows[plain]:
        raise RuntimeError(f"read_committed saw {rows[ours]} rows, pyarrow.dataset {rows[plain]}: {root}")
    for i in range(repeats):
        for read in (ours, plain) if i % 2 == 0 else (plain, ours):
            started = time.perf_counter()
            read()
            seconds[read].append(time.perf_counter() - started)
    return {
        "rows": rows[ours],
        "read_committed_seconds": statistics.median(seconds[ours]),
        "pyarrow_dataset_seconds": statistics.median(seconds[plain]),
        "ratio": statistics.median(seconds[ours]) / statistics.median(seconds[plain]),
        "repeats": repeats,
    }


def time_open(root: str, repeats: int) -> dict[str, Any]:
    """Seconds to open the table and list what ``read_committed`` would read (no data read)."""
    import pyarrow.dataset as ds

    from lakesink_reader import Lake

    ours, theirs = [], []
    files = 0
    for _ in range(repeats):
        started = time.perf_counter()
        files = len(cast(ds.FileSystemDataset, Lake(root).dataset()).files)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        ds.dataset(root, format="parquet")
        theirs.append(time.perf_counter() - started)
    return {
        "files": files,
        "open_seconds": statistics.median(ours),
        "pyarrow_dataset_open_seconds": statistics.median(theirs),
    }


# The tables to open --------------------------------------------------------------------------


def cached_table(base: Path, kind: str, count: int, build: Callable[[Path, int], None]) -> Path:
    """The table of ``count`` files / epochs, built once and kept beside the input files.

    Creating 20,000-30,000 small files takes ~30 s on a loaded machine; the tables depend only
    on the count and the lake format version, so later runs reuse them.
    """
    from lakesink_reader.names import FORMAT_VERSION

    version = 2 if kind == "epochs" else FORMAT_VERSION  # see build_many_epochs
    root = base / f"open-{kind}-{count}-v{version}"
    marker = base / f"{root.name}.complete"
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        build(root, count)
        marker.touch()
    return root


def build_many_files(root: Path, count: int) -> None:
    """A foreach-mode table of ``count`` tiny committed files (8 partitions, ``count / 8`` epochs).

    Every file holds the same 10 rows: opening the table reads names and metadata, so the
    content does not matter.
    """
    from lakesink_reader.format.table import ensure_table
    from lakesink_reader.names import data_file_name
    from lakesink_reader.storage.local import LocalStorage

    storage = LocalStorage(str(root))
    root.mkdir(parents=True)
    ensure_table(storage, input_schema(), "foreach")
    data = tiny_parquet()
    with no_fsync():
        for i in range(count):
            storage.put_if_absent(data_file_name(i % 8, i // 8, "b0b0b0b0b0b0b0b0"), data)


def build_many_epochs(root: Path, count: int) -> None:
    """A format-2 epoch-mode table of ``count`` epochs of one tiny file each, logged as a
    format-2 writer logs them (format 3's log at scale is ``log_scale``'s).

    Each epoch: its file, its record, then the log checkpoint segment when one is due --
    what the format-2 writer did, minus the checks a single writer needs no proof of here.
    """
    from lakesink_reader.format.log import CommittedFile, EpochLog, EpochRecord
    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.names import TABLE_FILE, data_file_name
    from lakesink_reader.storage.local import LocalStorage

    storage = LocalStorage(str(root))
    root.mkdir(parents=True)
    # A format-2 table.json, as lakesink's format-2 writer (gone since 2026-11-27) created it.
    storage.put_if_absent(TABLE_FILE, TableMetadata.new("epoch", input_schema(), format_version=2).to_json())
    data = tiny_parquet()
    log = EpochLog(storage)
    with no_fsync():
        for epoch in range(count):
            name = data_file_name(0, epoch, "c0c0c0c0c0c0c0c0")
            storage.put_if_absent(name, data)
            record = EpochRecord.new(epoch, [CommittedFile(name, 0, epoch, 10, len(data))], query_id="bench")
            won, _ = log.append(record)
            if not won:
                raise RuntimeError(f"epoch {epoch} of {root} was recorded twice")
            log.ensure_checkpoint(epoch)


def tiny_parquet() -> bytes:
    """The bytes of a Parquet file of the stream's first 10 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(make_chunk(0, 10), sink)
    return bytes(sink.getvalue().to_pybytes())


@contextlib.contextmanager
def no_fsync() -> Iterator[None]:
    """Switch off fsync while building the open-time tables, in this process only.

    Through the storage's durable writes (two fsyncs per file), 10,000 files take minutes on
    a plain disk; what is measured afterwards is opening the table, which reads names and
    metadata, so durability does not matter for the build.
    """
    # The local backend calls os.fsync (files and folders); setattr, as a test's monkeypatch does.
    saved = os.fsync
    setattr(os, "fsync", lambda fd: None)  # noqa: B010
    try:
        yield
    finally:
        setattr(os, "fsync", saved)  # noqa: B010
