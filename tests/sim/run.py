"""One seed: pick a world from it, run it to the end, check the invariants, report.

A seed picks (with the switches, ``Config``, bounding it): how many writers and batches, which
maintenance actors run and how often, each actor's clock skew, and the chances of each fault.
The scheduler then runs the actors one step at a time (``tests.sim.world``), checking the
invariants (``tests.sim.invariants``) after every step that changed the store; a step budget
ends the busy phase by killing whatever still runs. The final phase then settles the world,
fault-free: pending requests land or are dropped, each unfinished writer is restarted and
replays, and a final pass of vacuum, sweep and (with views) sync-views must converge.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.sim import actors, foreach, recreate
from tests.sim.determinism import install
from tests.sim.invariants import Checker, Violation
from tests.sim.store import OP_FAULTS, READ_FAULTS, Shared, SimStore, store_fault
from tests.sim.world import START, Actor, World

if TYPE_CHECKING:
    from tests.sim.recreate import RecreateWorld
    from tests.sim.upgrade import UpgradeWorld

FAULTS = ("lost", "late", "fail", "delete", "list", "kill", "stall", "skew", "dup", "clockstep", "lease")
ACTORS = (
    "writer",
    "vacuum",
    "compact",
    "sweep",
    "reader",
    "verify",
    "idle",
    "views",
    "multi",
    "continue",
    "foreach",
    "upgrade",
    "autocompact",
    "threads",
    "iceberg",
    "recreate",
)
#: Fault-free steps the settle phase gives the writers to finish their batches.
SETTLE_STEPS = 6000
#: The faults the store applies to a call (kill and skew are the scheduler's).
STORE_FAULTS = ("lost", "late", "fail", "delete", "list")  # and "dup", drawn apart (``_setup``)


@dataclass(frozen=True)
class Config:
    """Which faults and actors a seed may pick (the ``--faults`` / ``--actors`` switches)."""

    faults: frozenset[str] = frozenset(FAULTS)
    actors: frozenset[str] = frozenset(ACTORS)
    max_steps: int = 400
    #: The final pass starts with compact's abandon of dead ops (``settle_ops``).
    final_abandon: bool = True
    #: "upgrade": every seed is an upgrade world (``--world``; the seed's draw is made all the same).
    world: str = "any"
    #: "s3": the real S3Storage over in-process moto (``--store``; tests/sim/s3store.py).
    store: str = "local"

    @classmethod
    def parse(
        cls,
        faults: str,
        actors: str,
        max_steps: int = 400,
        final_abandon: bool = True,
        world: str = "any",
        store: str = "local",
    ) -> Config:
        f = frozenset(x for x in faults.split(",") if x) if faults != "all" else frozenset(FAULTS)
        a = frozenset(x for x in actors.split(",") if x) if actors != "all" else frozenset(ACTORS)
        for name, given, known in (("fault", f, FAULTS), ("actor", a, ACTORS)):
            unknown = sorted(given - set(known))
            if unknown:
                raise ValueError(f"unknown {name}(s) {unknown}; known: {', '.join(known)}")
        if world not in ("any", "upgrade"):
            raise ValueError(f"unknown world {world!r}; known: any, upgrade")
        if world == "upgrade":
            a |= {"upgrade"}
        if store not in ("local", "s3"):
            raise ValueError(f"unknown store {store!r}; known: local, s3")
        if store == "s3" and a & {"foreach", "upgrade"}:
            raise ValueError("--store s3 runs the epoch world: leave out the foreach and upgrade actors")
        return cls(f, a | {"writer"}, max_steps, final_abandon, world, store)

    def describe(self) -> str:
        text = f"--faults {','.join(sorted(self.faults)) or ','} --actors {','.join(sorted(self.actors))}"
        text += "" if self.world == "any" else f" --world {self.world}"
        text += "" if self.store == "local" else f" --store {self.store}"
        return text + ("" if self.final_abandon else " --no-final-abandon")


@dataclass
class Outcome:
    seed: int
    ok: bool
    violation: str | None
    trace: list[str]
    steps: int
    checks: int
    summary: dict[str, Any] = field(default_factory=dict)


class Env:
    """What the actors of one seed share: the world, the store, the lake, the writers."""

    def __init__(self, world: World, root: str, cfg: Config) -> None:
        from lakesink_reader.storage.local import LocalStorage

        self.world = world
        self.root = root
        self.cfg = cfg
        self.shared = Shared(LocalStorage(root), world)
        self.clients: dict[int, SimStore] = {}  # by actor (identity: two may share a name)
        self.table_id = ""
        self.interval = 4
        self.writers: list[actors.WriterPlan] = []
        self.checker = Checker(self)
        #: The fault a resumed call meets (set up per seed by ``_setup``).
        self.decide: Callable[[Actor], str | None] = lambda actor: None
        self.late_delays: list[float] = [1.0]  # how long a queued request waits before it lands
        self.p_burst = 0.0  # chance per step that the chosen actor runs alone for a while
        self.burst: tuple[Actor | None, int] = (None, 0)
        self.p_coincide = 0.0  # chance that a jump of the clock wakes every sleeper due within a day
        self.idle: list[float] = []  # the idle stretches writers may take between batches
        #: The foreach world (``tests.sim.foreach``) when the seed builds a foreach lake.
        self.foreach: foreach.ForeachWorld | None = None

        #: The upgrade world (``tests.sim.upgrade``; switch ``upgrade``), or None: a fresh lake.
        self.upgrade: UpgradeWorld | None = None
        #: The recreate world (``tests.sim.recreate``; switch ``recreate``), or None.
        self.recreate: RecreateWorld | None = None
        self.aim_gap = False  # an aimed order that needs a longer busy phase (``_setup``)

    def add_writer(
        self,
        *,
        batches: int,
        stream: int = -1,
        base: int = 0,
        continues: str | None = None,
        offset: float = 0.0,
        allow_other_queries: bool | None = None,
        views: bool | None = None,
    ) -> actors.WriterPlan:
        """A new streaming query (a fresh checkpoint), started now."""
        import uuid

        first = self.writers[0] if self.writers else None
        plan = actors.WriterPlan(
            len(self.writers),
            str(uuid.uuid4()),
            batches,
            allow_other_queries
            if allow_other_queries is not None
            else first is not None and first.allow_other_queries,
            views if views is not None else first is not None and first.views,
            stream=stream,
            base=base,
            continues=continues,
            auto_compact=first is not None and first.auto_compact,  # the same job, restarted
        )
        if first is not None:  # the same job, restarted: through the same door
            plan.door, plan.p_new_worker, plan.p_driver = first.door, first.p_new_worker, first.p_driver
        self.writers.append(plan)
        _start_writer(self, plan, offset=offset, idle=self.idle)
        return plan

    def client(self, actor: Actor | None) -> SimStore:
        key = id(actor) if actor is not None else 0
        if key not in self.clients:
            self.clients[key] = SimStore(self.shared, actor)
        return self.clients[key]


_current_env: Env | None = None


def _open_storage(path: str, options: Any = None) -> Any:
    """``open_storage`` for ``Lake(path)``: the running actor's client of the simulated store."""
    env = _current_env
    assert env is not None and os.path.abspath(path) == env.root, path
    return env.client(env.world.current)


