"""`make run` / `make run-s3`: stream into a fresh lake with one injected task failure, read it back.

The local flavour writes ./demo/lake; the S3 flavour starts a moto server on 127.0.0.1, writes
s3://demo-lake/events through it, and stops the server by PID whatever happens.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"


def run_job(lake: str, checkpoint: Path, options: dict[str, Any], args: argparse.Namespace) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "jobs" / "stream_to_lake.py"),
        "--source", "rate",
        "--rows-per-second", str(args.rows_per_second),
        "--duration", str(args.duration),
        "--mode", args.mode,
        "--fail-once-after-rows", "300",
        "--lake", lake,
        "--checkpoint", str(checkpoint),
    ]  # fmt: skip
    for key, value in options.items():
        if key == "client_kwargs":
            cmd += ["--storage-option", f"region_name={value['region_name']}"]
        else:
            cmd += ["--storage-option", f"{key}={value}"]
    print("(a stack trace of ONE injected task failure follows; Spark retries that task)", flush=True)
    print("$", " ".join(c if "secret" not in c else c.split("=")[0] + "=***" for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def report(lake: str, options: dict[str, Any]) -> int:
    from reader import Lake, SkippedFilesWarning, read_committed

    committed = read_committed(lake, storage_options=options)
    ids = committed.column("id").to_pylist()
    dupes = len(ids) - len(set(ids))
    gaps = (max(ids) + 1 - len(set(ids))) if ids else 0
    files = Lake(lake, options).files("read_all")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        everything = Lake(lake, options).read("read_all")
    print()
    print(f"lake: {lake}")
    print(f"read_committed: {committed.num_rows} rows, {len(set(ids))} distinct ids, {dupes} duplicates, "
          f"{gaps} ids missing from 0..max")  # fmt: skip
    states: dict[str, int] = {}
    for f in files:
        states[f.state] = states.get(f.state, 0) + 1
    print(f"read_all: {everything.table.num_rows} rows from files by state {states}; "
          f"skipped {len(everything.skipped)} unreadable")  # fmt: skip
    for w in caught:
        if isinstance(w.message, SkippedFilesWarning):
            print(f"  warning: {w.message}")
    injected = DEMO / "checkpoint" / "_fault_injected"
    print(f"injected failure: {injected.read_text().strip() if injected.exists() else 'did not fire'}")
    return 0 if dupes == 0 and gaps == 0 and committed.num_rows > 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", choices=("local", "s3"), default="local")
    p.add_argument("--mode", choices=("foreach", "epoch"), default="foreach")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--rows-per-second", type=int, default=2000)
    args = p.parse_args()
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    checkpoint = DEMO / "checkpoint"
    if args.target == "local":
        lake = str(DEMO / "lake")
        run_job(lake, checkpoint, {}, args)
        return report(lake, {})

    from lakesink.devserver import create_bucket, dev_storage_options, start_moto, stop_moto

    server, url = start_moto()
    print(f"moto S3 server on {url} (pid {server.pid})")
    try:
        options: dict[str, Any] = dev_storage_options(url)
        create_bucket(url, "demo-lake")
        lake = "s3://demo-lake/events"
        run_job(lake, checkpoint, options, args)
        return report(lake, options)
    finally:
        stop_moto(server)
        print(f"stopped moto (pid {server.pid})")


if __name__ == "__main__":
    sys.exit(main())
