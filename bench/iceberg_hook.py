"""The Iceberg view's cost per commit (docs/design/iceberg-view.md, "Left for later sessions",
item 1): ``--commits`` appends of 2 small files each to a fresh local lake, committed through
the log's writer (no Spark) with the view's hook, which alone is timed.

    .venv/bin/python bench/iceberg_hook.py [--commits 200] [--dir /tmp] [--interval 100] [--profile 25]

Prints the hook's median, p90, mean and max per commit in ms, and with ``--profile N`` the N
functions with the most own time under cProfile (which slows Python code: read the shares,
not the seconds). The data files are real (written before each commit, outside the timing):
the view's statistics come from them.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path[1:1] = [str(BENCH_DIR.parent)]  # the checkout (lakesink, when not installed)

import pyarrow as pa  # noqa: E402 - after the path set-up above

from lakesink.commit.files import FileWriter  # noqa: E402
from lakesink.commit.versions import VersionedLogWriter  # noqa: E402
from lakesink.views.iceberg_layout import read_hint  # noqa: E402
from lakesink.views.iceberg_view import IcebergView  # noqa: E402
from lakesink_reader.format.table import TableMetadata  # noqa: E402
from lakesink_reader.format.v3.commits import AddFile, PendingCommit  # noqa: E402
from lakesink_reader.names import TABLE_FILE  # noqa: E402
from lakesink_reader.storage import open_storage  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])
WRITER = "11111111-1111-4111-8111-111111111111"


def run(
    root: str, commits: int, interval: int, profile: cProfile.Profile | None
) -> tuple[list[float], list[float]]:
    """Commit ``commits`` appends to a new lake at ``root``; the hook's seconds per commit, of
    the wall clock and of this process's CPU (less sensitive to the machine's other load)."""
    storage = open_storage(root)
    table_id = uuid.uuid4().hex
    meta = TableMetadata(3, "epoch", SCHEMA, time.time(), table_id, checkpoint_interval=interval)
    assert storage.put_if_absent(TABLE_FILE, meta.to_json())
    hook = IcebergView(storage, table_id, create=True)
    spent: list[float] = []
    cpu: list[float] = []

    def timed(commit: object, state: object) -> None:
        if profile is not None:
            profile.enable()
        start, start_cpu = time.perf_counter(), time.process_time()
        hook(commit, state)  # type: ignore[arg-type]
        spent.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        if profile is not None:
            profile.disable()

    log = VersionedLogWriter(storage, table_id, checkpoint_interval=interval, after_commit=timed)
    for batch in range(commits):
        adds = []
        for part in range(2):
            name = f"b{batch:06d}-p{part}.parquet"
            writer = FileWriter(storage, name, SCHEMA)
            start = batch * 20 + part * 10
            ids = pa.array(range(start, start + 10), pa.int64())
            writer.write(pa.record_batch([ids, pa.array([f"r{i}" for i in range(10)])], schema=SCHEMA))
            published = writer.publish()
            assert published is not None
            adds.append(AddFile(name, published.rows, published.size, part, batch, published.stats))
        pending = PendingCommit.append(writer_id=WRITER, batch=batch, run="run-0000000000000001", adds=adds)
        assert log.commit(pending).status == "committed"
    assert read_hint(storage) == commits, "the view did not keep up (see the log)"
    return spent, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--dir", default="/tmp", help="where the scratch lake goes (removed after)")
    parser.add_argument("--interval", type=int, default=100, help="the lake's checkpoint interval")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="iceberg-hook-", dir=args.dir)
    profile = cProfile.Profile() if args.profile else None
    try:
        spent, cpu = run(str(Path(scratch) / "lake"), args.commits, args.interval, profile)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for what, seconds in (("wall", spent), ("cpu", cpu)):
        ms = sorted(s * 1000 for s in seconds)
        p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
        print(
            f"{len(ms)} commits, the Iceberg view's hook ({what}): median {statistics.median(ms):.1f} ms, "
            f"p90 {p90:.1f} ms, mean {statistics.fmean(ms):.1f} ms, max {ms[-1]:.1f} ms"
        )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
