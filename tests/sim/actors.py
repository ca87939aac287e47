"""The simulation's actors: each runs the real code over its own client of the simulated store.

- an epoch writer *run* is what one run of a streaming query's driver and tasks do
  (``lakesink.spark.datasource.LakeStreamWriter``): read the log once at the start (Spark's
  ``committed_through``: tasks of a batch the log holds write nothing), then per batch publish
  each task's Parquet file with ``FileWriter`` under a name unique to the attempt (a failed
  task is retried with a new attempt, as Spark does), commit the batch with
  ``BatchCommitter.commit`` from the cursor the previous commit returned, and sweep once per
  run after the first commit (``sweep_after_commit``). A failed commit is aborted
  (``BatchCommitter.abort``, as Spark calls it) and ends the run; the next run replays the
  batch from Spark's checkpoint (the writer's ``next_batch``), which advances only when a
  commit returned. A run may idle between batches (a query that gets no data);
- ``vacuum``, ``compact`` and the orphan ``sweep`` as the CLI runs them, a few times each;
- readers (``Lake``) at the latest version and at an older retained one, and ``verify``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from tests.sim.run import Env
    from tests.sim.world import Actor

SCHEMA = pa.schema([("id", pa.int64())])
#: Ids of writer w's batch b, task t are w * W + b * B + t * T + row: disjoint per (w, b).
W, B, T = 10_000_000, 1_000, 100


def batch_rows(writer: int, batch: int) -> list[list[int]]:
    """The rows of each task of ``batch`` of writer ``writer``: fixed, so that a replay writes the
    same rows (Spark re-plans a batch from its offset log)."""
    tasks = 1 + (writer + batch) % 2
    return [
        [writer * W + batch * B + t * T + r for r in range(1 + (3 * writer + 5 * batch + t) % 4)]
        for t in range(tasks)
    ]


def batch_of(row_id: int) -> tuple[int, int]:
    return row_id // W, (row_id % W) // B


@dataclass
class WriterPlan:
    """One streaming query: its id, how many batches it writes, and Spark's checkpoint.

    A query reads one input *stream*; its batch ``b`` is the stream's batch ``base + b`` (its
    rows and end offsets). A query that continues another (``continue_writer``) reads the same
    stream from where that one ended, with ``continues`` naming it and ``base`` one past its
    last batch then; the query it continues is ``abandoned`` (its checkpoint lost: no restart).
    """

    index: int
    id: str
    batches: int
    allow_other_queries: bool
    views: bool
    stream: int = -1  # the input it reads; -1: its own (index)
    base: int = 0
    continues: str | None = None
    next_batch: int = 0  # Spark's commit log: every batch below it was acknowledged
    acked: dict[int, str] = field(default_factory=dict)  # batch -> the commit's status
    runs: int = 0
    actor: Actor | None = None
    abandoned: bool = False  # its checkpoint is gone: nobody restarts it
    refused: bool = False  # its continuation was refused: the user starts another one
    replaced: bool = False  # ... and has started it
    auto_compact: bool = False  # its driver compacts after a commit when enough files are small
    iceberg: bool = False  # it keeps the Iceberg view too (``iceberg_view``; only with ``views``)
    #: Its views' hooks run at once, as threads of its process (``in_threads``, what the data
    #: source and foreachBatch doors do); False: one after the other.
    views_together: bool = False
    #: The Spark door it writes through: "data_source" (each call in a driver worker, the abort
    #: of a failed commit in a fresh one) or "foreach_batch" (every call in the user's process).
    door: str = "data_source"
    #: The chance that a data-source call runs in another driver worker than the last (its memo lost).
    p_new_worker: float = 0.0
    #: foreach_batch: the chance that a batch is written on the driver, as one task (``driver_write``).
    p_driver: float = 0.0

    def __post_init__(self) -> None:
        if self.stream < 0:
            self.stream = self.index

    @property
    def finished(self) -> bool:
        return self.next_batch >= self.batches

    def rows(self, batch: int) -> list[list[int]]:
        return batch_rows(self.stream, self.base + batch)

    def end_offsets(self, batch: int) -> list[dict[str, dict[str, int]]]:
        """The source's end offsets of ``batch``, as Spark's offset log holds them: the stream's
        next offset (ten per stream batch)."""
        return [{"src": {"0": 10 * (self.base + batch + 1)}}]


class TaskFailed(Exception):
    pass


class SimCheckpoint:
    """Spark's checkpoint of a simulated query (``lakesink.writer.run.QueryCheckpoint``): its id,
    its batches' end offsets, and where a continuing query starts."""

    def __init__(self, plan: WriterPlan) -> None:
        self.plan = plan

    def query_id(self) -> str | None:
        return self.plan.id

    def end_offsets(self, batch: int) -> Any:
        return self.plan.end_offsets(batch)

    def start_offsets(self) -> Any:
        return self.plan.end_offsets(-1)


