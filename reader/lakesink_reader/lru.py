"""A process's memo of a bounded number of things, the least recently used dropped first.

What a process keeps to save time -- storage clients (``lakesink_reader.storage``), a run's
memo (``lakesink.writer.memo``), what it knows of a lake's views (``lakesink.views.memo``) --
is kept here: keyed by what makes the thing, made on first use, bounded, and safe to share
between threads. Losing an entry only costs making it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruMemo(Generic[K, V]):
    """At most ``bound`` values by key, each made by ``make`` the first time it is asked for."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._values: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, made now if this process has none (or dropped it)."""
        with self._lock:
            value = self._values.get(key)
            if value is None:
                value = self._values[key] = make()
                while len(self._values) > self.bound:
                    self._values.popitem(last=False)
            else:
                self._values.move_to_end(key)
            return value

    def pop(self, key: K) -> None:
        """Forget ``key``'s value: the next ``get`` makes it again."""
        with self._lock:
            self._values.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
