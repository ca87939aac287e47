"""Log scale (format 3): opening and committing to a lake of 100,000 commits and 1,000,000 live files.

The lake is synthetic and built fast (:func:`build_lake`): its commits are encoded by the
library's own encoder (``PendingCommit.append(...).at(v)`` then ``encode_commit``) and written
as plain files, one writer committing ``--log-scale-files-per-commit`` (10) files a batch; the
checkpoint two intervals below the newest version is written directly too (its file list
through the library's list schema and row-group writer, its small part through
``encode_checkpoint``). No data file exists: nothing measured here reads one, only the log.
Then, each in a fresh subprocess (peak RSS from ``/proc/self/status`` VmHWM, wall time with
``time.perf_counter``):

- ``checkpoint``: the library's ``write_checkpoint`` of the newest multiple of the interval
  (from the direct one below it and the commits since), at ~1M live files: time, peak RSS,
  and the size of the list and the small part. Readers then start from it, with N-1 commits
  after it, the most a current checkpoint leaves (the open's worst case);
- ``open``: ``Lake(path)``, ``--log-scale-repeats`` processes (the median counts), next to
  the interpreter alone, ``import lakesink_reader`` and ``import pyarrow.parquet``;
- ``first commit``: ``BatchCommitter.commit`` of one batch, by the continuing writer (its next
  batch) and by a new writer with ``allow_other_queries``. Its version is a multiple of the
  interval, so it writes the checkpoint at 1M files too: the time to the commit point and the
  checkpoint's time are taken apart (the committer's ``checkpoint_if_due`` is wrapped), and
  the versions it added are removed again afterwards;
- ``latency``: ``--log-scale-latency-commits`` (200) commits in a row of ``BatchCommitter``
  (checkpoint interval 100) into a fresh local lake, the same files per commit; again with the
  Iceberg view on too (all three derived views); again on the 1M
  lake (its continuing writer); unless ``--skip-s3``, on a fresh moto S3 server too. p50/p95/max
  per commit. (Format 2's writer, measured beside it until 2026-11-27, is gone.)

At full scale (2 cores) the build takes ~45 s, the local measurements ~10 s, S3 ~30 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from figures import middle, p50_p95

#: The lake's one writer (a query id) and its run token: fixed, so that builds are repeatable.
WRITER = str(uuid.UUID(int=0x5EED_0000_0000_4000_8000_0000_0000_0001))
RUN = "bench-log-scale"
#: The other writer of the "new writer" first commit.
NEW_WRITER = str(uuid.UUID(int=0x6EED_0000_0000_4000_8000_0000_0000_0002))  # another tag
COMMITTED_AT = 1_767_225_600.0  # 2026-01-01: commit v is dated this + v seconds
MiB = 1 << 20


# The synthetic lake -----------------------------------------------------------------------------


def _h(*parts: int) -> int:
    """A cheap deterministic 64-bit hash of small ints."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = ((x ^ p) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
        x ^= x >> 31
    return x


def add_file(version: int, partition: int, tag: str) -> Any:
    """The ``AddFile`` of file ``partition`` of the batch committed at ``version`` (batch = version):
    a format-3 writer's name, a size between 64 KiB and 32 MiB, stats of the bench stream's
    four columns (exact in shape, made-up values)."""
    from lakesink_reader.format.v3.commits import AddFile

    h = _h(version, partition)
    size = (1 << 16) + h % (32 << 20)
    rows = size // 24
    first = (version * 1000 + partition) * 100_000
    day = 1 + version % 28
    stats = {
        "numRecords": rows,
        "minValues": {
            "id": first,
            "ts": f"2026-01-{day:02d}T00:00:00.000Z",
            "label": f"label-{h % 1000:05d}-aaaaaaaaaa",
            "amount": -float(h % 1000),
        },
        "maxValues": {
            "id": first + rows - 1,
            "ts": f"2026-01-{day:02d}T23:59:59.999Z",
            "label": f"label-{h % 1000:05d}-zzzzzzzzzz",
            "amount": float(h % 100_000) + 0.5,
        },
        "nullCount": {"id": 0, "ts": 0, "label": h % 7, "amount": 0},
    }
    name = f"w{tag}-b{version:012d}-p{partition:05d}-{_h(h):016x}.parquet"
    return AddFile(name, rows, size, partition, version, stats)


