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


def parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items``, :data:`READ_BATCH` at a time in threads, results in order."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(READ_BATCH, len(items))) as pool:
        return list(pool.map(fn, items))
