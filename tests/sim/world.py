"""The simulated world: one seeded scheduler, one clock, actors that run one at a time.

Each actor is a thread, but only the one that holds the baton runs: every storage call (and
every ``time.sleep``) is a *scheduling point* where the actor hands the baton back to the
scheduler (:meth:`World.point`), which then picks the next actor to resume with its seeded RNG
and decides the fault the resumed call meets. Threads rather than greenlets: the real code
calls storage synchronously from deep inside (pyarrow's writer calls ``write`` on the staged
file), so an actor must be able to stop anywhere on its own stack, and the standard library
has no other way to do that (greenlet is not a dependency of lakesink).

Time is simulated: the clock moves only when the scheduler says (a small step per storage
call, to the next wake-up when every actor sleeps), and each actor reads it with its own
offset (clock skew). A killed actor (kill -9) raises :class:`Killed` at its scheduling point,
and every later storage call of it raises :class:`Killed` again without touching the store:
its ``finally`` blocks and cleanup handlers run (Python cannot stop a thread otherwise) but
change nothing, which is what a process killed with -9 does. It keeps the baton until its
thread ends, so even its dying steps are deterministic.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The simulated epoch every seed starts at (2026-01-01T00:00:00Z): wall-clock free.
START = 1_767_225_600.0
#: How long the scheduler waits for an actor to reach its next scheduling point before it
#: calls it a hang (a real deadlock, or code that blocks outside the simulated store).
STEP_TIMEOUT = 120.0


class Killed(BaseException):
    """The actor was killed (kill -9): raised at its scheduling points, never caught by lakesink's
    ``except Exception`` cleanup, so the actor's thread unwinds without storage effects."""


class Hang(Exception):
    """An actor did not come back to the scheduler within STEP_TIMEOUT (wall clock)."""


@dataclass
class Actor:
    name: str
    body: Callable[[Actor], Any]
    offset: float = 0.0  # clock skew: this actor's clock reads world.now + offset
    wake: float = 0.0  # sleeping until this (simulated) time
    stalled: int = 0  # stalled until the world has taken this many steps
    op: str = "start"  # the call it is parked at
    target: str = ""
    done: bool = False
    killed: bool = False
    fault: str | None = None
    error: BaseException | None = None
    result: Any = None
    go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    thread: threading.Thread | None = None
    data: dict[str, Any] = field(default_factory=dict)  # the body's own notes (the writer's progress)
    #: A thread of another actor's process (``World.together``): it dies with that process, and
    #: its storage calls go through that actor's client as its own.
    parent: Actor | None = None
    #: The threads this actor waits for (``World.together``): it runs again when all have ended.
    joining: list[Actor] = field(default_factory=list)


