"""The upgrade world (switch ``upgrade``; issue 32, "upgrade of a format-2 lake").

A seed that picks it starts from a **format-2 epoch lake** (:func:`format2_lake`, the one
place it is built) holding the first epochs of one streaming query, and then runs, under every
fault the simulation has:

- 1-3 ``upgrade`` actors, each running ``lakesink.maintenance.upgrade.upgrade`` (the CLI's call:
  the store check on) until it ended well once or twice, possibly at once, rerun after a failure
  and run again when killed (:func:`supervised`); some of them *slow*: a run pauses for hours to
  days at one of upgrade's steps (its ``hook``), or until the log was truncated, as a paused
  process would -- how a run resumes after another one finished and vacuum truncated the log;
  beside a slow one, a forced ``vacuum --retain 0`` (``truncate``) once the lake is format 3;
- the query itself: each run reads table.json when it starts (as the data source does) and
  writes **format 2** (``tests.sim.legacy.EpochCommitter``, as lakesink's format-2 writer did)
  while it says 2 -- a run that started before the upgrade keeps writing through it and after
  its commit point, as a zombie does -- and **format 3** (``tests.sim.actors.writer_run``)
  once it says 3, continuing its epochs as batches: the upgrade imported epoch ``e`` as batch
  ``e`` of writer ``<query id>``, so ``committed_through`` and the replay skipping work as for
  any format-3 writer;
- maybe a **zombie twin**: a second driver of the same query (one thought dead) on format 2,
  never restarted, committing epochs from where it stands; it shares the query's checkpoint;
- with ``multi``, fresh format-3 writers (``allow_other_queries``) once the lake is format 3;
  and the maintenance actors the seed enables, most of them waiting for format 3.

Invariants (:class:`UpgradeChecker`, after every step that changed the store): before the
commit point the lake reads as format 2 -- every acknowledged epoch recorded once, the rows
whole epochs once, exactly the recorded ones; after it, as format 3 (the common invariants of
``tests.sim.invariants``: every acknowledged v2 epoch and v3 batch present once, nothing
duplicated); table.json never goes back; and always, **the fence holds**: no format-2 record
after the fence, and no upgrade run reports strays (the format-2 committer refuses every epoch
at or after the fence, whatever its query id, so upgrade's loud report must never be needed).
Settling: a final fault-free upgrade if none reached the commit point; then the common final
pass, and a last upgrade run that must find the lake upgraded, with no strays.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tests.sim import actors
from tests.sim.invariants import Checker, Violation, _folder_stats, _stat

if TYPE_CHECKING:
    from tests.sim.run import Env
    from tests.sim.world import Actor

#: The format-2 query's plan index (its rows are ``actors.batch_rows(0, epoch)``).
QUERY = 0


def format2_lake(env: Env, plan: actors.WriterPlan, epochs: int, interval: int) -> str:
    """The format-2 epoch lake the world starts from: ``epochs`` epochs of query ``plan``, written
    fault-free by the format-2 writer (``tests.sim.legacy``). Returns the table id.

    The one place the simulation makes a format-2 lake: with the format-2 writer's frozen copy,
    so that each seed's lake (epochs, checkpoint interval) stays what its schedule was drawn for;
    the tests' end-to-end upgrades start from bytes instead (``tests/fixtures/format2-query``)."""
    from tests.sim.legacy import EpochCommitter, format2_table

    storage = env.client(None)
    meta = format2_table(storage, actors.SCHEMA, "epoch")
    committer = EpochCommitter(storage, query_id=plan.id, checkpoint_interval=interval)
    for epoch in range(epochs):
        committer.commit(epoch, _publish(storage, epoch), source_offsets=_offsets(epoch))
        plan.acked[epoch] = "committed"
        plan.next_batch = epoch + 1
    assert meta.table_id is not None
    return meta.table_id


def _offsets(epoch: int) -> Any:
    return [{"src": {"0": 10 * (epoch + 1)}}]


def _publish(storage: Any, epoch: int) -> list[Any]:
    """A format-2 epoch's task files (``data_file_name``, as ``LakeStreamWriter.write`` names them
    for a format-2 lake), published; raises when a task fails (the run then fails)."""
    from lakesink.commit.files import FileWriter, WriteOptions
    from lakesink_reader.format.log import CommittedFile
    from lakesink_reader.names import data_file_name, new_attempt_id

    files = []
    for task, ids in enumerate(actors.batch_rows(QUERY, epoch)):
        name = data_file_name(task, epoch, new_attempt_id())
        writer = FileWriter(storage, name, actors.SCHEMA, WriteOptions(row_group_bytes=1024))
        writer.write(pa.record_batch([pa.array(ids, pa.int64())], schema=actors.SCHEMA))
        done = writer.publish()
        assert done is not None and done.won
        files.append(CommittedFile(name, task, epoch, done.rows, done.size))
    return files