def synthetic_files(version: int, count: int, tag: str) -> list[Any]:
    return [add_file(version, p, tag) for p in range(count)]


def layout(commits: int, interval: int) -> tuple[int, int]:
    """(direct, measured): the checkpoint the builder writes, and the newest one, written by the
    library's ``write_checkpoint`` as the ``checkpoint`` measurement."""
    last = commits - 1
    measured = last // interval * interval
    direct = measured - interval
    if direct < interval:
        raise ValueError(f"--log-scale-commits must be at least {3 * interval} (3 checkpoint intervals)")
    return direct, measured


def build_lake(root: Path, commits: int, files_per_commit: int, interval: int) -> dict[str, Any]:
    """The synthetic lake at ``root``: table.json, commits ``0..commits-1``, the direct checkpoint
    and the hint naming it. Returns what the measurements need (table id, checkpoint versions)."""
    import pyarrow.parquet as pq
    from inputs import input_schema

    from lakesink.commit.checkpoints import LIST_ROW_GROUP_ROWS, RowGroups
    from lakesink_reader.format.table import ensure_table
    from lakesink_reader.format.v3.checkpoint import (
        LAST_CHECKPOINT,
        LIST_SCHEMA,
        Checkpoint,
        _list_table,
        checkpoint_name,
        encode_checkpoint,
        file_list_name,
    )
    from lakesink_reader.format.v3.commits import PendingCommit, encode_commit, writer_tag
    from lakesink_reader.format.v3.logfiles import commit_name
    from lakesink_reader.format.v3.state import LiveFile, TableState
    from lakesink_reader.storage import open_storage

    started = time.perf_counter()
    direct, measured = layout(commits, interval)
    root.mkdir(parents=True)
    storage = open_storage(str(root))
    meta = ensure_table(storage, input_schema(), "epoch", checkpoint_interval=interval)
    table_id = meta.table_id
    assert table_id is not None
    tag = writer_tag(WRITER)
    (root / commit_name(0)).parent.mkdir(parents=True, exist_ok=True)
    list_token = f"{_h(commits, files_per_commit):016x}" * 2
    list_name = file_list_name(direct, list_token)
    state = TableState.empty(table_id)
    log_bytes = 0
    # Creating 100,000 small files is most of the build: threads overlap the file system's waits.
    with (
        pq.ParquetWriter(str(root / list_name), LIST_SCHEMA, compression="zstd") as writer,
        ThreadPoolExecutor(4) as pool,
    ):
        writes: list[Future[int]] = []
        groups = RowGroups(writer, LIST_ROW_GROUP_ROWS)
        pending_rows: list[Any] = []
        for v in range(commits):
            adds = synthetic_files(v, files_per_commit, tag)
            commit = PendingCommit.append(
                writer_id=WRITER,
                batch=v,
                run=RUN,
                adds=adds,
                source_offsets=[{"events": {"0": (v + 1) * 500, "1": (v + 1) * 500}}],
                token=f"{_h(v, 1):016x}{_h(v, 2):016x}",
                committed_at=COMMITTED_AT + v,
            ).at(v, table_id)
            data = encode_commit(commit)
            log_bytes += len(data)
            writes.append(pool.submit((root / commit_name(v)).write_bytes, data))
            if len(writes) >= 1000:
                for write in writes:
                    write.result()
                writes = []
            if v <= direct:
                state = state.fold(commit.header)
                pending_rows += [
                    LiveFile(a.path, a.rows, a.size, v, WRITER, a.batch, a.partition, a.stats)
                    for a in commit.adds
                ]
                if len(pending_rows) >= LIST_ROW_GROUP_ROWS or v == direct:
                    groups.add(_list_table(pending_rows))
                    pending_rows = []
        groups.finish()
        for write in writes:
            write.result()
    list_bytes = (root / list_name).stat().st_size
    checkpoint = Checkpoint(state, list_token, time.time(), list_name, state.counts.files, list_bytes)
    (root / checkpoint_name(direct)).write_bytes(encode_checkpoint(checkpoint))
    (root / LAST_CHECKPOINT).write_bytes(json.dumps({"version": direct}).encode())
    return {
        "table_id": table_id,
        "commits": commits,
        "files_per_commit": files_per_commit,
        "live_files": commits * files_per_commit,
        "checkpoint_interval": interval,
        "direct_checkpoint": direct,
        "measured_checkpoint": measured,
        "log_bytes": log_bytes,
        "build_seconds": time.perf_counter() - started,
    }


