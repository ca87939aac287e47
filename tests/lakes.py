"""Build small lakes directly with the commit protocol (no Spark) for reader tests."""

from __future__ import annotations

import pyarrow as pa

from lakesink.commit import ParquetStage, WriteOptions, publish
from lakesink.layout import committed_name
from lakesink.metadata import ensure_table
from lakesink.storage import Storage, open_storage

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
    """Stage (and by default publish) one foreach-mode file; returns its committed name."""
    name = committed_name(partition, epoch, QUERY)
    stage = ParquetStage(storage, name, SCHEMA, WriteOptions(row_group_bytes=row_group_bytes))
    stage.write(rows(start, count))
    sealed = stage.seal()
    assert sealed is not None
    if commit:
        assert publish(storage, sealed)
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