def acting(env: Env) -> contextlib.AbstractContextManager[None]:
    """A call that acts on one version of the lake: in a recreate world, the lake is not reset
    while it runs (``tests.sim.recreate``)."""
    return env.recreate.busy() if env.recreate is not None else contextlib.nullcontext()


def writer_run(env: Env, plan: WriterPlan, *, idle: list[float]) -> Callable[[Actor], Any]:
    """One run of ``plan``'s query, through the writer's run (``lakesink.writer.run``) as a Spark
    door drives it: per batch, the planning call (``WriterRun.start``), the tasks
    (``TaskPlan.write``, a failed task retried up to 3 times), the commit call (``start`` again,
    then ``commit``), and after a failure the abort call (``start``, then ``abort`` with a
    failed task's report missing). Each call is a fresh ``WriterRun``, as Spark unpickles a
    fresh writer; the run's memo is lost as a worker changes: at random between calls, and
    always for the abort after a failed commit (pyspark ends the worker whose call raised).
    A ``foreach_batch`` plan is the other door: every call in the user's one process (the memo
    kept) and no abort at all (a failed commit cleans up after itself; a failed task's files
    are left to the sweep); a batch of it may be written on the driver as one task
    (``driver_write``)."""
    from lakesink.commit.files import WriteOptions
    from lakesink.config import SinkConfig, SinkOptions
    from lakesink.writer.memo import RunMemo
    from lakesink.writer.run import TaskReport, WriterRun
    from lakesink_reader.errors import CommitRefusedError
    from tests.sim.store import new_connection, release_held

    def body(actor: Actor) -> str:
        world, storage = env.world, env.client(actor)
        config = SinkConfig(
            env.root,
            write=WriteOptions(row_group_bytes=1024),
            sink=SinkOptions(
                checkpoint_interval=env.interval,
                staged_cleanup_age=3600.0,
                allow_other_queries=plan.allow_other_queries,
                continue_writer=plan.continues,
                delta_log=plan.views,
                spark_metadata=plan.views,
                iceberg_view=plan.iceberg or None,
                # Sized for the simulation's few tiny files (``compaction`` below).
                auto_compact=plan.auto_compact,
            ),
        )
        token = uuid.uuid4().hex[:16]
        memo = RunMemo()

        def call(fresh: bool = False) -> WriterRun:
            """A Spark call's writer: the run's memo, unless this call runs in another worker."""
            nonlocal memo
            if fresh or (plan.door == "data_source" and world.rng.random() < plan.p_new_worker):
                memo = RunMemo()
                if new_connection(actor):
                    world.note(f"{actor.name}: a new worker: its calls go on a new connection")
            return WriterRun(
                config,
                storage,
                SimCheckpoint(plan),
                memo,
                token,
                together=world.together if plan.views_together else None,
                compaction={"min_small": 4, "min_files": 2},
            )

        while not plan.finished:
            b = plan.next_batch
            if idle and world.rng.random() < 0.3:
                import time

                time.sleep(world.rng.choice(idle))
            reports: list[TaskReport | None] = []
            committing = False
            rows = plan.rows(b)
            try:
                tasks = call().start(SCHEMA)  # Spark plans the batch: streamWriter
                if plan.door == "foreach_batch" and world.rng.random() < plan.p_driver:
                    rows = [[i for task in rows for i in task]]  # ``driver_write``: one task, on the driver
                for task, ids in enumerate(rows):
                    report = None
                    for attempt in range(3):  # Spark retries a failed task
                        try:
                            batch = pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)
                            report = tasks.write(iter([batch]), task, b, plan.id, storage=storage)
                        except Exception as exc:  # noqa: BLE001 - Spark retries any task failure
                            what = f"task {task} of batch {b} attempt {attempt}"
                            world.note(f"{actor.name}: {what} failed: {exc!r:.120}")
                            continue
                        break
                    reports.append(report)
                    if report is None:
                        raise TaskFailed(f"task {task} of batch {b} failed 3 times")
                # An aimed reset of the lake (``tests.sim.recreate``): the tasks end slowly, until
                # the lake is reset under them; the data source door's commit call then runs in
                # another driver worker (Spark's choice: any), which reads the new lake afresh.
                reset = env.recreate is not None and env.recreate.planned(plan, b, tasks.committed_through)
                if reset:
                    env.recreate.drain()
                committing = True
                with acting(env):
                    driver = call(fresh=reset and plan.door == "data_source")
                    driver.start(SCHEMA)  # the commit worker asks for the writer first
                    result = driver.commit(b, [r for r in reports if r is not None])
            except Exception as exc:  # noqa: BLE001 - any failure is the outcome noted
                world.note(f"{actor.name}: batch {b} failed: {type(exc).__name__}: {exc!s:.160}")
                refused = isinstance(exc, CommitRefusedError) and plan.continues is not None and b == 0
                if plan.door == "data_source" and not refused:
                    # Spark's abort, in a fresh worker after a failed commit; a task's slot empty.
                    slots = reports + [None] * (len(rows) - len(reports))
                    try:
                        with acting(env):
                            aborter = call(fresh=committing)
                            aborter.start(SCHEMA)
                            aborter.abort(b, slots)
                        world.note(f"{actor.name}: batch {b} aborted")
                    except Exception as abort_exc:  # noqa: BLE001 - Spark logs a failed abort
                        world.note(f"{actor.name}: abort of batch {b} failed: {abort_exc!r:.120}")
                    finally:
                        release_held(env.shared, actor)
                if refused:
                    # The continued query committed since this one read its offsets: the start
                    # offsets in this query's checkpoint are stale for good. Its user starts anew.
                    plan.refused = plan.abandoned = True
                return f"failed at batch {b}"
            plan.acked[b] = result.status
            plan.next_batch = b + 1
            world.note(f"{actor.name}: batch {b} acknowledged: {result.status} at version {result.version}")
            if driver.compacted is not None:
                done = driver.compacted
                what = done.report.status if done.report is not None else "failed"
                world.note(f"{actor.name}: auto-compaction after batch {b}: {what}")
        return "done"

    return body


