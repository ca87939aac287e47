"""Auto-compaction (issue 36): the writer's driver compacts the lake's small files after a commit
once there are enough of them, never failing the query, beside a manual ``lakesink compact``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakes import v3_table
from test_reader_v3 import W1, Writer

import lakesink
from lakesink.commit.versions import VersionedLogWriter
from lakesink.config import SinkConfig
from lakesink.maintenance import compact
from lakesink.maintenance.auto_compact import AUTO_COMPACT_MIN_SMALL, compact_if_due, small_files
from lakesink.spark import batch_log
from lakesink_reader import Lake, read_committed
from lakesink_reader.storage import Storage


def test_compaction_is_due_at_the_threshold_and_never_raises(lake: str) -> None:
    storage, table_id = v3_table(lake)
    log = VersionedLogWriter(storage, table_id, checkpoint_interval=100)
    writer = Writer(log, W1)
    for batch in range(AUTO_COMPACT_MIN_SMALL // 2 - 1):
        writer.append(batch * 20)  # two small files a batch
    state = log.open()
    assert small_files(state) == AUTO_COMPACT_MIN_SMALL - 2
    assert compact_if_due(storage, state) is None  # not due: nothing read, nothing written
    # Due, but no bin to join (here: bins of 1,000): the driver looks again only once
    # min_small more small files are live, not at every commit.
    idle = compact_if_due(storage, state, min_small=4, min_files=1_000)
    assert idle is not None and idle.report is not None and idle.report.status == "nothing_to_do"
    assert idle.next_due == small_files(state) + 4
    assert compact_if_due(storage, state, min_small=4, min_files=1_000, due=idle.next_due) is None
    writer.append(10_000)
    state = log.open()
    done = compact_if_due(storage, state)
    assert done is not None and done.report is not None and done.report.status == "committed"
    after = log.open()
    assert small_files(after) == 1 and after.version == state.version + 1  # one output, small too
    assert [v.operation for v in Lake(lake).history(limit=1)] == [
        "auto-compaction"
    ]  # the header says who ran it
    assert sorted(read_committed(lake).column("id").to_pylist()) == sorted(
        i for b in range(AUTO_COMPACT_MIN_SMALL // 2 - 1) for i in range(b * 20, b * 20 + 20)
    ) + list(range(10_000, 10_020))

    class Broken(Storage):  # every read fails: the compaction fails, the call does not
        def __init__(self) -> None:
            self.url = storage.url

        def __getattr__(self, name: str) -> Any:
            raise OSError(f"storage down ({name})")

    failed = compact_if_due(Broken(), state, min_small=1)
    assert failed is not None and failed.report is None


def test_the_batch_log_names_the_compaction_right_after_a_batch_auto_or_manual(lake: str) -> None:
    """``register(spark, batch_log=True)``'s figures, read from the log as the listener reads
    them: a batch, then its query's auto-compaction (or a manual one) at the next version."""
    from test_reader_v3 import compact as compact_in_log
    from test_reader_v3 import live_adds

    storage, table_id = v3_table(lake)
    log = VersionedLogWriter(storage, table_id, checkpoint_interval=100)
    writer = Writer(log, W1)
    writer.append(0)  # version 0, batch 0
    writer.append(20)  # version 1, batch 1
    assert compact_in_log(log, live_adds(log, 0, 1), 0, 40, trigger="auto") == 2
    figures = batch_log.batch_figures(W1, 1, lake, {})
    assert figures is not None and (figures.version, figures.files, figures.rows) == (1, 2, 20)
    assert figures.compaction == (2, 4, 1)
    assert figures.line().endswith("; compacted at version 2 (4 files -> 1)")
    writer.append(40)  # version 3, batch 2; then a manual compaction
    assert compact_in_log(log, live_adds(log, 2, 3), 0, 60) == 4
    manual = batch_log.batch_figures(W1, 2, lake, {})
    assert manual is not None and manual.compaction == (4, 3, 1)
    assert batch_log.batch_figures(W1, 1, lake, {}) is None  # no longer the writer's last batch


def test_the_option_is_parsed() -> None:
    assert SinkConfig.from_options({"path": "/x", "auto_compact": "true"}).sink.auto_compact is True
    assert SinkConfig.from_options({"path": "/x"}).sink.auto_compact is None  # the lake's default
    assert SinkConfig.from_options({"path": "/x", "auto_compact": "false"}).sink.auto_compact is False
    with pytest.raises(ValueError, match="option 'auto_compact' must be true or false"):
        SinkConfig.from_options({"path": "/x", "auto_compact": "sometimes"})


