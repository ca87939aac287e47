"""What the derived views (``_delta_log/``, ``_spark_metadata/``, ``metadata/``) share: what a
process knows of one lake's view between the commits it writes, and the view's stop file.

A writer's driver, compaction and vacuum continue a view after each lake commit; remembering
where the view stands (its last version known to hold lakesink's bytes, whether a foreign
writer stopped it, the commit times its snapshots need) saves a listing and a read per commit.
Like the writer's run memo (``lakesink.writer.memo``), it is kept so that nothing can trip over
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

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from lakesink_reader import jsondoc, limits
from lakesink_reader.lru import LruMemo

if TYPE_CHECKING:
    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.format.v3.commits import Commit
    from lakesink_reader.storage.base import Storage

#: Lakes remembered per process and view kind: a driver writes a handful of lakes at a time.
MAX_LAKES = 64
#: Commit times a process keeps per lake, shared by its views: up to twice this, then the newest
#: this many (:meth:`ViewMemo.remember_time`).
MAX_TIMES = 100_000


class CommitTimes(dict[int, int]):
    """Lake version -> its commit's time in ms, shared by every kind of view of one lake: they
    are facts of the lake's log, and each view of a lake of a million files started from
    nothing needs the times of the versions that added them (a header read each: 100,000
    reads, ~8 s on local disk). ``filling`` is held while a view reads the ones it lacks, so
    that the views, which run in threads, read them once between them, not once each."""

    def __init__(self) -> None:
        super().__init__()
        self._filling = threading.Lock()

    @contextlib.contextmanager
    def filling(self) -> Iterator[None]:
        """Held while a view reads the times it lacks and takes what it needs, or while the
        bound trims them. Waited for by polling ``time.sleep``, not in the lock: a view waits
        for another's fill (seconds, on a lake of 100,000 versions), and under a cooperative
        scheduler -- the simulation's actors, where ``time.sleep`` is a scheduling point -- a
        thread blocked in a lock would stop every actor."""
        while not self._filling.acquire(blocking=False):
            time.sleep(0.005)
        try:
            yield
        finally:
            self._filling.release()


@dataclass
class ViewMemo:
    """What every kind of view remembers; a view's own memo adds its position in the view."""

    stop_checked: bool = False  # the stop file was looked for
    stopped: str | None = None  # why the view is not updated (its stop file's reason)
    interval: int | None = None  # the lake's checkpoint interval
    table: TableMetadata | None = None  # the lake's table.json, as given or read once
    #: Lake version -> its commit's time in ms (the ``modificationTime`` of the files it added);
    #: the lake's, shared by its views (``ViewMemos.get``).
    times: CommitTimes = field(default_factory=CommitTimes)
    warned: set[str] = field(default_factory=set)

    def remember_time(self, commit: Commit) -> None:
        """Keep ``commit``'s time (ms) for the view files that list its files, in a bounded
        cache (beyond it, headers or older view files say). Past twice the bound the newest
        :data:`MAX_TIMES` stay: a view started on a lake of 100,000 versions fills one entry a
        version, and the next view of that lake, or its next commit, must not lose them all."""
        times = self.times
        if len(times) >= 2 * MAX_TIMES:
            # Under the lock the views fill and read it with: never between a fill and its use.
            with times.filling():
                for version in sorted(times)[: len(times) - MAX_TIMES]:
                    times.pop(version, None)
        times[commit.version] = round(commit.header.committed_at * 1000)

    def warn_once(self, log: logging.Logger, key: str, message: str, *args: object) -> None:
        """Log ``message`` the first time ``key`` comes up for this lake's view."""
        if key not in self.warned:
            self.warned.add(key)
            log.warning(message, *args)


Memo = TypeVar("Memo", bound=ViewMemo)


_TIMES: LruMemo[tuple[str, str], CommitTimes] = LruMemo(MAX_LAKES)


class ViewMemos(Generic[Memo]):
    """One kind of view's memos, by (lake URL, table id), the least recently used dropped first."""

    def __init__(self, fresh: Callable[[], Memo]) -> None:
        self._fresh = fresh
        self._memos: LruMemo[tuple[str, str], Memo] = LruMemo(MAX_LAKES)

    def get(self, storage: Storage, table_id: str) -> Memo:
        """The memo of the lake in ``storage`` with ``table_id`` (a fresh one the first time),
        its commit times the lake's, shared with the other views' memos of it."""
        key = (storage.url, table_id)

        def fresh() -> Memo:
            memo = self._fresh()
            memo.times = _TIMES.get(key, CommitTimes)
            return memo

        return self._memos.get(key, fresh)

    def forget(self, storage: Storage, table_id: str) -> None:
        """Drop what this process knows of one lake's view (after a sync, in tests): the next
        commit looks at the view afresh."""
        self._memos.pop((storage.url, table_id))


class StopFile:
    """A view's stop file (``name``, under ``_lakesink/``): written when the view was found
    holding content lakesink did not derive; while it is there, no writer updates the view, and
    ``status``/``verify`` report its reason (``otherwise`` when it cannot be read)."""

    def __init__(self, name: str, otherwise: str, log: logging.Logger) -> None:
        self.name, self.otherwise, self._log = name, otherwise, log

    def mark(self, storage: Storage, version: int, reason: str) -> None:
        """Write the stop file; a failure to write it is only logged (the view stays stopped
        in this process, and the next one finds the foreign content again)."""
        try:
            doc = {"version": version, "reason": reason, "found_at": time.time()}
            storage.put(self.name, json.dumps(doc, sort_keys=True).encode())
        except Exception:  # noqa: BLE001 -- best effort: the view stays stopped in this process
            self._log.warning("could not write %s/%s", storage.url, self.name, exc_info=True)

    def stops(self, storage: Storage, memo: ViewMemo, view: str) -> bool:
        """Whether ``view`` (its name, for the log) is stopped: by ``memo``, or by the stop file,
        looked for once per memo (a process meets it at its first commit; `sync` forgets)."""
        if memo.stopped is not None:
            return True
        if not memo.stop_checked:
            if storage.exists(self.name):
                memo.stopped = self.reason(storage)
                memo.warn_once(
                    self._log, "stopped", "the %s of %s is not updated: %s", view, storage.url, memo.stopped
                )
                return True
            memo.stop_checked = True
        return False

    def reason(self, storage: Storage) -> str:
        try:
            return str(jsondoc.loads(limits.read(storage, self.name, limits.VIEW_NOTE))["reason"])[:500]
        except Exception:  # noqa: BLE001 -- only a message
            return f"{self.name} {self.otherwise}"