def continuer(env: Env, old: WriterPlan, *, stop: bool) -> Callable[[Actor], Any]:
    """A user whose query ``old`` lost its checkpoint: they stop it (``stop``; else it runs on,
    a zombie), read its offsets from the lake (``lakesink offsets``) and start a new query with
    ``continue_writer`` from them. Nothing is started when the lake does not know ``old`` yet
    (there is nothing to continue: the old query is kept) or holds all of its stream."""
    from lakesink.commit.versions import VersionedLogWriter

    def body(actor: Actor) -> str:
        if old.finished or (old.abandoned and not old.refused):
            return f"{old.id[:8]} needs no continuation"
        if stop and old.actor is not None and not old.actor.done:
            old.actor.killed = True  # the user stops the old query (its next call raises)
        state = VersionedLogWriter(env.client(actor), env.table_id, checkpoint_interval=env.interval).open()
        target = old
        while target.continues is not None and target.id not in state.writers:
            # A refused continuation never reached the log: continue what it meant to.
            target = next(p for p in env.writers if p.id == target.continues)
        known = state.writers.get(target.id)
        if known is None:
            return f"{target.id[:8]} is not in the lake: nothing to continue"
        old.abandoned = True
        base = target.base + known.last_batch + 1
        total = target.base + target.batches
        if base >= total:
            return f"the lake holds all of stream {target.stream}: nothing to continue"
        plan = env.add_writer(
            batches=total - base, stream=target.stream, base=base, continues=target.id, offset=actor.offset
        )
        return f"writer {plan.index} continues writer {target.index} from stream batch {base}"

    return body


