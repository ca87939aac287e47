"""The foreach world: a foreach lake written through ``LakeForeachWriter``'s hooks, as Spark's
foreach bridge calls them, beside the orphan sweep, readers, ``verify``, and ``vacuum`` and
``compact`` (which must refuse it); with its own invariants (docs/design/simulation.md).

A seed allowed the ``foreach`` switch builds this world instead of the epoch one with chance
:data:`P_FOREACH`, drawn from its own RNG so that a seed that does not pick it runs the epoch
world exactly as without the switch.

- a *query run* (``fq<i>.run<n>``) is a driver: it builds ``LakeForeachWriter`` (its
  ``__init__`` runs on the driver: it finds the lake and probes the store), pickles it, and per
  epoch from Spark's checkpoint (``next_epoch``: every epoch below it is in Spark's commit log,
  i.e. acknowledged) launches one task actor per partition and waits for them. A task that
  fails is retried (Spark's ``spark.task.maxFailures``, 4); a partition that fails 4 times
  fails the run, and the query is restarted, replaying the epoch. With the seed's chances a
  copy of a slow task runs beside it (speculation: the copy that finishes first wins, the other
  is killed), and the driver dies after an epoch's tasks finished but before its commit log
  records it (the whole epoch is replayed by the next run). A driver killed (kill -9) leaves
  its tasks running: zombies of the old run beside the new one, which FORMAT.md's fault
  model names (a second driver of the same query).
- a *task* (``...e<epoch>p<partition>a<attempt>``) unpickles the writer and calls ``open``,
  ``process`` per row and ``close`` as ``pyspark``'s ``func_with_open_process_close`` does:
  ``close(error)`` after a failure upstream of the writer mid-way (it discards), and -- the
  bridge's quirk FORMAT.md describes -- ``close(None)`` after a *prefix* of the rows, as if the
  partition were complete, before the task fails (the retry's longer file must replace it).
  A task's rows are fixed per (query, epoch, partition) (:func:`task_rows`), so a replay writes
  the same rows. The query tag that ``open`` reads from Spark's TaskContext (``query_tag``) is
  the query's: stable across its runs, another per query. Some seeds' lakes are partitioned
  (``partition_by=["key"]``): a task's rows fall into up to three folders, one file each.
- ``multi``: up to three queries with ``allow_other_queries=True``; and, with some chance, an
  *intruder*: a new query without it, started once the lake exists. Every attempt of its
  tasks must be refused (CommitError) and it must leave nothing in the lake.
- ``sweep``, ``reader`` and ``verify`` as in the epoch world; ``vacuum`` and ``compact`` must
  refuse a foreach lake (ValueError: "needs an epoch-mode lake") through a store client that
  records every request that would change the store: none may be made.

Invariants (:class:`ForeachChecker`), after every step that changed what a reader lists:
``readable`` (``Lake(path).to_table()``), ``exactly_once`` (no row twice, no row of anyone but
the queries, each (query, partition, epoch) a prefix of its rows -- per folder when
partitioned: FORMAT.md lets an attempt publish "a part of them"), ``acknowledged`` (every
partition of an epoch Spark's commit log holds is complete), ``refuses`` (the intruder wrote
nothing). At the end every epoch of every query is complete and once, and a fault-free
``orphans --delete`` leaves nothing else.
"""

from __future__ import annotations

import math
import os
import pickle
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tests.sim.actors import SCHEMA
from tests.sim.invariants import Violation, _stat
from tests.sim.store import store_fault
from tests.sim.world import START, Actor, Killed

if TYPE_CHECKING:
    from tests.sim.run import Env

