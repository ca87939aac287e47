"""The simulated store: the real ``LocalStorage`` behind a seam where every call is a scheduling
point and may meet a fault.

:class:`SimStore` is a ``Storage`` (it passes ``lakesink.storage_contract`` with faults off,
tests/test_simulation.py). Without a world it only delegates. With one, each call of an actor:

1. parks at a scheduling point (``World.point``); the scheduler resumes it with a fault or none;
2. ``fail``: raises :class:`SimIOError` and changes nothing (a failed request); ``delete``
   is the same for deletes (a separate switch: issue 32's hole 2);
3. ``late``: raises :class:`SimIOError` as a client timeout would, and keeps the request
   *pending*: the scheduler applies it at a later step of its choosing, or never (a proxy
   queue, an S3 request inside its signature window) -- writes only;
4. ``lost``: applies the request, then raises :class:`SimIOError` (the answer was lost);
5. ``dup``: applies the request and answers, and keeps a copy *pending*, applied again at a
   later step (a request a proxy delivered twice) -- writes only;
6. ``list`` (listings only): a listing is two scheduling points, and an object created or
   removed between them may or may not be in it -- a paged listing is no snapshot, which is
   all the contract lets a store do (objects there before the listing started and still there
   at its end are always listed).

A killed actor's calls raise ``Killed`` before any effect. Reads of Parquet data go through
``arrow_filesystem()``, which is the real local file system: no scheduling point, no fault
(docs/design/simulation.md, "Not yet covered").

File times are simulated too: the store records the (simulated) time each name was created,
and ``list``/``staged`` report those, never the disk's mtimes; a published file keeps its
staged file's time, as a hard link keeps its inode's mtime.
"""

from __future__ import annotations

import builtins
import errno
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from lakesink_reader.storage.base import Sealed, StagedEntry, StoredFile
from lakesink_reader.storage.local import LocalSealed, LocalStorage

if TYPE_CHECKING:
    import pyarrow.fs

    from tests.sim.world import Actor, World

T = TypeVar("T")


#: The faults each call may meet (kill aside, which any call may meet).
OP_FAULTS: dict[str, tuple[str, ...]] = {
    "put_if_absent": ("fail", "lost", "late", "dup"),
    "put": ("fail", "lost", "late", "dup"),
    "delete": ("delete", "lost", "late", "dup"),
    "drop_staged": ("delete", "lost", "late", "dup"),
    "publish": ("fail", "lost"),
    "supersede": ("fail", "lost"),  # a foreach file's replacement (the epoch world never calls it)
    "discard": ("delete",),
    "discard_staged": ("delete",),
    "read_data": (),  # a scheduling point only (kills and stalls are the scheduler's)
    "list": ("fail", "list"),
}
#: Every other call (reads, stage, seal, discard, ...) may fail, never apply late.
READ_FAULTS = ("fail",)


def store_fault(
    shared: Shared, actor: Actor, rng: random.Random, p_fault: float, p_outage: float
) -> str | None:
    """The store fault (of those the seed turned on) the actor's parked call meets, or None: an
    outage under way repeats its kind; else one with chance ``p_fault``, which starts an outage
    (the next 3-10 calls of this client fail so too) with chance ``p_outage``."""
    allowed = sorted(set(OP_FAULTS.get(actor.op, READ_FAULTS)) & shared.faults)
    outage = actor.data.get("outage")
    if outage is not None:  # this client's requests keep failing so for a while
        kind, left = outage
        actor.data["outage"] = (kind, left - 1) if left > 1 else None
        if kind in allowed:
            return str(kind)
    if p_fault and rng.random() < p_fault and allowed:
        kind = rng.choice(allowed)
        if rng.random() < p_outage:
            actor.data["outage"] = (kind, rng.choice([3, 6, 10]))
            assert shared.world is not None
            shared.world.note(f"{actor.name}: an outage of {kind} starts")
        return kind
    return None