def reset_lake(root: Path, commits: int, hint: int) -> int:
    """Remove every log entry at a version >= ``commits`` (what a measurement committed, with its
    checkpoints) and point the hint at ``hint`` again; returns how many entries went."""
    from lakesink_reader.format.v3.checkpoint import LAST_CHECKPOINT

    folder = root / LAST_CHECKPOINT
    removed = 0
    for entry in folder.parent.iterdir():
        head = entry.name.split(".", 1)[0]
        if head.isdigit() and len(head) == 20 and int(head) >= commits:
            entry.unlink()
            removed += 1
    folder.write_bytes(json.dumps({"version": hint}).encode())
    return removed


def list_sizes(root: Path, version: int) -> dict[str, int]:
    """Bytes of the checkpoint at ``version``: its small part and its file list."""
    from lakesink_reader.format.v3.checkpoint import checkpoint_name

    small = root / checkpoint_name(version)
    doc = json.loads(small.read_bytes())
    return {
        "small_part_bytes": small.stat().st_size,
        "list_bytes": (small.parent / doc["files"]["name"]).stat().st_size,
        "list_rows": doc["files"]["rows"],
    }


class MeasureFailed(RuntimeError):
    """A measurement that did not run to its end, or measured something other than it should."""


# The children -----------------------------------------------------------------------------------

#: Every child starts with this: a JSON argument in, a JSON line out, VmHWM/VmRSS from /proc.
PRELUDE = """
import json, sys, time
ARGS = json.loads(sys.argv[1])

def rss(key="VmHWM"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) << 10
    raise KeyError(key)

def done(**found):
    found.setdefault("peak_rss_bytes", rss())
    print("RESULT " + json.dumps(found), flush=True)
"""