#: The chance that a seed allowed the ``foreach`` switch builds a foreach lake.
P_FOREACH = 0.3
#: Spark's ``spark.task.maxFailures``: a partition failing that often fails the query run.
MAX_TASK_FAILURES = 4
#: Row ids: query q, epoch e, partition p, row r is q * Q + e * E + p * P + r.
Q, E, P = 100_000_000, 10_000, 1_000
#: ``LakeForeachWriter``'s batch_rows: small, so that a task's rows reach the Parquet writer (and
#: its staged file) before ``close``; with 1 KiB row groups a staged file exists after ~130 rows.
BATCH_ROWS = 50
STORE_FAULTS = ("lost", "late", "fail", "delete", "list")
#: Calls where two attempts at one name race (publish, the version read before a replacement,
#: the replacement): kills and stalls weigh on them (FoundationDB's "buggify").
RACE_OPS = ("publish", "version", "supersede")


def picks_foreach(seed: int, actors: frozenset[str]) -> bool:
    """Whether ``seed`` builds a foreach lake: its own RNG, so that the seeds that do not pick
    it draw the epoch world exactly as without the switch."""
    return "foreach" in actors and random.Random(seed ^ 0xF0EAC4).random() < P_FOREACH


def task_rows(query: int, epoch: int, partition: int) -> list[int]:
    """The rows of a (query, epoch, partition): fixed, so that every attempt and every replay
    writes the same rows (Spark re-plans an epoch from its offset log). 1 to 241 rows: enough
    that some tasks stage a file before ``close``."""
    n = 1 + ((3 * query + 5 * epoch + 7 * partition) % 5) * 60
    return [query * Q + epoch * E + partition * P + r for r in range(n)]


def key_of(row_id: int) -> tuple[int, int, int]:
    """(query, epoch, partition) of a row id."""
    return row_id // Q, (row_id % Q) // E, (row_id % E) // P


def folder_value(row_id: int) -> str:
    """A partitioned lake's ``key`` column (``partition_by=["key"]``): a task's rows fall into up
    to three folders, each a file of the (partition, epoch)'s name that commits on its own."""
    return f"k{row_id % 3}"


#: A partitioned foreach lake's stream: the rows' ids and their folder.
KEYED_SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


class UpstreamFailure(Exception):
    """The task failed upstream of the writer (the source, a UDF): pyspark calls close(error)."""


@dataclass
class QueryPlan:
    """One streaming query: its tag, its epochs and partitions, and Spark's checkpoint."""

    index: int
    tag: str
    epochs: int
    partitions: int
    allow_other_queries: bool
    intruder: bool = False
    next_epoch: int = 0  # Spark's commit log: every epoch below it was acknowledged
    runs: int = 0
    refused: int = 0  # the intruder's task attempts refused with CommitError
    actor: Actor | None = None

    @property
    def finished(self) -> bool:
        return self.next_epoch >= self.epochs


