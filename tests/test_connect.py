"""Every lakesink door from a Spark Connect client, and exactly once when the server dies.

A real Connect server (``devtools.connect``: pyspark's own, on a free loopback port, its workers
running this venv's Python) is shared by the module. Clients are separate processes that run
``tests/connect_client.py`` from a folder outside the checkout, with nothing on PYTHONPATH,
as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devtools.connect import ConnectServer
from devtools.procs import wait_until
from lakesink_reader import Lake, read_committed

pytestmark = [pytest.mark.spark, pytest.mark.connect]

CLIENT = Path(__file__).resolve().parent / "connect_client.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    started = ConnectServer(tmp_path_factory.mktemp("connect-server")).start()
    try:
        yield started
    finally:
        started.stop()


def make_input(folder: Path, files: int, rows: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        ids = pa.array(range(i * rows, (i + 1) * rows), pa.int64())
        pq.write_table(pa.table({"id": ids, "label": pa.array([f"r{v % 7}" for v in range(len(ids))])}),
                       folder / f"in-{i:04d}.parquet")  # fmt: skip
        os.utime(folder / f"in-{i:04d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))


def client(work: Path, *args: str, timeout: float = 600) -> subprocess.Popen[str]:
    """Start the client script, copied outside the checkout, as a user's process."""
    script = work / "client.py"
    shutil.copy(CLIENT, script)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    return subprocess.Popen(
        [sys.executable, str(script), *args], cwd=work, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no result from the client (exit {proc.returncode}):\n{err[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert "crashed" not in result, result["crashed"] + err[-3000:]
    return result


def ids(lake: Path) -> list[int]:
    return sorted(read_committed(str(lake)).column("id").to_pylist())


def check_doors(work: Path, seen: dict[str, Any]) -> None:
    expected = list(range(300))
    lakes = {"format-no-register": "epoch", "format-register": "epoch", "write-stream": "epoch",
             "foreach": "foreach", "datasource-register": "epoch", "format-partitioned": "epoch"}  # fmt: skip
    for name, mode in lakes.items():
        assert ids(work / name) == expected, name
        assert Lake(str(work / name)).mode == mode, name
    assert seen["batch_read"] == expected  # spark.read.format("lakesink") from the client
    assert ids(work / "lake-source") == expected  # spark.readStream.format("lakesink") from it
    assert Lake(str(work / "format-partitioned")).metadata.partition_columns == ("label",)
    folders = sorted(p.name for p in (work / "format-partitioned").glob("label=*"))
    assert folders == [f"label=r{i}" for i in range(7)]
    assert seen["unknown_option"].startswith("ValueError: unknown option(s) ['compresion']")
    # The lake exists unpartitioned: .partitionBy reaches the checks (as an option) and is refused.
    refusal = seen["partition_by"]
    assert refusal.startswith("SchemaMismatchError") and "is not partitioned" in refusal
    assert "output mode 'complete'" in seen["complete_mode"]
    assert seen["other_schema"].startswith("SchemaMismatchError") and "'extra'" in seen["other_schema"]
    assert (
        seen["second_query"].startswith("OtherQueryError")
        and "written by streaming query" in seen["second_query"]
    )
    assert "output mode 'complete'" in seen["foreach_complete"]
    assert seen["active_after_mistakes"] == 0
    assert not (work / "format-register-agg").exists() and not (work / "agg-foreach").exists()


def test_every_door_from_a_remote_connect_client_and_with_spark_api_mode_connect(
    server: ConnectServer, tmp_path: Path
) -> None:
    """Both Connect doors, side by side (each judged apart): a remote client of the module's
    server, and ``spark.api.mode=connect``, whose local server lives in the client's own
    process (it cannot share the module's). Their clients run at once: most of a door's time
    is waiting on small Spark batches, so the two overlap (they were two tests, one after the
    other)."""
    env_python = os.environ.get("PYSPARK_PYTHON")
    assert env_python, "conftest points PYSPARK_PYTHON at this venv"
    doors = {"remote": server.url, "api-mode": "api-mode"}
    running: dict[str, subprocess.Popen[str]] = {}
    for name, url in doors.items():
        make_input(tmp_path / name / "in", files=3, rows=100)
        running[name] = client(tmp_path / name, "doors", url, str(tmp_path / name))
    seen: dict[str, dict[str, Any]] = {}
    try:
        for name, proc in running.items():
            try:
                seen[name] = finish(proc)
            except AssertionError as exc:
                raise AssertionError(f"the {name} door: {exc}") from None
    finally:
        for proc in running.values():  # the other door's client, when one failed
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
    for name in doors:
        assert seen[name]["session"] == "pyspark.sql.connect.session", name
        check_doors(tmp_path / name, seen[name])


def committed_rows(lake: Path) -> int:
    try:
        return len(read_committed(str(lake)))
    except Exception:  # noqa: BLE001 - no lake yet
        return 0


def test_a_killed_server_loses_and_duplicates_nothing_in_either_mode(
    server: ConnectServer, tmp_path: Path
) -> None:
    """A query of each mode streams through the server when it is killed with -9 (one kill and
    one restart of the server for both: each costs a JVM start); each mode is judged apart.
    16 files, one an epoch: the faster stream is still running when the slower has 2 epochs."""
    files, rows = 16, 500
    runs: dict[str, tuple[Path, tuple[str, ...]]] = {}
    for mode in ("epoch", "foreach"):
        work = tmp_path / mode
        make_input(work / "in", files=files, rows=rows)
        runs[mode] = (
            work,
            ("stream", server.url, mode, str(work / "lake"), str(work / "chk"), str(work / "in")),
        )
    running = {mode: client(work, *args, "continuous") for mode, (work, args) in runs.items()}
    try:
        # Some epochs committed in both, more to come: then the server dies mid-stream (kill -9).
        streaming = wait_until(
            lambda: all(committed_rows(work / "lake") >= 2 * rows for work, _ in runs.values()),
            300,
            give_up=lambda: any(proc.poll() is not None for proc in running.values()),
        )
        exited = {
            mode: proc.communicate()[1][-3000:] for mode, proc in running.items() if proc.poll() is not None
        }
        assert streaming, exited or "no epoch committed in both modes in 300 s"
        server.kill()
        killed_at = {mode: committed_rows(work / "lake") for mode, (work, _) in runs.items()}
    finally:
        # A Connect client whose server died blocks for minutes (reattachable execution).
        for proc in running.values():
            with contextlib.suppress(ProcessLookupError):  # one that exited early is reaped
                os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
    for mode, rows_then in killed_at.items():
        assert rows_then < files * rows, (
            f"{mode}: the stream had finished before the kill: nothing was tested"
        )
    server.start()
    time.sleep(1)
    restarted = {mode: client(work, *args, "available-now") for mode, (work, args) in runs.items()}
    wrong = {}
    for mode, proc in restarted.items():
        result, got = finish(proc), ids(runs[mode][0] / "lake")
        if result["error"] is not None or got != list(range(files * rows)):
            wrong[mode] = result["error"] or f"{len(got)} rows, {len(set(got))} distinct of {files * rows}"
    assert not wrong, wrong  # every row once, in each mode


def test_the_job_runs_through_a_connect_server(server: ConnectServer, tmp_path: Path) -> None:
    make_input(tmp_path / "in", files=3, rows=100)
    job = Path(__file__).resolve().parent.parent / "jobs" / "stream_to_lake.py"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}
    done = subprocess.run(
        [sys.executable, str(job), "--remote", server.url, "--source", "files",
         "--input", str(tmp_path / "in"), "--available-now", "--mode", "epoch",
         "--lake", str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "chk")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert ids(tmp_path / "lake") == list(range(300))
    # The job's line per epoch, with the row count from a Connect client's progress.
    assert re.search(r"epoch 0: rows=100 files=1 ", done.stdout), done.stdout[-2000:]