CHILDREN = {
    # The interpreter and the prelude alone: what every other child pays before its imports.
    "interpreter": "done()",
    "import_reader": """
        t = time.perf_counter()
        import lakesink_reader
        done(import_seconds=time.perf_counter() - t)
    """,
    "import_parquet": """
        t = time.perf_counter()
        import pyarrow.parquet
        done(import_seconds=time.perf_counter() - t)
    """,
    "open": """
        t = time.perf_counter()
        from lakesink_reader import Lake
        t1 = time.perf_counter()
        after_import = rss()
        lake = Lake(ARGS["root"])
        t2 = time.perf_counter()
        done(import_seconds=t1 - t, open_seconds=t2 - t1, peak_rss_after_import_bytes=after_import,
             version=lake.version, pyarrow_parquet_imported="pyarrow.parquet" in sys.modules)
    """,
    "checkpoint": """
        t = time.perf_counter()
        from lakesink.commit.checkpoints import write_checkpoint
        from lakesink_reader.storage import open_storage
        storage = open_storage(ARGS["root"])
        after_import = rss()
        t1 = time.perf_counter()
        found = write_checkpoint(storage, ARGS["table_id"], ARGS["version"], interval=ARGS["interval"])
        t2 = time.perf_counter()
        done(import_seconds=t1 - t, checkpoint_seconds=t2 - t1, peak_rss_after_import_bytes=after_import,
             files=found.files_rows)
    """,
    "commit": """
        t = time.perf_counter()
        import log_scale
        from lakesink.commit.batches import BatchCommitter
        from lakesink.views.derived import derived_views
        from lakesink_reader.format.v3.commits import writer_tag
        from lakesink_reader.storage import open_storage
        storage = open_storage(ARGS["root"])
        committer = BatchCommitter(storage, table_id=ARGS["table_id"], writer_id=ARGS["writer"],
                                   run="bench-first-commit", allow_other_queries=ARGS["allow_other_queries"],
                                   checkpoint_interval=ARGS["interval"],
                                   after_commit=derived_views(storage, ARGS["table_id"]))
        files = log_scale.synthetic_files(ARGS["batch"], ARGS["files"], writer_tag(ARGS["writer"]))
        marks = {}
        real = committer.log.checkpoint_if_due
        def timed(version, state=None):
            marks["commit_point"] = time.perf_counter()
            marks["peak_rss_at_commit_point_bytes"] = rss()
            try:
                return real(version, state)
            finally:
                marks["checkpoint_done"] = time.perf_counter()
        committer.log.checkpoint_if_due = timed
        after_import = rss()
        t1 = time.perf_counter()
        result = committer.commit(ARGS["batch"], files)
        t2 = time.perf_counter()
        done(import_seconds=t1 - t, commit_seconds=t2 - t1,
             to_commit_point_seconds=marks["commit_point"] - t1,
             checkpoint_seconds=marks["checkpoint_done"] - marks["commit_point"],
             peak_rss_after_import_bytes=after_import,
             peak_rss_at_commit_point_bytes=marks["peak_rss_at_commit_point_bytes"],
             status=result.status, version=result.version)
    """,
    "latency": """
        import log_scale
        from lakesink_reader.storage import open_storage
        storage = open_storage(ARGS["url"], ARGS.get("storage_options"))
        commit = log_scale.committer(storage, ARGS)
        seconds = []
        for batch in range(ARGS["first_batch"], ARGS["first_batch"] + ARGS["count"]):
            t = time.perf_counter()
            commit(batch)
            seconds.append(time.perf_counter() - t)
        done(seconds=seconds)
    """,
}


def committer(storage: Any, args: dict[str, Any]) -> Callable[[int], None]:
    """For the ``latency`` child: a function committing batch ``b`` of ``args['files']`` files with
    ``BatchCommitter``; a fresh lake (no ``table_id`` given) is created first, as the writer's
    start would."""
    from inputs import input_schema

    from lakesink.commit.batches import BatchCommitter
    from lakesink.views.derived import derived_views
    from lakesink_reader.format.table import ensure_table
    from lakesink_reader.format.v3.commits import writer_tag

    files = args["files"]
    table_id = (
        args.get("table_id")
        or ensure_table(storage, input_schema(), "epoch", checkpoint_interval=args["interval"]).table_id
    )
    assert table_id is not None
    v3 = BatchCommitter(
        storage,
        table_id=table_id,
        writer_id=WRITER,
        run="bench-latency",
        checkpoint_interval=args["interval"],
        # (``iceberg``: the opt-in Iceberg view too, beside the Delta and Spark views.)
        after_commit=derived_views(storage, table_id, iceberg=bool(args.get("iceberg"))),
    )
    tag = writer_tag(WRITER)
    cursor: list[Any] = [None]  # the state the last commit left, as the writer's driver keeps it

    def commit3(batch: int) -> None:
        result = v3.commit(batch, synthetic_files(batch, files, tag), state=cursor[0])
        if result.status != "committed":
            raise RuntimeError(f"batch {batch}: {result.status}")
        cursor[0] = result.state

    return commit3