class ForeachWorld:
    """The queries of a foreach seed and Spark's fault chances (off once the world settles)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.queries: list[QueryPlan] = []
        self.settling = False
        self.p_task_fail = 0.0  # a task fails upstream of the writer mid-way: close(error)
        self.p_cut = 0.0  # pyspark's bridge ends the input early: close(None) on a prefix, then fails
        self.p_spec = 0.0  # a speculative copy of a running task
        self.p_driver_dies = 0.0  # the driver dies between an epoch's tasks and its commit log
        self.idle: list[float] = []
        self.partitioned = False  # partition_by=["key"]: a task's rows go to up to 3 folders

    @property
    def writers(self) -> list[QueryPlan]:
        """The queries that may write (the intruder must not)."""
        return [q for q in self.queries if not q.intruder]

    def acknowledged(self) -> set[tuple[int, int]]:
        return {(q.index, e) for q in self.writers for e in range(q.next_epoch)}

    def files_of(self, query: QueryPlan, epoch: int, partition: int) -> set[str]:
        """The names a (partition, epoch) of ``query`` publishes: one per folder its rows meet."""
        base = f"part-{partition:05d}-epoch-{epoch:012d}-{query.tag}.parquet"
        if not self.partitioned:
            return {base}
        return {f"key={folder_value(r)}/{base}" for r in task_rows(query.index, epoch, partition)}

    def all_files(self) -> set[str]:
        """Every name the queries publish, once they all finished."""
        return {
            name
            for q in self.writers
            for e in range(q.epochs)
            for p in range(q.partitions)
            for name in self.files_of(q, e, p)
        }

    # The world's hooks into tests.sim.run ------------------------------------------------------

    def restart(self, *, final: bool) -> None:
        """A query run that ended early is restarted from its checkpoint: it replays."""
        if final:
            self.settling = True
        rng = self.env.world.rng
        for plan in self.queries:
            if plan.intruder or plan.finished or plan.actor is None or not plan.actor.done:
                continue
            if final or plan.runs < 4:
                _start_run(self, plan, delay=0.0 if final else rng.choice([1.0, 60.0, 3600.0]))

    def final(self) -> None:
        _final(self)


# Setup -----------------------------------------------------------------------------------------


def setup(env: Env) -> None:
    """Build the foreach world of ``env``'s seed: queries, maintenance, fault chances."""
    import uuid

    from tests.sim import actors

    world, cfg, rng = env.world, env.cfg, env.world.rng
    fw = ForeachWorld(env)
    env.foreach = fw
    env.checker = ForeachChecker(env, fw)  # type: ignore[assignment]
    _install(env)
    faults = cfg.faults
    env.shared.faults = frozenset(f for f in STORE_FAULTS if f in faults and rng.random() < 0.7)
    p_fault = rng.choice([0.02, 0.05, 0.1]) if env.shared.faults else 0.0
    p_kill = rng.choice([0.0, 0.01, 0.03]) if "kill" in faults else 0.0
    p_stall = rng.choice([0.0, 0.02, 0.05]) if "stall" in faults else 0.0
    late_delays = rng.choice([[0.1, 1.0], [1.0, 10.0, 60.0], [10.0, 600.0, math.inf], [math.inf]])
    # Spark's own faults: always part of the foreach world (they are how Spark runs tasks), each
    # seed with its own chances, none at all in some.
    fw.p_task_fail = rng.choice([0.0, 0.1, 0.3])
    fw.p_cut = rng.choice([0.0, 0.1, 0.3])
    fw.p_spec = rng.choice([0.0, 0.0, 0.2])
    fw.p_driver_dies = rng.choice([0.0, 0.1, 0.2])
    fw.idle = [60.0, 3600.0, 2 * 86400.0] if "idle" in cfg.actors else []
    fw.partitioned = rng.random() < 0.3
    n_queries = rng.choice([1, 1, 2, 3]) if "multi" in cfg.actors else 1
    intruder = "multi" in cfg.actors and rng.random() < 0.4
    for i in range(n_queries + intruder):
        fw.queries.append(
            QueryPlan(
                i,
                uuid.uuid4().hex[:16],
                rng.randint(2, 6),
                rng.randint(1, 3),
                # One query may own the lake alone; several must each allow the others (whichever
                # creates the lake owns it). The intruder does not: it must be refused.
                allow_other_queries=(n_queries > 1 or rng.random() < 0.5) and i < n_queries,
                intruder=i == n_queries,
            )
        )
    world.note(
        f"seed {world.seed}: {cfg.describe()}; FOREACH lake"
        f"{' partitioned by key' if fw.partitioned else ''}, "
        f"store faults {sorted(env.shared.faults)} "
        f"p={p_fault}, kill p={p_kill}, stall p={p_stall}; tasks fail p={fw.p_task_fail}, cut short "
        f"p={fw.p_cut}, speculation p={fw.p_spec}, driver dies p={fw.p_driver_dies}; queries "
        + ", ".join(
            f"{q.index} ({q.tag}: {q.epochs} epochs x {q.partitions} partitions"
            + (", intruder" if q.intruder else ", allows others" if q.allow_other_queries else "")
            + ")"
            for q in fw.queries
        )
    )

    def skew() -> float:
        return rng.choice([0.0, 0.0, -600.0, 30.0, 3600.0, -3600.0]) if "skew" in faults else 0.0

    for plan in fw.queries:
        _start_run(fw, plan, offset=skew(), delay=600.0 if plan.intruder else 0.0)
    pause = [1.0, 60.0, 3600.0, 86400.0]
    jobs: list[tuple[str, Callable[[Any], str]]] = [
        ("vacuum", _refusal_job(env, "vacuum")),
        ("compact", _refusal_job(env, "compact")),
        ("sweep", actors.sweep_job(env)),
        ("reader", _read_job(env, fw)),
        ("verify", actors.verify_job(env)),
    ]
    for name, job in jobs:
        if name in cfg.actors and rng.random() < 0.6:
            world.spawn(
                name,
                actors.repeat(env, rng.randint(1, 3), pause, name, job),
                offset=skew(),
                delay=rng.choice([0.0, 10.0, 600.0]),
            )

    p_outage = rng.choice([0.0, 0.3, 0.6])

    def decide(actor: Actor) -> str | None:
        if actor.op in ("start", "sleep", "list_end"):
            return None
        race = actor.op in RACE_OPS
        if p_kill and rng.random() < p_kill * (5 if race else 1):
            return "kill"
        if p_stall and rng.random() < p_stall * (5 if race else 1):
            return "stall"
        return store_fault(env.shared, actor, rng, p_fault, p_outage)

    env.decide = decide
    env.late_delays = late_delays
    env.p_burst = rng.choice([0.0, 0.05, 0.2])
    env.p_coincide = rng.choice([0.0, 0.5])
    env.idle = fw.idle