def new_connection(actor: Actor) -> bool:
    """The actor's next call comes from another process (a fresh Spark worker): an outage under
    way on its old connection does not follow it there. True when one was under way."""
    return actor.data.pop("outage", None) is not None


class SimIOError(OSError):
    """A simulated I/O failure: a timeout, a reset, a 503. Whether it was applied, the caller
    cannot tell (that is the point)."""


@dataclass
class Deferred:
    """A request the client gave up on that the store may still apply."""

    actor: str
    op: str
    name: str
    apply: Callable[[], Any]
    at: float | None = None  # when it lands (simulated time; inf: never), set by the scheduler
    #: Held until its caller gave up and cleaned up (a writer's abort call has run, a compaction
    #: returned), then landed (``release_held``): the order issue 50's hole needs, aimed at.
    until_abort: bool = False


def release_held(shared: Any, actor: Actor) -> None:
    """``actor`` gave up on its held create and cleaned up after it (a writer's abort call has
    run, a compaction returned): the held requests land at the next step."""
    actor.data.pop("held_create", None)
    for request in shared.deferred:
        if request.actor == actor.name and request.until_abort:
            request.until_abort, request.at = False, shared.world.now


class Shared:
    """What every actor's view of the store shares: the disk, the simulated file times, and
    the requests still pending."""

    def __init__(self, raw: LocalStorage, world: World | None) -> None:
        self.raw = raw
        self.world = world
        self.times: dict[str, float] = {}
        self.deferred: list[Deferred] = []
        self.dirty = False  # something a reader sees changed since the invariants were checked
        self.faults: frozenset[str] = frozenset()
        #: Whether a read of Parquet data (``arrow_filesystem``) is a scheduling point too: a
        #: reader's log read and its data read then straddle maintenance (issue 50, item 3).
        self.data_points = False

    def stamp(self, name: str, when: float | None = None) -> None:
        if self.world is not None:
            self.times[name] = self.world.now if when is None else when
        # What a reader of the latest version sees changes only with the log (commits,
        # checkpoints, the hint) or a view's files: a new data file is nobody's until a commit
        # lists it.
        self.dirty = self.dirty or seen_by_readers(name)

    def forget(self, name: str) -> None:
        self.times.pop(name, None)
        base = name.rsplit("/", 1)[-1]
        self.dirty = self.dirty or seen_by_readers(name) or not base.startswith((".", "_"))


def seen_by_readers(name: str) -> bool:
    """Whether a change of ``name`` can change what a reader reads: an entry of the lake's log,
    or a file of a view (a Delta or Spark reader reads the view's newest version: a view written
    wrong and put right before the lake's next commit is still a wrong read -- issue 50, item 3).
    Hidden staged names are nobody's."""
    base = name.rsplit("/", 1)[-1]
    return name.startswith(("_lakesink/log/", "_delta_log/", "_spark_metadata/")) and not base.startswith(".")


class SimStagedFile:
    """The real staged file, with ``seal`` and ``discard`` as scheduling points and writes of a
    killed actor refused."""

    def __init__(self, store: SimStore, inner: Any) -> None:
        self._store, self._inner = store, inner
        self.name = inner.name

    def write(self, data: bytes | memoryview, /) -> int:
        self._store._alive()
        return int(self._inner.write(data))

    def tell(self) -> int:
        return int(self._inner.tell())

    def flush(self) -> None:
        self._store._alive()
        self._inner.flush()

    def close(self) -> None:
        self._store._alive()
        self._inner.close()

    @property
    def closed(self) -> bool:
        return bool(self._inner.closed)

    def seal(self) -> Sealed:
        return self._store._call("seal", self.name, self._inner.seal)

    def discard(self) -> None:
        def discard() -> None:
            self._inner.discard()
            self._store.shared.forget(self._inner._staged)

        self._store._call("discard_staged", self.name, discard)


