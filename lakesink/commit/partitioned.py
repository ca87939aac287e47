"""One task's files of a partitioned lake: a ``FileWriter`` per partition folder it meets.

Rows are split by their partition values with one sort per incoming batch (the values are
dictionary-encoded into one integer key, and each run of equal keys goes to its folder's
writer), and written without the partition columns, which the folder names hold.

Memory: the Arrow rows buffered across all open files stay within ``row_group_bytes`` (when
they exceed it, the file holding the most is written out as a row group, a smaller one); each
open file adds a Parquet writer's state (and on S3 a multipart upload's part buffer). At most
``max_open_files`` are open: the least recently written one is then finished -- published,
which in epoch mode is not committing: the driver commits the task's files together -- and a
later row of its folder starts another file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink.commit.files import FileWriter, Published, WriteOptions, fill_slices
from lakesink.commit.observer import Observer
from lakesink_reader.arrays import scalar
from lakesink_reader.format.partitions import partition_dir, texts_of
from lakesink_reader.storage import Storage


@dataclass(frozen=True)
class PartitionFile:
    """A published file of a partitioned write, and the folder it is in."""

    folder: str
    published: Published


class PartitionedWriter:
    """Splits one task's batches by partition folder and writes each folder's rows to its files.

    Parameters
    ----------
    storage, schema, partition_columns, options
        Where; the stream's schema (partition columns included); which columns make folders;
        the Parquet layout and ``max_open_files``.
    file_name
        The name of a new file in a folder, relative to the folder.
    observer, epoch, partition
        As for ``FileWriter``.
    evict
        Past ``max_open_files``, finish the least recently written file and start another in
        its folder later (epoch mode: ``file_name`` gives a new name each call, and the driver
        commits the task's files together). False (foreach mode, where a published file is
        committed and its name must be the same in a replay): fail instead, naming the option,
        before anything is published.
    """

    def __init__(
        self,
        storage: Storage,
        schema: pa.Schema,
        partition_columns: Sequence[str],
        file_name: Callable[[], str],
        options: WriteOptions | None = None,
        *,
        observer: Observer | None = None,
        epoch: int = -1,
        partition: int | None = None,
        evict: bool = True,
    ) -> None:
        self.storage = storage
        self.evict = evict
        self.columns = tuple(partition_columns)
        self.data_columns = [n for n in schema.names if n not in self.columns]
        self.data_schema = pa.schema([schema.field(n) for n in self.data_columns])
        self.options = options or WriteOptions()
        self._file_name = file_name
        self._observer, self._epoch, self._partition = observer, epoch, partition
        self._open: OrderedDict[str, FileWriter] = OrderedDict()  # least recently written first
        self.published: list[PartitionFile] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        limit = self.options.max_records_per_file
        if limit is not None and not self.evict:
            raise ValueError(
                "max_records_per_file rolls files, which a foreach task cannot: each of its files "
                "commits when published, and a replay must name the same one. Write in epoch mode"
            )
        for folder, rows in split_by_folder(batch, self.columns, self.data_columns):
            current = self._open.get(folder)
            for part, full in fill_slices(rows, current.rows if current is not None else 0, limit):
                self._writer(folder).write(part)
                self._open.move_to_end(folder)
                if full:  # max_records_per_file: the folder's next rows start another file
                    self._finish(folder)
        self._bound_memory()

    def _writer(self, folder: str) -> FileWriter:
        writer = self._open.get(folder)
        if writer is None:
            if len(self._open) >= self.options.max_open_files:
                if not self.evict:
                    raise ValueError(
                        f"this task's rows fall into more than max_open_files={self.options.max_open_files} "
                        f"partition folders (the next one: {folder!r}); a foreach task keeps one file open "
                        "per folder until it closes. Raise max_open_files (WriteOptions), partition by "
                        "fewer values, or write in epoch mode, which finishes files early instead"
                    )
                self._finish(next(iter(self._open)))
            writer = FileWriter(
                self.storage,
                f"{folder}/{self._file_name()}",
                self.data_schema,
                self.options,
                observer=self._observer,
                epoch=self._epoch,
                partition=self._partition,
            )
            self._open[folder] = writer
        return writer

    def _bound_memory(self) -> None:
        while sum(w.pending_bytes for w in self._open.values()) > self.options.row_group_bytes:
            max(self._open.values(), key=lambda w: w.pending_bytes).flush()

    def _finish(self, folder: str) -> None:
        writer = self._open.pop(folder)
        published = writer.publish()
        if published is not None:
            self.published.append(PartitionFile(folder, published))

    def publish(self) -> list[PartitionFile]:
        """Publish every open file; the files published so far (all of this task's)."""
        try:
            while self._open:
                self._finish(next(iter(self._open)))
        except BaseException:
            self.discard()
            raise
        return self.published

    def discard(self) -> None:
        """Drop the open files' staged data (published ones are the caller's to delete)."""
        for writer in self._open.values():
            writer.discard()
        self._open.clear()


def split_by_folder(
    batch: pa.RecordBatch, columns: Sequence[str], data_columns: Sequence[str]
) -> list[tuple[str, pa.RecordBatch]]:
    """``batch``'s rows grouped by partition folder, each group without the partition columns."""
    # Here, not at the top: pyarrow.compute is ~2.9 MiB in each task worker, and only a
    # partitioned lake's tasks need it (tasks imports this module for all).
    import pyarrow.compute as pc

    texts = [texts_of(batch.column(name)) for name in columns]
    key: Any = None
    for column in texts:
        encoded: Any = pc.dictionary_encode(column)
        size = len(encoded.dictionary)
        # Null gets the code after the dictionary's last: one integer per row names its folder.
        # (Scalars of lakesink_reader.arrays: a Python int handed to pyarrow.compute becomes a
        # pa.scalar, which imports pandas in each task's worker.)
        codes = pc.fill_null(encoded.indices.cast(pa.int64()), scalar(size, pa.int64()))
        if key is not None:
            # Re-encoded after each column, so the combined key stays below rows * (size + 1).
            combined = pc.add(pc.multiply(key, scalar(size + 1, pa.int64())), codes)
            recoded: Any = pc.dictionary_encode(combined)
            codes = recoded.indices.cast(pa.int64())
        key = codes
    assert key is not None
    order = pc.sort_indices(key)
    compute: Any = pc  # run_end_encode is missing from pyarrow's type stubs
    runs = compute.run_end_encode(key.take(order))
    data = batch.select(list(data_columns)).take(order)
    groups = []
    start = 0
    for end in runs.run_ends.to_pylist():
        row = order[start].as_py()
        folder = partition_dir(columns, [column[row].as_py() for column in texts])
        groups.append((folder, data.slice(start, end - start)))
        start = end
    return groups
