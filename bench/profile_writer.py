"""Where a lakesink writer's time goes in a Spark Python worker: cProfile of one partition, and its shares.

foreach: the profiler is switched on in ``open`` and off in ``close``, in the worker's task
thread, so it sees everything the worker does for the partition: pyspark reading what the
JVM pickled and building ``Row`` objects, calling ``process`` once per row, lakesink's
batching, Arrow conversion and Parquet writing. epoch: it runs around the data source's
``write``, which pulls Spark's Arrow batches through pyspark's deserializer into a
``FileWriter``.

    .venv/bin/python bench/profile_writer.py foreach --rows 500000 [--batch-rows 10000] [--top 25]
    .venv/bin/python bench/profile_writer.py epoch --rows 1000000
    .venv/bin/python bench/profile_writer.py foreach --rows 500000 --json shares.json   # what make bench runs

Runs one partition (``coalesce(1)``, ``local[1]``) over the bench's input files, prints the
top functions by own time and by cumulative time, and the time by :data:`SHARES`.
cProfile roughly doubles the time of Python-heavy code: read the shares, not the seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import pstats
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
# bench/ for the input generator; the checkout for devtools/ (not installed).
sys.path[1:1] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from lakesink import LakeForeachWriter  # noqa: E402 - after the path set-up above

#: Where the time goes, in the order printed. A function of pyspark, pyarrow.parquet or lakesink
#: counts by the file that defines it; any other function (a built-in, the standard library)
#: counts where it was called from -- except reads of the JVM's socket, which are time spent
#: waiting for the JVM to send rows, and the import machinery.
SHARES = (
    "waiting on the JVM (socket reads)",
    "pyspark: unpickling rows, building Row objects",
    "lakesink process() and the rest of lakesink",
    "Arrow conversion (lakesink rows_to_batch)",
    "Parquet encoding (pyarrow.parquet)",
    "storage: staging, fsync, publish",
    "imports (once per worker process)",
    "other",
)
_READS = ("method 'read' of '_io.BufferedReader'", "method 'readinto'", "method 'recv_into'")


class ProfiledWriter(LakeForeachWriter):
    """Dumps one pstats file per (partition, epoch) into ``profile_dir``."""

    def __init__(self, path: str, profile_dir: str, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.profile_dir = profile_dir

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._profiler = _profiler()
        self._profile_name = f"p{partition_id}-e{epoch_id}-{os.getpid()}.pstats"
        self._profiler.enable()
        return super().open(partition_id, epoch_id)

    def close(self, error: BaseException | None) -> None:
        try:
            super().close(error)
        finally:
            self._profiler.disable()
            self._profiler.dump_stats(os.path.join(self.profile_dir, self._profile_name))


def profiled_epoch_source(profile_dir: str) -> Any:
    """A ``lakesink`` data source (as "lakesink_profiled") whose task writes run under cProfile."""
    from lakesink.spark.datasource import LakeSinkDataSource, LakeStreamWriter

    class ProfiledStreamWriter(LakeStreamWriter):
        def write(self, iterator: Any) -> Any:
            parts = _profile_part_uploads(profile_dir)
            profiler = _profiler()
            profiler.enable()
            try:
                return super().write(iterator)
            finally:
                profiler.disable()
                profiler.dump_stats(os.path.join(profile_dir, f"write-{os.getpid()}-{id(iterator)}.pstats"))
                parts()

    class ProfiledSource(LakeSinkDataSource):
        @classmethod
        def name(cls) -> str:
            return "lakesink_profiled"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            plain = super().streamWriter(schema, overwrite)
            profiled = object.__new__(ProfiledStreamWriter)  # the same writer, its write profiled
            profiled.__dict__.update(plain.__dict__)
            return profiled

    return ProfiledSource


def _profile_part_uploads(profile_dir: str) -> Any:
    """Profile S3 part uploads too: they run on the storage's threads, which the task's profiler
    does not see. Each upload runs under a profiler of its own, dumped as ``part-*.pstats`` when
    the returned function is called (at the end of the task's write)."""
    from lakesink_reader.storage.s3_upload import S3StagedFile

    plain = S3StagedFile.__dict__.get("_plain_put_part") or S3StagedFile._put_part
    done: list[cProfile.Profile] = []

    def put_part(self: Any, number: int, body: Any) -> Any:
        profiler = _profiler()
        profiler.enable()
        try:
            return plain(self, number, body)
        finally:
            profiler.disable()
            done.append(profiler)

    S3StagedFile._plain_put_part = plain  # type: ignore[attr-defined]
    S3StagedFile._put_part = put_part  # type: ignore[method-assign]

    def dump() -> None:
        for i, profiler in enumerate(done):
            profiler.dump_stats(os.path.join(profile_dir, f"part-{os.getpid()}-{id(done)}-{i}.pstats"))
        done.clear()

    return dump


#: The profilers' clock: wall time (cProfile's default), or with ``--cpu`` the CPU time of the
#: thread being profiled (``time.thread_time``), which another process's load does not inflate.
#: Read by the task's worker from its environment (the driver's is inherited).
CPU_CLOCK_ENV = "LAKESINK_PROFILE_CPU"


def _profiler() -> cProfile.Profile:
    if os.environ.get(CPU_CLOCK_ENV):
        import time

        return cProfile.Profile(time.thread_time)
    return cProfile.Profile()


# The shares -------------------------------------------------------------------------------------

Func = tuple[str, int, str]  # pstats' key: (file, line, function name); file "~" for built-ins


def _own_share(func: Func) -> str | None:
    """The share of ``func`` by what it is; None when it counts where it was called from."""
    path, _, name = func
    if path == "~":  # a built-in: only a read of the JVM's socket and import machinery count by name
        if _is_read(func):
            return SHARES[0]
        return SHARES[6] if "marshal" in name or "builtins.exec" in name or "_imp." in name else None
    if "/lakesink/spark/rows.py" in path:
        return SHARES[3]
    if "/pyarrow/parquet/" in path:
        return SHARES[4]
    if "/lakesink/storage/" in path or "/lakesink_reader/storage/" in path or "/botocore/" in path:
        return SHARES[5]
    if "/lakesink/" in path:
        return SHARES[2]
    if "/pyspark/" in path:
        return SHARES[1]
    if "importlib" in path or name == "<module>":
        return SHARES[6]
    return None  # the standard library and other packages: on behalf of their caller


def _is_read(func: Func) -> bool:
    return func[0] == "~" and any(read in func[2] for read in _READS)


def _from_http(caller: Func) -> bool:
    return any(part in caller[0] for part in ("/http/client.py", "/urllib3/", "/ssl.py", "/socket.py"))


def shares(stats: pstats.Stats) -> dict[str, float]:
    """Profiled seconds by share: each function's own time, charged to its callers where it has no share."""
    table: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]  # pstats' table, documented in its code
    split: dict[Func, dict[str, float]] = {}  # memo: how a function's time divides among the shares

    def split_of(func: Func, visiting: frozenset[Func]) -> dict[str, float]:
        if func in split:
            return split[func]
        share = _own_share(func)
        callers = table[func][4] if func in table else {}
        # Each caller edge holds the callee's own time on behalf of that caller (its third field).
        edges = {c: edge[2] for c, edge in callers.items() if edge[2] > 0 and c not in visiting}
        total = sum(edges.values())
        if share == SHARES[0] and total and any(_from_http(c) for c in edges):
            # A socket read on behalf of an HTTP client (S3) is not the JVM's: per caller edge.
            found = defaultdict(float)
            for caller, seconds in edges.items():
                for name, part in (
                    split_of(caller, visiting | {func}) if _from_http(caller) else {share: 1.0}
                ).items():
                    found[name] += part * seconds / total
            split[func] = found
            return found
        if share is not None or not total:
            found = {share or SHARES[7]: 1.0}
        else:
            found = defaultdict(float)
            for caller, seconds in edges.items():
                for name, part in split_of(caller, visiting | {func}).items():
                    found[name] += part * seconds / total
        # Kept even when a call cycle was cut on the way: recursion is rare here, and without
        # the memo the walk up the callers is exponential.
        split[func] = found
        return found

    totals: dict[str, float] = defaultdict(float)
    for func, row in table.items():
        for name, part in split_of(func, frozenset()).items():
            totals[name] += part * row[2]
    return {share: totals.get(share, 0.0) for share in SHARES}


