"""Profile a lakesink writer inside a Spark Python worker with cProfile.

foreach: the profiler is switched on in ``open`` and off in ``close``, in the worker's task
thread, so it sees everything the worker does for the partition: pyspark unpickling rows and
building ``Row`` objects, calling ``process`` once per row, lakesink's batching and Parquet
writing. epoch: it runs around the data source's ``write``, which pulls Spark's Arrow batches
through pyspark's deserializer and into ``ParquetStage``.

    .venv/bin/python bench/profile_writer.py foreach --rows 500000 [--batch-rows 10000] [--top 25]
    .venv/bin/python bench/profile_writer.py epoch --rows 1000000

Runs one partition (``coalesce(1)``) over the bench's input files and prints the top functions
by own time and by cumulative time. cProfile roughly doubles the time of Python-heavy code:
read the shares, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import os
import pstats
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lakesink import LakeForeachWriter


class ProfiledWriter(LakeForeachWriter):
    """Dumps one pstats file per (partition, epoch) into ``profile_dir``."""

    def __init__(self, path: str, profile_dir: str, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.profile_dir = profile_dir

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._profiler = cProfile.Profile()
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
    from lakesink.spark import LakeSinkDataSource, LakeStreamWriter

    class ProfiledStreamWriter(LakeStreamWriter):
        def write(self, iterator: Any) -> Any:
            profiler = cProfile.Profile()
            profiler.enable()
            try:
                return super().write(iterator)
            finally:
                profiler.disable()
                profiler.dump_stats(os.path.join(profile_dir, f"write-{os.getpid()}-{id(iterator)}.pstats"))

    class ProfiledSource(LakeSinkDataSource):
        @classmethod
        def name(cls) -> str:
            return "lakesink_profiled"

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            plain = super().streamWriter(schema, overwrite)
            return ProfiledStreamWriter(plain.config, plain.schema, plain.run_token)

    return ProfiledSource


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("writer", choices=("foreach", "epoch"))
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--batch-rows", type=int, default=None, help="LakeForeachWriter batch_rows")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--workdir", default=None)
    args = p.parse_args()

    import run  # the bench's input generator

    from lakesink.localspark import local_session

    base = Path(args.workdir or tempfile.mkdtemp(prefix="lakesink-profile-"))
    files = run.ensure_input(base / "input", args.rows, run.ROWS_PER_FILE)
    folder = run.link_subset(files, args.rows, run.ROWS_PER_FILE, base / f"input-{args.rows}")
    profiles = base / f"profiles-{args.writer}"
    shutil.rmtree(profiles, ignore_errors=True)
    profiles.mkdir()
    spark = local_session("lakesink-profile", master="local[1]")
    from pyspark.sql.pandas.types import from_arrow_schema

    df = (
        spark.readStream.schema(from_arrow_schema(run.input_schema()))
        .option("maxFilesPerTrigger", 1 << 20)
        .parquet(str(folder))
        .coalesce(1)
    )
    lake, chk = str(base / f"lake-{args.writer}"), str(base / f"chk-{args.writer}")
    if args.writer == "foreach":
        kwargs: dict[str, Any] = {"schema": df.schema}
        if args.batch_rows:
            kwargs["batch_rows"] = args.batch_rows
        writer = ProfiledWriter(lake, str(profiles), **kwargs)
        stream = df.writeStream.foreach(writer)
    else:
        spark.dataSource.register(profiled_epoch_source(str(profiles)))
        stream = df.writeStream.format("lakesink_profiled").option("path", lake)
    query = stream.option("checkpointLocation", chk).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()
    dumps = glob.glob(str(profiles / "*.pstats"))
    stats = pstats.Stats(*dumps)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
