"""What one ``write_stream`` run asks of S3: its requests by operation and by what they touch, per epoch.

    .venv/bin/python bench/s3_requests.py --rows 2000000 [--door auto|data_source] [--json out.json]

Runs the bench's ``epoch-s3`` child (``write_stream`` into a fresh moto server on 127.0.0.1) with
the project's proxy (``tests/netfaults.py``, no rule: it forwards and counts) between the sink
and moto, and prints the requests by S3 operation and by the part of the lake each touches
(data files; ``_lakesink/...`` by its folder; the views' folders), in total and per epoch,
beside the child's CPU by process kind (JVM, Spark's Python workers, the driver's Python). The
proxy adds a hop, so the run's rates are not the bench's: read the counts and the CPU split.
Issue 38's target 5 (docs/design/performance.md, "Session 12").
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

BENCH_DIR = Path(__file__).resolve().parent
sys.path[1:1] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from inputs import ROWS_PER_FILE, ensure_input, link_subset  # noqa: E402 - after the path set-up above
from launch import bench_env, run_child  # noqa: E402
from stores import BUCKET, TESTS_DIR  # noqa: E402
from throughput import Stream  # noqa: E402


def part_of(key: str, prefix: str) -> str:
    """What a key is, for counting: "data" for a data file, else its first two folders in the lake."""
    rel = key[len(prefix) :] if key.startswith(prefix) else key
    if not rel:
        return "(lake root)"
    parts = rel.split("/")
    if not parts[0].startswith(("_", ".")):
        return "data"
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def run(rows: int, door: str, work: Path, files_per_trigger: int) -> dict[str, Any]:
    from devtools.moto import create_bucket, dev_storage_options, start_moto, stop_moto

    base = work.parent
    # A fresh query: a kept checkpoint would refuse the new lake.
    shutil.rmtree(work / "chk", ignore_errors=True)
    files = ensure_input(base / "input", rows, ROWS_PER_FILE)
    stream_input = link_subset(files, rows, ROWS_PER_FILE, work / "input-stream")
    stream = Stream(
        stream_input,
        work,
        rows,
        "local[2]",
        files_per_trigger,
        {"spark.sql.execution.arrow.maxRecordsPerBatch": "10000"},
        {},
        0.5,
    )
    if str(TESTS_DIR) not in sys.path:
        sys.path.append(str(TESTS_DIR))
    from netfaults import FaultProxy  # type: ignore[import-not-found]

    class CountingProxy(FaultProxy):  # type: ignore[misc]
        """The proxy, keeping each request's key or, for a listing, its prefix."""

        def __init__(self, upstream: str) -> None:
            super().__init__(upstream)
            self.seen: list[tuple[str, str]] = []

        def record(self, request: Any, status: Any, rule: Any) -> None:
            super().record(request, status, rule)
            prefix = (
                parse_qs(request.query).get("prefix", [""])[0] if request.operation.startswith("List") else ""
            )
            with self._lock:
                self.seen.append((request.operation, request.key or prefix))

    moto, url = start_moto()
    try:
        create_bucket(url, BUCKET)
        with CountingProxy(url) as proxy:
            label = f"epoch-s3-{door}"
            spec = stream.spec(label, "epoch", f"s3://{BUCKET}/{label}", write_options={"via": door})
            figures = run_child(spec, work, bench_env(dev_storage_options(proxy.endpoint_url)), 0.5)
            log = list(proxy.seen)
    finally:
        stop_moto(moto)
    prefix = f"{label}/"
    by_op = collections.Counter(op for op, _ in log)
    by_part: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for op, key in log:
        by_part[part_of(key, prefix)][op] += 1
    by_key = collections.Counter(
        f"{op} {key[len(prefix) :] if key.startswith(prefix) else key}" for op, key in log
    )
    epochs = figures["epochs"]
    return {
        "rows": rows,
        "door": door,
        "epochs": epochs,
        "requests": len(log),
        "requests_per_epoch": len(log) / epochs,
        "by_operation": dict(by_op.most_common()),
        "by_part": {part: dict(ops.most_common()) for part, ops in sorted(by_part.items())},
        "by_key": dict(sorted(by_key.items())),
        "cpu_seconds": {
            "total": figures["query_cpu_seconds"],
            "jvm": figures["query_cpu_seconds_jvm"],
            "python_workers": figures["query_cpu_seconds_python_workers"],
            "driver_python": figures["query_cpu_seconds_driver_python"],
        },
        "query_seconds": figures["query_seconds"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--door", choices=("auto", "data_source"), default="auto", help="write_stream's via")
    p.add_argument("--files-per-trigger", type=int, default=4, help="maxFilesPerTrigger (the bench's: 4)")
    p.add_argument("--workdir", default=None, help="input cache and scratch")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from devtools.spark import prepare_environment

    prepare_environment()
    base = Path(args.workdir or tempfile.mkdtemp(prefix="lakesink-s3-requests-"))
    work = base / f"run-{args.door}-{args.rows}-{args.files_per_trigger}"
    work.mkdir(parents=True, exist_ok=True)
    found = run(args.rows, args.door, work, args.files_per_trigger)
    print(json.dumps(found, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
