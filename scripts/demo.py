"""`make run` / `make run-s3`: stream files of known rows into a fresh lake with one injected task
failure, then show what the reader sees.

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
sys.path.insert(0, str(ROOT))  # devtools/ is not installed: it is found from the checkout

from devtools.stream_job import JOB, check_lake, job_args, write_input  # noqa: E402

DEMO = ROOT / "demo"


def run_job(lake: str, options: dict[str, Any], args: argparse.Namespace) -> None:
    args_ = job_args(lake, DEMO / "checkpoint", DEMO / "in", options, args.mode, fail_once_after_rows=300)
    cmd = [sys.executable, str(JOB), *args_]
    print("$", " ".join(c if "secret" not in c else c.split("=")[0] + "=***" for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def report(lake: str, options: dict[str, Any], expected: int) -> int:
    from lakesink_reader import Lake, SkippedFilesWarning

    print()
    try:
        print("read_committed:", check_lake(lake, options, expected))
        ok = True
    except AssertionError as exc:
        print("read_committed: NOT EXACTLY ONCE:", exc)
        ok = False
    lake_ = Lake(lake, options)
    states: dict[str, int] = {}
    for f in lake_.files("read_all"):
        states[f.state] = states.get(f.state, 0) + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        everything = lake_.read("read_all")
    print(f"read_all: {everything.table.num_rows} rows from files by state {states}; "
          f"skipped {len(everything.skipped)} unreadable")  # fmt: skip
    for w in caught:
        if isinstance(w.message, SkippedFilesWarning):
            print(f"  warning: {w.message}")
    injected = DEMO / "checkpoint" / "_fault_injected"
    fired = injected.read_text().strip() if injected.exists() else "did not fire"
    print(f"injected task failure: {fired}{' (Spark retried that task)' if injected.exists() else ''}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", choices=("local", "s3"), default="local")
    p.add_argument("--mode", choices=("foreach", "epoch"), default="foreach")
    p.add_argument("--files", type=int, default=10, help="input files: two make one micro-batch")
    p.add_argument("--rows-per-file", type=int, default=2_000)
    args = p.parse_args()
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    expected = write_input(DEMO / "in", files=args.files, rows_per_file=args.rows_per_file)
    print(
        f"{expected} rows in {args.files} files under {DEMO / 'in'}, streamed in {args.mode} mode", flush=True
    )
    if args.target == "local":
        lake = str(DEMO / "lake")
        run_job(lake, {}, args)
        return report(lake, {}, expected)

    from devtools.moto import create_bucket, dev_storage_options, start_moto, stop_moto

    server, url = start_moto()
    print(f"moto S3 server on {url} (pid {server.pid})")
    try:
        options: dict[str, Any] = dev_storage_options(url)
        create_bucket(url, "demo-lake")
        lake = "s3://demo-lake/events"
        run_job(lake, options, args)
        return report(lake, options, expected)
    finally:
        stop_moto(server)
        print(f"stopped moto (pid {server.pid})")


if __name__ == "__main__":
    sys.exit(main())