@pytest.mark.spark
@pytest.mark.parametrize(
    "trigger",
    [
        pytest.param({"availableNow": True}, id="available-now"),
        pytest.param({"processingTime": "1 second"}, id="one-second", marks=pytest.mark.long),
    ],
)
def test_a_stream_with_auto_compact_keeps_its_small_files_bounded_beside_a_manual_compact(
    spark: Any, tmp_path: Path, trigger: dict[str, Any]
) -> None:
    """40 micro-batches of one input file each, written by two tasks: 80 small files without
    auto-compaction. With it, at most AUTO_COMPACT_MIN_SMALL + 2 are ever live after a commit
    (the threshold, plus one batch's files), every row once, while a manual ``compact`` loops
    beside the stream."""
    folder, batches = tmp_path / "in", 40
    folder.mkdir()
    for i in range(batches):
        ids = pa.array(range(i * 100, (i + 1) * 100), pa.int64())
        pq.write_table(pa.table({"id": ids, "label": pa.array([f"r{v}" for v in ids.to_pylist()])}),
                       folder / f"in-{i:04d}.parquet")  # fmt: skip
    lake = str(tmp_path / "lake")
    stop = threading.Event()
    manual: list[str] = []
    first_auto: list[int] = []

    def compact_beside() -> None:
        # Only once the stream compacted by itself, a manual compact runs beside it, every half
        # second, on bins of 8 small files or more.
        while not stop.is_set() and not first_auto:
            try:
                first_auto.extend(v.version for v in Lake(lake).history() if v.operation == "auto-compaction")
            except Exception:  # noqa: BLE001 -- the lake is not there yet
                pass
            stop.wait(0.2)
        while not stop.is_set():
            try:
                manual.append(compact(lake, min_files=8, check_store=False).status)
            except Exception as exc:  # noqa: BLE001 -- a lost race with the driver's compaction
                manual.append(type(exc).__name__)
            stop.wait(0.5)

    beside = threading.Thread(target=compact_beside, daemon=True)
    beside.start()
    # The batch log (register(spark, batch_log=True)): a line per batch, read from the lake.
    lakesink.register(spark, batch_log=True)
    listener = batch_log.install(spark)
    query = lakesink.write_stream(
        spark.readStream.schema("id long, label string").option("maxFilesPerTrigger", 1).parquet(str(folder))
        .repartition(2),
        lake, checkpoint_location=str(tmp_path / "chk"), auto_compact=True,
        trigger=trigger, driver_write="never",  # two tasks, two files a batch
    )  # fmt: skip
    try:
        if "availableNow" in trigger:
            query.awaitTermination(600)
        else:
            query.processAllAvailable()
    finally:
        query.stop()
        stop.set()
        beside.join(60)
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(batches * 100))
    try:  # the listener hears of the last batch after the query ended: Spark's bus is asynchronous
        qid = str(query.id)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            qid not in listener.last or listener.last[qid].batch < batches - 1
        ):
            time.sleep(0.2)
        last = listener.last[qid]
        assert (last.batch, last.lake, last.files, last.rows) == (batches - 1, lake, 2, 100)
        assert last.version == max(
            v.version for v in Lake(lake).history() if v.batch == batches - 1 and v.writer == qid
        )
        assert last.line().startswith(
            f"lakesink: query {qid} batch {batches - 1} -> {lake} version {last.version}: +2 files"
        )
        assert qid not in listener.lakes  # forgotten when the query terminated
    finally:
        spark.streams.removeListener(listener)
        delattr(spark, "_lakesink_batch_log")
    history = Lake(lake).history()
    appends = [v for v in history if v.operation == "append"]
    autos = [v for v in history if v.operation == "auto-compaction"]
    manuals = [v for v in history if v.operation == "compaction"]
    assert len(appends) == batches and autos, [v.operation for v in history]
    assert first_auto, "the stream never compacted by itself"
    # The history tells the two apart: each manual compact that committed is a "compaction".
    assert "committed" in manual and len(manuals) == manual.count("committed"), (manual, len(manuals))
    # The Delta view marks it as Delta's own autoCompact marks its OPTIMIZE commits.
    with open(Path(lake, "_delta_log", f"{autos[-1].version:020d}.json"), "rb") as delta_commit:
        info = json.loads(delta_commit.readline())["commitInfo"]
    assert (info["operation"], info["operationParameters"]) == ("OPTIMIZE", {"auto": "true"})
    # After every commit, the live small files: never past the threshold plus one batch's files.
    live_small = 0
    for v in reversed(history):  # oldest first
        live_small += v.add_files - v.remove_files
        assert live_small <= AUTO_COMPACT_MIN_SMALL + 2, (v.version, live_small)
    assert len(Lake(lake).files()) < AUTO_COMPACT_MIN_SMALL