def top_functions(stats: pstats.Stats, count: int) -> list[dict[str, Any]]:
    """The ``count`` functions with the most own time."""
    table: dict[Func, Any] = stats.stats  # type: ignore[attr-defined]
    ordered = sorted(table.items(), key=lambda item: item[1][2], reverse=True)[:count]
    return [
        {
            "function": f"{func[0]}:{func[1]}({func[2]})",
            "calls": row[1],
            "own_seconds": row[2],
            "cumulative_seconds": row[3],
        }
        for func, row in ordered
    ]


# The run ----------------------------------------------------------------------------------------


def profile_partition(
    writer: str,
    rows: int,
    base: Path,
    batch_rows: int | None,
    s3: bool = False,
    files_per_trigger: int = 1 << 20,
) -> pstats.Stats:
    """Stream ``rows`` rows as one partition through ``writer`` under cProfile; the merged profiles.

    ``s3``: the epoch writer's lake is on a fresh moto server on 127.0.0.1 (``stores.s3_store``).
    ``files_per_trigger``: input files (250,000 rows each) per epoch; by default one epoch.
    """
    if s3:
        if writer != "epoch":
            raise SystemExit("--s3 profiles the epoch writer only")
        from stores import s3_store

        with s3_store() as store:
            return _profile_partition(
                writer,
                rows,
                base,
                batch_rows,
                store.url("profiled"),
                store.storage_options(),
                files_per_trigger,
            )
    return _profile_partition(writer, rows, base, batch_rows, None, None, files_per_trigger)


