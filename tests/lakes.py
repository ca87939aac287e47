"""Build small lakes directly with the commit protocol (no Spark) for reader and sweep tests.

Format-2 lakes are made by the format-2 writer's frozen copy (``tests.sim.legacy``: lakesink
writes format 3 only), or copied from bytes a Spark query of that writer left
(:func:`format2_query`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from lakesink.commit import FileWriter, WriteOptions
from lakesink_reader.format.v3.commits import AddFile
from lakesink_reader.names import data_file_name
from lakesink_reader.storage import Sealed, Storage, open_storage
from tests.sim.legacy import EpochCommitter, format2_table

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
    """A format-2 foreach-mode lake with ids 0 .. epochs*partitions*rows_per_file - 1, all committed."""
    storage = open_storage(path)
    format2_table(storage, SCHEMA, "foreach")
    n = 0
    for epoch in range(epochs):
        for partition in range(partitions):
            write_file(storage, partition, epoch, n, rows_per_file)
            n += rows_per_file
    return storage


def epoch_lake(path: str, *, epochs: int = 3, partitions: int = 2, rows_per_file: int = 100) -> Storage:
    """A format-2 epoch-mode lake with ids 0 .. epochs*partitions*rows_per_file - 1, every epoch recorded."""
    from lakesink_reader.format.log import CommittedFile

    storage = open_storage(path)
    format2_table(storage, SCHEMA, "epoch")
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


#: A format-2 lake, its query's Spark checkpoint and input, as bytes (its README says how made).
FORMAT2_QUERY = Path(__file__).resolve().parent / "fixtures" / "format2-query"


@dataclass(frozen=True)
class Format2Query:
    """A copy of :data:`FORMAT2_QUERY`: a format-2 epoch lake (epochs 0 and 1, ids 0-199, two
    files an epoch) written by streaming query ``query_id``, whose checkpoint (``checkpoint``,
    batches 0 and 1 committed) reads ``input`` (``in-0000.parquet``, ``in-0001.parquet``:
    ``test_epoch_v3.add_input``'s files 0 and 1) with ``test_epoch_v3.stream``."""

    lake: str
    checkpoint: Path
    input: Path
    query_id: str = "62275c69-f363-439e-8cc6-847b46cb5570"


def format2_query(dest: Path) -> Format2Query:
    """Copy the frozen format-2 query under ``dest`` (``lake/``, ``checkpoint/``, ``input/``),
    pointing its checkpoint's file-source log at the copied input."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in ("lake", "checkpoint", "input"):
        shutil.copytree(FORMAT2_QUERY / part, dest / part)
    for log in (dest / "checkpoint" / "sources" / "0").iterdir():
        log.write_text(log.read_text().replace("@ROOT@", str(dest.resolve())))
    for index in (0, 1):  # git keeps no modification times; Spark's file source orders by them
        os.utime(dest / "input" / f"in-{index:04d}.parquet", (1_700_000_000 + index,) * 2)
    return Format2Query(str(dest / "lake"), dest / "checkpoint", dest / "input")


# Format 3 (docs/design/format-v3.md): table.json, data files and commits, built by hand until the
# epoch writer writes them (its landing step 5).


def v3_table(
    path: str, *, checkpoint_interval: int = 100, mode: str = "epoch", table_id: str | None = None
) -> tuple[Storage, str]:
    """An empty format-3 lake: its table.json (with ``checkpoint_interval``, and ``table_id``, a
    new one when None); returns the storage and the table id (what a ``VersionedLog`` of it needs)."""
    import json
    import time
    import uuid

    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.names import TABLE_FILE

    storage = open_storage(path)
    metadata = TableMetadata(3, mode, SCHEMA, time.time(), table_id or uuid.uuid4().hex)  # type: ignore[arg-type]
    doc = json.loads(metadata.to_json())
    doc["checkpoint_interval"] = checkpoint_interval
    assert storage.put_if_absent(TABLE_FILE, json.dumps(doc, indent=2).encode())
    assert metadata.table_id is not None
    return storage, metadata.table_id


def v3_file(storage: Storage, name: str, start: int, count: int, *, batch: int | None = None,
            partition: int | None = None) -> AddFile:  # fmt: skip
    """Write and publish one data file of ids ``start..start+count-1``; returns its ``AddFile``
    (rows, size and stats from the writer), for a commit of a ``VersionedLog``."""
    writer = FileWriter(storage, name, SCHEMA)
    writer.write(rows(start, count))
    published = writer.publish()
    assert published is not None and published.won
    return AddFile(name, published.rows, published.size, partition, batch, published.stats)


def v3_name(writer_id: str, batch: int, partition: int) -> str:
    """A writer's data file name under format 3: ``w<tag>-b<batch>-p<partition>-<attempt>.parquet``."""
    from lakesink_reader.format.v3.commits import writer_tag
    from lakesink_reader.names import new_attempt_id

    return f"w{writer_tag(writer_id)}-b{batch:012d}-p{partition:05d}-{new_attempt_id()}.parquet"
