"""Starting one measured run from the bench's parent: a child (``child.py``), or the job as a user runs it.

Owns the environments a run gets (the bench's, or a user's), the invocations of
``jobs/stream_to_lake.py`` and of its twin with Spark's parquet sink (``parquet_job.py``),
under ``spark-submit`` or plain ``python`` (their flags are named here and nowhere else), what
the job's log lines tell, watching the run's process tree for peak RSS (``procmem``), and
checking what a run wrote: bytes and files a plain reader sees, and the rows read back.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from child import STORAGE_OPTIONS_ENV, ChildSpec
from procmem import PeakRSS, TreeSampler

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
#: The job of the spark-submit and python entry points.
SUBMIT_JOB = ROOT / "jobs" / "stream_to_lake.py"
#: The job with Spark's parquet sink: their baseline, launched the same ways.
PARQUET_JOB = BENCH_DIR / "parquet_job.py"
#: How a job run is started, and what it writes with.
Launcher = Literal["spark-submit", "python"]
JobSink = Literal["lakesink", "parquet", "parquet-arrow"]
#: What the job logs for each epoch, after logging's time: "2026-11-27 12:58:57,170
#: stream_to_lake epoch 3: rows=1000000 files=2 seconds=0.88". Not anchored to the start of a
#: line: under spark-submit, Spark's console progress bar ends in a carriage return, not a newline.
_LOGGED = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) stream_to_lake "
_JOB_EPOCH_LINE = re.compile(_LOGGED + r"epoch (\d+): rows=(\d+) files=\S+ seconds=([\d.]+)")
#: What the job logs right before ``spark.stop()``.
_JOB_STOP_LINE = re.compile(_LOGGED + "stopping Spark")
#: Variables that the bench (devtools.spark.prepare_environment) or the Makefile set, and that
#: a user running a script or spark-submit would not have.
_BENCH_ONLY_VARIABLES = ("SPARK_HOME", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", STORAGE_OPTIONS_ENV)


class RunFailed(RuntimeError):
    """A run exited with an error; the message ends with the end of its log."""


def bench_env(
    storage_options: dict[str, Any] | None = None, *, stock_spark_home: bool = False
) -> dict[str, str]:
    """The environment of a bench child: this process's, bench/ on the Python path of Spark's workers.

    Workers import ``commit_times`` (the observer) from bench/. ``stock_spark_home``: Spark's
    own worker setup, where workers compile pyspark.zip (see devtools/spark.py).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH")) if p)
    if storage_options:
        env[STORAGE_OPTIONS_ENV] = json.dumps(storage_options)
    if stock_spark_home:
        from devtools.spark import installed_spark_home

        env["SPARK_HOME"] = str(installed_spark_home())
    return env


def user_env() -> dict[str, str]:
    """The environment of a user's job: the venv's Python for the workers, Spark on loopback, nothing else.

    No SPARK_HOME (pyspark finds its own, with pyspark.zip), no Python path of ours.
    """
    env = {key: value for key, value in os.environ.items() if key not in _BENCH_ONLY_VARIABLES}
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def run_child(spec: ChildSpec, work: Path, env: dict[str, str], rss_interval: float) -> dict[str, Any]:
    """Run ``spec`` in a child process: its own figures plus its process's wall time and peak RSS."""
    spec_path = work / f"spec-{spec.name}.json"
    spec.save(spec_path)
    cmd = [sys.executable, str(BENCH_DIR / "child.py"), str(spec_path)]
    seconds, peak = _run(cmd, env, work / f"log-{spec.name}.txt", rss_interval)
    figures: dict[str, Any] = json.loads(Path(spec.result).read_text())
    return _with_process(figures, seconds, peak)


def job_command(
    launcher: Launcher,
    sink: JobSink,
    input_dir: Path,
    lake: str,
    checkpoint: str,
    *,
    master: str,
    files_per_trigger: int,
    via: str | None = None,
) -> list[str]:
    """The job in epoch mode (``sink`` "lakesink") or its parquet twin over ``input_dir``, ending when
    the input is read; ``via`` is write_stream's door (None: its default).

    Under spark-submit the master is spark-submit's, as a user passes it; with plain python the
    job's own ``--master``.
    """
    script = SUBMIT_JOB if sink == "lakesink" else PARQUET_JOB
    if launcher == "spark-submit":
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master, str(script)]
    else:
        cmd = [sys.executable, str(script), "--master", master]
    if sink == "lakesink":
        cmd += ["--mode", "epoch", *(["--via", via] if via else [])]
    elif sink == "parquet-arrow":
        cmd += ["--through-arrow"]
    return [
        *cmd,
        "--source", "files",
        "--input", str(input_dir),
        "--max-files-per-trigger", str(files_per_trigger),
        "--available-now",
        "--lake", lake,
        "--checkpoint", checkpoint,
    ]  # fmt: skip