def _install(env: Env) -> None:
    """Point ``LakeForeachWriter``'s module at the simulation, in this process only: its
    ``open_storage`` gives the running actor's client of the simulated store, ``query_tag``
    (Spark's TaskContext) the running task's query, and ``freeze_heap_once`` (``gc.freeze``
    for Spark's forked workers) does nothing. The checker must see every published file, so
    any stamp of a name a reader lists marks the store changed (the epoch world's only marks
    the log's)."""
    import lakesink.spark.foreach as foreach_module
    from tests.sim import run as sim_run

    def query_tag() -> str | None:
        current = env.world.current
        return None if current is None else current.data.get("tag")

    # A task killed with its Parquet writer open: pyarrow's ParquetWriter.__del__ closes it when
    # collected, and the write meets Killed again ("Exception ignored in ... __del__" on
    # stderr). A killed process would never get there: nothing to report.
    if not getattr(sys.unraisablehook, "sim_quiet", False):
        previous = sys.unraisablehook

        def quiet(unraisable: Any) -> None:
            if not isinstance(unraisable.exc_value, Killed):
                previous(unraisable)

        quiet.sim_quiet = True  # type: ignore[attr-defined]
        sys.unraisablehook = quiet
    foreach_module.open_storage = sim_run._open_storage  # type: ignore[assignment]
    foreach_module.query_tag = query_tag
    foreach_module.freeze_heap_once = lambda: None
    shared = env.shared
    stamp = shared.stamp

    def stamp_any(name: str, when: float | None = None) -> None:
        stamp(name, when)
        if not name.rsplit("/", 1)[-1].startswith("."):
            shared.dirty = True

    shared.stamp = stamp_any  # type: ignore[method-assign]


# Queries: drivers and tasks ----------------------------------------------------------------------


def _start_run(fw: ForeachWorld, plan: QueryPlan, *, offset: float | None = None, delay: float = 0.0) -> None:
    plan.runs += 1
    if offset is None:
        offset = plan.actor.offset if plan.actor is not None else 0.0
    plan.actor = fw.env.world.spawn(
        f"fq{plan.index}.run{plan.runs}", _driver(fw, plan), offset=offset, delay=delay
    )


