"""``lakesink vacuum`` on format-3 lakes (docs/design/format-v3.md, section 11).

Lakes are built by hand (tests/lakes.py, as tests/test_compact.py does) or written by the real
epoch writer; every test reads the result back and compares the rows with what was committed.
Retention is tested by handing ``vacuum`` its clock (``now``), not by waiting.
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lakes import v3_file, v3_name
from live import LiveWriter, kill_when_ready
from test_compact import WRITER, build, ids, whole_blocks

from lakesink.cli import main
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import compact, sweep, vacuum, verify
from lakesink.maintenance.vacuum import DAY
from lakesink_reader import Lake, read_committed
from lakesink_reader.format.v3.commits import PendingCommit
from lakesink_reader.names import parse_data_file
from lakesink_reader.storage import open_storage

LOG = os.path.join("_lakesink", "log")


def data_files(path: str) -> set[str]:
    return {n for n in os.listdir(path) if n.endswith(".parquet") and not n.startswith(".")}


def log_entries(path: str) -> list[str]:
    return sorted(os.listdir(os.path.join(path, LOG)))


def compacted_lake(path: str) -> tuple[set[str], float]:
    """Versions 0..9 appends (20 files, ids 0..999), 10 a compaction of them all, then 11 and 12
    appends (ids 1000..1199); returns the replaced files and a time between versions 10 and 11."""
    vlog = build(path)
    replaced = data_files(path)
    report = compact(path, min_files=2, target_file_size=1 << 20)
    assert report.version == 10
    between = time.time()
    time.sleep(0.01)
    append(path, vlog, 10, 1000)
    append(path, vlog, 11, 1100)
    return replaced, between


def append(path: str, vlog: VersionedLogWriter, batch: int, start: int) -> None:
    adds = [
        v3_file(vlog.storage, v3_name(WRITER, batch, p), start + 50 * p, 50, batch=batch, partition=p)
        for p in range(2)
    ]
    vlog.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="run00001", adds=adds))


def test_dry_run_lists_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "lake")
    replaced, between = compacted_lake(path)
    files, entries = data_files(path), log_entries(path)
    report = vacuum(path, retain=DAY, now=between + DAY)
    assert report.retained_from == 10 and report.version is None and not report.delete
    assert {o.name for o in report.files} == replaced and not report.removed
    assert report.checkpoint == 8 and any(e.endswith("00000000000000000007.json") for e in report.log_entries)
    assert data_files(path) == files and log_entries(path) == entries  # nothing changed
    assert Lake(path).version == 12 and ids(path, version=3) == list(range(400))
    assert main(["vacuum", path]) == 0  # the CLI default is a dry run too (7d: nothing that old)
    assert "nothing to vacuum" in capsys.readouterr().out
    assert data_files(path) == files and log_entries(path) == entries
    # Forced to now: a summary of what would go, one line a kind; --list names each file (issue 53).
    assert main(["vacuum", path, "--retain", "0", "--force"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith(f"{len(replaced)} file(s) and ") and "would go (dry run" in out[1]
    assert any(line.split()[:2] == ["removed_file", str(len(replaced))] and "compactions replaced" in line
               for line in out), out  # fmt: skip
    assert len(out) < 8 and not any(name in "\n".join(out) for name in replaced)
    assert main(["vacuum", path, "--retain", "0", "--force", "--list"]) == 0
    listed = capsys.readouterr().out
    assert (
        all(name in listed for name in replaced)
        and "removed from the table (a compaction replaced it)" in listed
    )
    assert data_files(path) == files and log_entries(path) == entries


def test_retain_below_the_floor_is_refused_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "lake")
    build(path, batches=2)
    with pytest.raises(ValueError, match=r"below the safety floor of 86400 s \(24h\).*force"):
        vacuum(path, retain=3600, delete=True)
    assert main(["vacuum", path, "--retain", "1h", "--delete"]) == 2
    err = capsys.readouterr().err  # said as a CLI user gives it
    assert "--retain 1h is below the safety floor of 24h" in err and "Add --force" in err
    assert "force=True" not in err
    assert Lake(path).version == 1  # nothing committed
    assert main(["vacuum", path, "--retain", "0", "--force", "--json"]) == 0  # forced: a dry run
    assert '"retained_from": 1' in capsys.readouterr().out


def test_vacuum_removes_replaced_files_and_old_versions(tmp_path: Path) -> None:
    path = str(tmp_path / "lake")
    replaced, between = compacted_lake(path)
    report = vacuum(path, retain=DAY, now=between + DAY, delete=True)
    assert report.retained_from == 10 and report.version == 13 and report.ok
    assert set(report.removed) >= replaced and not (replaced & data_files(path))
    # the log is kept from the checkpoint at or below R (8), the rest went
    entries = log_entries(path)
    assert entries[0].startswith("00000000000000000008.") and "00000000000000000007.json" not in entries
    assert ids(path) == list(range(1200))  # reads at the latest version are exact
    with pytest.raises(ValueError, match=r"retained range .*versions 10\.\.13"):
        read_committed(path, version=9)
    assert ids(path, version=10) == list(range(1000))  # versions >= R still read
    assert ids(path, version=11) == list(range(1100))
    assert [v.version for v in Lake(path).versions()] == list(range(10, 14))
    assert verify(path).ok
    again = vacuum(path, retain=DAY, now=between + DAY, delete=True)  # idempotent: nothing left to do
    assert again.version is None and not again.removed and again.retained_from == 10
    assert ids(path) == list(range(1200))


KILLED = textwrap.dedent(
    """
    import sys, time
    from lakesink.maintenance import vacuum

    def pause():
        print("ready", flush=True)
        time.sleep(120)

    def hook(step):
        if step == sys.argv[3]:
            pause()

    def progress(done, total):
        if sys.argv[3] == "files" and done == 1 and total > 1:
            pause()  # one file removed, the others not

    vacuum(sys.argv[1], retain=86400, now=float(sys.argv[2]), delete=True, hook=hook, progress=progress)
    """
)


@pytest.mark.parametrize("step", ["committed", "files", "log_entry"])
def test_kill_9_mid_vacuum_then_a_rerun_converges(tmp_path: Path, step: str) -> None:
    path = str(tmp_path / "lake")
    replaced, between = compacted_lake(path)
    kill_when_ready(KILLED, path, str(between + DAY), step)
    assert ids(path) == list(range(1200))  # killed anywhere: every row once
    assert Lake(path)._view("vacuum").state.retained_from == 10  # the killed run committed R
    if step == "files":
        assert replaced & data_files(path) and replaced - data_files(path)  # half-way
    if step == "log_entry":
        assert "00000000000000000000.json" not in log_entries(path)
        assert "00000000000000000007.json" in log_entries(path)  # half-way
    report = vacuum(path, retain=DAY, now=between + DAY, delete=True)
    assert report.ok and report.version is None and report.retained_from == 10  # committed by the killed run
    assert not (replaced & data_files(path))
    assert log_entries(path)[0].startswith("00000000000000000008.")
    assert ids(path) == list(range(1200)) and ids(path, version=10) == list(range(1000))
    assert verify(path).ok
    assert not vacuum(path, retain=DAY, now=between + DAY, delete=True).removed  # converged


# With the real writer (Spark) ---------------------------------------------------------------------


@pytest.mark.spark
def test_vacuum_and_orphans_beside_a_live_writer(spark: Any, tmp_path: Path, lake: str) -> None:
    total = 30
    in_flight: list[str] = []  # unlisted published files of a batch not committed yet, seen and kept
    vacuumed: list[int] = []  # vacuum commits with appends landing between their read and commit
    removed: list[str] = []
    stop = threading.Event()

    errors: list[BaseException] = []

    def orphans() -> None:  # the orphan sweep in a tight loop, beside the writer and the vacuums
        try:
            while not stop.is_set():
                swept = sweep(lake, older_than=3600, delete=True)
                in_flight.extend(o.name for o in swept.kept if (o.epoch or 0) > 0)
                removed.extend(o.name for o in swept.removed)
        except Exception as exc:  # noqa: BLE001 -- reported by the test's thread
            errors.append(exc)

    sweeper = threading.Thread(target=orphans)
    with LiveWriter(spark, tmp_path, lake, total) as live:
        sweeper.start()
        try:
            while not live.done.is_set() or len(removed) < 2:
                compact(lake, min_files=2, target_file_size=1 << 20)
                report = vacuum(lake, retain=0, force=True, delete=True)
                in_flight += [o.name for o in report.kept if (o.epoch or 0) > 0]
                removed += [n for n in report.removed if n.endswith(".parquet")]
                if report.version is not None and report.version > report.latest + 1:
                    vacuumed.append(report.version)
                whole_blocks(ids(lake), "latest")  # during: never a row twice, never half a batch
                time.sleep(0.05)
            live.query.processAllAvailable()
        finally:
            stop.set()
            sweeper.join(60)
    assert live.query.exception() is None, live.query.exception()
    assert not errors, errors
    assert ids(lake) == list(range(total * 100)), "after: every row exactly once"
    vacuum(lake, retain=0, force=True, delete=True)
    listed = {f.name for f in Lake(lake).files()}
    [writer] = Lake(lake).writers()
    left = {n: parse_data_file(n) for n in data_files(lake) - listed}
    # what stays: unlisted files of batch 0 (any unknown writer's first batch, by name) or of a
    # batch the stopped writer never committed
    for name, parsed in left.items():
        assert parsed is not None and (parsed.epoch == 0 or parsed.epoch > writer.last_batch), name
    assert ids(lake) == list(range(total * 100))
    assert removed, "vacuum removed no replaced file"
    assert in_flight or vacuumed, (
        "no sweep met a batch in flight, and no vacuum had appends land while it ran"
    )
    assert verify(lake).ok
    print(f"kept in flight: {len(in_flight)}; vacuums raced: {len(vacuumed)}; removed: {len(removed)}")


def test_a_read_of_a_version_vacuumed_while_it_was_pinned_fails_with_the_way_on(tmp_path: Path) -> None:
    """A Lake object pins its version; when a compaction and ``vacuum --retain 0`` remove that
    version before its data read, the read fails naming what happened -- never part of the rows
    (the simulation's final pass reads this way too)."""
    path = str(tmp_path / "lake")
    build(path)  # versions 0..9, 20 files
    pinned = Lake(path)
    assert pinned.version == 9
    compact(path, min_files=2, target_file_size=1 << 20)
    vacuum(path, retain=0, force=True, delete=True)
    with pytest.raises(ValueError, match=r"version=9 of .* was vacuumed while it was read.*from 10.*refresh"):
        pinned.to_table()
    pinned.refresh()
    assert sorted(pinned.to_table(columns=["id"]).column("id").to_pylist()) == list(range(1000))


def test_a_pinned_read_of_a_retained_version_outlives_its_checkpoint(tmp_path: Path) -> None:
    """A Lake pinned at the latest version, whose snapshot starts from checkpoint 2; vacuum
    (retain 0) keeps that version, writes the checkpoint at 4 and truncates the log below it,
    checkpoint 2 included: the pinned read goes on from checkpoint 4 (simulation seed 205)."""
    path = str(tmp_path / "lake")
    build(path, batches=3, interval=2)  # versions 0..2, checkpoint 2
    storage = open_storage(path)
    no_checkpoints = VersionedLogWriter(storage, Lake(path).metadata.table_id or "", checkpoint_interval=None)
    append(path, no_checkpoints, 3, 300)  # versions 3 and 4: the writer died before checkpoint 4
    append(path, no_checkpoints, 4, 400)
    pinned = Lake(path)
    assert pinned.version == 4
    report = vacuum(path, retain=0, force=True, delete=True)
    assert report.retained_from == 4 and report.checkpoint == 4
    assert not os.path.exists(os.path.join(path, LOG, "00000000000000000002.checkpoint.json"))
    assert sorted(pinned.to_table(columns=["id"]).column("id").to_pylist()) == list(range(500))