class SimStore:
    """One actor's client of the simulated store (``actor`` None: the scheduler's own, fault-free)."""

    def __init__(self, shared: Shared, actor: Actor | None = None) -> None:
        self.shared = shared
        self.raw = shared.raw
        self.actor = actor
        self.url = self.raw.url

    @classmethod
    def plain(cls, root: str) -> SimStore:
        """A store without a world: every call delegates (the storage contract's fixture)."""
        return cls(Shared(LocalStorage(root), None))

    def __repr__(self) -> str:
        return f"SimStore({self.raw.root!r}, actor={self.actor.name if self.actor else None})"

    # The seam -------------------------------------------------------------------------------------

    def _acting(self) -> Actor | None:
        """Who makes the call: this client's actor, or a thread of its process that holds the
        baton (``World.together``: the views' hooks share the writer's client)."""
        world, actor = self.shared.world, self.actor
        current = world.current if world is not None else None
        if actor is not None and current is not None and current.parent is actor:
            return current
        return actor

    def _alive(self) -> None:
        from tests.sim.world import Killed

        actor = self._acting()
        if actor is not None and actor.killed:
            raise Killed()

    def _call(self, op: str, name: str, fn: Callable[[], T]) -> T:
        world, actor = self.shared.world, self._acting()
        if world is None or actor is None:
            return fn()
        fault = world.point(actor, op, name)
        if fault not in OP_FAULTS.get(op, READ_FAULTS) or fault not in self.shared.faults:
            fault = None
        held = op == "put_if_absent" and actor.data.get("held_create") == name
        if held:
            fault = "late"
        forced = actor.data.pop("forced", None)  # an aimed order's fault for this very call
        if forced is not None and forced[:2] == (op, name):
            fault = forced[2]
        if fault in ("fail", "delete"):
            raise SimIOError(errno.EIO, f"simulated: {op} {name} failed (not applied)")
        if fault == "late":
            self.shared.deferred.append(Deferred(actor.name, op, name, fn, until_abort=held))
            raise SimIOError(
                errno.ETIMEDOUT, f"simulated: {op} {name} timed out (the request is still queued)"
            )
        result = fn()
        if fault == "dup":
            # Delivered twice (a proxy retried it): applied and answered now, and again later.
            self.shared.deferred.append(Deferred(actor.name, op, name, fn))
        if fault == "lost":
            raise SimIOError(errno.ETIMEDOUT, f"simulated: {op} {name} timed out (it was applied)")
        return result

    # Storage ----------------------------------------------------------------------------------------

    def stage(self, name: str) -> SimStagedFile:
        def stage() -> SimStagedFile:
            inner = self.raw.stage(name)
            self.shared.stamp(inner._staged)
            return SimStagedFile(self, inner)

        return self._call("stage", name, stage)

    def publish(self, sealed: Sealed) -> bool:
        def publish() -> bool:
            won = self.raw.publish(sealed)
            if won and isinstance(sealed, LocalSealed):
                self.shared.stamp(sealed.name, self.shared.times.pop(sealed.staged, None))
            return won

        return self._call("publish", sealed.name, publish)

    def version(self, name: str) -> str | None:
        return self._call("version", name, lambda: self.raw.version(name))

    def supersede(self, sealed: Sealed, version: str) -> bool:
        def supersede() -> bool:
            done = self.raw.supersede(sealed, version)
            if done:
                self.shared.stamp(sealed.name)
            return done

        return self._call("supersede", sealed.name, supersede)

    def discard(self, sealed: Sealed) -> None:
        def discard() -> None:
            self.raw.discard(sealed)
            if isinstance(sealed, LocalSealed):
                self.shared.forget(sealed.staged)

        self._call("discard", sealed.name, discard)

    def staged(self, folder: str = "") -> builtins.list[StagedEntry]:
        def staged() -> builtins.list[StagedEntry]:
            found = sorted(self.raw.staged(folder), key=lambda e: e.handle)
            if self.shared.world is None:
                return found
            return [
                StagedEntry(e.name, e.kind, self.shared.times.get(e.handle, e.started), e.size, e.handle)
                for e in found
            ]

        return self._call("staged", folder, staged)

    def drop_staged(self, entry: StagedEntry) -> None:
        def drop() -> None:
            self.raw.drop_staged(entry)
            self.shared.forget(entry.handle)

        self._call("drop_staged", entry.handle, drop)

    def exists(self, name: str) -> bool:
        return self._call("exists", name, lambda: self.raw.exists(name))

    def refuse_link(self, name: str) -> None:
        # A local check (lstat), no request to a store: not a scheduling point.
        self.raw.refuse_link(name)

    def list(self, folder: str = "") -> builtins.list[StoredFile]:
        world, actor = self.shared.world, self._acting()
        if world is None:
            return self.raw.list(folder)
        if actor is None:
            return self._listed(folder)
        fault = world.point(actor, "list", folder)
        if fault == "fail" and "fail" in self.shared.faults:
            raise SimIOError(errno.EIO, f"simulated: list {folder} failed")
        first = self._listed(folder)
        if fault != "list" or "list" not in self.shared.faults:
            return first
        # A paged listing is no snapshot: what changed while it ran may or may not be in it.
        world.point(actor, "list_end", folder)
        last = self._listed(folder)
        before = {f.name: f for f in first}
        after = {f.name: f for f in last}
        rng = world.rng
        names = sorted(set(before) | set(after))
        kept = [n for n in names if (n in before and n in after) or rng.random() < 0.5]
        missed = [n for n in names if n not in kept]
        if missed:
            world.note(f"{actor.name}: listing of {folder or '/'} misses {missed}")
        return [after.get(n) or before[n] for n in kept]

    def _listed(self, folder: str) -> builtins.list[StoredFile]:
        times = self.shared.times
        return sorted(
            (StoredFile(f.name, f.size, times.get(f.name, f.modified)) for f in self.raw.list(folder)),
            key=lambda f: f.name,
        )

    def folders(self, folder: str = "") -> builtins.list[str]:
        return self._call("folders", folder, lambda: sorted(self.raw.folders(folder)))

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        return self._call(
            "read",
            name,
            lambda: self.raw.read_bytes(name, first_contact=first_contact, limit=limit),
        )

    def put_if_absent(self, name: str, data: bytes) -> bool:
        def put_if_absent() -> bool:
            created = self.raw.put_if_absent(name, data)
            if created and name not in self.shared.times:
                self.shared.stamp(name)
            return created

        return self._call("put_if_absent", name, put_if_absent)

    def put(self, name: str, data: bytes) -> None:
        def put() -> None:
            self.raw.put(name, data)
            self.shared.stamp(name)

        self._call("put", name, put)

    def delete(self, name: str) -> None:
        def delete() -> None:
            if os.path.lexists(self.raw.path_of(name)):
                self.raw.delete(name)
                self.shared.forget(name)

        self._call("delete", name, delete)

    def root_exists(self) -> bool:
        return self._call("root_exists", "", self.raw.root_exists)

    def check_conditional_writes(self, name: str) -> None:
        from lakesink_reader.storage.base import check_put_if_absent

        # Over this seam, not the raw store's: the probe's requests are scheduling points too.
        try:
            check_put_if_absent(self, name, f"file {name}", f"the simulated store replaced {name}")
        finally:
            try:
                self.delete(name)
            except OSError:
                pass  # a failed cleanup of the probe: the sweep removes it later

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        # The file system itself is the real local one (no fault, no point inside a read): the
        # point is before the data read starts, where a vacuum or a compaction may run whole.
        if not self.shared.data_points:
            return self.raw.arrow_filesystem()
        return self._call("read_data", "", self.raw.arrow_filesystem)