def _driver(fw: ForeachWorld, plan: QueryPlan) -> Callable[[Actor], Any]:
    from lakesink.commit.files import WriteOptions
    from lakesink.spark.foreach import LakeForeachWriter

    env = fw.env

    def body(actor: Actor) -> str:
        world = env.world
        if plan.intruder:  # a new query on a lake that exists (else it would be the owner)
            while not os.path.exists(os.path.join(env.root, "_lakesink", "table.json")):
                time.sleep(600.0)
        try:
            writer = LakeForeachWriter(
                env.root,
                schema=KEYED_SCHEMA if fw.partitioned else SCHEMA,
                batch_rows=BATCH_ROWS,
                write_options=WriteOptions(row_group_bytes=1024),
                allow_other_queries=plan.allow_other_queries,
                partition_by=["key"] if fw.partitioned else None,
            )
        except Exception as exc:  # noqa: BLE001 - the query fails to start; it is restarted
            why = world.redacted(str(exc))
            world.note(f"{actor.name}: LakeForeachWriter(...) raised {type(exc).__name__}: {why:.160}")
            return "failed to start"
        blob = pickle.dumps(writer)  # what Spark ships to every task
        while not plan.finished:
            epoch = plan.next_epoch
            if fw.idle and not fw.settling and world.rng.random() < 0.3:
                time.sleep(world.rng.choice(fw.idle))
            if not _run_epoch(fw, plan, actor, epoch, blob):
                return "refused" if plan.intruder else f"failed at epoch {epoch}"
            if not fw.settling and world.rng.random() < fw.p_driver_dies:
                world.note(f"{actor.name}: the driver dies before its commit log records epoch {epoch}")
                return f"died after epoch {epoch}'s tasks"
            # Spark's commit log: not on the lake's store, but a point where kill -9 can land.
            world.point(actor, "commit_log", f"epoch {epoch}")
            plan.next_epoch = epoch + 1
            world.note(f"{actor.name}: epoch {epoch} acknowledged")
        return "done"

    return body


def _run_epoch(fw: ForeachWorld, plan: QueryPlan, driver: Actor, epoch: int, blob: bytes) -> bool:
    """Spark's scheduling of one epoch's tasks: retries and speculative copies; True when every
    partition's task succeeded."""
    world = fw.env.world
    rng = world.rng
    attempts = dict.fromkeys(range(plan.partitions), 0)
    running: dict[int, list[Actor]] = {p: [] for p in range(plan.partitions)}
    done: set[int] = set()

    def launch(p: int) -> None:
        attempts[p] += 1
        rows = task_rows(plan.index, epoch, p)
        mode, cut = "all", len(rows)
        if not fw.settling:
            draw = rng.random()
            if draw < fw.p_task_fail:
                mode, cut = "fail", rng.randint(0, len(rows))
            elif draw < fw.p_task_fail + fw.p_cut:
                mode, cut = "cut", rng.randint(0, len(rows) - 1)
        task = world.spawn(
            f"{driver.name}.e{epoch}p{p}a{attempts[p]}",
            _task(fw, plan, epoch, p, blob, mode, cut),
            offset=driver.offset,
        )
        task.data["tag"] = plan.tag  # Spark's TaskContext: sql.streaming.queryId
        running[p].append(task)

    for p in range(plan.partitions):
        launch(p)
    while len(done) < plan.partitions:
        time.sleep(1.0)  # the driver waits for its tasks: a scheduling point
        for p in range(plan.partitions):
            if p in done:
                continue
            tasks = running[p]
            if any(t.done and t.result == "ok" for t in tasks):
                done.add(p)
                for t in tasks:  # Spark kills the other copies of a finished task
                    if not t.done:
                        t.killed = True
                continue
            live = [t for t in tasks if not t.done]
            failures = len(tasks) - len(live)
            if not live:
                if failures >= MAX_TASK_FAILURES:
                    world.note(f"{driver.name}: partition {p} of epoch {epoch} failed {failures} times")
                    return False
                launch(p)
            elif len(live) == 1 and not fw.settling and fw.p_spec and rng.random() < fw.p_spec / 10:
                world.note(f"{driver.name}: a speculative copy of partition {p} of epoch {epoch}")
                launch(p)
    return True