def table_format(root: str) -> int:
    """table.json's format version, read god's-eye (no scheduling point)."""
    with open(os.path.join(root, "_lakesink", "table.json"), "rb") as f:
        return int(json.loads(f.read())["format_version"])


@dataclass
class UpgradeWorld:
    """What the upgrade world's actors and checks share."""

    v2_interval: int  # the format-2 writer's checkpoint interval (segments and the hint)
    epochs: int  # epochs in the lake the world started from
    format3_seen: bool = False  # the checker saw table.json say 3
    #: format-2 files the final sweep keeps by design (``undocumented``)
    kept_by_design: set[str] = field(default_factory=set)

    @classmethod
    def create(cls, env: Env) -> UpgradeWorld:
        """Build the format-2 lake (its query is ``env.writers[0]``); sets ``env.table_id`` and
        ``env.interval`` (what table.json says once upgraded: the default, 100, or one it names)."""
        from lakesink_reader.format.v3.logfiles import DEFAULT_CHECKPOINT_INTERVAL
        from lakesink_reader.names import TABLE_FILE

        rng = env.world.rng
        world = cls(v2_interval=env.interval, epochs=rng.randint(2, 4))
        plan = actors.WriterPlan(QUERY, str(uuid.uuid4()), world.epochs + rng.randint(1, 4), False, False)
        env.writers.append(plan)
        env.table_id = format2_lake(env, plan, world.epochs, world.v2_interval)
        env.interval = DEFAULT_CHECKPOINT_INTERVAL
        if rng.random() < 0.6:
            # A lake whose table.json names its interval (upgrade keeps it): the upgraded log then
            # checkpoints within a few versions, so vacuum truncates while upgrades and writers
            # run, as on a long-lived lake at 100 -- which a seed's few dozen versions never reach.
            env.interval = rng.choice([2, 3, 4])
            storage = env.client(None)
            doc = json.loads(storage.read_bytes(TABLE_FILE))
            storage.put(TABLE_FILE, json.dumps({**doc, "checkpoint_interval": env.interval}).encode())
        env.checker = UpgradeChecker(env, world)
        env.world.note(
            f"upgrade world: a format-2 lake with {world.epochs} epoch(s) of query {plan.id[:8]} "
            f"(v2 checkpoint interval {world.v2_interval}, format-3 interval {env.interval}), "
            f"{plan.batches} batches in all"
        )
        return world

    def spawn(
        self, env: Env, *, skew: Callable[[], float], idle: list[float], views: bool, n_writers: int
    ) -> None:
        """The seed's actors: the query's first busy run, maybe its zombie twin, the upgrades,
        and (``multi``) fresh format-3 writers."""
        from lakesink_reader.format.v3.logfiles import DEFAULT_CHECKPOINT_INTERVAL
        from tests.sim.run import _start_writer

        world, rng = env.world, env.world.rng
        query = env.writers[QUERY]
        query.views = views
        _start_writer(env, query, offset=skew(), idle=idle)
        if rng.random() < 0.5:
            world.spawn("zombie", self.v2_run(env, query, idle=idle), offset=skew())
        slow = [rng.random() < 0.4 for _ in range(rng.randint(1, 3))]
        for i, is_slow in enumerate(slow):
            self.spawn_upgrade(env, f"upgrade{i}", rng.randint(1, 2), slow=is_slow, offset=skew(), restarts=3)
        if any(slow) and "vacuum" in env.cfg.actors and env.interval < DEFAULT_CHECKPOINT_INTERVAL:
            # What a slow run must survive (issue 32): the log truncated under it. The seed's
            # own vacuum mostly waits out retention; this one is forced, as soon as it can be.
            supervised(
                env,
                "truncate",
                lambda first: after_format_3(env, self.truncate_runs(env)),
                offset=skew(),
                restarts=3,
                delay=[0.0],
            )
        for i in range(1, n_writers):
            plan = actors.WriterPlan(i, str(uuid.uuid4()), rng.randint(2, 7), True, views)
            env.writers.append(plan)
            _start_writer(env, plan, offset=skew(), idle=idle)

    # The query's runs ----------------------------------------------------------------------------

    def writer_run(self, env: Env, plan: actors.WriterPlan, *, idle: list[float]) -> Callable[[Actor], Any]:
        """One run of a query: the format table.json says when it starts decides how it writes
        (``lakesink.spark.datasource``: ``checked_table``); a fresh writer waits for format 3."""
        from lakesink_reader.format.table import read_table_metadata

        v3 = actors.writer_run(env, plan, idle=idle)
        v2 = self.v2_run(env, plan, idle=idle)

        def body(actor: Actor) -> Any:
            if plan.index != QUERY:
                wait_for_format_3(env)
            if read_table_metadata(env.client(actor)).format_version >= 3:
                return v3(actor)
            return v2(actor)

        return body

    def v2_run(self, env: Env, plan: actors.WriterPlan, *, idle: list[float]) -> Callable[[Actor], Any]:
        """A run of the query on format 2 (``LakeStreamWriter`` with a format-2 lake): per epoch,
        the tasks ask the epoch log whether it is committed (a replay writes nothing), publish
        their files, and the driver commits with ``EpochCommitter`` (sweeping once per run); a
        failed commit is aborted and ends the run. It never reads table.json again: once the
        upgrade fenced the log, its commits must fail."""
        from tests.sim.legacy import EpochCommitter

        def body(actor: Actor) -> str:
            world, storage = env.world, env.client(actor)
            committer = EpochCommitter(storage, query_id=plan.id, checkpoint_interval=self.v2_interval)
            swept = False
            while not plan.finished:
                e = plan.next_batch
                if idle and world.rng.random() < 0.3:
                    time.sleep(world.rng.choice(idle))
                files: list[Any] = []
                try:
                    if not committer.committed(e):
                        files = _publish(storage, e)
                    outcome = committer.commit(
                        e, files, source_offsets=_offsets(e), sweep_older_than=None if swept else 3600.0
                    )
                except Exception as exc:  # noqa: BLE001 - any failure is the outcome noted
                    what = f"{type(exc).__name__}: {exc!s:.160}"
                    world.note(f"{actor.name}: v2 epoch {e} failed: {what}; abort")
                    try:
                        committer.abort(e, files)
                    except Exception as abort_exc:  # noqa: BLE001 - Spark logs a failed abort
                        world.note(f"{actor.name}: abort of epoch {e} failed: {abort_exc!r:.120}")
                    return f"failed at v2 epoch {e}"
                swept = True
                fence = self.fence_epoch(env)
                if fence is not None and e >= fence:
                    told = f"{actor.name} was told v2 epoch {e} committed"
                    raise Violation("fence", f"{told}, at or after the fence at {fence}")
                plan.acked[e] = outcome.status
                plan.next_batch = max(plan.next_batch, e + 1)
                world.note(f"{actor.name}: v2 epoch {e} acknowledged: {outcome.status}")
            return "done"

        return body

    # The upgrades -------------------------------------------------------------------------------

    def spawn_upgrade(
        self, env: Env, name: str, runs: int, *, slow: bool, offset: float, restarts: int
    ) -> None:
        """An operator's ``lakesink upgrade``, run again when killed (``supervised``)."""
        supervised(
            env,
            name,
            lambda first: self.upgrade_runs(env, runs, slow=slow and first),
            offset=offset,
            restarts=restarts,
            delay=[0.0, 10.0, 600.0, 3600.0],
        )

    def upgrade_runs(self, env: Env, runs: int, *, slow: bool) -> Callable[[Actor], Any]:
        """``lakesink upgrade PATH`` until it has ended well ``runs`` times, rerun after a failure
        as its error says (up to 5 failures); a slow one pauses at one step of its first run."""
        from lakesink.maintenance.upgrade import STEPS, upgrade

        def body(actor: Actor) -> None:
            rng = env.world.rng
            storage = env.client(actor)
            pause_at = rng.choice(STEPS[:-1]) if slow else None
            pause = rng.choice([3600.0, 86400.0, 2 * 86400.0])
            # Half the slow runs pause until the log was truncated under them (or two days): the
            # moment issue 32 names, which fixed pauses meet only by chance.
            until_truncated = rng.random() < 0.5

            def hook(step: str) -> None:
                nonlocal pause_at
                if step != pause_at:
                    return
                pause_at = None
                if not until_truncated:
                    env.world.note(f"{actor.name}: pauses {pause:.0f} s at {step}")
                    time.sleep(pause)
                    return
                env.world.note(f"{actor.name}: pauses at {step} until the log is truncated")
                for _ in range(48):
                    if truncated(env):
                        env.world.note(f"{actor.name}: resumes at {step}: the log was truncated")
                        return
                    time.sleep(3600.0)

            ended, failed = 0, 0
            while ended < runs and failed < 5:
                try:
                    report = upgrade(storage, hook=hook)
                except Exception as exc:  # noqa: BLE001 - any failure is the outcome noted
                    failed += 1
                    why = env.world.redacted(str(exc))
                    env.world.note(f"{actor.name}: upgrade: raised {type(exc).__name__}: {why:.200}")
                    time.sleep(rng.choice([1.0, 60.0, 600.0]))
                    continue
                ended += 1
                self.check_report(report, actor.name)
                env.world.note(
                    f"{actor.name}: upgrade: {report.status}: fence {report.fence_epoch} (created "
                    f"{report.fence_created}), {report.imported} imported, "
                    f"upgrade at {report.upgrade_version}"
                )
                time.sleep(rng.choice([60.0, 3600.0, 86400.0]))

        return body

    def truncate_runs(self, env: Env) -> Callable[[Actor], Any]:
        """``lakesink vacuum --retain 0 --force`` until it ran through 1-3 times (up to 6 failures),
        minutes apart."""
        from lakesink.maintenance.vacuum import vacuum

        def body(actor: Actor) -> None:
            rng = env.world.rng
            runs, ok, failed = rng.randint(1, 3), 0, 0
            while ok < runs and failed < 6:
                time.sleep(rng.choice([1.0, 60.0, 600.0]))
                try:
                    report = vacuum(env.client(actor), retain=0, delete=True, force=True, older_than=0.0)
                    outcome = f"R={report.retained_from} checkpoint={report.checkpoint}, "
                    outcome += f"removed {len(report.removed)}"
                    ok += 1
                except Exception as exc:  # noqa: BLE001 - any failure is the outcome noted
                    outcome = f"raised {type(exc).__name__}: {env.world.redacted(str(exc)):.200}"
                    failed += 1
                env.world.note(f"{actor.name}: vacuum --retain 0 --force: {outcome}")

        return body

    @staticmethod
    def check_report(report: Any, who: str) -> None:
        if not report.ok:
            raise Violation("fence", f"{who}: {report.strays_message()}")
        if report.status not in ("upgraded", "already_format_3"):
            raise Violation("upgrade", f"{who}: upgrade ended with status {report.status}")

    # Fence, settle, final ---------------------------------------------------------------------

    @staticmethod
    def fence_epoch(env: Env) -> int | None:
        """The fence's epoch in the format-2 log (god's-eye), or None before there is one."""
        from lakesink.maintenance.upgrade import fence_token
        from lakesink_reader.format.log import EpochLog

        records = EpochLog(env.client(None)).records()
        return next((r.epoch for r in records if fence_token(r) is not None), None)

    def settle(self, env: Env) -> None:
        """Faults are off and nothing runs: a last upgrade when none reached the commit point."""
        from lakesink.maintenance.upgrade import upgrade

        if table_format(env.root) >= 3:
            return
        env.world.note("settle: no upgrade reached the commit point: a final one")
        try:
            report = upgrade(env.client(None))
        except Exception as exc:
            raise Violation("converges", f"the final upgrade raised {type(exc).__name__}: {exc}") from exc
        self.check_report(report, "the final upgrade")
        env.world.note(f"settle: upgrade: {report.status} at {report.upgrade_version}")
        env.checker.check()

    def undocumented(self, env: Env, kept: list[Any]) -> list[Any]:
        """What the final sweep kept, less the one leftover format-v3.md section 11 documents: a
        ``part-<p>-epoch-<b>-…`` file (a format-2 writer's; the name says no writer) no version
        lists is settled only when ``b > 0`` and *every* unretired writer has committed batch
        ``b`` -- so a format-2 run's dead attempt stays for good beside a format-3 writer that
        ended below ``b`` (every writer has finished here). Noted in the trace, left out of
        the leftovers check too."""
        documented = [
            o for o in kept if o.kind == "unrecorded_file" and o.name.startswith("part-") and not o.settled
        ]
        for orphan in documented:
            env.world.note(f"final: kept by design (format-v3.md section 11): {orphan.name}: {orphan.reason}")
            self.kept_by_design.add(orphan.name)
        return [o for o in kept if o not in documented]

    def final(self, env: Env) -> None:
        """After the final pass: another run finds the lake upgraded and no stray."""
        from lakesink.maintenance.upgrade import upgrade

        try:
            report = upgrade(env.client(None))
        except Exception as exc:
            what = f"{type(exc).__name__}: {exc}"
            raise Violation("converges", f"upgrade after the final pass raised {what}") from exc
        self.check_report(report, "upgrade after the final pass")
        if report.status != "already_format_3":
            raise Violation("upgrade", f"upgrade after the final pass says {report.status}")