def repeat(
    env: Env, runs: int, pause: list[float], what: str, job: Callable[[Any], str]
) -> Callable[[Actor], Any]:
    """An actor that runs ``job`` ``runs`` times with pauses, noting each outcome (a maintenance
    command fails under faults; only the final fault-free pass must succeed)."""

    def body(actor: Actor) -> None:
        import time

        from tests.sim.invariants import Violation

        storage = env.client(actor)
        for _ in range(runs):
            time.sleep(env.world.rng.choice(pause))
            try:
                with acting(env):
                    outcome = job(storage)
            except Violation:  # what a reader found wrong fails the seed (not an outcome to note)
                raise
            except Exception as exc:  # noqa: BLE001 - any failure is the outcome noted
                outcome = f"raised {type(exc).__name__}: {env.world.redacted(str(exc)):.200}"
            env.world.note(f"{actor.name}: {what}: {outcome}")

    return body


def vacuum_job(env: Env) -> Callable[[Any], str]:
    from lakesink.maintenance.vacuum import vacuum

    def job(storage: Any) -> str:
        rng, actor = env.world.rng, env.world.current
        assert actor is not None
        actor.data["clock_high"] = actor.offset  # the clock may step during the run: its highest
        retain = rng.choice([0.0, 60.0, 600.0, 3600.0, 86400.0])
        if any(a.data.get("parked") == "truncation" for a in env.world.live()):
            retain = 0.0  # ``aim_gap``: a writer waits at its create for a truncation past it
        elif actor.name == "vacuum.window":
            retain = 600.0 if retain < 600.0 else min(retain, 3600.0)  # ``aim_window``
        report = vacuum(
            storage,
            retain=retain,
            delete=True,
            force=True,
            older_than=rng.choice([0.0, 600.0, 3600.0]),
            check_store=rng.random() < 0.3,
        )
        for other in env.world.actors:  # those parked for what this vacuum did go on (aimed
            parked = other.data.get("parked")  # orders: ``aim_straddle``, ``aim_gap``)
            if (parked == "files" and report.removed) or (
                parked == "truncation" and other.target in report.log_entries
            ):
                other.stalled, other.data["parked"] = 0, None
        # Judged at the latest time this actor's clock read during the run: the loosest bound.
        high = env.world.now + max(actor.data.pop("clock_high"), actor.offset)
        env.checker.check_retention(
            report.retained_from, report.previous_retained_from, high - retain, retain
        )
        return (
            f"retain {retain:g}: R={report.retained_from} commit={report.version} "
            f"checkpoint={report.checkpoint} removed {len(report.removed)} failed {len(report.failed)}"
            f" views {sum(o.kind == 'view_file' for o in report.files)}"
        )

    return job


