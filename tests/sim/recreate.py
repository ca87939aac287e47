"""The recreate world: the lake deleted and created again while its queries run (fault 12 of
docs/FORMAT.md).

A user resets a lake: everything under its root is deleted and a new table is made there (a
new ``table_id``), while the streaming queries that wrote the old one go on. What lakesink must
keep, from then on, is the new lake: readable, each of its batches whole and once. A query
whose checkpoint is past its first batch can never write into the new lake (it "is new to this
lake but commits batch b"): its user starts it again with a new checkpoint, which re-reads the
stream from the start. A query still at its first batch goes on, and must not commit into the
new lake what it wrote for the old one -- or a batch its tasks skipped as "committed" on the
strength of the old lake's log (``commit-skips-tasks-skipped-check``, issue 50's mutant).

The fault model allows the reset *between* the calls that act on one lake version: no commit
call, maintenance run or read in flight, no request of the old lake still queued (fault 12 says
why: a create that lands in a new lake cannot be told from the new lake's own). The world keeps
that rule with a count of those calls (:meth:`RecreateWorld.busy`), and the recreate actor
waits for the count to be zero.

In half of the recreate seeds the reset is aimed at a writer's batch 0, between its tasks and
its commit call, in one of two ways. ``replay``: the writer is killed right after the create of
its batch 0's commit (before Spark records the batch), and the reset waits for its restart's
tasks, which take batch 0 for a replay (the old lake's log holds it) while the new lake holds
nothing of it. ``first``: the reset comes after the tasks of a writer's first batch 0 wrote
their files into the old lake (deleted with it).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tests.sim.world import START, Actor

if TYPE_CHECKING:
    from tests.sim.actors import WriterPlan
    from tests.sim.run import Env

LOG_ENTRY = re.compile(r"_lakesink/log/\d{20}\.json$")
#: How often the recreate actor looks for its moment (simulated seconds): a step each time.
POLL = 30.0
#: How long the tasks of batch 0 take at most to end (simulated seconds), in an aimed seed: the
#: moment the reset is aimed at.
REPLAY_DRAIN = 3600.0
#: How long an aimed reset waits for a replay before it resets the lake anyway.
AIM_DEADLINE = 4 * 3600.0


def picks_recreate(seed: int) -> random.Random | None:
    """The world's own generator when ``seed`` is a recreate world (its draws apart, so that
    other seeds keep their schedules), else None."""
    rng = random.Random(seed ^ 0x2EC8)
    return rng if rng.random() < 0.15 else None


class RecreateWorld:
    def __init__(self, env: Env, rng: random.Random) -> None:
        self.env = env
        self.rng = rng
        aimed = rng.random() < 0.5  # drawn first: the draws' order keeps the seeds' schedules
        self.in_flight = 0
        #: The aimed reset's moment came (:meth:`planned`): it waits only for quiet now.
        self.due = False
        self.killed_after_create = False
        self.done = False
        self.actor: Actor | None = None
        #: A reset not aimed comes this long after the seed starts (simulated seconds).
        self.after = rng.choice([10.0, 60.0, 300.0])
        #: What an aimed reset waits for (the module docstring): "replay" or "first"; None: not aimed.
        self.aim = ("replay" if rng.random() < 0.5 else "first") if aimed else None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """A call that acts on one lake version (a commit, an abort, a maintenance run, a
        read): the lake is not reset while it runs."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def quiet(self) -> bool:
        return self.in_flight == 0 and not self.env.shared.deferred

    # The aimed order ----------------------------------------------------------------------------

    def kill_after_first_create(
        self, actor: Actor, plan: WriterPlan | None, last: tuple[str, str] | None
    ) -> bool:
        """In an aimed seed: kill the writer at the step right after (``last``, its previous
        call) the create of its batch 0's commit (the batch in the log, not in Spark's commit
        log), once."""
        if self.aim != "replay" or self.killed_after_create or self.done:
            return False
        if plan is None or plan.next_batch != 0:
            return False
        if last is None or last[0] != "put_if_absent" or not LOG_ENTRY.search(last[1]):
            return False
        self.killed_after_create = True
        self.env.world.note(f"{actor.name}: killed right after its first batch's create (aim_recreate)")
        return True

    def planned(self, plan: WriterPlan, batch: int, committed_through: int | None) -> bool:
        """The tasks of ``batch`` ran (``committed_through``: the run's plan's): True when the
        aimed reset is due now, before the commit call (the writer then calls :meth:`drain`).
        ``replay``: batch 0 that the plan took for a replay (the log at the run's start held
        it); ``first``: batch 0 written (its files in the lake)."""
        if self.aim is None or self.done or batch != 0:
            return False
        replay = committed_through is not None and batch <= committed_through
        if replay != (self.aim == "replay"):
            return False
        self.due = True
        what = "planned as a replay" if replay else "written"
        self.env.world.note(f"writer {plan.index}: batch {batch} {what}: the reset is due")
        return True

    def drain(self) -> None:
        """The batch's tasks end slowly: until the reset came, or ``REPLAY_DRAIN`` passed (the
        others' calls in flight may keep it away)."""
        import time

        waited = 0.0
        while not self.done and waited < REPLAY_DRAIN:
            time.sleep(POLL)
            waited += POLL

    # The actor ----------------------------------------------------------------------------------

    def spawn(self) -> None:
        self.actor = self.env.world.spawn("recreate", self.actor_body)

    def restart(self) -> None:
        """The reset still to come when its actor was killed (the busy phase's end)."""
        if not self.done and self.actor is not None and self.actor.done:
            self.spawn()

    def actor_body(self, actor: Actor) -> str:
        import time

        world = self.env.world
        deadline = START + (AIM_DEADLINE if self.aim else self.after)
        while True:
            time.sleep(POLL if self.aim and not self.due else 1.0)
            if (self.due or world.now >= deadline) and self.quiet():
                self.recreate()
                return "recreated the lake"

    def recreate(self) -> None:
        """Delete everything under the lake's root and create a new table there, in one step
        (nobody else runs meanwhile); then the model starts again from the new lake."""
        from lakesink_reader.format.table import ensure_table
        from tests.sim import actors

        env = self.env
        root = env.root
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        env.shared.times.clear()
        env.shared.dirty = True
        meta = ensure_table(env.client(None), actors.SCHEMA, "epoch", checkpoint_interval=env.interval)
        assert meta.table_id is not None
        old, env.table_id = env.table_id, meta.table_id
        self.done = True
        env.world.note(f"recreate: the lake deleted and created anew (table {old[:8]} -> {env.table_id[:8]})")
        env.checker.forget_lake()
        for plan in list(env.writers):
            plan.acked.clear()  # the old lake's acknowledgements: gone with it, by the user's hand
            if plan.abandoned or plan.next_batch == 0:
                continue  # a query at its first batch goes on into the new lake
            # Its checkpoint is past batch 0: the new lake refuses it for good. Its user starts
            # it again with a new checkpoint location, which re-reads the stream from the start.
            plan.abandoned = True
            fresh = env.add_writer(
                batches=plan.base + plan.batches,
                stream=plan.stream,
                allow_other_queries=True,
                offset=plan.actor.offset if plan.actor is not None else 0.0,
            )
            fresh.iceberg = plan.iceberg
            env.world.note(f"recreate: writer {plan.index}'s query starts again as writer {fresh.index}")