def supervised(
    env: Env,
    name: str,
    make: Callable[[bool], Callable[[Actor], Any]],
    *,
    offset: float,
    restarts: int,
    delay: list[float],
    first: bool = True,
) -> None:
    """Spawn ``make(first)``'s body as ``name``; killed (kill -9), it is run again after a drawn
    delay, up to ``restarts`` times, as an operator or a cron job would (the successor is
    spawned by the dying run, which holds the baton until its thread ends)."""
    from tests.sim.world import Killed

    body = make(first)

    def run(actor: Actor) -> Any:
        try:
            return body(actor)
        except Killed:
            # Not when the busy phase ended (``_busy`` kills whatever runs at twice the budget).
            if restarts and env.world.steps < 2 * env.cfg.max_steps:
                base, _, n = name.partition(".run")
                supervised(
                    env,
                    f"{base}.run{int(n or 1) + 1}",
                    make,
                    offset=offset,
                    restarts=restarts - 1,
                    delay=delay,
                    first=False,
                )
            raise

    env.world.spawn(name, run, offset=offset, delay=env.world.rng.choice(delay))


def truncated(env: Env) -> bool:
    """Whether vacuum truncated the upgraded log (its version 0 is gone), god's-eye."""
    log = os.path.join(env.root, "_lakesink", "log")
    return table_format(env.root) >= 3 and not os.path.exists(os.path.join(log, f"{0:020d}.json"))