def _task(
    fw: ForeachWorld, plan: QueryPlan, epoch: int, partition: int, blob: bytes, mode: str, cut: int
) -> Callable[[Actor], Any]:
    """One task attempt, as pyspark's ``func_with_open_process_close`` runs a foreach writer."""
    from lakesink_reader.errors import CommitError

    def body(actor: Actor) -> str:
        writer = pickle.loads(blob)  # our own object, as Spark ships it to the task
        rows = task_rows(plan.index, epoch, partition)
        writer.open(partition, epoch)
        error: Exception | None = None
        try:
            for row_id in rows[:cut]:
                writer.process((row_id, folder_value(row_id)) if fw.partitioned else (row_id,))
            if mode == "fail":
                raise UpstreamFailure(f"the task failed upstream after {cut} of {len(rows)} rows")
        except Exception as exc:  # noqa: BLE001 - pyspark hands it to close, then re-raises it
            error = exc
        try:
            writer.close(error)
        except CommitError as exc:
            if not plan.intruder:
                raise Violation("refuses", f"query {plan.index} was refused: {exc}") from exc
            plan.refused += 1
            return "refused (CommitError)"
        except Exception as exc:  # noqa: BLE001 - the task fails; Spark retries it
            return f"failed in close: {type(exc).__name__}: {fw.env.world.redacted(str(exc)):.120}"
        if error is not None:
            return f"failed: {error}"
        if mode == "cut":
            # pyspark's bridge ended the input as if complete: the prefix is published, then
            # the task fails (docs/FORMAT.md), and the retry's longer file must replace it.
            return f"failed after close(None) on a prefix of {cut} of {len(rows)} rows"
        if plan.intruder:
            raise Violation("refuses", f"query {plan.index} (no allow_other_queries) wrote to another's lake")
        return "ok"

    return body


# Maintenance, readers -------------------------------------------------------------------------


class ReadOnly:
    """A store client that records (and refuses) every request that would change the store."""

    WRITES = frozenset(
        {"stage", "publish", "supersede", "discard", "drop_staged", "put_if_absent", "put", "delete",
         "check_conditional_writes"}
    )  # fmt: skip

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.touched: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.WRITES:
            return attr

        def refused(*args: Any, **kwargs: Any) -> Any:
            self.touched.append(f"{name}{args[:1]}")
            raise PermissionError(f"the simulation refuses {name}: this must not change a foreach lake")

        return refused


def _refusal_job(env: Env, what: str) -> Callable[[Any], str]:
    """``vacuum`` / ``compact`` on a foreach lake: refused ("needs an epoch-mode lake"), no
    request that changes the store (under faults a read may fail first: noted)."""

    def job(storage: Any) -> str:
        guard = ReadOnly(storage)
        outcome = _refuse(env, what, guard)
        if guard.touched:
            raise Violation("refuses", f"{what} on a foreach lake tried to change it: {guard.touched[:3]}")
        return outcome

    return job


def _refuse(env: Env, what: str, storage: Any) -> str:
    from lakesink.commit.files import WriteOptions
    from lakesink.maintenance.compact import compact
    from lakesink.maintenance.vacuum import vacuum
    from lakesink_reader.errors import LakeSinkError

    try:
        if what == "vacuum":
            vacuum(storage, retain=0.0, delete=True, force=True, older_than=0.0)
        else:
            compact(
                storage,
                target_file_size=64 << 10,
                min_files=2,
                write_options=WriteOptions(row_group_bytes=1024),
                abandon_older_than=0.0,
            )
    except ValueError as exc:
        if "needs an epoch-mode lake" not in str(exc):
            raise Violation("refuses", f"{what} raised {exc!r}, not its refusal of a foreach lake") from exc
        return "refused: a foreach lake"
    except (OSError, LakeSinkError) as exc:  # no lake yet, or a failed read under faults
        return f"raised {type(exc).__name__}: {env.world.redacted(str(exc)):.120}"
    raise Violation("refuses", f"{what} ran on a foreach lake")