def run_job(
    name: str,
    input_dir: Path,
    lake: str,
    work: Path,
    *,
    launcher: Launcher,
    sink: JobSink,
    master: str,
    files_per_trigger: int,
    rss_interval: float,
    via: str | None = None,
) -> dict[str, Any]:
    """The job (or its parquet twin) as a user runs it, in a user's environment, launch to exit.

    The job reports neither when its query started nor its CPU, so a job run has the process's
    figures -- wall time from launch to exit (JVM start included) and peak RSS -- and what its
    log lines tell: rows and epochs; launch to the first epoch's line (the job looks at its
    query's progress every 0.5 s: up to that much late, alike for both sinks); and from the
    "stopping Spark" line to exit (``spark.stop()``, then the interpreter's and the JVM's exit).
    """
    cmd = job_command(
        launcher,
        sink,
        input_dir,
        lake,
        str(work / "chk" / name),
        master=master,
        files_per_trigger=files_per_trigger,
        via=via,
    )
    log = work / f"log-{name}.txt"
    env = user_env()
    env["PYTHONUNBUFFERED"] = "1"  # the job's lines whole, in a log the JVM writes into too
    launched = time.time()
    seconds, peak = _run(cmd, env, log, rss_interval)
    text = log.read_text(errors="replace")
    epochs = [(_logged_at(m[1]), int(m[3]), float(m[4])) for m in _JOB_EPOCH_LINE.finditer(text) if int(m[3])]
    stops = _JOB_STOP_LINE.findall(text)
    figures = {
        "name": name,
        "sink": "epoch" if sink == "lakesink" else "parquet",
        "session": launcher,
        "via": via,
        "rows": sum(rows for _, rows, _ in epochs),
        "epochs": len(epochs),
        "epoch_seconds": [seconds for _, _, seconds in epochs],
        "launch_to_first_epoch_seconds": epochs[0][0] - launched if epochs else None,
        "stop_to_exit_seconds": launched + seconds - _logged_at(stops[-1]) if stops else None,
    }
    return _with_process(figures, seconds, peak)


def _logged_at(stamp: str) -> float:
    """The epoch seconds of logging's default time ("2026-11-27 12:58:57,170", local time)."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged


def run_profile(rows: int, work: Path, env: dict[str, str], rss_interval: float) -> dict[str, Any]:
    """``profile_writer.py foreach`` in a child process: the shares of the foreach writer's time."""
    out = work / "profile.json"
    cmd = [
        sys.executable, str(BENCH_DIR / "profile_writer.py"), "foreach",
        "--rows", str(rows), "--workdir", str(work / "profile"), "--top", "0", "--json", str(out),
    ]  # fmt: skip
    seconds, _ = _run(cmd, env, work / "log-profile.txt", rss_interval)
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["process_seconds"] = seconds
    return doc


def _with_process(figures: dict[str, Any], seconds: float, peak: PeakRSS) -> dict[str, Any]:
    figures.update(peak.to_dict())
    figures["process_seconds"] = seconds
    figures["rows_per_process_second"] = figures["rows"] / seconds
    return figures


def _run(cmd: list[str], env: dict[str, str], log: Path, rss_interval: float) -> tuple[float, PeakRSS]:
    """Run ``cmd`` with its output to ``log``: (seconds from launch to exit, peak RSS of its tree)."""
    started = time.monotonic()
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        try:
            with TreeSampler(proc.pid, rss_interval) as sampler:
                code = proc.wait()
        except BaseException:
            proc.kill()  # by PID: our own child; its JVM exits with it (the py4j gateway closes)
            proc.wait()
            raise
    seconds = time.monotonic() - started
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RunFailed(f"{shorten(cmd)} failed (exit {code}); the end of {log}:\n{tail}")
    return seconds, sampler.peak


def shorten(cmd: list[str]) -> str:
    return " ".join(os.path.relpath(part, ROOT) if part.startswith(str(ROOT)) else part for part in cmd[:4])


# What a run wrote ------------------------------------------------------------------------------


def output_bytes_local(root: str) -> tuple[int, int]:
    """(bytes, files) of the visible Parquet files under ``root`` (what plain readers see)."""
    total = files = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in names:
            if name.endswith(".parquet") and not name.startswith(("_", ".")):
                total += os.path.getsize(os.path.join(folder, name))
                files += 1
    return total, files


def output_bytes_s3(endpoint: str, bucket: str, prefix: str) -> tuple[int, int]:
    """(bytes, files) of the visible Parquet objects under ``prefix`` on the moto server."""
    from devtools.moto import dev_client

    client = dev_client(endpoint)
    total = files = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            base = obj["Key"].rsplit("/", 1)[-1]
            rel = obj["Key"][len(prefix) :]
            if base.endswith(".parquet") and not base.startswith((".", "_")) and not rel.startswith("_"):
                total += obj["Size"]
                files += 1
    return total, files


def count_rows(sink: str, out: str, storage_options: dict[str, Any] | None) -> int:
    """Rows a reader sees in a run's output: the check that the run wrote every row once."""
    if sink == "parquet":
        import pyarrow.dataset as ds

        return int(ds.dataset(out, format="parquet").count_rows())
    if sink == "delta-peer":
        return _count_delta(out)
    from lakesink_reader import Lake

    return int(Lake(out, storage_options).dataset().count_rows())


def _count_delta(out: str) -> int:
    """Rows of the peer's Delta table, counted by ``delta_peer.py count`` in a process of its own.

    Not here: deltalake stays out of the bench's own process (delta_peer.py says why).
    """
    cmd = [sys.executable, str(BENCH_DIR / "delta_peer.py"), "count", out]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    if done.returncode != 0:
        raise RunFailed(f"{shorten(cmd)} {out} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return int(done.stdout)
