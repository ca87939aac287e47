"""Writing checkpoints of the versioned log (docs/design/format-v3.md, section 5): the
writer's side of ``lakesink_reader.format.v3.checkpoint``, which encodes, finds and reads them.

Writing one (:func:`write_checkpoint`): (1) the file list, streamed from the previous
checkpoint's list row group by row group, minus the paths removed since, merged with the paths
added since (held in memory: at most the commits since that checkpoint), under a fresh token;
(2) the small part, create-if-absent -- a second writer of the same checkpoint loses here and
deletes its own list, and a kill between (1) and (2) leaves an unreferenced list that nothing
reads (vacuum removes it); (3) the hint, only when it is newer than the hint read.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink_reader.errors import CorruptFileError
from lakesink_reader.format.v3.checkpoint import (
    LAST_CHECKPOINT,
    LIST_SCHEMA,
    Changes,
    Checkpoint,
    checkpoint_name,
    derive_changes,
    encode_checkpoint,
    file_list_name,
    iter_file_list,
    merge_file_list,
    plain_commit_reader,
    read_checkpoint,
    read_hint,
    usable_base,
)
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.logfiles import DEFAULT_CHECKPOINT_INTERVAL, LOG_DIR
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)

#: Rows per row group of a file list (a reader filters row groups; a merge holds one).
LIST_ROW_GROUP_ROWS = 65_536


def write_checkpoint(
    storage: Storage,
    table_id: str,
    version: int,
    *,
    interval: int | None = DEFAULT_CHECKPOINT_INTERVAL,
    expected: TableState | None = None,
    read_commit: Callable[[int], Commit | None] | None = None,
) -> Checkpoint:
    """Make sure the checkpoint at ``version`` exists; returns it (ours or another writer's).

    Built from the newest usable checkpoint below it (or from version 0) and the whole commits
    since, which must all be there. ``expected``: the state the caller folded at ``version``
    (a committing writer's); a checkpoint that derives another one is not written
    (CorruptFileError). ``read_commit``: how to read one commit (a ``VersionedLog``'s, which
    checks the table id), else a plain read.
    """
    if version < 1:
        raise ValueError(f"checkpoints are written at versions >= 1, got {version}")
    existing = read_checkpoint(storage, table_id, version)
    if existing is not None:
        advance_hint(storage, version)
        return existing
    reader = read_commit or plain_commit_reader(storage, table_id)
    base, base_list = usable_base(storage, table_id, version, interval)
    state, changes = derive_changes(storage, base, table_id, version, reader)
    if expected is not None and expected != state:
        raise CorruptFileError(
            f"the checkpoint at version {version} of {_url(storage, LOG_DIR)} derives another state than "
            f"the writer folded: {state} != {expected}"
        )
    token = uuid.uuid4().hex
    list_name = file_list_name(version, token)
    where = _url(storage, list_name)
    base_batches: Iterable[pa.RecordBatch] = (
        iter_file_list(storage, base, opened=base_list) if base is not None and base_list is not None else ()
    )
    files_bytes = _write_list(storage, list_name, base_batches, changes, state, where)
    checkpoint = Checkpoint(state, token, time.time(), list_name, state.counts.files, files_bytes)
    # The commit point. If it raises, ours may have landed: the list is kept (unreferenced, it
    # is harmless; referenced, it is the checkpoint's).
    if not storage.put_if_absent(checkpoint_name(version), encode_checkpoint(checkpoint)):
        log.info("the checkpoint at version %d was written by another writer: dropping ours", version)
        storage.delete(list_name)
        winner = read_checkpoint(storage, table_id, version)
        if winner is None:
            raise CorruptFileError(f"{_url(storage, checkpoint_name(version))} exists but cannot be read")
        checkpoint = winner
    else:
        log.info(
            "wrote the checkpoint at version %d of %s: %d live file(s)",
            version,
            _url(storage, LOG_DIR),
            state.counts.files,
        )
    advance_hint(storage, version)
    return checkpoint


def advance_hint(storage: Storage, version: int) -> None:
    """Point ``_last_checkpoint`` at ``version`` unless it names a newer one already."""
    hinted = read_hint(storage)
    if hinted is None or hinted < version:
        storage.put(LAST_CHECKPOINT, json.dumps({"version": version}).encode())


def _write_list(
    storage: Storage,
    name: str,
    base: Iterable[pa.RecordBatch],
    changes: Changes,
    state: TableState,
    where: str,
) -> int:
    """Stream the merged list into a staged file, publish it under ``name``; returns its size."""
    staged = storage.stage(name)
    try:
        writer = pq.ParquetWriter(staged, LIST_SCHEMA, compression="zstd")  # type: ignore[arg-type]
        groups = RowGroups(writer, LIST_ROW_GROUP_ROWS)
        files, rows, size = merge_file_list(base, changes, groups.add, where=where)
        groups.finish()
        writer.close()
        counts = state.counts
        if (files, rows, size) != (counts.files, counts.rows, counts.bytes):
            raise CorruptFileError(
                f"{where}: the merged list holds {files} files, {rows} rows, {size} bytes; the state at "
                f"version {state.version} counts {counts.files}, {counts.rows}, {counts.bytes}"
            )
        sealed = staged.seal()
    except BaseException:
        staged.discard()
        raise
    if not storage.publish(sealed):  # a fresh token: nothing else has this name
        storage.discard(sealed)
        raise CorruptFileError(f"{where} exists already, under a token that should be fresh")
    return sealed.size


class RowGroups:
    """Writes tables as row groups of exactly ``rows`` rows (the last one shorter)."""

    def __init__(self, writer: pq.ParquetWriter, rows: int) -> None:
        self.writer, self.rows = writer, rows
        self.pending: list[pa.Table] = []
        self.count = 0

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.count += table.num_rows
        while self.count >= self.rows:
            self._write(self.rows)

    def _write(self, rows: int) -> None:
        whole = pa.concat_tables(self.pending).combine_chunks()
        self.writer.write_table(whole.slice(0, rows), row_group_size=rows)
        rest = whole.slice(rows)
        self.pending, self.count = ([rest] if rest.num_rows else []), rest.num_rows

    def finish(self) -> None:
        if self.count:
            self._write(self.count)


def _url(storage: Storage, name: str) -> str:
    return f"{storage.url.rstrip('/')}/{name}"
