"""What a process knows of one lake's derived view (``_delta_log/``, ``_spark_metadata/``)
between the commits it writes.

A writer's driver, compaction and vacuum continue a view after each lake commit; remembering
where the view stands (its last version known to hold lakesink's bytes, whether a foreign
writer stopped it, the commit times its snapshots need) saves a listing and a read per commit.
Like the writer's run memo (``lakesink.spark.runs``), it is kept so that nothing can trip over
it:

- **keyed by the lake's table id** (with its URL): a lake deleted and recreated at the same
  path has a new table id, so it starts from nothing; two queries on one lake share what they
  know of its view, which is a fact of the lake, not of a query;
- **only time is saved**: every fact is checked before it is relied on (a view version is
  written create-if-absent and read back when it exists), and a memo lost to the bound below,
  another process, or ``forget`` (after a sync) means the view is looked at again;
- **bounded**: the lakes seen last, at most :data:`MAX_LAKES` per kind of view.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

#: Lakes remembered per process and view kind: a driver writes a handful of lakes at a time.
MAX_LAKES = 64

Memo = TypeVar("Memo")


class ViewMemos(Generic[Memo]):
    """One kind of view's memos, by (lake URL, table id), the least recently used dropped first."""

    def __init__(self, fresh: Callable[[], Memo]) -> None:
        self._fresh = fresh
        self._memos: OrderedDict[tuple[str, str], Memo] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, url: str, table_id: str) -> Memo:
        """The memo of the lake at ``url`` with ``table_id`` (a fresh one the first time)."""
        key = (url, table_id)
        with self._lock:
            memo = self._memos.get(key)
            if memo is None:
                memo = self._memos[key] = self._fresh()
                while len(self._memos) > MAX_LAKES:
                    self._memos.popitem(last=False)
            else:
                self._memos.move_to_end(key)
            return memo

    def forget(self, url: str, table_id: str) -> None:
        """Drop the memo of one lake: the next commit looks at its view afresh."""
        with self._lock:
            self._memos.pop((url, table_id), None)
