"""Auto-compaction's thresholds, measured without Spark (issue 36): what each choice costs in
rewritten bytes (write amplification) and how many small files it leaves live.

A writer's driver commits micro-batches of ``--files`` files of ``--rows`` rows each to a
format-3 lake on local disk (real Parquet files, the real log, the real ``compact``), and after
each commit calls ``compact_if_due`` as the data source does. For every threshold choice
(``--choices MIN_SMALL/MIN_FILES,...``), after ``--batches`` batches:

- ``amplification``: bytes compaction wrote / bytes the batches wrote (1.0: each byte rewritten
  once on average);
- ``max_small`` / ``final_files``: the most small files live after any commit, and the live files
  at the end;
- ``compactions``, ``found_nothing``, ``p50/max seconds``: how often the driver compacted (and
  read the file list to find no bin), and what one cost (the delay it adds to the next
  micro-batch).

    .venv/bin/python bench/auto_compact_thresholds.py --batches 1500 \\
        --out bench/results/2026-11-27-auto-compact-thresholds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakesink.commit.files import FileWriter
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance.auto_compact import compact_if_due, small_files
from lakesink_reader.format.table import TableMetadata
from lakesink_reader.format.v3.commits import AddFile, PendingCommit, writer_tag
from lakesink_reader.names import TABLE_FILE, new_attempt_id
from lakesink_reader.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("device", pa.string()), ("value", pa.float64())])
WRITER = str(uuid.UUID(int=0x5EED))


def batch_rows(start: int, count: int) -> pa.RecordBatch:
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.record_batch(
        [ids, pa.array([f"device-{i % 997}" for i in range(start, start + count)]),
         pa.array([i * 0.5 for i in range(start, start + count)])],
        schema=SCHEMA,
    )  # fmt: skip


def run(
    root: Path, batches: int, files: int, rows: int, min_small: int, min_files: int, tiered: bool
) -> dict[str, Any]:
    storage = open_storage(str(root))
    metadata = TableMetadata(3, "epoch", SCHEMA, time.time(), uuid.uuid4().hex)
    storage.put_if_absent(TABLE_FILE, metadata.to_json())
    assert metadata.table_id is not None
    log = VersionedLogWriter(storage, metadata.table_id, checkpoint_interval=100)
    appended = compacted = 0
    max_small = 0
    seconds: list[float] = []
    due = idle = 0
    for batch in range(batches):
        adds = []
        for p in range(files):
            name = f"w{writer_tag(WRITER)}-b{batch:012d}-p{p:05d}-{new_attempt_id()}.parquet"
            writer = FileWriter(storage, name, SCHEMA)
            writer.write(batch_rows((batch * files + p) * rows, rows))
            published = writer.publish()
            assert published is not None
            adds.append(AddFile(name, published.rows, published.size, p, batch, published.stats))
            appended += published.size
        result = log.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="r" * 8, adds=adds))
        assert result.status == "committed" and result.state is not None
        max_small = max(max_small, small_files(result.state))
        done = compact_if_due(
            storage, result.state, min_small=min_small, min_files=min_files,
            tier_ratio=min_files if tiered else None, due=due,
        )  # fmt: skip
        if done is not None:
            due = done.next_due
            assert done.report is not None, "an auto-compaction failed"
            seconds.append(done.seconds)
            idle += done.report.status == "nothing_to_do"
            compacted += sum(a.size for a in done.report.outputs)
    state = log.open()
    return {
        "min_small": min_small,
        "min_files": min_files,
        "tiered": tiered,
        "batches": batches,
        "appended_bytes": appended,
        "compacted_bytes": compacted,
        "amplification": round(compacted / appended, 2),
        "max_small": max_small,
        "final_files": state.counts.files,
        "compactions": len(seconds) - idle,
        "found_nothing": idle,
        "p50_seconds": round(statistics.median(seconds), 3) if seconds else None,
        "max_seconds": round(max(seconds), 3) if seconds else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--files", type=int, default=2, help="files a micro-batch writes (its tasks)")
    parser.add_argument("--rows", type=int, default=2000, help="rows a file holds")
    parser.add_argument(
        "--choices", default="32/8,32/8t,64/8t,16/4t,64/16t", help="MIN_SMALL/MIN_FILES[t: size tiers],..."
    )
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    results = []
    for choice in args.choices.split(","):
        tiered = choice.endswith("t")
        min_small, min_files = (int(n) for n in choice.rstrip("t").split("/"))
        with tempfile.TemporaryDirectory(prefix="autocompact-") as tmp:
            began = time.monotonic()
            found = run(Path(tmp) / "lake", args.batches, args.files, args.rows, min_small, min_files, tiered)
            found["run_seconds"] = round(time.monotonic() - began, 1)
        results.append(found)
        print(json.dumps(found), flush=True)
    if args.out:
        doc = {"batches": args.batches, "files": args.files, "rows": args.rows, "results": results}
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
