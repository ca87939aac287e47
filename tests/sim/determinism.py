"""What the simulation patches in its own process so that one seed replays exactly.

The simulation owns its process (``python -m tests.sim``), so it may replace process-global
things that a library must never touch; nothing here is imported by lakesink or by a pytest
process (the pytest wrapper runs the simulation as a subprocess):

- ``time.time`` reads the world's clock (with the running actor's skew); ``time.sleep`` is a
  scheduling point that advances it;
- ``uuid.uuid4`` (table ids, commit tokens, attempt ids, op tokens) draws from the seed;
- ``VersionedLogWriter``'s backoff: its default ``sleep`` (bound when the class was defined, so the
  ``time.sleep`` patch does not reach it) and its jitter RNG (``random.Random()`` seeded from
  the OS) come from the world;
- ``parallel`` (``lakesink_reader.format.v3.logfiles``), which reads headers and commits in a
  ThreadPoolExecutor, runs sequentially: a thread the scheduler does not control would call
  the store outside any actor. Patched in every module that imported it, in this process only:
  a library switch (say, the storage declaring how many reads it wants at once) would be a
  new Storage protocol member for one test double; this keeps the library unchanged;
- a compaction's lease refresher thread (``_Lease``) does not start: it would call the store
  from a thread no actor owns, on the wall clock. The lease is still written at the start;
  a compaction that runs long in simulated time may then be abandoned by another one, which
  the protocol allows (the late compaction's commit is refused);
- the format-2 epoch log's ``EpochLog._parallel`` (its own ThreadPoolExecutor) runs
  sequentially too (the upgrade world reads and writes format-2 logs).

``PYTHONHASHSEED`` must be fixed too (sets of strings iterate in hash order): ``__main__``
re-executes itself with it set.
"""

from __future__ import annotations

import sys
import time
import types
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from tests.sim.world import World

T = TypeVar("T")
R = TypeVar("R")

_installed: World | None = None


def sequential(fn: Callable[[T], R], items: Sequence[T], threads: int = 1) -> list[R]:
    """``logfiles.parallel`` in a world: in turn, whatever ``threads`` says."""
    return [fn(item) for item in items]


def install(world: World) -> None:
    """Point the process's clock, ids and hidden threads at ``world`` (the latest one installed)."""
    global _installed
    first = _installed is None
    _installed = world
    if not first:
        return
    import importlib
    import random

    # Import everything that binds `parallel` by name before replacing it.
    import lakesink.commit.versions as versions
    import lakesink.maintenance.sweep
    import lakesink.maintenance.upgrade
    import lakesink.maintenance.vacuum
    import lakesink.maintenance.verify
    import lakesink.views.delta_view
    import lakesink.views.spark_metadata_view  # noqa: F401
    import lakesink_reader.format.v3.checkpoint
    import lakesink_reader.format.v3.logfiles as logfiles
    import lakesink_reader.format.v3.vlog
    import lakesink_reader.lake
    import lakesink_reader.v3  # noqa: F401

    # (lakesink.maintenance exports a function named compact, which hides the module.)
    compact = importlib.import_module("lakesink.maintenance.compact")

    def now() -> float:
        assert _installed is not None
        return _installed.time()

    def sleep(seconds: float) -> None:
        assert _installed is not None
        _installed.sleep(seconds)

    def uuid4() -> uuid.UUID:
        assert _installed is not None
        return uuid.UUID(int=_installed.ids.getrandbits(128), version=4)

    def jitter_rng() -> random.Random:
        assert _installed is not None
        if _installed.current is None:
            # The scheduler's own reads (the invariants' god's-eye view) never back off: they
            # draw nothing, so that how often they open a log cannot reshuffle the actors' ids.
            return random.Random(0)
        return random.Random(_installed.ids.getrandbits(64))

    time.time = now
    time.sleep = sleep
    uuid.uuid4 = uuid4
    defaults = versions.VersionedLogWriter.__init__.__kwdefaults__
    assert defaults is not None and "sleep" in defaults
    defaults["sleep"] = sleep
    versions.random = types.SimpleNamespace(Random=jitter_rng)  # type: ignore[assignment]
    original = logfiles.parallel
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "parallel", None) is original:
            module.parallel = sequential  # type: ignore[attr-defined]
    # The format-2 epoch log reads records in its own ThreadPoolExecutor (the upgrade world).
    import lakesink_reader.format.log as epoch_log

    epoch_log.EpochLog._parallel = lambda self, fn, items: [fn(item) for item in items]  # type: ignore[method-assign]
    compact._Lease.start = compact._Lease.put  # type: ignore[method-assign]
    compact._Lease.stop = lambda self: None  # type: ignore[method-assign]