def _read_job(env: Env, fw: ForeachWorld) -> Callable[[Any], str]:
    """A reader (``Lake(path).to_table()``): what it reads must hold every epoch acknowledged
    before it started, whole; the rest as prefixes; no row twice."""
    from lakesink_reader.errors import NotALakeError, TableNotFoundError
    from lakesink_reader.lake import Lake

    def job(storage: Any) -> str:
        acked = fw.acknowledged()
        try:
            lake = Lake(env.root)
        except (TableNotFoundError, NotALakeError):
            return "no lake yet"
        rows = lake.to_table(columns=["id"]).column("id").to_pylist()
        checker = env.checker
        assert isinstance(checker, ForeachChecker)
        checker.check_rows(rows, f"a reader ({len(acked)} epochs acknowledged when it started)", acked)
        return f"read {len(rows)} rows"

    return job


# Invariants -----------------------------------------------------------------------------------


class ForeachChecker:
    """The foreach world's invariants, with a god's-eye view of the store (no scheduling point)."""

    def __init__(self, env: Env, fw: ForeachWorld) -> None:
        self.env = env
        self.fw = fw
        self.checks = 0
        self._key: object = None

    def check(self, *, final: bool = False) -> None:
        self.checks += 1
        root = self.env.root
        names = _data_names(root)
        intruders = [q.tag for q in self.fw.queries if q.intruder]
        wrote = [n for n in names for tag in intruders if tag in n]
        if wrote:
            raise Violation("refuses", f"the intruder query left {wrote[:3]} in the lake")
        # What a reader lists: the published names (a staged file changes nothing it reads).
        table = os.path.join(root, "_lakesink", "table.json")
        key = (
            _stat(table),
            tuple((n, _stat(os.path.join(root, n))) for n in names if "/." not in f"/{n}"),
            self.fw.acknowledged(),
        )
        if key == self._key and not final:
            return
        if _stat(table) is None:
            data = [n for n in names if n.endswith(".parquet")]
            if data:
                raise Violation("readable", f"data files {data[:3]} but no table.json")
            self._key = key
            return
        from lakesink_reader.lake import Lake

        try:
            lake = Lake(root)
            files = lake.files()
            rows = lake.to_table(columns=["id"]).column("id").to_pylist()
        except Exception as exc:
            raise Violation("readable", f"the lake cannot be read: {type(exc).__name__}: {exc}") from exc
        acked = self.fw.acknowledged()
        if final:
            acked = {(q.index, e) for q in self.fw.writers for e in range(q.epochs)}
        self.check_rows(rows, "the lake", acked)
        tags = {q.tag: q.index for q in self.fw.queries}
        for f in files:  # each file is its (query, partition, epoch)'s: its rows say whose
            tag = f.name.removesuffix(".parquet").rsplit("-", 1)[-1]
            if tag not in tags:
                raise Violation("exactly_once", f"{f.name} is no query's")
        self._key = key

    def check_rows(self, rows: list[int], where: str, acked: set[tuple[int, int]]) -> None:
        """No row twice; rows of the queries only, each (query, epoch, partition) a prefix of its
        rows; every partition of each acknowledged (query, epoch) whole."""
        counts = Counter(rows)
        twice = sorted(r for r, n in counts.items() if n > 1)
        if twice:
            raise Violation(
                "exactly_once", f"{where} holds rows {twice[:5]} more than once ({len(twice)} in all)"
            )
        groups: dict[tuple[int, int, int], set[int]] = {}
        for r in counts:
            groups.setdefault(key_of(r), set()).add(r)
        plans = {q.index: q for q in self.fw.writers}
        for (q, e, p), have in sorted(groups.items()):
            plan = plans.get(q)
            if plan is None or e >= plan.epochs or p >= plan.partitions:
                raise Violation("exactly_once", f"{where} holds rows {sorted(have)[:3]} that no query writes")
            # A partitioned lake: each folder's file commits on its own, so a folder's rows are a
            # prefix of the (partition, epoch)'s rows in that folder.
            folders: dict[str, list[int]] = {}
            for r in task_rows(q, e, p):
                folders.setdefault(folder_value(r) if self.fw.partitioned else "", []).append(r)
            for folder, want in folders.items():
                got = {r for r in have if not self.fw.partitioned or folder_value(r) == folder}
                if got != set(want[: len(got)]):
                    raise Violation(
                        "exactly_once",
                        f"{where} holds {len(got)} rows of query {q}'s epoch {e} partition {p} "
                        f"{'in folder ' + folder + ' ' if folder else ''}that are not a prefix of its "
                        f"{len(want)} rows",
                    )
        for q, e in sorted(acked):
            for p in range(plans[q].partitions):
                want = task_rows(q, e, p)
                have = groups.get((q, e, p), set())
                if len(have) != len(want):
                    raise Violation(
                        "acknowledged",
                        f"{where}: query {q}'s epoch {e} is acknowledged, but partition {p} holds "
                        f"{len(have)} of its {len(want)} rows",
                    )

    def check_versions(self) -> None:
        """After the settle phase: every query finished, every epoch whole, once."""
        unfinished = [q.index for q in self.fw.writers if not q.finished]
        if unfinished:
            raise Violation("converges", f"queries {unfinished} could not finish their epochs without faults")
        self.check(final=True)

    def leftovers(self) -> list[str]:
        """What a converged foreach lake must not hold: anything but table.json and the files of
        the queries' (partition, epoch)s (no staged file, no lock, no probe)."""
        root = self.env.root
        expected = self.fw.all_files()
        found = []
        for folder, _, names in os.walk(root):
            rel = os.path.relpath(folder, root)
            for name in names:
                path = name if rel == "." else f"{rel}/{name}"
                if path != "_lakesink/table.json" and path not in expected:
                    found.append(path)
        return sorted(found)


