"""The versioned log's files and how they are read: names, the folder, the default checkpoint
interval, and the bounded parallel read both the log (``vlog``) and its checkpoints
(``checkpoint``) use -- below both, so that neither imports the other to get them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lakesink_reader.names import META_DIR

LOG_DIR = f"{META_DIR}/log"
#: Commits read at once: on an object store each read is a request of tens of ms.
READ_BATCH = 16
_COMMIT_NAME = re.compile(r"^(?P<version>\d{20})\.json$")

#: Default of table.json's ``checkpoint_interval``: a checkpoint at every version ``c % N == 0``.
DEFAULT_CHECKPOINT_INTERVAL = 100

T = TypeVar("T")
R = TypeVar("R")


def commit_name(version: int) -> str:
    """The name of the commit of ``version`` (zero-padded: a listing sorts by version)."""
    if version < 0:
        raise ValueError(f"a log version must be >= 0, got {version}")
    return f"{LOG_DIR}/{version:020d}.json"


def parse_commit_name(base_name: str) -> int | None:
    """The version of a commit's base name in the log folder; None for anything else
    (checkpoints, the hint, staged copies)."""
    match = _COMMIT_NAME.match(base_name)
    return int(match.group("version")) if match else None


def read_threads(storage: object) -> int:
    """Threads for reading many small log files from ``storage``: its ``read_threads`` when it
    says (local disk: 1), else :data:`READ_BATCH`. A read that waits on the network gains from
    threads; a local one is ~30 us of system calls and ~50 us of Python holding the GIL, and
    threads only contend for it (a commit header: 75-85 us read in turn, 130-250 us with 2-16
    threads; session 19, docs/design/performance.md)."""
    threads: int = getattr(storage, "read_threads", READ_BATCH)
    return threads


def parallel(fn: Callable[[T], R], items: Sequence[T], threads: int = READ_BATCH) -> list[R]:
    """``fn`` over ``items``, ``threads`` at a time in threads (:func:`read_threads` says how
    many a store gains from), results in order."""
    if len(items) <= 1 or threads <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        return list(pool.map(fn, items))
