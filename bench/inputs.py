"""The bench's input: one deterministic stream of Parquet files, generated once and kept between runs.

Every sink reads the same files with Spark's ``readStream`` file source, so what differs
between two runs is the sink alone. The rows are (long, timestamp, 20-character string,
double): ``id`` counts up, ``label`` is unique (dictionary encoding cannot cheat) and
``amount`` is a seeded random double, so the bytes are the same on every run and machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

#: Rows per generated input file: 4 files (one trigger) make an epoch of 1M rows at the default.
ROWS_PER_FILE = 250_000
SEED = 20240611


def input_schema() -> Any:
    """The stream's Arrow schema (a ``pyarrow.Schema``)."""
    import pyarrow as pa

    fields: list[pa.Field[Any]] = [
        pa.field("id", pa.int64()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("label", pa.string()),
        pa.field("amount", pa.float64()),
    ]
    return pa.schema(fields)


def make_chunk(start: int, rows: int) -> Any:
    """Rows ``start .. start+rows-1`` of the stream as a ``pyarrow.Table``: the same bytes every time.

    ``label`` is a unique 20-character string (like ``jobs/stream_to_lake.py``'s rate source),
    so dictionary encoding cannot cheat; ``amount`` is a seeded random double.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = np.arange(start, start + rows, dtype=np.int64)
    ts = pa.array(1_700_000_000_000_000 + ids * 1_000, type=pa.timestamp("us", tz="UTC"))
    digits = pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), width=14, padding="0")
    # pyarrow-stubs want all scalars or all arrays; pyarrow broadcasts the scalar prefix.
    label = pc.binary_join_element_wise(pa.scalar("event-"), digits, "")  # type: ignore[call-overload]
    amount = np.random.default_rng(SEED + start).random(rows) * 1000.0
    return pa.table([pa.array(ids), ts, label, pa.array(amount)], schema=input_schema())


def ensure_input(folder: Path, rows: int, rows_per_file: int) -> list[Path]:
    """The input files of ``rows`` rows, generated once (same parameters, same bytes: reused).

    A marker file named after the parameters says the folder is complete; a folder without
    it (an interrupted run, other parameters) is generated again from scratch.
    """
    import pyarrow.parquet as pq

    marker = folder / f"_complete-{rows}-{rows_per_file}"
    files = [folder / f"in-{i:05d}.parquet" for i in range((rows + rows_per_file - 1) // rows_per_file)]
    if marker.exists():
        return files
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i, path in enumerate(files):
        start = i * rows_per_file
        pq.write_table(make_chunk(start, min(rows_per_file, rows - start)), path, compression="snappy")
    marker.touch()
    return files


def link_subset(files: list[Path], rows: int, rows_per_file: int, folder: Path) -> Path:
    """A folder holding hard links to the first of ``files`` that make up ``rows`` rows.

    The file source reads a whole folder: a run over fewer rows than were generated gets a
    folder of its own, without copying any data.
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for path in files[: (rows + rows_per_file - 1) // rows_per_file]:
        os.link(path, folder / path.name)
    return folder