def run_child(kind: str, args: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """One child in a fresh interpreter; its RESULT line's figures plus its process wall time."""
    code = PRELUDE + textwrap.dedent(CHILDREN[kind])
    bench_dir = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [bench_dir, os.environ.get("PYTHONPATH")])),
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise MeasureFailed(f"log-scale child {kind} failed ({done.returncode}): {done.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    found["process_seconds"] = wall
    return found


# The phase ---------------------------------------------------------------------------------------


def _median_of(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [r[key] for r in runs]
    return {"median": middle(values), "min": min(values), "max": max(values), "runs": len(values)}


def latency_figures(seconds: list[float]) -> dict[str, Any]:
    found: dict[str, Any] = p50_p95(seconds)
    found["max"] = max(seconds)
    found["mean"] = sum(seconds) / len(seconds)
    return found


def log_scale_phase(
    work: Path,
    *,
    commits: int,
    files_per_commit: int,
    interval: int,
    repeats: int,
    latency_commits: int,
    with_s3: bool,
    note: Callable[[str], None],
) -> dict[str, Any]:
    """Build the lake in ``work``, measure (module docstring), remove the lake; the figures."""
    root = work / "log-scale-lake"
    shutil.rmtree(root, ignore_errors=True)
    found: dict[str, Any] = {
        "failures": {},
        "parameters": {"open_repeats": repeats, "latency_commits": latency_commits, "s3": with_s3},
    }
    note(f"building a format-3 log of {commits:,} commits, {commits * files_per_commit:,} live files")
    lake = build_lake(root, commits, files_per_commit, interval)
    found["lake"] = lake
    note(f"built in {lake['build_seconds']:.1f} s ({lake['log_bytes'] / MiB:,.0f} MiB of commits)")
    table_id, measured = lake["table_id"], lake["measured_checkpoint"]

    def attempt(name: str, measure: Callable[[], Any]) -> None:
        try:
            found[name] = measure()
        except (MeasureFailed, subprocess.TimeoutExpired) as exc:  # reported; the others go on
            found["failures"][f"log-scale-{name}"] = str(exc)
            note(f"{name} FAILED: {str(exc).splitlines()[0] if str(exc) else exc!r}")

    def checkpoint() -> dict[str, Any]:
        run = run_child(
            "checkpoint", {"root": str(root), "table_id": table_id, "version": measured, "interval": interval}
        )
        run.update(list_sizes(root, measured))
        run["version"] = measured
        note(
            f"checkpoint at version {measured:,} ({run['list_rows']:,} live files): "
            f"{run['checkpoint_seconds']:.2f} s, "
            f"list {run['list_bytes'] / MiB:.1f} MiB, peak RSS {run['peak_rss_bytes'] / MiB:.0f} MiB"
        )
        return run

    attempt("checkpoint", checkpoint)
    # Readers and writers now start from the checkpoint the library wrote (whatever happened to it).
    reset_lake(root, commits, measured if "checkpoint" in found else lake["direct_checkpoint"])

    def baselines() -> dict[str, Any]:
        return {kind: run_child(kind, {}) for kind in ("interpreter", "import_reader", "import_parquet")}

    attempt("baselines", baselines)

    def open_lake() -> dict[str, Any]:
        runs = [run_child("open", {"root": str(root)}) for _ in range(repeats)]
        if any(r["version"] != commits - 1 for r in runs):
            raise MeasureFailed(f"Lake(...) opened version {runs[0]['version']}, expected {commits - 1}")
        figures = {
            "open_seconds": _median_of(runs, "open_seconds"),
            "import_seconds": _median_of(runs, "import_seconds"),
            "peak_rss_bytes": _median_of(runs, "peak_rss_bytes"),
            "peak_rss_after_import_bytes": _median_of(runs, "peak_rss_after_import_bytes"),
            "pyarrow_parquet_imported": any(r["pyarrow_parquet_imported"] for r in runs),
            "version": commits - 1,
            "runs": runs,
        }
        note(
            f"Lake(...): {figures['open_seconds']['median']:.3f} s (median of {repeats}), peak RSS "
            f"{figures['peak_rss_bytes']['median'] / MiB:.0f} MiB"
        )
        return figures

    attempt("open", open_lake)

    def first_commit(writer: str, batch: int, allow: bool) -> Callable[[], dict[str, Any]]:
        def measure() -> dict[str, Any]:
            args = {
                "root": str(root),
                "table_id": table_id,
                "writer": writer,
                "batch": batch,
                "allow_other_queries": allow,
                "interval": interval,
                "files": files_per_commit,
            }
            try:
                run = run_child("commit", args)
                if run["status"] != "committed" or run["version"] != commits:
                    raise MeasureFailed(f"the first commit ended {run['status']} at version {run['version']}")
                if commits % interval == 0:
                    run["checkpoint"] = list_sizes(root, commits)
            finally:
                reset_lake(root, commits, measured)
            note(
                f"first commit ({'new writer' if allow else 'continuing writer'}): "
                f"{run['commit_seconds']:.2f} s, {run['to_commit_point_seconds'] * 1000:.0f} ms to the "
                f"commit point, then the checkpoint {run['checkpoint_seconds']:.2f} s; peak RSS "
                f"{run['peak_rss_at_commit_point_bytes'] / MiB:.0f} MiB at the commit point, "
                f"{run['peak_rss_bytes'] / MiB:.0f} MiB in all"
            )
            return run

        return measure

    attempt("first_commit_continuing", first_commit(WRITER, commits, False))
    attempt("first_commit_new_writer", first_commit(NEW_WRITER, 0, True))

    latency: dict[str, Any] = {}
    found["latency"] = latency

    def series(label: str, args: dict[str, Any], after: Callable[[], None] | None = None) -> None:
        def measure() -> dict[str, Any]:
            try:
                run = run_child("latency", {**args, "files": files_per_commit, "interval": interval})
            finally:
                if after is not None:
                    after()
            figures = latency_figures(run["seconds"])
            figures["seconds"] = run["seconds"]
            note(
                f"{label}: {len(run['seconds'])} commits, p50 {figures['p50'] * 1000:.1f} ms, "
                f"p95 {figures['p95'] * 1000:.1f} ms, max {figures['max'] * 1000:.0f} ms"
            )
            return figures

        try:
            latency[label] = measure()
        except (MeasureFailed, subprocess.TimeoutExpired) as exc:
            found["failures"][f"log-scale-latency-{label}"] = str(exc)
            note(f"latency {label} FAILED: {str(exc).splitlines()[0] if str(exc) else exc!r}")

    count = latency_commits
    url = str(work / "log-scale-latency-v3")
    shutil.rmtree(url, ignore_errors=True)
    series("v3-local", {"url": url, "first_batch": 0, "count": count},
           lambda: shutil.rmtree(url, ignore_errors=True))  # fmt: skip
    # The same with all three views (issue 54: the Iceberg view's cost per commit).
    series("v3-local-iceberg", {"url": url, "first_batch": 0, "count": count, "iceberg": True},
           lambda: shutil.rmtree(url, ignore_errors=True))  # fmt: skip
    series(
        "v3-local-big",
        {"url": str(root), "table_id": table_id, "first_batch": commits, "count": count},
        lambda: reset_lake(root, commits, measured),
    )
    if with_s3:
        from stores import s3_store

        try:
            with s3_store() as store:
                series(
                    "v3-s3",
                    {
                        "url": store.url("log-scale-v3"),
                        "storage_options": store.storage_options(),
                        "first_batch": 0,
                        "count": count,
                    },
                )
        except (RuntimeError, OSError) as exc:
            found["failures"]["log-scale-s3"] = str(exc)  # moto did not start (the series catch their own)
    shutil.rmtree(root, ignore_errors=True)
    return found
