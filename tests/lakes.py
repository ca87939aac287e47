"""Build small lakes directly with the commit protocol (no Spark) for reader and sweep tests."""

from __future__ import annotations

import pyarrow as pa

from lakesink.commit import FileWriter, WriteOptions
from lakesink.format.names import data_file_name
from lakesink.format.table import ensure_table
from lakesink.storage import Sealed, Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("bucket", pa.int32()), ("label", pa.string())])
QUERY = "0123456789abcdef"


def rows(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([i % 7 for i in ids], pa.int32()),
            pa.array([f"r{i}" for i in ids]),
        ],
        schema=SCHEMA,
    )


def write_file(storage: Storage, partition: int, epoch: int, start: int, count: int, *, commit: bool = True,
               row_group_bytes: int = 64 << 20) -> str:  # fmt: skip
    """Write one foreach-mode file, published (``commit``) or only sealed; returns its name."""
    name = data_file_name(partition, epoch, QUERY)
    writer = FileWriter(storage, name, SCHEMA, WriteOptions(row_group_bytes=row_group_bytes))
    writer.write(rows(start, count))
    if commit:
        published = writer.publish()
        assert published is not None and published.won
    else:
        assert isinstance(writer.seal(), Sealed)
    return name


def foreach_lake(path: str, *, epochs: int = 3, partitions: int = 2, rows_per_file: int = 100) -> Storage:
    """A foreach-mode lake with ids 0 .. epochs*partitions*rows_per_file - 1, all committed."""
    storage = open_storage(path)
    ensure_table(storage, SCHEMA, "foreach")
    n = 0
    for epoch in range(epochs):
        for partition in range(partitions):
            write_file(storage, partition, epoch, n, rows_per_file)
            n += rows_per_file
    return storage


def epoch_lake(path: str, *, epochs: int = 3, partitions: int = 2, rows_per_file: int = 100) -> Storage:
    """An epoch-mode lake with ids 0 .. epochs*partitions*rows_per_file - 1, every epoch recorded."""
    from lakesink.commit import EpochCommitter
    from lakesink.format.log import CommittedFile

    storage = open_storage(path)
    ensure_table(storage, SCHEMA, "epoch")
    committer = EpochCommitter(storage, query_id="q")
    n = 0
    for epoch in range(epochs):
        files = []
        for partition in range(partitions):
            name = data_file_name(partition, epoch, f"{epoch:08x}{partition:08x}")
            with FileWriter(storage, name, SCHEMA) as writer:
                writer.write(rows(n, rows_per_file))
            size = next(f.size for f in storage.list("") if f.name == name)
            files.append(CommittedFile(name, partition, epoch, rows_per_file, size))
            n += rows_per_file
        committer.commit(epoch, files)
    return storage