def compact_job(env: Env) -> Callable[[Any], str]:
    from lakesink.commit.files import WriteOptions
    from lakesink.maintenance.compact import compact

    def job(storage: Any) -> str:
        from tests.sim.store import release_held

        rng = env.world.rng
        try:
            report = compact(
                storage,
                target_file_size=64 << 10,
                min_files=2,
                write_options=WriteOptions(row_group_bytes=1024),
                abandon_older_than=rng.choice([0.0, 600.0, 3600.0]),
                check_store=False,
            )
        finally:  # a create held until the compaction gave up (an aimed order) lands now
            assert env.world.current is not None
            release_held(env.shared, env.world.current)
        return f"{report.status} at {report.version}: {report.input_files} -> {len(report.outputs)}"

    return job


def sweep_job(env: Env) -> Callable[[Any], str]:
    from lakesink.maintenance.sweep import sweep

    # ``lakesink orphans``: with the Iceberg view, its expired files too, beside live hooks (no
    # draw of the world's generator: seeds keep their schedules up to the sweep's own calls).
    views = any(p.iceberg for p in env.writers)

    def job(storage: Any) -> str:
        older_than = env.world.rng.choice([0.0, 600.0, 3600.0])
        report = sweep(storage, older_than=older_than, delete=True, check_store=False, views=views)
        return f"removed {len(report.removed)} kept {len(report.kept)} failed {len(report.failed)}"

    return job


def read_job(env: Env) -> Callable[[Any], str]:
    """A reader at the latest version, then at an older retained one. Each read is held to the
    model of the version it pinned (``Checker.check_read``): its rows are that version's batches,
    each once; it may fail only under store faults or once vacuum gave that version up. With
    ``data_points``, maintenance may run whole between the log read and the data read."""
    from lakesink_reader.lake import Lake

    def ids(lake: Lake) -> list[int]:
        return lake.to_table(columns=["id"]).column("id").to_pylist()

    def job(storage: Any) -> str:
        lake = Lake(env.root)
        latest = lake.version
        if latest is None:  # a format-2 lake (an upgrade world): no versions to pin
            rows = ids(lake)
            env.checker.check_rows(rows, "a reader of a format-2 lake")
            return f"read {len(rows)} rows of a format-2 lake"
        rows = env.checker.check_read(latest, "a reader at the latest version", lambda: ids(lake))
        versions = [v.version for v in lake.versions()]
        if not versions:
            return f"read {len(rows)} rows at {latest}"
        older = env.world.rng.choice(versions)
        old_rows = env.checker.check_read(
            older, "a reader at an older version", lambda: ids(lake.at(version=older))
        )
        return f"read {len(rows)} rows at {latest}, {len(old_rows)} at {older}"

    return job


def view_syncs(env: Env) -> list[tuple[str, Callable[[Any], Any]]]:
    """What ``lakesink sync-views`` brings up in this world, by name: the Delta and Spark views,
    and the Iceberg view when a writer keeps it (pyiceberg loads only then)."""
    from lakesink.views.delta_view import delta_sync
    from lakesink.views.spark_metadata_view import spark_sync

    syncs: list[tuple[str, Callable[[Any], Any]]] = [("Delta", delta_sync), ("Spark", spark_sync)]
    if any(p.iceberg for p in env.writers):
        from lakesink.views.iceberg_view import iceberg_sync

        syncs.append(("Iceberg", iceberg_sync))
    return syncs


def sync_views_job(env: Env) -> Callable[[Any], str]:
    """``lakesink sync-views``: brings the views up to the lake, beside writers that update
    them too."""
    syncs = [(name.lower(), sync) for name, sync in view_syncs(env)]

    def job(storage: Any) -> str:
        return "; ".join(f"{name}: {sync(storage).summary()}" for name, sync in syncs)

    return job


def verify_job(env: Env) -> Callable[[Any], str]:
    from lakesink.maintenance.verify import verify

    def job(storage: Any) -> str:
        report = verify(storage)
        return f"ok={report.ok} problems={[(p.name, p.problem) for p in report.problems][:3]}"

    return job
