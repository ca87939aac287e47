"""`make run` / `make run-s3` / `make run-hdfs`: stream files of known rows into a fresh lake with
one injected task failure, then show what the reader sees.

The local flavour writes ./demo/lake; the S3 flavour starts a moto server on 127.0.0.1, writes
s3://demo-lake/events through it, and stops the server by PID whatever happens. The HDFS flavour
starts a MiniDFSCluster on 127.0.0.1 (``make hdfs-jars`` builds it), writes
hdfs://127.0.0.1:PORT/demo/events with Spark's checkpoint on HDFS too, and stops it by PID.
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


def run_job(
    lake: str, options: dict[str, Any], args: argparse.Namespace, checkpoint: str | None = None
) -> None:
    """Run jobs/stream_to_lake.py; its checkpoint is ./demo/checkpoint unless ``checkpoint`` (a URL).

    The job keeps its injected-failure marker at ``<checkpoint>/_fault_injected`` as a local
    path; for a URL checkpoint that path is relative, so the job runs in ./demo and the marker
    lands under ./demo/hdfs:/... (see :func:`fault_marker`).
    """
    chk: Any = checkpoint if checkpoint is not None else DEMO / "checkpoint"
    args_ = job_args(lake, chk, DEMO / "in", options, args.mode, fail_once_after_rows=300)
    cmd = [sys.executable, str(JOB), *args_]
    print("$", " ".join(c if "secret" not in c else c.split("=")[0] + "=***" for c in cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=DEMO)


def fault_marker(checkpoint: str | None) -> Path:
    """Where the job's injected-failure marker is: in the checkpoint folder, or for a URL
    checkpoint the same path taken as a local one, relative to ./demo (the job's cwd)."""
    return DEMO / (checkpoint if checkpoint is not None else "checkpoint") / "_fault_injected"


def report(lake: str, options: dict[str, Any], expected: int, checkpoint: str | None = None) -> int:
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
    injected = fault_marker(checkpoint)
    fired = injected.read_text().strip() if injected.exists() else "did not fire"
    print(f"injected task failure: {fired}{' (Spark retried that task)' if injected.exists() else ''}")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", choices=("local", "s3", "hdfs"), default="local")
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

    if args.target == "hdfs":
        return run_hdfs(args, expected)

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


def run_hdfs(args: argparse.Namespace, expected: int) -> int:
    """The demo on a MiniDFSCluster it starts: the lake and Spark's checkpoint both on HDFS."""
    from devtools.hdfs import start_hdfs, stop_hdfs
    from lakesink_reader.storage import open_storage

    server = start_hdfs()
    print(f"MiniDFSCluster {server.url} (pid {server.pid}): ready in {server.started_in:.1f} s, "
          f"RSS {server.rss_bytes() / 2**20:.0f} MiB", flush=True)  # fmt: skip
    try:
        lake, checkpoint = f"{server.url}/demo/events", f"{server.url}/demo/checkpoint"
        run_job(lake, {}, args, checkpoint)
        code = report(lake, {}, expected, checkpoint)
        chk = open_storage(checkpoint)
        print(f"Spark's checkpoint on HDFS: {checkpoint} ({len(chk.list('commits'))} epochs committed); "
              f"cluster RSS now {server.rss_bytes() / 2**20:.0f} MiB")  # fmt: skip
        return code
    finally:
        stop_hdfs(server)
        print(f"stopped the MiniDFSCluster (pid {server.pid})")


if __name__ == "__main__":
    sys.exit(main())
