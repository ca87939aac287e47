"""``lakesink upgrade``: a format-1/2 lake converted to format 3 in place (docs/design/format-v3.md,
section 13): same rows, epochs as versions, fenced against format-2 writers, idempotent under
kill -9 and concurrent runs."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from lakes import SCHEMA, epoch_lake, foreach_lake, format2_query, rows, v3_table
from live import kill_when_ready

from lakesink import CommitError
from lakesink.cli import main
from lakesink.commit import FileWriter
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import status, upgrade, verify
from lakesink.maintenance.upgrade import UNKNOWN_WRITER, fence_token
from lakesink_reader import Lake, read_committed
from lakesink_reader.errors import FormatVersionError
from lakesink_reader.format.log import CommittedFile, EpochLog, EpochRecord
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.format.v3.logfiles import LOG_DIR
from lakesink_reader.names import EPOCHS_DIR, TABLE_FILE, data_file_name, epoch_record_name
from lakesink_reader.storage import Storage, open_storage
from tests.sim.legacy import EpochCommitter

ROOT = Path(__file__).resolve().parents[1]


def ids(path: str, **selector: Any) -> list[int]:
    return sorted(v for v in read_committed(path, **selector).column("id").to_pylist() if v is not None)


def fmt(path: str) -> int:
    return read_table_metadata(open_storage(path)).format_version


def meta_files(path: str) -> dict[str, bytes]:
    """Every file under ``_lakesink/`` (staged leftovers aside), by name."""
    found = {}
    for folder, _, names in os.walk(os.path.join(path, "_lakesink")):
        for name in names:
            if not name.startswith("."):
                full = os.path.join(folder, name)
                found[os.path.relpath(full, path)] = Path(full).read_bytes()
    return found


def fence_epochs(path: str) -> list[int]:
    return [r.epoch for r in EpochLog(open_storage(path)).records() if fence_token(r) is not None]


def v2_file(storage: Storage, epoch: int, start: int, count: int) -> CommittedFile:
    """One published epoch-mode data file of ``epoch`` (a format-2 writer's task)."""
    name = data_file_name(0, epoch, f"{epoch:08x}ffffffff")
    with FileWriter(storage, name, SCHEMA) as writer:
        writer.write(rows(start, count))
    size = next(f.size for f in storage.list("") if f.name == name)
    return CommittedFile(name, 0, epoch, count, size)


class Stop(Exception):
    pass


def stop_at(step: str) -> Any:
    def hook(at: str) -> None:
        if at == step:
            raise Stop(step)

    return hook


def test_an_epoch_lake_keeps_its_rows_and_epochs_become_versions(lake: str, capsys: Any) -> None:
    epoch_lake(lake, epochs=4)
    before = ids(lake)
    assert main(["upgrade", lake, "--check"]) == 0
    assert "would upgrade" in capsys.readouterr().out and fmt(lake) == 2 and not fence_epochs(lake)

    report = upgrade(lake)
    assert (report.status, report.fence_epoch, report.upgrade_version, report.imported) == (
        "upgraded",
        4,
        4,
        4,
    )
    assert fmt(lake) == 3 and ids(lake) == before == list(range(800))
    opened = Lake(lake)
    assert [(v.version, v.kind, v.writer, v.batch) for v in opened.versions()] == [
        (0, "append", "q", 0), (1, "append", "q", 1), (2, "append", "q", 2), (3, "append", "q", 3),
        (4, "upgrade", None, None),
    ]  # fmt: skip
    v2 = EpochLog(open_storage(lake)).records()
    assert [v.committed_at for v in opened.versions()][:4] == [r.committed_at for r in v2[:4]]
    assert ids(lake, epoch=1) == list(range(400))  # time travel by epoch still works
    assert ids(lake, version=2) == list(range(600))
    assert sorted(Lake(lake, epoch=3).since(epoch=1).to_table().column("id").to_pylist()) == list(
        range(400, 800)
    )
    [writer] = opened.writers()
    assert (writer.id, writer.first_batch, writer.last_batch, writer.last_version) == ("q", 0, 3, 3)
    doc = json.loads(Path(lake, TABLE_FILE).read_bytes())
    assert doc["upgraded_from"]["fence_epoch"] == 4 and doc["upgraded_from"]["upgrade_version"] == 4
    assert doc["checkpoint_interval"] == 100
    assert Path(lake, LOG_DIR, f"{4:020d}.checkpoint.json").exists()
    assert verify(lake).ok and status(lake).version == 4 and status(lake).rows == 800

    again = upgrade(lake)
    assert again.status == "already_format_3" and again.ok
    assert main(["upgrade", lake]) == 0
    assert "already format 3" in capsys.readouterr().out


def test_check_with_a_fence_in_place_writes_nothing(lake: str) -> None:
    epoch_lake(lake, epochs=2)
    with pytest.raises(Stop):
        upgrade(lake, hook=stop_at("fenced"))
    files = meta_files(lake)
    report = upgrade(lake, check=True)
    assert (report.status, report.fence_epoch, report.fence_created, report.upgrade_version) == (
        "would_upgrade", 2, False, 2,
    )  # fmt: skip
    assert meta_files(lake) == files and fmt(lake) == 2


KILLED = textwrap.dedent(
    """
    import sys, time
    from lakesink.maintenance import upgrade

    def hook(step):
        if step == sys.argv[2]:
            print("ready", flush=True)
            time.sleep(120)

    upgrade(sys.argv[1], hook=hook)
    """
)


@pytest.mark.parametrize(
    "step",
    [
        "fenced",
        "importing",
        "imported",
        "upgrade_committed",
        "checkpoint_listed",
        "checkpointed",
        "committed",
    ],
)
def test_kill_9_at_each_step_then_a_rerun_writes_what_one_run_writes(tmp_path: Path, step: str) -> None:
    path, reference = str(tmp_path / "lake"), str(tmp_path / "reference")
    epoch_lake(path, epochs=20, partitions=1, rows_per_file=5)  # 20 imports: two batches of creates
    shutil.copytree(path, reference)
    kill_when_ready(KILLED, path, step)
    # Before the commit point the lake is format 2, readable, with its rows.
    assert fmt(path) == (3 if step == "committed" else 2)
    assert ids(path) == list(range(100))
    report = upgrade(path)
    assert report.status == ("already_format_3" if step == "committed" else "upgraded") and report.ok
    # The reference: the same lake, fenced by the same fence, upgraded in one run.
    [fence] = fence_epochs(path)
    shutil.copy(Path(path, epoch_record_name(fence)), Path(reference, epoch_record_name(fence)))
    assert upgrade(reference).fence_created is False
    assert meta_files(path) == meta_files(reference)
    assert ids(path) == list(range(100)) and [v.version for v in Lake(path).versions()] == list(range(21))


def test_two_upgrades_at_once_agree(lake: str) -> None:
    epoch_lake(lake, epochs=5)
    barrier = threading.Barrier(4)
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            reports.append(upgrade(lake))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(fence_epochs(lake)) == 1  # one fence, reused by the others
    assert {(r.fence_epoch, r.upgrade_version) for r in reports if r.status == "upgraded"} == {(5, 5)}
    assert sum(r.fence_created for r in reports) == 1
    assert fmt(lake) == 3 and ids(lake) == list(range(1000)) and Lake(lake).version == 5
    names = sorted(os.listdir(Path(lake, LOG_DIR)))
    assert len([n for n in names if n.endswith(".files")]) == 1  # one checkpoint list, derived


@pytest.mark.parametrize("when", ["fenced", "upgraded"])
def test_a_live_format_2_writer_is_refused_at_the_fence(lake: str, when: str) -> None:
    storage = epoch_lake(lake, epochs=3)
    if when == "fenced":
        with pytest.raises(Stop):
            upgrade(lake, hook=stop_at("fenced"))
    else:
        upgrade(lake)
    # A format-2 writer that checked table.json when it started reaches the fence's epoch ...
    with pytest.raises(CommitError, match="lakesink-upgrade-"):
        EpochCommitter(storage, query_id="q").commit(3, [v2_file(storage, 3, 600, 10)])
    # ... or the epoch after it: refused too, and its files are gone
    with pytest.raises(CommitError, match="lakesink-upgrade-"):
        EpochCommitter(storage, query_id="q").commit(4, [v2_file(storage, 4, 610, 10)])
    assert not [n for n in os.listdir(lake) if "ffffffff" in n]
    assert [r.epoch for r in EpochLog(storage).records()] == [0, 1, 2, 3]
    report = upgrade(lake)
    assert report.ok and fmt(lake) == 3 and ids(lake) == list(range(600))


def test_a_record_after_the_fence_is_reported(lake: str, capsys: Any) -> None:
    storage = epoch_lake(lake, epochs=2)
    with pytest.raises(Stop):
        upgrade(lake, hook=stop_at("fenced"))
    # The format-2 committer refuses every epoch on or after the fence, even without a query id
    # (which skips its ownership checks) ...
    late = v2_file(storage, 3, 400, 10)
    with pytest.raises(CommitError, match="upgraded to lake format 3"):
        EpochCommitter(storage, query_id=None).commit(3, [late])
    # ... an older lakesink's did not: its record lands after the fence.
    late = v2_file(storage, 3, 400, 10)
    assert EpochLog(storage).append(EpochRecord.new(3, [late], query_id=None))[0]
    report = upgrade(lake)
    assert report.status == "upgraded" and not report.ok
    [stray] = report.strays
    assert stray.epoch == 3 and stray.files == (data_file_name(0, 3, "00000003ffffffff"),)
    assert fmt(lake) == 3 and ids(lake) == list(range(400))  # its rows are not in the format-3 lake
    assert main(["upgrade", lake]) == 1  # and every later run says so
    err = capsys.readouterr().err
    assert "after the upgrade's fence at epoch 2" in err and "epoch 3" in err


def test_format_version_takes_3_only_and_names_the_upgrade(lake: str) -> None:
    from lakesink.config import SinkConfig

    with pytest.raises(ValueError, match=r"format_version must be 3 .*got 2.*`lakesink upgrade PATH`"):
        SinkConfig.from_options({"path": lake, "format_version": "2"})
    assert SinkConfig.from_keywords(lake, format_version=3).sink.format_version == 3
    for bad in (1, 2, 4, True):
        with pytest.raises(ValueError, match=rf"format_version must be 3 .*got {bad!r}"):
            SinkConfig.from_keywords(lake, format_version=bad)


@pytest.mark.spark
def test_a_foreach_writer_refuses_a_format_2_lake_until_it_is_upgraded(lake: str) -> None:
    from lakesink.spark.foreach import LakeForeachWriter

    foreach_lake(lake)
    with pytest.raises(FormatVersionError, match=rf"format 2.*`lakesink upgrade {lake}`"):
        LakeForeachWriter(lake, schema=SCHEMA)  # on the driver, before any task
    upgrade(lake)
    assert fmt(lake) == 3
    LakeForeachWriter(lake, schema=SCHEMA)


def test_foreach_lakes_get_table_json_only(lake: str, capsys: Any) -> None:
    foreach_lake(lake)
    before = ids(lake)
    assert main(["upgrade", lake, "--check"]) == 0 and fmt(lake) == 2
    capsys.readouterr()
    assert main(["upgrade", lake, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "upgraded"
    assert fmt(lake) == 3 and ids(lake) == before
    assert not Path(lake, LOG_DIR).exists() and not Path(lake, EPOCHS_DIR).exists()
    doc = json.loads(Path(lake, TABLE_FILE).read_bytes())
    assert doc["upgraded_from"]["format_version"] == 2 and doc["upgraded_from"]["fence_epoch"] is None
    assert upgrade(lake).status == "already_format_3"


def test_a_format_1_lake(lake: str) -> None:
    storage = epoch_lake(lake, epochs=3)
    doc = json.loads(Path(lake, TABLE_FILE).read_bytes())
    doc["format_version"] = 1
    del doc["table_id"]
    Path(lake, TABLE_FILE).write_text(json.dumps(doc))
    for epoch in range(3):
        record = json.loads(Path(lake, epoch_record_name(epoch)).read_bytes())
        record.update(format_version=1, query_id=None)
        del record["commit_id"]
        Path(lake, epoch_record_name(epoch)).write_text(json.dumps(record))
    report = upgrade(storage)
    assert (report.status, report.from_format, report.upgrade_version) == ("upgraded", 1, 3)
    assert fmt(lake) == 3 and ids(lake) == list(range(600))
    assert [w.id for w in Lake(lake).writers()] == [UNKNOWN_WRITER]
    table_id = read_table_metadata(storage).table_id
    assert table_id and VersionedLogWriter(storage, table_id).read_header(0).token.startswith("v1-")  # type: ignore[union-attr]


def test_a_format_3_lake_is_left_alone(lake: str, capsys: Any) -> None:
    v3_table(lake)
    files = meta_files(lake)
    assert main(["upgrade", lake]) == 0
    assert "already format 3" in capsys.readouterr().out and meta_files(lake) == files


@pytest.mark.spark
def test_a_v2_stream_resumes_on_the_upgraded_lake(spark: Any, tmp_path: Path) -> None:
    """The lake and checkpoint a query of lakesink's format-2 writer left (frozen bytes): refused
    until upgraded, then the same query goes on from its checkpoint, writing format 3."""
    from test_epoch_v3 import add_input, stream

    import lakesink

    old = format2_query(tmp_path / "old")
    lake = old.lake

    def run() -> Any:
        query = lakesink.write_stream(
            stream(spark, old.input).repartition(2), lake, checkpoint_location=str(old.checkpoint),
            trigger={"availableNow": True},
        )  # fmt: skip
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        return query

    assert fmt(lake) == 2 and [e.epoch for e in Lake(lake).epochs()] == [0, 1]
    before = meta_files(lake)
    with pytest.raises(FormatVersionError, match=rf"format 2.*`lakesink upgrade {lake}`"):
        run()  # a writer of today refuses the old lake, before it writes anything
    assert meta_files(lake) == before and ids(lake) == list(range(200))
    report = upgrade(lake)
    assert (report.fence_epoch, report.upgrade_version) == (2, 2)
    assert ids(lake) == list(range(200)) and ids(lake, epoch=0) == list(range(100))
    # Spark replays its last batch (its commit is missing from the checkpoint), then goes on.
    (old.checkpoint / "commits" / "1").unlink()
    add_input(old.input, 2)
    query = run()
    assert query.id == old.query_id
    assert fmt(lake) == 3 and ids(lake) == list(range(300))  # the replay skipped, batch 2 once
    versions = Lake(lake).versions()
    assert [(v.version, v.kind, v.writer, v.batch) for v in versions] == [
        (0, "append", query.id, 0), (1, "append", query.id, 1), (2, "upgrade", None, None),
        (3, "append", query.id, 2),
    ]  # fmt: skip
    assert verify(lake).ok
