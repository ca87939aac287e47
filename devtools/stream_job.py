"""Runs of jobs/stream_to_lake.py that can be checked: a replayable input, the job's arguments, the check.

Used by the cluster demo (``scripts/cluster.py``) and ``tests/test_cluster.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devtools.shipping import ROOT

JOB = ROOT / "jobs" / "stream_to_lake.py"


def write_input(folder: Path, files: int, rows_per_file: int) -> int:
    """Parquet files with unique ids 0..files*rows_per_file-1; returns how many rows.

    Written under a hidden name, then renamed: the stream never lists a half-written file.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        ids = pa.array(range(i * rows_per_file, (i + 1) * rows_per_file), pa.int64())
        table = pa.table(
            {
                "id": ids,
                "bucket": pc.cast(pc.divide(ids, 7), pa.int32()),
                "label": pa.array([f"row-{n}" for n in ids.to_pylist()]),
            }
        )
        tmp = folder / f".input-{i:04d}.parquet"
        pq.write_table(table, tmp)
        tmp.rename(folder / f"input-{i:04d}.parquet")
    return files * rows_per_file


def option_pairs(options: Mapping[str, Any]) -> list[str]:
    """Storage options as the jobs' ``--storage-option KEY=VALUE`` pairs: nested keys dotted.

    ``{"client_kwargs": {"region_name": "us-east-1"}}`` -> ``["client_kwargs.region_name=us-east-1"]``.
    Checked: ``lakesink_reader.storage.options.parse_option_pairs`` (what the jobs use) gives
    ``options`` back, else ValueError.
    """
    from lakesink_reader.storage.options import parse_option_pairs

    def flatten(prefix: str, value: Any) -> list[str]:
        if isinstance(value, Mapping):
            return [pair for key, inner in value.items() for pair in flatten(f"{prefix}{key}.", inner)]
        return [f"{prefix[:-1]}={value}"]

    pairs = flatten("", options) if options else []
    if parse_option_pairs(pairs) != dict(options):
        # Never show the options: they may hold a secret.
        raise ValueError(f"storage options {sorted(options)} do not survive KEY=VALUE pairs")
    return pairs


def job_args(
    lake: str,
    checkpoint: Path,
    source: Path,
    storage_options: Mapping[str, Any],
    mode: str,
    *,
    fail_once_after_rows: int = 500,
) -> list[str]:
    """Arguments of jobs/stream_to_lake.py: the files source, two files an epoch, two partitions.

    ``storage_options`` as lakesink takes them (nested dicts), passed as ``--storage-option``
    pairs. ``fail_once_after_rows`` injects one failed task attempt (0: none): partition 0's
    first attempt raises mid-partition and Spark retries it on the cluster. Its marker lives in
    the checkpoint folder -- a local path every executor sees only because they share this host.
    """
    args = [
        "--source", "files",
        "--input", str(source),
        "--max-files-per-trigger", "2",
        "--available-now",
        "--partitions", "2",
        "--mode", mode,
        "--lake", lake,
        "--checkpoint", str(checkpoint),
        "--fail-once-after-rows", str(fail_once_after_rows),
    ]  # fmt: skip
    for pair in option_pairs(storage_options):
        args += ["--storage-option", pair]
    return args


def check_lake(lake: str, storage_options: Mapping[str, Any], expected_rows: int) -> str:
    """One line on what ``read_committed`` sees; AssertionError when a row is missing or duplicated.

    Rows are the ids ``write_input`` wrote. Files not committed (staged, or published by an
    epoch that has no record) are counted, not an error: the orphan sweep removes them.
    """
    from lakesink_reader import Lake, read_committed

    ids = read_committed(lake, storage_options=dict(storage_options)).column("id").to_pylist()
    distinct = set(ids)
    missing = expected_rows - len(distinct & set(range(expected_rows)))
    duplicates = len(ids) - len(distinct)
    unexpected = len(distinct - set(range(expected_rows)))
    files = Lake(lake, dict(storage_options)).files("read_all")
    leftovers = sum(1 for f in files if f.state != "committed")
    line = (
        f"{lake}: {len(ids)} rows committed in {len(files) - leftovers} files; {missing} missing, "
        f"{duplicates} duplicated, {unexpected} unexpected; {leftovers} uncommitted files left"
    )
    if missing or duplicates or unexpected:
        raise AssertionError(line)
    return line