def run_seed(seed: int, cfg: Config, *, base: str | None = None) -> Outcome:
    global _current_env
    import lakesink_reader.lake

    world = World(seed)
    install(world)
    lakesink_reader.lake.open_storage = _open_storage  # type: ignore[assignment]
    scratch = tempfile.mkdtemp(prefix=f"sim-{seed}-", dir=base)
    root = os.path.join(scratch, "lake")
    os.makedirs(root)
    world.redact = root
    env = Env(world, root, cfg)
    if cfg.store == "s3":
        from tests.sim import s3store

        s3store.attach(env)
    _current_env = env
    try:
        violation = _run(env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Outcome(
        seed,
        violation is None,
        None if violation is None else violation.replace(root, "<lake>"),
        world.trace,
        world.steps,
        env.checker.checks,
        {"writers": len(env.writers), "actors": len(world.actors)},
    )


def _run(env: Env) -> str | None:
    world = env.world
    try:
        _setup(env)
        _busy(env)
        _settle(env)
        _final(env)
    except Violation as exc:
        world.note(f"VIOLATION {exc}")
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a crash of the simulation is a failed seed too
        world.note(f"CRASH {type(exc).__name__}: {exc}")
        world.trace.extend(line.replace(env.root, "<lake>") for line in traceback.format_exc().splitlines())
        return f"crash: {type(exc).__name__}: {exc}"
    finally:
        # A world that ended early (a violation) leaves actors parked: kill them, so that their
        # threads end without touching the store.
        for actor in world.live():
            actor.killed = True
            actor.go.release()
    return None


def _setup(env: Env) -> None:
    import uuid

    from lakesink_reader.format.table import ensure_table

    world, cfg, rng = env.world, env.cfg, env.world.rng
    if foreach.picks_foreach(world.seed, cfg.actors):
        foreach.setup(env)
        return
    # The world, drawn here only: a fresh format-3 lake, or a format-2 lake to upgrade (the draw
    # happens whenever upgrade is allowed, so that --world upgrade keeps a seed's other choices).
    upgrading = "upgrade" in cfg.actors and (rng.random() < 0.3 or cfg.world == "upgrade")
    env.interval = rng.choice([2, 3, 4, 5])
    if upgrading:
        from tests.sim.upgrade import UpgradeWorld

        env.upgrade = UpgradeWorld.create(env)
    else:
        meta = ensure_table(env.client(None), actors.SCHEMA, "epoch", checkpoint_interval=env.interval)
        assert meta.table_id is not None
        env.table_id = meta.table_id
    faults = cfg.faults
    env.shared.faults = frozenset(f for f in STORE_FAULTS if f in faults and rng.random() < 0.7)
    # Issue 50's faults draw from a generator of their own: a seed that picks none of them keeps
    # the schedule it had. ``dup``: a write applied now and delivered again later (a proxy's
    # retry); ``clockstep``: an actor's clock steps mid-run (NTP); ``lease``: a compaction
    # pauses for long right after it put its lease (its refresher stalled with it).
    more = random.Random(world.seed ^ 0x50D0)
    if "dup" in faults and more.random() < 0.5:
        env.shared.faults = env.shared.faults | {"dup"}
    p_clockstep = more.choice([0.0, 0.002, 0.01]) if "clockstep" in faults else 0.0
    p_lease_pause = more.choice([0.0, 0.3, 1.0]) if "lease" in faults else 0.0
    # A reader's data read a scheduling point of its own (issue 50, item 3): apart too.
    if hasattr(env.shared, "data_points"):
        env.shared.data_points = random.Random(world.seed ^ 0x57AD).random() < 0.5
    p_fault = rng.choice([0.02, 0.05, 0.1]) if env.shared.faults else 0.0
    p_kill = rng.choice([0.0, 0.01, 0.03]) if "kill" in faults else 0.0
    p_stall = rng.choice([0.0, 0.02, 0.05]) if "stall" in faults else 0.0
    late_delays = rng.choice([[0.1, 1.0], [1.0, 10.0, 60.0], [10.0, 600.0, math.inf], [math.inf]])
    views = "views" in cfg.actors and rng.random() < 0.5
    idle = [60.0, 3600.0, 2 * 86400.0] if "idle" in cfg.actors else []
    n_writers = rng.choice([1, 1, 2, 3]) if "multi" in cfg.actors else 1
    # ``aim_gap`` (below): a writer parked at its log create until a vacuum truncated the log
    # past its base, and that vacuum's delete of the base failing. Drawn here, from a generator
    # of its own: such a seed gets a second writer, whose commits carry the log past the parked
    # one's base meanwhile (the checkpoint a truncation needs).
    aimed_gap = random.Random(world.seed ^ 0xA1EF)
    aim_gap = "delete" in faults and "vacuum" in cfg.actors and aimed_gap.random() < 0.3
    if aim_gap and "multi" in cfg.actors and n_writers < 2:
        n_writers = 2
    world.note(
        f"seed {world.seed}: {cfg.describe()}; interval {env.interval}, "
        f"store faults {sorted(env.shared.faults)} p={p_fault}, kill p={p_kill}, stall p={p_stall}, "
        f"views {views}, "
        f"{n_writers} writer(s)"
    )

    def skew() -> float:
        return rng.choice([0.0, 0.0, -600.0, 30.0, 3600.0, -3600.0]) if "skew" in faults else 0.0

    # Auto-compaction in the writers' drivers: drawn from a generator of its own, so that a seed
    # keeps every other choice (and its schedule, where no writer compacts) it had before.
    auto = random.Random(world.seed ^ 0xA17C) if "autocompact" in cfg.actors else None
    # The views' hooks at once, in threads of the writer's process (as the Spark doors run
    # them): a generator of its own too, and only where the writer keeps views.
    threads = random.Random(world.seed ^ 0x7EAD) if "threads" in cfg.actors and views else None
    # The Iceberg view (issue 54), kept by writers that keep the views: a generator of its own.
    iceberg = random.Random(world.seed ^ 0x1CEB) if "iceberg" in cfg.actors and views else None
    # The Spark door each query writes through, and how often its data-source calls land in
    # another driver worker (the memo lost): a generator of its own too (issue 50).
    doors = random.Random(world.seed ^ 0xD00A)
    if env.upgrade is not None:
        env.upgrade.spawn(env, skew=skew, idle=idle, views=views, n_writers=n_writers)
    for i in range(n_writers if env.upgrade is None else 0):
        plan = actors.WriterPlan(i, str(uuid.uuid4()), rng.randint(2, 7), n_writers > 1, views)
        if aim_gap:  # commits enough, while another is parked, to carry the log past its base
            plan.batches = max(plan.batches, 12)
        plan.auto_compact = auto is not None and auto.random() < 0.4
        if plan.auto_compact:
            world.note(f"writer {i} compacts after its commits (auto_compact)")
        plan.iceberg = iceberg is not None and iceberg.random() < 0.7
        if plan.iceberg:
            world.note(f"writer {i} keeps the Iceberg view (iceberg_view)")
        plan.views_together = threads is not None and threads.random() < 0.7
        if plan.views_together:
            world.note(f"writer {i} updates its views in threads, at once")
        _draw_door(plan, doors)
        world.note(f"writer {i} writes through the {plan.door} door (new worker {plan.p_new_worker:.0%})")
        env.writers.append(plan)
        _start_writer(env, plan, offset=skew(), idle=idle)
    # The recreate world (``tests.sim.recreate``): the lake deleted and created again while its
    # queries run. Not with a continued query (its continuation would be refused for good) or
    # an aimed truncation (its parked writer holds a commit in flight: the reset waits for none).
    recreating = recreate.picks_recreate(world.seed) if "recreate" in cfg.actors else None
    if recreating is not None and env.upgrade is None and not aim_gap and cfg.store == "local":
        env.recreate = recreate.RecreateWorld(env, recreating)
        aimed = f" (aimed: {env.recreate.aim} of batch 0)" if env.recreate.aim else ""
        world.note(f"recreate: the lake is deleted and created again while the queries run{aimed}")
    later = world.later
    if "continue" in cfg.actors and later.random() < 0.5 and env.recreate is None:
        # A query loses its checkpoint; its user continues it from the lake's offsets, having
        # stopped it or not (a zombie driver still committing).
        _continue(
            env,
            later.choice(env.writers),
            stop=later.random() < 0.5,
            offset=later.choice([0.0, 0.0, -600.0, 30.0, 3600.0, -3600.0]) if "skew" in faults else 0.0,
            delay=later.choice([1.0, 60.0, 3600.0]),
        )
    pause = [1.0, 60.0, 3600.0, 86400.0]
    for name, job in (
        ("vacuum", actors.vacuum_job),
        ("compact", actors.compact_job),
        ("sweep", actors.sweep_job),
        ("reader", actors.read_job),
        ("verify", actors.verify_job),
    ):
        if name in cfg.actors and rng.random() < 0.6:
            body = actors.repeat(env, rng.randint(1, 6 if name == "vacuum" else 3), pause, name, job(env))
            if env.upgrade is not None and rng.random() < 0.75:
                from tests.sim.upgrade import after_format_3

                body = after_format_3(env, body)
            world.spawn(
                name,
                body,
                offset=skew(),
                delay=rng.choice([0.0, 10.0, 600.0]),
            )

    env.aim_gap = aim_gap
    if env.recreate is not None:
        env.recreate.spawn()
    if aim_gap:
        world.note("aim_gap: writers park at their log creates until a vacuum truncates past them")
    # ``aim_window``: a vacuum that runs close behind the writers' commits, its retention
    # window holding the newest of them (a clock in step with theirs): what it may give up
    # is decided by the window, not by "now" (the ``retention`` invariant). Its own generator.
    aimed_window = random.Random(world.seed ^ 0xA1F0)
    if not aim_gap and "vacuum" in cfg.actors and env.upgrade is None and aimed_window.random() < 0.3:
        world.note("aim_window: a vacuum runs close behind the commits, retaining 600 or 3600 s")
        world.spawn(
            "vacuum.window",
            actors.repeat(env, 10, [1.0, 10.0, 60.0], "vacuum", actors.vacuum_job(env)),
            delay=aimed_window.choice([10.0, 60.0]),
        )
    if aim_gap and env.upgrade is None:
        # A vacuum that runs often while the writers commit (``aim_gap``): truncations to meet.
        # Its clock an hour ahead where clocks may differ (every commit is old to it); a kill
        # ends a run, and cron starts it again (up to three times).
        def vacuum_often(starts: int, delay: float) -> None:
            actor = world.spawn(
                f"vacuum.often{starts}",
                actors.repeat(env, 30, [60.0, 600.0, 3600.0], "vacuum", actors.vacuum_job(env)),
                offset=3600.0 if "skew" in faults else 0.0,
                delay=delay,
            )
            if starts < 3:
                actor.data["again"] = lambda: vacuum_often(starts + 1, 60.0)

        vacuum_often(1, aimed_gap.choice([0.0, 60.0, 600.0]))

    # Aimed orders: in some seeds, an order a hole needs is made often rather than left to
    # chance (drawn apart, so that the other seeds keep their schedules).
    # ``aim_held``: a log create of a data-source writer or of a compaction held, every try of
    # it, until its caller gave up and cleaned up (the writer's abort call in a fresh worker,
    # the compaction's return), then landed: what it deleted, the log now lists (issue 50's hole).
    # ``aim_straddle``: a reader parked between its log read and its data read stays parked
    # while others run (a slow planner): a vacuum may remove the version it pinned meanwhile.
    aimed = random.Random(world.seed ^ 0xA1ED)
    aim_held = "late" in faults and aimed.random() < 0.3
    aimed_read = random.Random(world.seed ^ 0xA1EE)  # apart: the reads do not move the holds
    aim_straddle = "stall" in faults and aimed_read.random() < 0.5
    # ``aim_gap`` (drawn above): what vacuum deleted must stay a prefix, or the parked writer's
    # create lands in the deleted part, unseen, its base standing.
    if aim_straddle and "reader" in cfg.actors and getattr(env.shared, "data_points", False):
        # A dashboard that refreshes often: reads that straddle maintenance (``aim_straddle``).
        world.spawn(
            "dashboard",
            actors.repeat(env, 8, [1.0, 60.0, 600.0, 3600.0], "dashboard", actors.read_job(env)),
            delay=aimed_read.choice([60.0, 600.0, 3600.0]),
        )
    if views and later.random() < 0.5:  # `lakesink sync-views` beside the writers
        world.spawn(
            "sync-views",
            actors.repeat(env, later.randint(1, 3), pause, "sync-views", actors.sync_views_job(env)),
            offset=later.choice([0.0, 0.0, -600.0, 30.0, 3600.0, -3600.0]) if "skew" in faults else 0.0,
            delay=later.choice([0.0, 10.0, 600.0]),
        )
    p_outage = rng.choice([0.0, 0.3, 0.6])

    # Buggify (FoundationDB's name): in half of the seeds, faults also fire often at the few
    # points where the protocol is most exposed -- a commit's create, the step after it (the
    # views and the checkpoint still to do), vacuum's deletes of log entries -- rather than
    # evenly. Drawn from ``later``: the seeds without it keep their schedules.
    later = world.later
    buggify = later.random() < 0.5
    if buggify:
        world.note("buggify: faults weigh on commits' creates, the step after them, log deletes")
    log_entry = re.compile(r"_lakesink/log/\d{20}\.json$")

    def vacuum_running() -> bool:
        return any(a.name.startswith("vacuum") and not a.done for a in world.actors)

    def aimed_order(actor: Actor, resuming: bool) -> str | None:
        creates = actor.op == "put_if_absent" and log_entry.search(actor.target) is not None
        # Not the first commit (it has no base), and only while a vacuum may still truncate.
        parks_writer = aim_gap and creates and actor.name.startswith("writer") and not resuming
        if (
            parks_writer
            and not actor.target.endswith(f"{0:020d}.json")
            and vacuum_running()
            and aimed_gap.random() < 0.5
        ):
            actor.data["parks"] = "truncation"
            return "park"
        if (
            aim_gap
            and actor.name.startswith("vacuum")
            and actor.op == "delete"
            and log_entry.search(actor.target)
        ):
            base = int(actor.target.rsplit("/", 1)[-1][:20])
            above = f"_lakesink/log/{base + 1:020d}.json"
            if any(a.data.get("parked") == "truncation" and a.target == above for a in world.live()):
                actor.data["forced"] = ("delete", actor.target, "delete")  # ``SimStore._call``
                world.note(f"{actor.name}: the delete of a parked writer's base {actor.target} fails")
                return "delete"
        if aim_straddle and actor.op == "read_data" and actor.name in ("reader", "dashboard"):
            if resuming:
                return None
            if vacuum_running() and aimed_read.random() < 0.5:
                actor.data["parks"] = "files"
                return "park"  # until a vacuum removed data files (``vacuum_job``)
            return None
        if not (aim_held and actor.op == "put_if_absent" and log_entry.search(actor.target)):
            return None
        data_source = any(p.actor is actor and p.door == "data_source" for p in env.writers)
        if not (data_source or actor.name == "compact") or "held_create" in actor.data:
            return None
        # A compaction commits once a run, a writer once a batch: the compaction's is held more.
        if aimed.random() >= (0.5 if actor.name == "compact" else 0.2):
            return None
        actor.data["held_create"] = actor.target  # its tries go late (``SimStore._call``)
        world.note(f"{actor.name}: every try of this create is held until it gave up and cleaned up")
        return "late"

    def buggified(actor: Actor) -> str | None:
        prev, actor.data["prev"] = actor.data.get("prev"), (actor.op, actor.target)
        if not buggify:
            return None
        allowed = set(OP_FAULTS.get(actor.op, READ_FAULTS)) & env.shared.faults
        if prev is not None and prev[0] == "put_if_absent" and log_entry.search(prev[1]):
            # Right after a commit's create: the views and the checkpoint are still to come.
            if p_kill and later.random() < 0.15:
                return "kill"
            if p_stall and later.random() < 0.15:
                return "stall"
        creates = allowed & {"lost", "late", "dup"}
        if (
            actor.op == "put_if_absent"
            and log_entry.search(actor.target)
            and creates
            and later.random() < 0.15
        ):
            kind = later.choice(sorted(creates))
            if kind == "late" and later.random() < 0.5:
                # A queue that holds every try of this create (a proxy, a partition): the
                # commit's outcome stays unknown while its first request may still land --
                # the abort that follows must keep the batch's files (issue 50, item 1).
                actor.data["outage"] = ("late", 10)
                world.note(f"{actor.name}: every try of this create goes unanswered")
            return kind
        if (
            actor.op == "delete"
            and actor.target.startswith("_lakesink/log/")
            and allowed & {"delete", "late", "dup"}
        ) and later.random() < 0.15:
            return later.choice(sorted(allowed & {"delete", "late", "dup"}))
        return None

    lease_put = re.compile(r"_lakesink/ops/[^/]+\.json$")

    def decide(actor: Actor) -> str | None:
        if actor.op in ("start", "sleep", "list_end"):
            return None
        if p_clockstep and more.random() < p_clockstep:
            # A step, within the hour of skew the final pass's 2 h jump gets past (a clock ahead
            # by more only keeps its versions retained longer: vacuum would converge later).
            step = more.choice([-3600.0, -600.0, -30.0, 30.0, 600.0, 3600.0])
            before, actor.offset = actor.offset, max(-3600.0, min(3600.0, actor.offset + step))
            if "clock_high" in actor.data:
                actor.data["clock_high"] = max(actor.data["clock_high"], actor.offset)
            world.note(f"{actor.name}: its clock steps by {actor.offset - before:+.0f} s")
        last = actor.data.get("prev")
        # Once per call: a call that a stall or a park held is resumed next, not held again by
        # an aimed order or a pause (seed 119 of session 16: a lease refresh parked right after
        # the lease's put paused again at every turn, for good -- a livelock).
        resuming = actor.data.pop("held_call", False)
        fault = buggified(actor)  # first: it notes each call (``prev``) as it goes
        fault = aimed_order(actor, resuming) or fault
        if fault is not None:
            return fault
        # Right after a compaction put its lease: the process pauses (GC, a swapped-out VM), its
        # refresher with it; another compaction may abandon its op meanwhile.
        held = last is not None and last[0] == "put" and lease_put.search(last[1]) is not None
        if held and not resuming and p_lease_pause and more.random() < p_lease_pause:
            world.note(f"{actor.name}: pauses holding the lease {last[1]}")
            return "stall"
        if env.recreate is not None and env.recreate.kill_after_first_create(
            actor, next((p for p in env.writers if p.actor is actor), None), last
        ):
            return "kill"
        # Kills weigh on a view's update: between a lake commit and it is where views lag.
        view_write = actor.op == "put_if_absent" and actor.target.startswith(
            ("_delta_log/", "_spark_metadata/")
        )
        if p_kill and rng.random() < p_kill * (10 if view_write else 1):
            return "kill"
        # Stalls weigh on reads of commits: between two of them is where a writer's view of the
        # log can go stale (a vacuum truncating it meanwhile, issue 32's hole 1).
        log_read = actor.op == "read" and actor.target.startswith("_lakesink/log/0")
        if p_stall and rng.random() < p_stall * (5 if log_read else 1):
            return "stall"
        return store_fault(env.shared, actor, rng, p_fault, p_outage)

    env.decide = decide
    env.late_delays = late_delays
    env.p_burst = rng.choice([0.0, 0.05, 0.2])
    env.p_coincide = rng.choice([0.0, 0.5])
    env.idle = idle


def _draw_door(plan: actors.WriterPlan, rng: random.Random) -> None:
    """The Spark door of ``plan``'s query: the data source (each call in a driver worker, which
    changes at random between calls, and always after a failed commit) or foreachBatch."""
    plan.door = "foreach_batch" if rng.random() < 0.25 else "data_source"
    plan.p_new_worker = rng.choice([0.0, 0.1, 0.5, 1.0]) if plan.door == "data_source" else 0.0
    plan.p_driver = rng.choice([0.0, 0.5, 1.0]) if plan.door == "foreach_batch" else 0.0


def _start_writer(
    env: Env, plan: actors.WriterPlan, *, offset: float, idle: list[float], delay: float = 0.0
) -> None:
    plan.runs += 1
    run = env.upgrade.writer_run if env.upgrade is not None else actors.writer_run
    plan.actor = env.world.spawn(
        f"writer{plan.index}.run{plan.runs}",
        run(env, plan, idle=idle),
        offset=offset,
        delay=delay,
    )


def _continue(
    env: Env, old: actors.WriterPlan, *, stop: bool, offset: float, delay: float, tries: int = 1
) -> None:
    actor = env.world.spawn(
        f"continuer{len(env.world.actors)}", actors.continuer(env, old, stop=stop), offset=offset, delay=delay
    )
    actor.data.update({"continues": old, "try": tries})


def _step(env: Env, *, faults: bool) -> bool:
    """One scheduling step; False when no actor is left."""
    world, rng = env.world, env.world.rng
    _deferred(env, faults=faults)
    runnable = world.runnable()
    if not runnable:
        live = world.live()
        if not live:
            return False
        sleeping = [a for a in live if a.wake > world.now]
        if not sleeping:  # only stalled actors are left: nobody else can take steps
            # Those an aimed order parked wait for the others first: for what they are parked
            # for, the others must go on (they go on too once only parked ones are left).
            waiting = [a for a in live if not a.data.get("parked")] or live
            for actor in waiting:
                actor.stalled = 0
                actor.data["parked"] = None
            return True
        # Every actor sleeps: time jumps to the next wake-up, or to a queued request's landing.
        landing = [d.at for d in env.shared.deferred if d.at is not None and d.at < math.inf]
        world.now = max(world.now, min([a.wake for a in sleeping] + landing))
        if env.p_coincide and rng.random() < env.p_coincide:
            # Coincidences: whoever would wake within a day wakes now too (an idle writer's next
            # commit meets the vacuum that runs while it idled), which separate sleeps rarely give.
            for other in sleeping:
                if other.wake <= world.now + 86400.0:
                    other.wake = world.now
        _deferred(env, faults=faults)
        _check_if_changed(env)
        runnable = world.runnable()
        if not runnable:
            return True
    chosen, left = env.burst
    if chosen is not None and left > 0 and chosen in runnable:
        actor, env.burst = chosen, (chosen, left - 1)
    else:
        actor = rng.choice(runnable)
        # A burst: this actor runs alone for a while (a whole vacuum between two reads of a
        # writer's commit), which a uniform choice at every step almost never does.
        env.burst = (actor, rng.randint(5, 60)) if env.p_burst and rng.random() < env.p_burst else (None, 0)
    world.now += rng.choice([0.0, 0.01, 0.1, 1.0])
    fault = env.decide(actor) if faults else None
    if fault in ("stall", "park"):
        actor.data["held_call"] = True  # resumed next, once (``decide``)
    if fault == "stall":
        # A slow request or a pause of the process (GC, a swapped-out VM): the call waits while
        # the others run, which is how a whole vacuum fits between two reads of one commit.
        if rng.random() < 0.5:
            actor.wake = world.now + rng.choice([1.0, 30.0, 600.0, 7200.0])
            world.note(f"{actor.name}: stalls at {actor.op} {actor.target} until +{actor.wake - START:.0f} s")
        else:  # until the others took that many steps: a vacuum runs whole meanwhile
            actor.stalled = world.steps + rng.choice([20, 80, 200])
            world.note(f"{actor.name}: stalls at {actor.op} {actor.target} until step {actor.stalled}")
        return True
    if fault == "park":  # an aimed order: parked until a vacuum resumes it (``vacuum_job``)
        actor.stalled, actor.data["parked"] = 1 << 62, actor.data.pop("parks")
        why = actor.data["parked"]
        world.note(f"{actor.name}: parked at {actor.op} {actor.target} until a vacuum's {why}")
        return True
    kill = fault == "kill"
    if actor.op != "sleep":
        world.note(f"{actor.name}: {actor.op} {actor.target}" + (f" [{fault}]" if fault else ""))
    world.resume(actor, kill=kill, fault=None if kill else fault)
    if actor.done:
        if actor.error is not None:
            world.note(f"{actor.name}: ended with {type(actor.error).__name__}: {actor.error!s:.200}")
            if isinstance(actor.error, Violation):
                raise actor.error
            if isinstance(actor.error, AssertionError):
                raise Violation("crash", f"{actor.name} failed an assertion: {actor.error!r}")
        elif actor.killed:
            world.note(f"{actor.name}: killed")
            if "again" in actor.data:  # started again after a kill (cron)
                actor.data.pop("again")()
        else:
            world.note(f"{actor.name}: ended: {actor.result}")
    _deferred(env, faults=faults)
    _check_if_changed(env)
    return True


def _check_if_changed(env: Env) -> None:
    if env.shared.dirty:
        env.shared.dirty = False
        env.checker.check()


def _deferred(env: Env, *, faults: bool) -> None:
    """Requests a client gave up on: each gets a time to land at when first seen (or never), and
    lands once the clock reaches it. ``faults`` off (the settle phase): every request lands
    now, except those that never would."""
    world, rng = env.world, env.world.rng
    for request in list(env.shared.deferred):
        if request.until_abort and faults:
            continue  # lands once its caller gave up and cleaned up (``release_held``)
        if request.at is None:
            request.at = world.now + rng.choice(env.late_delays)
        if request.at <= world.now or not faults:
            env.shared.deferred.remove(request)
            if request.at < math.inf:
                env.world.note(f"late: {request.actor}'s {request.op} {request.name} lands now")
                try:
                    request.apply()
                except Exception as exc:  # noqa: BLE001 - the store refused it: noted
                    env.world.note(f"late: {request.op} {request.name} failed: {exc!r:.120}")
            else:
                env.world.note(f"late: {request.actor}'s {request.op} {request.name} never lands")


def _restart(env: Env, *, final: bool) -> None:
    """A writer run that ended early is restarted (Spark's query restart): it replays. A refused
    continuation is replaced by a new one, which reads the lake's offsets again."""
    if env.foreach is not None:
        env.foreach.restart(final=final)
        return
    rng = env.world.rng
    if env.recreate is not None:
        env.recreate.restart()  # a user's reset is no fault: it may come in the settle phase too
    for plan in list(env.writers):
        if plan.refused and plan.actor is not None and plan.actor.done and not plan.replaced:
            plan.replaced = True
            _continue(
                env,
                plan,
                stop=True,
                offset=plan.actor.offset,
                delay=0.0 if final else rng.choice([1.0, 60.0]),
            )
    for actor in list(env.world.actors):
        # A continuation that failed before it started its query (killed, a read that failed):
        # its user tries again.
        # Past four tries the busy phase stops retrying, but the user has not given up: the
        # settle phase retries it (seed 62035: the fourth continuer killed, stream 0 was never
        # finished and "lacked batches").
        old = actor.data.get("continues")
        failed = old is not None and actor.done and (actor.killed or actor.error is not None)
        if failed and (final or actor.data["try"] < 4):
            del actor.data["continues"]
            _continue(
                env,
                old,
                stop=True,
                offset=actor.offset,
                delay=0.0 if final else 60.0,
                tries=actor.data["try"] + 1,
            )
    for plan in list(env.writers):
        if plan.finished or plan.abandoned or plan.actor is None or not plan.actor.done:
            continue
        if final or plan.runs < 4:
            _start_writer(
                env,
                plan,
                offset=plan.actor.offset,
                idle=[] if final else env.idle,
                delay=0.0 if final else rng.choice([1.0, 60.0, 3600.0]),
            )


def _busy(env: Env) -> None:
    world = env.world
    # An upgrade world spends its first steps on format 2 and the upgrade: twice the budget.
    # An ``aim_gap`` seed waits for commits and truncations around a parked writer: 4x.
    budget = env.cfg.max_steps * (1 if env.upgrade is None else 2) * (4 if env.aim_gap else 1)
    turns = 0
    while world.steps < budget:
        _restart(env, final=False)
        if not _step(env, faults=True):
            return
        turns += 1
        if turns > 100 * budget:  # turns without steps: faults that park an actor for good
            raise Violation("converges", f"the scheduler turned {turns:,} times for {world.steps} steps")
    world.kill_all("the step budget is spent")
    env.checker.check()


def _settle(env: Env) -> None:
    """Fault-free from here: queued requests land or are dropped, writers replay to the end."""
    world = env.world
    world.note("settle: no more faults")
    env.shared.faults = frozenset()
    _deferred(env, faults=False)
    if env.upgrade is not None:
        env.upgrade.settle(env)
    # A bound on liveness, not a budget: a writer whose every Spark call lands in a fresh worker
    # reads its lake (and checks its store) again at each call (issue 50), ~3x the calls.
    for _ in range(SETTLE_STEPS):
        _restart(env, final=True)
        if not _step(env, faults=False):
            break
    else:
        raise Violation(
            "converges", f"the writers did not finish their batches within {SETTLE_STEPS:,} fault-free steps"
        )
    unfinished = [p.index for p in env.writers if not p.finished and not p.abandoned]
    if unfinished:
        raise Violation("converges", f"writers {unfinished} could not finish their batches without faults")
    env.checker.check()
    env.checker.check_versions()
    if env.foreach is None:  # the foreach world checks its queries' epochs in check_versions
        env.checker.check_streams()


def _never_committed(env: Env, name: str) -> bool:
    """Whether ``name`` is a file of a query that never committed and never will: one whose
    continuation was refused, or that its user gave up on, before its first commit. The sweep
    keeps such files for good ("its first batch may be in flight"): nothing in the log says that
    query is gone (docs/design/simulation.md, "Found: files of a query that never committed")."""
    from lakesink_reader.format.v3.commits import writer_tag
    from lakesink_reader.names import parse_writer_file

    written = parse_writer_file(name)
    if written is None:
        return False
    state = Checker(env)._log().open()
    return any(
        p.abandoned and p.id not in state.writers and writer_tag(p.id) == written[0] for p in env.writers
    )


def _final(env: Env) -> None:
    """The fault-free maintenance pass must succeed and leave nothing behind."""
    from lakesink.maintenance.sweep import sweep
    from lakesink.maintenance.vacuum import vacuum
    from lakesink.maintenance.verify import verify

    if env.foreach is not None:
        env.foreach.final()
        return
    world, storage = env.world, env.client(None)
    world.now += 7200.0  # past every actor's skew: what they committed is in the past now
    world.note(
        "final: compact's abandon of dead ops, vacuum --retain 0 --force, orphans --delete, sync-views"
    )
    if env.cfg.final_abandon:
        # A killed or failed compaction's outputs and lease are settled only by a later compaction
        # abandoning its op (the sweep keeps them: "it may still commit"); compact's first step.
        from lakesink.maintenance.compact import open_v3, settle_ops

        _, vlog = open_v3(storage, "the final abandon")
        try:
            settle_ops(storage, vlog, vlog.open(), older_than=0.0, dry_run=False)
        except Exception as exc:
            raise Violation("converges", f"abandoning dead ops raised {type(exc).__name__}: {exc}") from exc
    read_pinned = _pin_and_compact(env)
    try:
        report = vacuum(storage, retain=0, delete=True, force=True, older_than=0.0)
    except Exception as exc:
        raise Violation("converges", f"the final vacuum raised {type(exc).__name__}: {exc}") from exc
    if not report.ok:
        raise Violation("converges", f"the final vacuum failed on {report.failed[:3]}")
    read_pinned()
    try:
        swept = sweep(storage, older_than=0.0, delete=True, views=any(p.iceberg for p in env.writers))
    except Exception as exc:
        raise Violation("converges", f"the final sweep raised {type(exc).__name__}: {exc}") from exc
    kept = [o for o in swept.kept if not _never_committed(env, o.name)]
    if env.upgrade is not None:
        kept = env.upgrade.undocumented(env, kept)
    if not swept.ok or kept:
        raise Violation("converges", f"the final sweep failed on {swept.failed[:3]}, kept {kept[:3]}")
    for orphan in swept.kept:
        if orphan not in kept:  # known gaps (docs/design/simulation.md): noted, not failed
            world.note(f"final: kept {orphan.name}: {orphan.reason}")
    if any(p.views for p in env.writers):
        syncs = actors.view_syncs(env)
        for name, sync in syncs:
            try:
                view = sync(storage)
            except Exception as exc:
                raise Violation(
                    "views", f"sync of the {name} view raised {type(exc).__name__}: {exc}"
                ) from exc
            if not view.ok:
                raise Violation("views", f"the {name} view does not sync: {view.summary()}")
        by_name = dict(syncs)
        if random.Random(world.seed ^ 0x4EB1).random() < 0.5:
            _rebuild_view(env, "Delta", "_delta_log", "_lakesink/delta_view_stopped.json", by_name["Delta"])
        if "Iceberg" in by_name and random.Random(world.seed ^ 0x1CEC).random() < 0.5:
            _rebuild_view(
                env, "Iceberg", "metadata", "_lakesink/iceberg_view_stopped.json", by_name["Iceberg"]
            )
    left = [x for x in env.checker.leftovers() if not _never_committed(env, x.rpartition(" ")[2])]
    if env.cfg.store == "s3":
        from tests.sim import s3store

        left += s3store.leftovers(env)
    if left:
        raise Violation("converges", f"the final pass left {left[:5]} ({len(left)} in all)")
    env.checker.check()
    if env.upgrade is not None:
        env.upgrade.final(env)
    checked = verify(storage)
    if not checked.ok:
        raise Violation(
            "converges",
            f"verify after the final pass: {[(p.name, p.problem) for p in checked.problems][:3]}, "
            f"Delta view {checked.delta_view}, Spark view {checked.spark_view}",
        )
    _damage_and_verify(env)
    world.note(
        f"final: converged at version {Checker(env)._log().open().version}; now +{world.now - START:.0f} s"
    )


def _pin_and_compact(env: Env) -> Callable[[], None]:
    """A reader that pinned the latest version, then a compaction and the final vacuum
    (retain 0) before its data read: the read must fail with an error once its files are gone,
    never return part of the version (``reads``; issue 50, item 3). Returns the read."""
    from lakesink.commit.files import WriteOptions
    from lakesink.maintenance.compact import compact
    from lakesink_reader.lake import Lake

    lake = Lake(env.root)
    pinned = lake.version
    if pinned is None or pinned < 0:
        return lambda: None
    try:
        done = compact(
            env.client(None),
            target_file_size=64 << 10,
            min_files=2,
            write_options=WriteOptions(row_group_bytes=1024),
            check_store=False,
        )
    except Exception as exc:
        raise Violation("converges", f"the final compaction raised {type(exc).__name__}: {exc}") from exc
    env.checker.check()
    env.world.note(f"final: a reader pinned version {pinned}; compaction {done.status} at {done.version}")

    def read() -> None:
        try:
            rows = env.checker.check_read(
                pinned,
                "a reader pinned before the final compaction and vacuum",
                lambda: lake.to_table(columns=["id"]).column("id").to_pylist(),
            )
        except Violation:
            raise
        except Exception as exc:  # noqa: BLE001 - allowed once vacuum gave the version up
            env.world.note(f"final: the pinned read failed: {type(exc).__name__}: {exc!s:.120}")
        else:
            env.world.note(f"final: the pinned read holds {len(rows)} rows")

    return read


def _rebuild_view(env: Env, name: str, folder: str, stop_file: str, sync: Callable[[Any], Any]) -> None:
    """The documented way back for a view (docs/guide/maintenance.md): remove its folder
    (`_delta_log/`, `metadata/`), run `lakesink sync-views`. Run as an actor, fault-free, so
    that the view is checked after each of its writes: a reader reads the view while it is
    rebuilt (issue 50, item 3; the Iceberg view, issue 54)."""
    world, storage = env.world, env.client(None)
    for entry in storage.list(folder):
        storage.delete(entry.name)
    storage.delete(stop_file)
    env.checker.forget_views()
    world.note(f"final: the {name} view removed; sync-views rebuilds it")
    rebuild = world.spawn(f"rebuild-{name.lower()}-view", lambda actor: sync(env.client(actor)).summary())
    for _ in range(SETTLE_STEPS):
        if rebuild.done or not _step(env, faults=False):
            break
    else:
        raise Violation("converges", f"the rebuild of the {name} view took over {SETTLE_STEPS:,} steps")
    if rebuild.error is not None:
        raise Violation("views", f"the rebuild of the {name} view raised {rebuild.error!r}")
    if rebuild.result is None or "ok" not in str(rebuild.result):
        world.note(f"final: the rebuilt {name} view: {rebuild.result}")


def _damage_and_verify(env: Env) -> None:
    """``verify`` checked for false negatives (issue 50, item 3): a committed file of the latest
    version deleted, or cut short, on purpose, must be named by ``verify`` with ok False; each
    damage is undone before the next."""
    from lakesink.maintenance.verify import verify
    from lakesink_reader.lake import Lake

    files = sorted(f.name for f in Lake(env.root).files())
    if not files:
        return
    rng = random.Random(env.world.seed ^ 0x7E1F)
    storage = env.client(None)
    for damage in ("delete", "truncate"):  # gone; cut short
        name = rng.choice(files)
        path = os.path.join(env.root, name)
        with open(path, "rb") as f:
            data = f.read()
        if damage == "delete":
            storage.delete(name)
        else:
            storage.put(name, data[: len(data) // 2])
        try:
            report = verify(storage)
        finally:
            storage.put(name, data)
        named = [p for p in report.problems if p.name == name]
        if report.ok or not named:
            raise Violation(
                "verify",
                f"verify did not report {name}, {damage}d on purpose "
                f"(ok={report.ok}, problems {[(p.name, p.problem) for p in report.problems][:3]})",
            )
    env.checker.check()
