"""What the epoch writer's driver remembers about one run of a streaming query between batches.

Spark builds a fresh writer for every micro-batch call (unpickled in a Python worker it may or
may not reuse: pyspark 4.3 ends a worker after any exception of a commit, so its ``abort`` runs
in another process), so nothing the writer learns survives on the object:
whether this run has read its lake (the table checked with the store, the log's state),
whether it has swept what earlier runs left, and the log state its last commit folded (the
design's *cursor*, docs/design/format-v3.md section 7). This module is the one place that
keeps those, and it keeps them so that nothing can trip over them:

- **keyed by the run**: a run token drawn at each query start (``LakeSinkDataSource`` draws it),
  and every memo is under it (with the lake's URL), so a second query, a restarted query, or a
  test in the same Python worker never sees another run's memo;
- **only time is saved**: a memo lost (another worker process, the bound below) means the check,
  sweep or log read runs again, never another decision (``lakesink.writer.run``: an abort keeps
  what a commit may still land without asking the memo); the cursor is validated against the
  log before each use (``VersionedLog.refresh`` re-reads the commit it was folded at: another
  token, or a log of another table, is refused; a vanished commit means a fresh read);
- **bounded**: the runs seen last, at most :data:`MAX_RUNS` of them.

``LAKESINK_NO_CURSOR=1`` turns the cursor off (every commit reads the log afresh): the commit
tests run once that way too, and must pass unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink_reader.lru import LruMemo

if TYPE_CHECKING:
    import pyarrow as pa

    from lakesink.commit.start import LakeAtStart
    from lakesink_reader.format.v3.state import TableState

#: Runs remembered per process: a driver worker serves a handful of queries at a time.
MAX_RUNS = 16
NO_CURSOR_ENV = "LAKESINK_NO_CURSOR"


@dataclass
class RunMemo:
    """One run's memo on one lake: what its driver has done already."""

    #: the lake as the run found it: table.json checked (with the store) and the log's state
    start: LakeAtStart | None = None
    table_schema: bytes = b""  # the writer's schema that start was read for (serialized)
    swept: bool = False  # the sweep after the run's first commit ran
    #: the writer: the query id its checkpoint's ``metadata`` holds, fixed for a run (Spark
    #: read it at the query's start), so each commit need not read that file again
    writer_id: str | None = None
    cursor: TableState | None = None  # format 3: the log state after this run's last commit
    #: format 3: the lake's new schema (encoded) this run's stream brings (merge_schema), or None
    schema_change: str | None = None
    #: the schema this run's data files store: the stream's columns as the lake declares them
    #: after this run's change (``lakesink_reader.format.schemas.file_schema``)
    file_schema: pa.Schema | None = None
    #: auto-compaction: the small-file count below which the driver does not look again (it
    #: last found nothing to join: ``AutoCompaction.next_due``)
    auto_compact_due: int = 0


_RUNS: LruMemo[tuple[str, str], RunMemo] = LruMemo(MAX_RUNS)


def run_memo(url: str, run_token: str) -> RunMemo:
    """The memo of run ``run_token`` on the lake at ``url`` (a fresh one the first time)."""
    return _RUNS.get((url, run_token), RunMemo)


def cursor_enabled() -> bool:
    return os.environ.get(NO_CURSOR_ENV, "") not in ("1", "true", "yes")