def test_a_lake_keeps_its_writers_auto_compact_default(lake: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``lakesink config PATH auto_compact=true``: table.json keeps the default (and what else it
    held); a query that does not set the option takes it when it starts, one that does keeps its
    own; a replace that lost a race with another writes nothing."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from lakesink.cli import main
    from lakesink.maintenance.lake_defaults import DefaultsChangedError, set_lake_defaults
    from lakesink.spark.datasource import LakeSinkDataSource
    from lakesink_reader.format.table import read_table_metadata
    from lakesink_reader.names import TABLE_FILE
    from lakesink_reader.storage import open_storage

    storage, _ = v3_table(lake)
    schema = StructType([StructField("id", LongType()), StructField("label", StringType())])

    def resolved(**options: str) -> bool:  # what a query's writer decides when it starts
        return bool(LakeSinkDataSource({"path": lake, **options}).streamWriter(schema, False).auto_compact)

    assert (
        main(["config", lake]) == 0
        and capsys.readouterr().out == "auto_compact = unset\niceberg_view = unset\n"
    )
    assert not resolved()
    doc = json.loads(storage.read_bytes(TABLE_FILE))
    storage.put(TABLE_FILE, json.dumps({**doc, "written_by_a_newer_lakesink": 1}).encode())
    assert (
        main(["config", lake, "auto_compact=true"]) == 0
        and capsys.readouterr().out == "auto_compact = true\niceberg_view = unset\n"
    )
    after = json.loads(storage.read_bytes(TABLE_FILE))
    assert after == {**doc, "written_by_a_newer_lakesink": 1, "auto_compact": True}  # the rest kept
    assert read_table_metadata(storage).auto_compact is True
    assert resolved() and not resolved(auto_compact="false")
    assert (
        main(["config", lake, "auto_compact=unset", "--json"]) == 0
        and json.loads(capsys.readouterr().out) == {}
    )
    assert not resolved() and resolved(auto_compact="true")

    assert main(["config", lake, "auto_compcat=true"]) == 2
    assert (
        "'auto_compcat' is not a lake default; the lake keeps ['auto_compact', 'iceberg_view']"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["config", lake, "auto_compact=sometimes"])
    assert "'auto_compact=sometimes' is not NAME=true, NAME=false or NAME=unset" in capsys.readouterr().err

    class Racing(type(storage)):  # type: ignore[misc]
        """Another ``lakesink config`` replaces table.json after this one read it."""

        def stage(self, name: str) -> Any:
            if name == TABLE_FILE and not raced:
                raced.append(set_lake_defaults(open_storage(lake), {"auto_compact": False}))
            return super().stage(name)

    raced: list[Any] = []
    racing = Racing.__new__(Racing)
    racing.__dict__.update(open_storage(lake).__dict__)
    with pytest.raises(DefaultsChangedError, match="changed while its defaults were set"):
        set_lake_defaults(racing, {"auto_compact": True})
    assert raced, "the race did not happen"
    assert read_table_metadata(storage).auto_compact is False  # the other run's, not overwritten
    assert [p.name for p in Path(lake, "_lakesink").iterdir() if "uncommitted" in p.name] == []


def test_bins_of_size_tiers_keep_earlier_outputs_out_of_small_files_bins() -> None:
    """``compact(tier_ratio=8)`` (auto-compaction's): a bin joins files within a power of 8 in
    size, so an earlier compaction's output waits for outputs of its own size instead of being
    rewritten with every few new files; without it, one bin takes them all."""
    from lakesink.maintenance.compact import InputFile, make_bins

    sizes = [100, 120, 900, 110, 130, 1000, 140]  # tiers (powers of 8): 2, 2, 3, 2, 2, 3, 2
    files = [InputFile(f"f{i}.parquet", 1, size, i) for i, size in enumerate(sizes)]
    assert [[f.size for f in b.inputs] for b in make_bins(files, 1 << 20, 2)] == [sizes]
    assert [[f.size for f in b.inputs] for b in make_bins(files, 1 << 20, 2, tier_ratio=8)] == [
        [100, 120, 110, 130, 140],
        [900, 1000],
    ]  # oldest first within each tier
    assert make_bins(files, 1 << 20, 3, tier_ratio=8)[1:] == []  # two of tier 3: no bin of 3