class World:
    """The scheduler, the clock and the trace of one seed."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)  # scheduling and faults
        #: Whether the actors added after the first results run in a seed (and how): apart, so
        #: that a seed that does not pick them keeps its schedule (the regression seeds' holes).
        self.later = random.Random(seed ^ 0x1A7E)
        self.ids = random.Random(seed ^ 0x5EED)  # uuids, attempt ids, jitter: apart, so that
        # a change in how many ids the code draws does not reshuffle the schedule
        self.now = START
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self.trace: list[str] = []
        self.steps = 0
        self.redact = ""  # the lake's path, left out of the trace
        self._back = threading.Semaphore(0)
        #: Called by the scheduler when it resumes a parked call: returns the fault (or None).
        self.decide: Callable[[Actor], str | None] = lambda actor: None
        #: Called by the scheduler between steps (deferred requests, invariants).
        self.between: Callable[[], None] = lambda: None

    # Time, as the patched time.time / time.sleep see it ----------------------------------------

    def time(self) -> float:
        actor = self.current
        return self.now + (actor.offset if actor is not None else 0.0)

    def sleep(self, seconds: float) -> None:
        actor = self.current
        if actor is None or threading.current_thread() is not actor.thread:
            self.now += max(0.0, seconds)  # the scheduler's own code: time just passes
            return
        actor.wake = self.now + max(0.0, seconds)
        self.point(actor, "sleep", f"{seconds:.3g}s")

    def redacted(self, text: str) -> str:
        """``text`` without the lake's path: the scratch folder differs between runs, and a
        replay's trace must not (redact before cutting a message short, or a cut path stays)."""
        return text.replace(self.redact, "<lake>") if self.redact else text

    def note(self, text: str) -> None:
        text = self.redacted(text)
        self.trace.append(f"{self.steps:5d} {self.now - START:10.2f} {text}")

    # Actors ---------------------------------------------------------------------------------------

    def spawn(
        self, name: str, body: Callable[[Actor], Any], *, offset: float = 0.0, delay: float = 0.0
    ) -> Actor:
        actor = Actor(name, body, offset=offset, wake=self.now + delay)
        thread = threading.Thread(target=self._run_actor, args=(actor,), name=f"sim-{name}", daemon=True)
        actor.thread = thread
        self.actors.append(actor)
        thread.start()
        self.note(f"{name}: spawned (skew {offset:+.0f} s, starts in {delay:.0f} s)")
        return actor

    def together(self, thunks: Sequence[Callable[[], None]]) -> None:
        """``lakesink.views.derived.in_threads`` in the simulation: each thunk runs as an actor of
        its own (a thread of the current actor's process, scheduled like any actor: every
        interleaving of their storage calls is a schedule the seed may pick), and the current
        actor waits until all have ended; the first error of one is raised in it, as
        ``in_threads`` raises it. A kill of any of them is the kill of the whole process."""
        parent = self.current
        if parent is None or threading.current_thread() is not parent.thread:
            for thunk in thunks:  # the scheduler's own code: no process to run threads in
                thunk()
            return
        children = []
        for i, thunk in enumerate(thunks):
            child = self.spawn(f"{parent.name}.t{i}", lambda _actor, t=thunk: t(), offset=parent.offset)
            child.parent = parent
            children.append(child)
        parent.joining = children
        try:
            self.point(parent, "join", f"{len(children)} threads")
        finally:
            parent.joining = []
        for child in children:
            if child.error is not None:
                raise child.error

    def process_of(self, actor: Actor) -> list[Actor]:
        """The actors of ``actor``'s process: its root and every thread under it."""

        def root(a: Actor) -> Actor:
            while a.parent is not None:
                a = a.parent
            return a

        mine = root(actor)
        return [a for a in self.actors if root(a) is mine]

    def _run_actor(self, actor: Actor) -> None:
        actor.go.acquire()  # wait for the first resume
        try:
            if actor.killed:
                raise Killed()
            actor.result = actor.body(actor)
        except Killed:
            actor.killed = True
        except BaseException as exc:  # noqa: BLE001 - recorded, the scheduler judges it
            actor.error = exc
        finally:
            actor.done = True
            self._back.release()

    def point(self, actor: Actor, op: str, target: str) -> str | None:
        """A scheduling point of ``actor`` before its call ``op`` on ``target``: hand the baton
        back, wait to be resumed; returns the fault the scheduler chose for this call."""
        if actor.killed:
            raise Killed()
        actor.op, actor.target = op, target
        self._back.release()
        actor.go.acquire()
        if actor.killed:
            raise Killed()
        fault, actor.fault = actor.fault, None
        return fault

    def resume(self, actor: Actor, *, kill: bool = False, fault: str | None = None) -> None:
        """Let ``actor`` run until its next scheduling point (or its end)."""
        if kill:  # kill -9 ends the process: every thread of it dies at its next step
            for member in self.process_of(actor):
                member.killed = True
        actor.fault = fault
        self.current = actor
        actor.go.release()
        if not self._back.acquire(timeout=STEP_TIMEOUT):
            raise Hang(
                f"{actor.name} did not reach a scheduling point within {STEP_TIMEOUT:.0f} s at {actor.op}"
            )
        self.current = None
        self.steps += 1

    def runnable(self) -> list[Actor]:
        return [
            a
            for a in self.actors
            if not a.done
            and a.wake <= self.now
            and a.stalled <= self.steps
            and all(c.done for c in a.joining)
        ]

    def live(self) -> list[Actor]:
        return [a for a in self.actors if not a.done]

    def kill_all(self, why: str) -> None:
        for actor in self.live():
            self.note(f"{actor.name}: killed ({why})")
            self.resume(actor, kill=True)
