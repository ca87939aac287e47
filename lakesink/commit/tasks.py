"""One epoch-mode task's output: its rows staged and published as the files the driver commits
together, under names unique to the attempt -- one file, or one per partition folder the rows
fall into (``partitioned``), or more where ``max_records_per_file`` rolls them. Published is
not committed: until the driver's commit lists them, readers do not see them, and an abort or
a sweep deletes them.

The shape is the same for all: a list of :class:`TaskFile` (empty when the task had no rows).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink.commit.files import FileWriter, WriteOptions, fill_slices
from lakesink.commit.observer import Observer
from lakesink.commit.partitioned import PartitionedWriter
from lakesink_reader.errors import CommitError, quietly
from lakesink_reader.names import data_file_name, new_attempt_id, writer_file_name
from lakesink_reader.storage import Storage


@dataclass(frozen=True)
class TaskFile:
    """A file a task published: its name (relative to the lake), rows, bytes and Delta stats."""

    name: str
    rows: int
    size: int
    stats: Any = None


def write_task(
    storage: Storage,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    *,
    tag: str | None,
    batch: int,
    partition: int,
    options: WriteOptions,
    observer: Observer | None = None,
    partition_columns: Sequence[str] = (),
) -> list[TaskFile]:
    """Stage and publish one task's ``batches`` of ``batch`` (Spark's task ``partition``).

    ``tag``: the writer's tag (``writer_tag`` of its query id), which names its files; None
    only for a task that got no query id, whose one file is named as format 2 named them
    (a partitioned lake refuses that: CommitError). On any failure nothing of the attempt is
    left published: staged data is discarded, files already published are deleted.
    """
    if partition_columns:
        return _partitioned(
            storage, schema, batches, tag, batch, partition, options, observer, partition_columns
        )
    if not tag and options.max_records_per_file is not None:
        raise CommitError(
            f"{storage.url}: max_records_per_file needs the streaming query's id, which this task lacks"
        )

    def new_file() -> FileWriter:
        name = (
            writer_file_name(tag, batch, partition, new_attempt_id())
            if tag
            else data_file_name(partition, batch, new_attempt_id())
        )
        return FileWriter(storage, name, schema, options, observer=observer, epoch=batch, partition=partition)

    done: list[TaskFile] = []
    writer = new_file()
    try:
        for rows in batches:
            for part, full in fill_slices(rows, writer.rows, options.max_records_per_file):
                writer.write(part)
                if full:  # max_records_per_file: this file is done, the next rows start another
                    done += _published(storage, writer)
                    writer = new_file()
        done += _published(storage, writer)
    except BaseException:
        writer.discard()
        for f in done:  # published, never committed: this attempt's garbage
            quietly(functools.partial(storage.delete, f.name), f"delete {f.name}")
        raise
    return done


def _published(storage: Storage, writer: FileWriter) -> list[TaskFile]:
    """Publish ``writer``'s file: the TaskFile (none when it got no rows)."""
    published = writer.publish()
    if published is None:
        return []
    if not published.won:  # names carry a fresh attempt id: a taken name is a bug, not a race
        raise CommitError(f"{storage.url}/{writer.name} already existed when this task published it")
    return [TaskFile(writer.name, published.rows, published.size, published.stats)]


def _partitioned(
    storage: Storage,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    tag: str | None,
    batch: int,
    partition: int,
    options: WriteOptions,
    observer: Observer | None,
    partition_columns: Sequence[str],
) -> list[TaskFile]:
    """A task of a partitioned lake: a file per partition folder it meets."""
    if not tag:
        raise CommitError(f"{storage.url}: a task of a partitioned lake got no streaming query id")
    writer = PartitionedWriter(
        storage,
        schema,
        partition_columns,
        lambda: writer_file_name(tag, batch, partition, new_attempt_id()),
        options,
        observer=observer,
        epoch=batch,
        partition=partition,
    )
    try:
        for rows in batches:
            writer.write(rows)
        files = writer.publish()
    except BaseException:
        writer.discard()
        for done in writer.published:  # published, never committed: this attempt's garbage
            name = done.published.name
            quietly(functools.partial(storage.delete, name), f"delete {name}")
        raise
    lost = [f.published.name for f in files if not f.published.won]
    if lost:  # names carry a fresh attempt id: a taken name is a bug, not a race
        raise CommitError(f"{storage.url}: {lost} already existed when this task published them")
    return [TaskFile(f.published.name, f.published.rows, f.published.size, f.published.stats) for f in files]
