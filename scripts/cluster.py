"""Demo: a throwaway Spark standalone cluster on 127.0.0.1 streams into lakes, which are read back.

    python scripts/cluster.py demo            # master + 2 workers, a local and an S3 (moto) lake
    python scripts/cluster.py demo --no-s3

jobs/stream_to_lake.py runs on the cluster with ``spark-submit`` (lakesink shipped as a
``--py-files`` zip to executors whose Python cannot import it otherwise), with one injected
task failure; then ``lakesink_reader`` must find every input row exactly once. Every process
started (master, workers, their executors, spark-submit, moto) is stopped by PID, also when a
job fails and on Ctrl-C, SIGTERM or SIGHUP. The parts live in ``devtools/``: ``standalone``
(the cluster), ``shipping`` (the zip and the executors' Python), ``procs`` (processes by PID),
``stream_job`` (the job's input, arguments and check).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # devtools/ is in the checkout only, never installed

from devtools import procs  # noqa: E402 - devtools/ is found from the checkout's root
from devtools.standalone import StandaloneCluster  # noqa: E402
from devtools.stream_job import JOB, check_lake, job_args, write_input  # noqa: E402

BUCKET = "cluster-demo"


def demo(args: argparse.Namespace) -> int:
    """Run the job once per lake on a fresh cluster; 0 when every lake checks out, else 1."""
    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    source = workdir / "input"
    expected = write_input(source, files=args.files, rows_per_file=args.rows_per_file)
    worker_env: dict[str, str] = {}
    # (lake, the job's storage options, the reader's storage options)
    lakes: list[tuple[str, dict[str, Any], dict[str, Any]]] = [(str(workdir / "lake"), {}, {})]
    try:
        if args.s3:
            from devtools.moto import (
                DEV_KEY,
                DEV_REGION,
                DEV_SECRET,
                create_bucket,
                dev_storage_options,
                start_moto,
            )

            moto, endpoint = start_moto()
            procs.adopt("moto", moto)
            create_bucket(endpoint, BUCKET)
            # Credentials reach the executors the way an instance role or node secret would:
            # in the workers' environment (boto3's default chain), never on a command line.
            worker_env.update(
                AWS_ACCESS_KEY_ID=DEV_KEY, AWS_SECRET_ACCESS_KEY=DEV_SECRET, AWS_DEFAULT_REGION=DEV_REGION
            )
            job_options = {"endpoint_url": endpoint, "client_kwargs": {"region_name": DEV_REGION}}
            lakes.append((f"s3://{BUCKET}/events", job_options, dev_storage_options(endpoint)))
        with StandaloneCluster(workdir / "cluster", workers=2, worker_env=worker_env) as cluster:
            workers = [w.pid for w in cluster.worker_procs]
            print(f"cluster: {cluster.master_url} (UI {cluster.ui_url}), worker pids {workers}", flush=True)
            failures = 0
            for i, (lake, job_options, reader_options) in enumerate(lakes):
                result = cluster.submit(
                    JOB,
                    job_args(lake, workdir / f"checkpoint-{i}", source, job_options, args.mode),
                    name=f"stream-to-lake-{i}",
                    env=worker_env,  # the driver reads the lake's metadata too
                    timeout=args.timeout,
                )
                print(
                    f"job {i} ({lake}): exit {result.returncode} in {result.seconds:.0f}s, log {result.log}"
                )
                if result.returncode != 0:
                    print(result.output()[-4000:], file=sys.stderr)
                    failures += 1
                    continue
                try:
                    print("  " + check_lake(lake, reader_options, expected), flush=True)
                except AssertionError as exc:
                    print(f"  FAILED: {exc}", file=sys.stderr)
                    failures += 1
        return 1 if failures else 0
    finally:
        procs.stop_all()  # moto, and anything a failure above left running


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo", help="standalone cluster; stream a local and an S3 (moto) lake; read both back"
    )
    d.add_argument("--workdir", default=str(ROOT / "demo" / "cluster"), help="wiped and rewritten")
    d.add_argument("--mode", choices=("foreach", "epoch"), default="foreach")
    d.add_argument("--files", type=int, default=4, help="input files (2 per epoch)")
    d.add_argument("--rows-per-file", type=int, default=5_000)
    d.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    d.add_argument("--no-s3", dest="s3", action="store_false", help="local lake only")
    args = p.parse_args(argv)
    if args.files < 1 or args.rows_per_file < 1:
        p.error(f"--files and --rows-per-file must be >= 1, got {args.files} and {args.rows_per_file}")
    procs.install_signal_handlers()
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
