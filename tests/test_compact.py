"""``lakesink compact`` on format-3 lakes (docs/design/format-v3.md, section 10).

Lakes are built by hand (tests/lakes.py) or written by the real epoch writer; every test reads
the result back through the reader and compares the rows with what was committed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakes import epoch_lake, v3_file, v3_name, v3_table
from live import CHECKOUT_PATH, LiveWriter, kill_when_ready

from lakesink import FormatVersionError
from lakesink.cli import main
from lakesink.commit import WriteOptions
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import compact, verify
from lakesink.maintenance.compact import parse_size
from lakesink_reader import Lake, read_committed
from lakesink_reader.errors import CommitConflictError, LakeSinkError
from lakesink_reader.format.v3.commits import PendingCommit
from lakesink_reader.names import OPS_DIR, parse_compaction_file

WRITER = "11111111-2222-3333-4444-555555555555"
ROOT = Path(__file__).resolve().parent.parent


def build(
    path: str, *, batches: int = 10, files: int = 2, rows: int = 50, interval: int = 4
) -> VersionedLogWriter:
    """A v3 lake of one writer: ``batches`` appends of ``files`` files of ``rows`` ids each."""
    storage, table_id = v3_table(path, checkpoint_interval=interval)
    vlog = VersionedLogWriter(storage, table_id, checkpoint_interval=interval)
    n = 0
    for batch in range(batches):
        adds = []
        for p in range(files):
            adds.append(v3_file(storage, v3_name(WRITER, batch, p), n, rows, batch=batch, partition=p))
            n += rows
        vlog.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="run00001", adds=adds))
    return vlog


def ids(path: str, **selector: Any) -> list[int]:
    return sorted(read_committed(path, **selector).column("id").to_pylist())


def compaction_files(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if parse_compaction_file(n) is not None)


def test_compaction_keeps_the_rows_drops_files_and_old_versions_read_old_files(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    build(path)
    before = Lake(path)
    old_files = {f.name for f in before.files()}
    assert len(old_files) == 20 and before.version == 9

    dry = compact(path, min_files=2, target_file_size=1 << 20, dry_run=True)
    assert dry.status == "dry_run" and dry.input_files == 20 and not compaction_files(path)

    report = compact(path, min_files=2, target_file_size=1 << 20)
    assert report.status == "committed" and report.version == 10 and report.base_version == 9
    assert len(report.outputs) == 1 and report.input_files == 20
    after = Lake(path)
    assert [f.name for f in after.files()] == [report.outputs[0].path]
    assert ids(path) == list(range(1000))  # same rows, in one file
    # rows keep the input order (oldest files first, each file's rows in order)
    assert read_committed(path).column("id").to_pylist() == list(range(1000))
    # stats are recomputed from the new footer
    stats = report.outputs[0].stats_object
    assert stats["numRecords"] == 1000 and stats["minValues"]["id"] == 0 and stats["maxValues"]["id"] == 999
    # time travel: the version before the compaction reads the old files
    assert {f.name for f in Lake(path).at(version=9).files()} == old_files
    assert ids(path, version=9) == list(range(1000))
    [info] = [v for v in Lake(path).versions() if v.kind == "compact"]
    assert (info.remove_files, info.add_files, info.op) == (20, 1, report.token)
    assert verify(path).ok
    assert not os.listdir(os.path.join(path, OPS_DIR))  # the lease is gone
    again = compact(path, min_files=2, target_file_size=1 << 20)
    assert again.status == "nothing_to_do" and again.version is None


def test_bins_follow_target_and_min_files(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    build(path, batches=6, files=1, rows=2000)
    size = Lake(path).files()[0].size
    assert size is not None
    # bins of 2 files each (3 do not fit the target); a target/2 threshold keeps every file small
    report = compact(path, min_files=2, target_file_size=2 * size + size // 2)
    assert report.status == "committed" and [len(b.inputs) for b in report.bins] == [2, 2, 2]
    assert ids(path) == list(range(12000)) and len(Lake(path).files()) == 3
    # min_files above any bin: nothing to do
    assert compact(path, min_files=3, target_file_size=2 * size + size // 2).status == "nothing_to_do"
    # max_input: only the oldest files are taken
    more = compact(path, min_files=2, target_file_size=1 << 30, max_input=2 * (2 * size + 100))
    assert more.status == "committed" and more.input_files == 2
    assert ids(path) == list(range(12000)) and len(Lake(path).files()) == 2


def test_a_format_2_lake_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "lake")
    epoch_lake(path)
    with pytest.raises(FormatVersionError, match=r"compaction needs lake format 3: .* is format 2"):
        compact(path)
    assert main(["compact", path]) == 2
    assert "compaction needs lake format 3" in capsys.readouterr().err


def test_concurrent_compactions_of_the_same_files_one_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    build(path, batches=6)
    paused, resume = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def first_hook(step: str) -> None:
        if step == "before_commit":
            paused.set()
            assert resume.wait(30)

    def first() -> None:
        try:
            outcome["first"] = compact(path, min_files=2, target_file_size=1 << 20, hook=first_hook)
        except LakeSinkError as exc:
            outcome["first"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    assert paused.wait(30)
    mine = compaction_files(path)
    assert len(mine) == 1  # published, invisible to read_committed
    assert ids(path) == list(range(600)) and not any(f.name in mine for f in Lake(path).files())
    second = compact(path, min_files=2, target_file_size=1 << 20)
    assert second.status == "committed"
    resume.set()
    thread.join(30)
    assert isinstance(outcome["first"], CommitConflictError), outcome
    assert "conflicts with later commits that removed 12 of its inputs" in str(outcome["first"])
    assert compaction_files(path) == [second.outputs[0].path]  # the loser's output is gone
    assert ids(path) == list(range(600))
    assert [v.kind for v in Lake(path).versions()][-1] == "compact" and Lake(path).version == 6
    assert not os.listdir(os.path.join(path, OPS_DIR))


KILLED = textwrap.dedent(
    """
    import sys, time
    from lakesink.maintenance import compact

    def hook(step):
        if step == sys.argv[2]:
            print("ready", flush=True)
            time.sleep(120)

    compact(sys.argv[1], min_files=2, target_file_size=1 << 20, hook=hook)
    """
)


@pytest.mark.parametrize("step", ["published", "before_commit"])
def test_kill_9_mid_compaction_loses_nothing_and_the_next_run_cleans_up(tmp_path: Path, step: str) -> None:
    path = str(tmp_path / "lake")
    build(path, batches=4)
    kill_when_ready(KILLED, path, step)
    left = compaction_files(path)
    assert len(left) == 1 and os.listdir(os.path.join(path, OPS_DIR))  # its output and lease stay
    assert ids(path) == list(range(400)) and Lake(path).version == 3  # nothing committed, no row twice
    # A run that finds the lease fresh leaves the op alone (it may be running)...
    report = compact(path, min_files=2, target_file_size=1 << 20)
    assert report.status == "committed" and not report.abandoned and left[0] in compaction_files(path)
    assert ids(path) == list(range(400))
    # ...and one that finds it idle abandons it and removes its files
    build_more(path)
    report = compact(path, min_files=2, target_file_size=1 << 20, abandon_older_than=0)
    [gone] = report.abandoned
    assert gone.version is not None and gone.removed == tuple(left)
    assert left[0] not in compaction_files(path) and not os.listdir(os.path.join(path, OPS_DIR))
    state = Lake(path)._view("ops").state
    assert state.ops[gone.token].outcome == "abandoned"
    assert ids(path) == list(range(500)) and verify(path).ok


def build_more(path: str) -> None:
    """One more batch of the writer of ``build``: ids 400..499 (two small files)."""
    storage = open_lake(path)
    vlog = VersionedLogWriter(storage, Lake(path).metadata.table_id or "", checkpoint_interval=4)
    adds = [v3_file(storage, v3_name(WRITER, 4, p), 400 + 50 * p, 50, batch=4, partition=p) for p in range(2)]
    vlog.commit(PendingCommit.append(writer_id=WRITER, batch=4, run="run00001", adds=adds))


def open_lake(path: str) -> Any:
    from lakesink_reader.storage import open_storage

    return open_storage(path)


def test_cli_dry_run_then_compact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "lake")
    build(path, batches=3)
    assert main(["compact", path, "--min-files", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: 6 of 6 live file(s)" in out and not compaction_files(path)
    assert main(["compact", path, "--min-files", "2", "--target-file-size", "1MB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "committed" and doc["version"] == 3 and len(doc["bins"][0]["files"]) == 6
    assert ids(path) == list(range(300))
    assert parse_size("128MB") == 128 << 20 and parse_size("1GiB") == 1 << 30 and parse_size("4096") == 4096
    with pytest.raises(ValueError, match="bad size"):
        parse_size("12 parsecs")


MEASURE = textwrap.dedent(
    """
    import re, sys
    import pyarrow, pyarrow.parquet
    from lakesink.commit import WriteOptions
    from lakesink.maintenance import compact

    def status(key):
        return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    before = status("VmRSS")
    report = compact(sys.argv[1], min_files=2, target_file_size=1 << 40,
                     write_options=WriteOptions(row_group_bytes=int(sys.argv[2]), compression="none"))
    print(report.status, report.input_bytes, status("VmHWM") - before)
    """
)


def test_memory_stays_bounded_by_the_row_group_not_the_input(tmp_path: Path) -> None:
    """Peak RSS growth of a compaction of ~180 MiB of incompressible input into one file with
    16 MiB row groups stays under 200 MiB (measured 90-155 MiB, the same for 115 and 463 MiB of
    input): row groups buffered and encoded, one input row group decoded, allocator slack."""
    import numpy as np

    from lakesink.commit import FileWriter

    path = str(tmp_path / "lake")
    storage, table_id = v3_table(path, checkpoint_interval=100)
    vlog = VersionedLogWriter(storage, table_id, checkpoint_interval=100)
    rng = np.random.default_rng(7)
    schema = Lake(path).schema
    n = 0
    per_file = 8 * 1024 * 1024 // 24  # ~8 MiB of Arrow per file
    for batch in range(16):
        name = v3_name(WRITER, batch, 0)
        ids_ = np.arange(n, n + per_file, dtype=np.int64)
        table = pa.record_batch(
            [pa.array(ids_), pa.array(rng.integers(0, 7, per_file, dtype=np.int32)),
             pa.array(rng.integers(0, 1 << 62, per_file).astype(str).astype(object))],
            schema=schema,
        )  # fmt: skip
        writer = FileWriter(storage, name, schema, WriteOptions(compression="none", use_dictionary=False))
        writer.write(table)
        done = writer.publish()
        assert done is not None
        from lakesink_reader.format.v3.commits import AddFile

        add = AddFile(name, done.rows, done.size, 0, batch, done.stats)
        vlog.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="run00001", adds=[add]))
        n += per_file
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, path, str(16 << 20)],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": CHECKOUT_PATH}, check=True,
    ).stdout.split()  # fmt: skip
    status, input_bytes, grown = out[0], int(out[1]), int(out[2])
    assert status == "committed" and input_bytes > 150 << 20
    print(f"compaction of {input_bytes >> 20} MiB: peak RSS grew {grown >> 20} MiB")
    assert grown < 200 << 20, f"peak RSS grew {grown >> 20} MiB for {input_bytes >> 20} MiB of input"
    assert pq.read_metadata(os.path.join(path, compaction_files(path)[0])).num_rows == n


# With the real writer (Spark) ---------------------------------------------------------------------


def whole_blocks(found: list[int], what: str) -> None:
    """Every row at most once, and whole input files only (file i holds ids 100i..100i+99)."""
    assert len(found) == len(set(found)), f"{what}: a row twice"
    blocks: dict[int, int] = {}
    for i in found:
        blocks[i // 100] = blocks.get(i // 100, 0) + 1
    assert all(n == 100 for n in blocks.values()), f"{what}: a partial input file"


@pytest.mark.spark
def test_compaction_of_a_lake_written_by_the_epoch_writer(spark: Any, tmp_path: Path, lake: str) -> None:
    from test_epoch_v3 import add_input, run

    for i in range(4):
        add_input(tmp_path / "in", i)
    assert run(spark, tmp_path / "in", lake, tmp_path / "chk").exception() is None
    before = Lake(lake)
    assert before.version == 3 and len(before.files()) >= 4
    report = compact(lake, min_files=2, target_file_size=1 << 20)
    assert report.status == "committed" and report.version == 4
    assert len(Lake(lake).files()) == 1 < len(before.files())
    assert ids(lake) == list(range(400)) == ids(lake, version=3)
    assert {f.name for f in Lake(lake).at(version=3).files()} == {f.name for f in before.files()}
    assert verify(lake).ok
    # the writer goes on after the compaction: its next batch is the next version
    add_input(tmp_path / "in", 4)
    assert run(spark, tmp_path / "in", lake, tmp_path / "chk").exception() is None
    assert ids(lake) == list(range(500)) and Lake(lake).version == 5


# Long (make chaos): the simulation runs compactions beside live writers under every fault in
# make test; this is the same race through Spark, and it needs the race to happen (load-bound).
@pytest.mark.spark
@pytest.mark.long
@pytest.mark.chaos
def test_compaction_in_a_loop_beside_a_live_writer(spark: Any, tmp_path: Path, lake: str) -> None:
    total = 40
    raced: list[int] = []  # compactions with appends committed between their base and their commit
    committed = []
    with LiveWriter(spark, tmp_path, lake, total) as live:
        while not live.done.is_set() or len(committed) < 2:
            report = compact(
                lake, min_files=2, target_file_size=1 << 20,
                hook=lambda step: time.sleep(0.5) if step == "before_commit" else None,
            )  # fmt: skip
            if report.status == "committed":
                assert report.version is not None
                committed.append(report.version)
                if report.version > report.base_version + 1:
                    raced.append(report.version)
                # the compact commit changes no rows; the version before it reads the old files
                now = ids(lake, version=report.version)
                assert now == ids(lake, version=report.version - 1)
                whole_blocks(now, f"version {report.version}")
                whole_blocks(ids(lake, version=report.base_version), f"version {report.base_version}")
            whole_blocks(ids(lake), "latest")  # during: never a row twice, never half a batch
            time.sleep(0.1)
        live.query.processAllAvailable()
    assert live.query.exception() is None, live.query.exception()
    final = compact(lake, min_files=2, target_file_size=1 << 20)
    assert ids(lake) == list(range(total * 100)), "after: every row exactly once"
    kinds = [v.kind for v in Lake(lake).versions()]
    assert raced, f"no compaction had appends land while it ran: {kinds}"
    first = kinds.index("compact")
    assert "append" in kinds[first:] and "append" in kinds[:first]
    assert final.status in ("committed", "nothing_to_do")
    assert len(Lake(lake).files()) < kinds.count("append") / 4  # the file count dropped
    assert verify(lake).ok