def wait_for_format_3(env: Env) -> None:
    """Sleep (scheduling points) until table.json says format 3."""
    while table_format(env.root) < 3:
        time.sleep(env.world.rng.choice([60.0, 600.0, 3600.0]))


def after_format_3(env: Env, body: Callable[[Actor], Any]) -> Callable[[Actor], Any]:
    """A maintenance actor that an operator starts once the lake is format 3."""

    def wrapped(actor: Actor) -> Any:
        wait_for_format_3(env)
        return body(actor)

    return wrapped


class UpgradeChecker(Checker):
    """The common format-3 invariants once table.json says 3; before, the lake as format 2; always,
    the fence."""

    def __init__(self, env: Env, world: UpgradeWorld) -> None:
        super().__init__(env)
        self.world = world
        self._v2: object = None

    def check(self) -> None:
        from lakesink.maintenance.upgrade import fence_token
        from lakesink_reader.format.log import EpochLog

        fmt = table_format(self.env.root)
        if fmt < 3 and self.world.format3_seen:
            raise Violation("upgrade", f"table.json went back to format {fmt} after the commit point")
        key = (
            _stat(os.path.join(self.env.root, "_lakesink", "table.json")),
            _folder_stats(os.path.join(self.env.root, "_lakesink", "epochs")),
        )
        if key != self._v2:
            try:
                records = EpochLog(self.env.client(None)).records()
            except Exception as exc:
                raise Violation(
                    "readable", f"the format-2 log cannot be read: {type(exc).__name__}: {exc}"
                ) from exc
            fence = next((i for i, r in enumerate(records) if fence_token(r) is not None), None)
            if fence is not None and records[fence + 1 :]:
                after = [(r.epoch, r.query_id) for r in records[fence + 1 :]]
                raise Violation(
                    "fence", f"format-2 record(s) {after} after the fence at epoch {records[fence].epoch}"
                )
            if fmt < 3:
                self._check_v2(records[:fence])
            self._v2 = key
        if fmt >= 3:
            self.world.format3_seen = True
            super().check()
        else:
            self.checks += 1

    def leftovers(self) -> list[str]:
        kept = self.world.kept_by_design
        return [p for p in super().leftovers() if p.removeprefix("unlisted data file ") not in kept]

    def _check_v2(self, records: list[Any]) -> None:
        """Before the commit point: the lake reads as format 2."""
        from lakesink_reader.lake import Lake

        query = self.env.writers[QUERY]
        recorded = {r.epoch for r in records}
        foreign = [r.epoch for r in records if r.query_id != query.id]
        if foreign:
            raise Violation("exactly_once", f"format-2 epochs {foreign} are recorded by another query")
        missing = sorted(set(query.acked) - recorded)
        if missing:
            raise Violation("acknowledged", f"v2 epochs {missing} were acknowledged but have no record")
        try:
            rows = Lake(self.env.root).to_table(columns=["id"]).column("id").to_pylist()
        except Exception as exc:
            raise Violation(
                "readable", f"the format-2 lake cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
        present = self.check_rows(rows, "the format-2 lake")
        expected = {(QUERY, e) for e in recorded}
        if present != expected:
            raise Violation(
                "exactly_once",
                f"the format-2 lake holds epochs {sorted(present - expected)} it has no record of, and "
                f"lacks {sorted(expected - present)} that it records",
            )
