"""Auto-compaction: the writer's driver compacts the lake's small files after a commit, when
there are enough of them, with the commit ``lakesink compact`` makes (issue 36).

Opt-in (``auto_compact=True``, ``.option("auto_compact", "true")``). After each of the query's
commits the driver counts the lake's small live files -- from the log state the commit just
folded, so the count costs nothing -- and when there are at least ``AUTO_COMPACT_MIN_SMALL``
it runs :func:`lakesink.maintenance.compact.compact` on them, oldest first, reading at most
``AUTO_COMPACT_MAX_INPUT`` bytes: that bound is the bound on how much one auto-compaction can
delay the query's next micro-batch, which runs after the commit call returns.

Why this is safe, and what may happen:

- The batch is committed before compaction starts; compaction is a separate version of the log
  (kind ``compact``), checked against every commit after its base as any compaction is, beside
  other writers, a manual ``lakesink compact`` and vacuum (docs/FORMAT.md, section 8).
- It never fails the query: a compaction that loses a race, or fails, is logged (WARNING) and
  the query goes on; the small files stay for the next turn. A driver killed mid-compaction
  leaves staged outputs and a lease that the next compaction (auto or manual) abandons after
  ``DEFAULT_ABANDON_AGE``, as it does a killed ``lakesink compact``.
- Memory: compaction streams row groups (``WriteOptions.row_group_bytes``), not whole files.
- Write amplification: a folder's compacted output is itself small until it reaches half the
  target size (64 MiB), and is rewritten with the next small files then -- as Delta's
  ``autoCompact`` does. ``lakesink compact`` with a larger ``--min-files`` joins fewer, larger
  bins when that matters.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from lakesink.commit.files import WriteOptions
from lakesink.maintenance.compact import DEFAULT_TARGET_FILE_SIZE, CompactReport, compact
from lakesink_reader.format.v3.commits import size_bucket
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.storage import Storage

log = logging.getLogger(__name__)

#: Small files (under half the compaction target: 64 MiB) in the lake before the driver compacts.
AUTO_COMPACT_MIN_SMALL = 32
#: A folder's small files that make a bin worth rewriting (``compact --min-files``).
AUTO_COMPACT_MIN_FILES = 8
#: Bytes one auto-compaction reads at most: the bound on the delay to the next micro-batch.
AUTO_COMPACT_MAX_INPUT = 256 << 20
#: Bins join files within one power of this of each other in size (``compact(tier_ratio=)``):
#: without it, each compaction rewrote the earlier outputs again, and a 1-second stream's
#: write amplification grew with its age (measured: ``bench/auto_compact_thresholds.py``).
AUTO_COMPACT_TIER_RATIO = 8


@dataclass(frozen=True)
class AutoCompaction:
    """What one auto-compaction did: the report (None when it failed), how long it took, and
    the small-file count at which the next one is due: ``min_small`` more than now when it
    found no bin to join (small files spread over size tiers or partition folders: reading
    the file list again at the next commit would find the same), else the threshold."""

    report: CompactReport | None
    seconds: float
    next_due: int = 0


def small_files(state: TableState, target_file_size: int = DEFAULT_TARGET_FILE_SIZE) -> int:
    """The live files under half of ``target_file_size`` (what compaction takes as inputs), from
    the state's size histogram: no file list is read. Counted by whole histogram buckets, so
    files just under the bound may count as large (never the other way)."""
    return sum(state.counts.histogram[: size_bucket(target_file_size // 2)])


def compact_if_due(
    storage: Storage,
    state: TableState,
    *,
    write_options: WriteOptions | None = None,
    min_small: int = AUTO_COMPACT_MIN_SMALL,
    min_files: int = AUTO_COMPACT_MIN_FILES,
    tier_ratio: int | None = AUTO_COMPACT_TIER_RATIO,
    due: int = 0,
) -> AutoCompaction | None:
    """After a commit whose folded state is ``state``: compact (bins of ``min_files`` or more)
    when at least ``min_small`` small files (and ``due``: the last one's ``next_due``) are live;
    None when not due. Never raises (but for BaseExceptions: a kill is a kill). The
    simulation's writers call it with small numbers."""
    small = small_files(state)
    if small < max(min_small, due):
        return None
    began = time.monotonic()
    try:
        report = compact(
            storage,
            min_files=min_files,
            max_input=AUTO_COMPACT_MAX_INPUT,
            write_options=write_options,
            check_store=False,  # the writer's run checked the store when it started
            trigger="auto",
            tier_ratio=tier_ratio,
        )
    except Exception as exc:  # noqa: BLE001 -- the batch is committed: compaction waits for the next turn
        log.warning("auto-compaction of %s after version %d failed (the query goes on): %s",
                    storage.url, state.version, exc)  # fmt: skip
        return AutoCompaction(None, time.monotonic() - began)
    seconds = time.monotonic() - began
    log.info("auto-compaction of %s after version %d: %s (%d small files; %.2f s)",
             storage.url, state.version, report.status, small, seconds)  # fmt: skip
    return AutoCompaction(report, seconds, small + min_small if report.status == "nothing_to_do" else 0)