def _data_names(root: str) -> list[str]:
    """Every name under ``root`` but ``_lakesink/`` (the root's and the partition folders')."""
    found = []
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != "_lakesink"]
        found += [n if rel == "." else f"{rel}/{n}" for n in names]
    return sorted(found)


def _final(fw: ForeachWorld) -> None:
    """Fault-free: vacuum and compact refuse, touching nothing; ``orphans --delete`` converges;
    ``verify`` is clean and checks every file."""
    from lakesink.maintenance.sweep import sweep
    from lakesink.maintenance.verify import verify

    env = fw.env
    world, storage = env.world, env.client(None)
    checker = env.checker
    assert isinstance(checker, ForeachChecker)
    world.now += 7200.0  # past every actor's skew
    world.note("final: vacuum and compact refuse, orphans --delete, verify")
    for what in ("vacuum", "compact"):
        guard = ReadOnly(storage)
        outcome = _refuse(env, what, guard)
        if outcome != "refused: a foreach lake" or guard.touched:
            raise Violation(
                "refuses", f"the final {what}: {outcome}; requests that change the store: {guard.touched}"
            )
    try:
        swept = sweep(storage, older_than=0.0, delete=True)
    except Exception as exc:
        raise Violation("converges", f"the final sweep raised {type(exc).__name__}: {exc}") from exc
    if not swept.ok or swept.kept:
        raise Violation("converges", f"the final sweep failed on {swept.failed[:3]}, kept {swept.kept[:3]}")
    left = checker.leftovers()
    if left:
        raise Violation("converges", f"the final pass left {left[:5]} ({len(left)} in all)")
    checker.check(final=True)
    report = verify(storage)
    files = len(fw.all_files())
    if not report.ok or report.checked != files:
        raise Violation(
            "converges",
            f"verify after the final pass: checked {report.checked} of {files} files, "
            f"problems {[(p.name, p.problem) for p in report.problems][:3]}",
        )
    refused = sum(q.refused for q in fw.queries if q.intruder)
    world.note(
        f"final: converged, {files} files, swept {len(swept.removed)}, intruder refused {refused} times; "
        f"now +{world.now - START:.0f} s"
    )