def _profile_partition(
    writer: str,
    rows: int,
    base: Path,
    batch_rows: int | None,
    lake_url: str | None,
    storage_options: dict[str, Any] | None,
    files_per_trigger: int,
) -> pstats.Stats:
    import inputs  # the bench's input generator

    from devtools.spark import local_session

    files = inputs.ensure_input(base / "input", rows, inputs.ROWS_PER_FILE)
    folder = inputs.link_subset(files, rows, inputs.ROWS_PER_FILE, base / f"input-{rows}")
    profiles = base / f"profiles-{writer}"
    shutil.rmtree(profiles, ignore_errors=True)
    profiles.mkdir()
    spark = local_session("lakesink-profile", master="local[1]")
    from pyspark.sql.pandas.types import from_arrow_schema

    df = (
        spark.readStream.schema(from_arrow_schema(inputs.input_schema()))
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(folder))
        .coalesce(1)
    )
    lake, chk = base / f"lake-{writer}", base / f"chk-{writer}"
    for old in (lake, chk):  # a kept workdir: a checkpoint of a finished run would read nothing
        shutil.rmtree(old, ignore_errors=True)
    if writer == "foreach":
        kwargs: dict[str, Any] = {"schema": df.schema}
        if batch_rows:
            kwargs["batch_rows"] = batch_rows
        stream = df.writeStream.foreach(ProfiledWriter(str(lake), str(profiles), **kwargs))
    else:
        spark.dataSource.register(profiled_epoch_source(str(profiles)))
        stream = df.writeStream.format("lakesink_profiled").option("path", lake_url or str(lake))
        if storage_options:
            stream = stream.option("storage_options", json.dumps(storage_options))
    query = stream.option("checkpointLocation", str(chk)).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()
    dumps = glob.glob(str(profiles / "*.pstats"))
    if not dumps:
        raise SystemExit(f"no profile was written to {profiles}: did the query read any rows?")
    parts = glob.glob(str(profiles / "part-*.pstats"))
    if parts:  # the S3 part uploads' threads: beside the task's own thread, all storage
        print(f"S3 part uploads on the storage's threads: {pstats.Stats(*parts).total_tt:.2f} s profiled")
    return pstats.Stats(*dumps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("writer", choices=("foreach", "epoch"))
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--batch-rows", type=int, default=None, help="LakeForeachWriter batch_rows")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="also write the shares and top functions here")
    p.add_argument("--s3", action="store_true", help="epoch: the lake on a moto server on 127.0.0.1")
    p.add_argument("--cpu", action="store_true", help="profile CPU time (time.thread_time), not wall time")
    p.add_argument(
        "--files-per-trigger", type=int, default=1 << 20, help="input files per epoch (default: one epoch)"
    )
    args = p.parse_args()
    base = Path(args.workdir or tempfile.mkdtemp(prefix="lakesink-profile-"))
    if args.cpu:
        os.environ[CPU_CLOCK_ENV] = "1"  # before the session: its workers inherit it
    stats = profile_partition(args.writer, args.rows, base, args.batch_rows, args.s3, args.files_per_trigger)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    found = shares(stats)
    total = sum(found.values())
    print(f"{args.writer} writer, one partition of {args.rows:,} rows: {total:.2f} s profiled")
    for share, seconds in found.items():
        print(f"  {seconds / total:6.1%}  {seconds:7.2f} s  {share}")
    if args.json:
        doc = {
            "writer": args.writer,
            "rows": args.rows,
            "profiled_seconds": total,
            "shares": found,
            "top": top_functions(stats, 12),
        }
        Path(args.json).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
