"""What a writer reads of a lake once, when a run starts: the table (``table.json``, checked, or
created with the store's check) and the versioned log's state, and what follows from them for
the stream -- the schema change it brings, the schema its files store, how far the log holds
this writer (a replay writes nothing), and the continuation its first commit carries.

The start()-time checks (``lakesink.spark.preflight``) and a run's driver
(``lakesink.spark.datasource``) each judge from one such reading, instead of opening the log
again for each question. Nothing here commits: the commit (``lakesink.commit.batches``) reads
the log afresh and judges again against the state it commits on, so a reading that went stale
costs at most a refusal later, never a wrong commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink.commit.continuation import check_continuation, continuation_of
from lakesink_reader.format.schemas import encode_schema, file_schema, schema_at, schema_change
from lakesink_reader.format.table import TableMetadata, ensure_table
from lakesink_reader.format.v3.commits import Continuation
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.storage.base import Storage


@dataclass(frozen=True)
class LakeAtStart:
    """A format-3 epoch-mode lake as a writer's run found it: its table and its log's state."""

    storage: Storage
    table: TableMetadata
    state: TableState

    @classmethod
    def read(cls, storage: Storage, table: TableMetadata) -> LakeAtStart:
        """The log's state now, of the lake whose ``table.json`` is ``table``."""
        log = VersionedLog(storage, table.table_id or "", checkpoint_interval=table.log_interval)
        return cls(storage, table, log.open())

    def stream_schemas(self, stream: pa.Schema, *, merge_schema: bool) -> tuple[str | None, pa.Schema]:
        """The lake's new schema (encoded) that ``stream`` brings, or None; and the schema the
        stream's data files store: its columns as the lake declares them once the change is made
        (types and nullability, so that engines reading the files' own schemas answer as the log
        does: ``schemas.file_schema``). SchemaMismatchError when the stream does not fit the
        lake's schema as its log records it (it evolves with ``merge_schema``)."""
        lake = schema_at(self.table.schema, self.state.schema_at(self.state.version))
        changed = schema_change(
            lake,
            stream,
            merge_schema=merge_schema,
            url=self.storage.url,
            partition_columns=self.table.partition_columns,
        )
        if changed is None:
            return None, file_schema(stream, lake)
        return encode_schema(changed), file_schema(stream, changed)

    def last_batch(self, writer: str) -> int:
        """The last batch of ``writer`` the log held (-1: none). Its tasks write nothing for a batch
        at or below it: a replay, which the driver skips whole. Replays come first in a run, so
        an answer read at the run's start serves the run; a stale one only costs a task a wasted
        write (the driver decides)."""
        found = self.state.writers.get(writer)
        return found.last_batch if found is not None else -1

    def continuation(
        self, writer: str, continue_writer: str | None, start_offsets: Callable[[], Any]
    ) -> Continuation | None:
        """The ``Continuation`` the first commit of ``writer`` carries (``continuation_of``)."""
        return continuation_of(self.state, writer, continue_writer, start_offsets, self.storage.url)

    def check_continuation(
        self, writer: str, continue_writer: str, start_offsets: Callable[[], Any] | None
    ) -> None:
        """Refuse (CommitRefusedError, as the commit would) a continuation of ``continue_writer``
        by ``writer`` that the log's rules refuse: a writer it does not know or that was
        continued already, and -- when ``start_offsets`` is given -- an overlap or a gap.
        ``start_offsets`` None: the offsets are not known yet (Spark knows them when it plans the
        first batch, and they are judged then); everything else is judged now."""
        known = start_offsets if start_offsets is not None else self._recorded_offsets(continue_writer)
        check_continuation(self.state, writer, self.continuation(writer, continue_writer, known))

    def _recorded_offsets(self, continue_writer: str) -> Callable[[], Any]:
        # Stand-in start offsets that continue the old writer exactly: the rules then judge
        # who is continued (known, not retired, not moved on) and nothing about the offsets.
        old = self.state.writer(continue_writer)
        return lambda: old.offsets if old is not None else None


def open_for_writing(
    storage: Storage,
    stream: pa.Schema,
    *,
    checkpoint_interval: int | None,
    partition_by: tuple[str, ...] | None,
) -> LakeAtStart:
    """The lake a run writes, read once at its start: ``table.json`` checked (or created: the
    run's first epoch makes a new lake) with the store's create-if-absent check, then the log."""
    table = ensure_table(
        storage,
        stream,
        "epoch",
        check_store=True,
        checkpoint_interval=checkpoint_interval,
        partition_by=partition_by,
        check_schema=False,  # the log's schema decides (it evolves): stream_schemas judges it
    )
    return LakeAtStart.read(storage, table)
