"""The epoch writer on a format-3 lake (``format_version=3``): one lake version per batch.

Format 3 lands step by step (docs/design/format-v3.md); these tests drive the writer through
its public doors and read the lake through its log, as the reader will.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chaos_hooks import KillPoints, parse_marker
from faults import start_unchecked
from lakes import format2_query

import lakesink
from lakesink import FormatVersionError, OtherQueryError
from lakesink.maintenance import verify
from lakesink_reader import Lake, read_committed
from lakesink_reader.errors import CommitRefusedError
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.format.v3.commits import writer_tag
from lakesink_reader.format.v3.state import LiveFiles
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.names import parse_writer_file
from lakesink_reader.storage import open_storage

pytestmark = pytest.mark.spark


def add_input(folder: Path, index: int, rows: int = 100) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = pa.array(range(index * rows, (index + 1) * rows), pa.int64())
    path = folder / f"in-{index:04d}.parquet"
    pq.write_table(pa.table({"id": ids, "label": pa.array([f"r{i}" for i in ids.to_pylist()])}), path)
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # file i is batch i


def stream(spark: Any, folder: Path) -> Any:
    return (
        spark.readStream.schema("id long, label string").option("maxFilesPerTrigger", 1).parquet(str(folder))
    )


def run(spark: Any, folder: Path, lake: str, checkpoint: Path, **options: Any) -> Any:
    query = lakesink.write_stream(
        stream(spark, folder).repartition(2), lake, checkpoint_location=str(checkpoint),
        trigger={"availableNow": True}, format_version=3, **options,
    )  # fmt: skip
    query.awaitTermination(300)
    return query


def log_of(lake: str) -> VersionedLog:
    storage = open_storage(lake)
    return VersionedLog(storage, read_table_metadata(storage).table_id or "")


def committed(lake: str) -> tuple[list[int], LiveFiles]:
    """Every row the log's live files hold, and the files; read_committed must read the same."""
    log = log_of(lake)
    live = LiveFiles()
    for version in range(log.open().version + 1):
        commit = log.read_commit(version)
        assert commit is not None, f"version {version} is missing"
        live.apply(commit)
    ids = sorted(i for f in live for i in pq.read_table(os.path.join(lake, f.path)).column("id").to_pylist())
    assert sorted(read_committed(lake).column("id").to_pylist()) == ids  # the reader agrees with the log
    return ids, live


def test_each_batch_is_one_version_and_every_row_lands_once(spark: Any, tmp_path: Path, lake: str) -> None:
    for i in range(3):
        add_input(tmp_path / "in", i)
    query = run(spark, tmp_path / "in", lake, tmp_path / "chk")
    assert query.exception() is None, query.exception()
    assert read_table_metadata(open_storage(lake)).format_version == 3
    state = log_of(lake).open()
    assert state.version == 2  # batches 0, 1, 2: versions 0, 1, 2
    [writer] = state.writers.values()
    assert (writer.id, writer.first_batch, writer.last_batch) == (query.id, 0, 2)
    assert writer.offsets is not None  # the batch's source offsets, from Spark's offset log
    ids, live = committed(lake)
    assert ids == list(range(300))
    assert all(f.stats is not None and f.stats_object["numRecords"] == f.rows for f in live)  # exact stats
    # Format 3's names say whose batch a file is: w<the query's tag>-b<batch>-p<partition>-...
    tag = writer_tag(query.id)
    assert live and all(parse_writer_file(f.path) == (tag, f.batch) for f in live), [f.path for f in live]
    assert not [n for n in os.listdir(lake) if n.endswith(".uncommitted")]
    assert verify(lake).ok
    opened = Lake(lake)
    assert [v.version for v in opened.versions()] == [0, 1, 2]
    assert [w.id for w in opened.writers()] == [query.id]
    assert sorted(read_committed(lake, version=0).column("id").to_pylist()) == list(range(100))


def test_a_replayed_batch_is_skipped_whole_and_the_lake_keeps_its_format(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    for i in range(2):
        add_input(tmp_path / "in", i)
    assert run(spark, tmp_path / "in", lake, tmp_path / "chk").exception() is None
    # Spark replays the last batch when its commit is missing from the checkpoint (a driver
    # that died between the lake's commit and Spark's own).
    commits = tmp_path / "chk" / "commits"
    last = max((p for p in commits.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    last.unlink()
    (commits / f".{last.name}.crc").unlink(missing_ok=True)
    add_input(tmp_path / "in", 2)
    steps = tmp_path / "steps"
    steps.mkdir()
    query = run(spark, tmp_path / "in", lake, tmp_path / "chk", observer=KillPoints(str(steps), 0))
    assert query.exception() is None, query.exception()
    ids, _ = committed(lake)
    assert ids == list(range(300))  # the replayed batch once, the new one once
    # The replay's tasks knew batch 1 was in the log (the driver told them): they wrote nothing.
    published = {parse_marker(n)[1] for n in os.listdir(steps) if n.startswith("after_publish")}
    records = {parse_marker(n)[1] for n in os.listdir(steps) if n.startswith("before_record")}
    assert published == {2} and records == {1, 2}, (published, records)
    state = log_of(lake).open()
    assert state.version == 2 and next(iter(state.writers.values())).last_batch == 2
    leftovers = [n for n in os.listdir(lake) if n.endswith(".parquet")]
    assert len(leftovers) == len(committed(lake)[1])  # the replay's own files were removed
    # Format 2 is no longer written: asking for it is refused, naming the upgrade.
    with pytest.raises(ValueError, match="format_version must be 3"):
        lakesink.write_stream(stream(spark, tmp_path / "in"), lake, checkpoint_location=str(tmp_path / "chk"),
                              format_version=2)  # fmt: skip


def test_a_second_query_is_refused_at_start_and_at_commit(spark: Any, tmp_path: Path, lake: str) -> None:
    add_input(tmp_path / "in", 0)
    first = run(spark, tmp_path / "in", lake, tmp_path / "chk")
    assert first.exception() is None
    with pytest.raises(OtherQueryError, match=rf"written by streaming query {first.id} .*a new one"):
        run(spark, tmp_path / "in", lake, tmp_path / "chk-new")
    # Past the driver's check (two starts racing), the log's own rule refuses it.
    from lakesink.config import SinkConfig

    config = SinkConfig.from_keywords(lake, checkpoint_location=str(tmp_path / "chk-new"), format_version=3)
    second = start_unchecked(
        stream(spark, tmp_path / "in").writeStream.format("lakesink").options(**config.to_options())
        .trigger(availableNow=True)
    )  # fmt: skip
    with pytest.raises(Exception, match="allow_other_queries"):
        second.awaitTermination(300)
    assert "CommitRefusedError" in str(second.exception())
    assert committed(lake)[0] == list(range(100))
    assert len(log_of(lake).open().writers) == 1
    assert not [
        n
        for n in os.listdir(lake)
        if n.endswith(".parquet") and n not in {f.path for f in committed(lake)[1]}
    ]


def test_an_old_checkpoint_over_a_recreated_lake_is_refused(spark: Any, tmp_path: Path, lake: str) -> None:
    """v2's epoch-0 hole: a lake deleted and recreated under an old checkpoint took its epochs."""
    for i in range(2):
        add_input(tmp_path / "in", i)
    assert run(spark, tmp_path / "in", lake, tmp_path / "chk-old").exception() is None
    shutil.rmtree(lake)
    other = tmp_path / "other"
    add_input(other, 50)
    assert run(spark, other, lake, tmp_path / "chk-new").exception() is None  # the new lake's writer
    add_input(tmp_path / "in", 2)
    config = json.loads((tmp_path / "chk-old" / "metadata").read_text())
    from lakesink.config import SinkConfig

    options = SinkConfig.from_keywords(lake, checkpoint_location=str(tmp_path / "chk-old"), format_version=3)
    old = start_unchecked(  # past the start() check, which refuses it too
        stream(spark, tmp_path / "in").writeStream.format("lakesink").options(**options.to_options())
        .trigger(availableNow=True)
    )  # fmt: skip
    with pytest.raises(Exception, match="batch 2"):
        old.awaitTermination(300)
    assert config["id"] in str(old.exception())
    assert committed(lake)[0] == list(range(5000, 5100))  # nothing of the old writer's batch 2


def test_an_old_checkpoint_over_a_deleted_or_empty_recreated_lake_is_refused_at_start(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    """Issue 35: refused at start() in one line, before any task writes, not at the first commit."""
    from lakesink_reader.errors import CommitRefusedError
    from lakesink_reader.format.table import ensure_table

    for i in range(2):
        add_input(tmp_path / "in", i)
    assert run(spark, tmp_path / "in", lake, tmp_path / "chk").exception() is None
    shutil.rmtree(lake)
    add_input(tmp_path / "in", 2)
    with pytest.raises(CommitRefusedError, match=r"committed batches 0\.\.1 .* does not exist") as deleted:
        run(spark, tmp_path / "in", lake, tmp_path / "chk")
    assert "\n" not in str(deleted.value) and "new checkpoint location" in str(deleted.value)
    assert not os.path.exists(lake)  # nothing written
    schema = pa.schema([("id", pa.int64()), ("label", pa.string())])
    ensure_table(open_storage(lake), schema, "epoch")  # recreated: a table.json, no writer yet
    with pytest.raises(CommitRefusedError, match="holds no batch of it"):
        run(spark, tmp_path / "in", lake, tmp_path / "chk")
    assert not [n for n in os.listdir(lake) if n.endswith(".parquet")]


# Several writers -------------------------------------------------------------------------------


def feed_and_run_two(
    spark: Any, tmp_path: Path, lake: str, storage_options: dict[str, Any] | None
) -> tuple[Any, Any]:
    """Two queries over different input (ids 0.. and 100000..), started together on one lake."""
    for i in range(4):
        add_input(tmp_path / "a", i)
        add_input(tmp_path / "b", 1000 + i)
    queries = [
        lakesink.write_stream(
            stream(spark, tmp_path / name),
            lake,
            checkpoint_location=str(tmp_path / f"chk-{name}"),
            trigger={"availableNow": True},
            format_version=3,
            allow_other_queries=True,
            storage_options=storage_options,
        )
        for name in ("a", "b")
    ]
    for query in queries:
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    return queries[0], queries[1]


def interleaved(versions: list[Any], first: str, second: str) -> bool:
    """Whether ``second`` committed a version between two of ``first``'s: they ran at once."""
    order = [v.writer for v in versions]
    firsts = [i for i, w in enumerate(order) if w == first]
    return any(firsts[0] < i < firsts[-1] for i, w in enumerate(order) if w == second)


def test_two_queries_that_allow_each_other_append_at_once_both_exactly_once(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    a, b = feed_and_run_two(spark, tmp_path, lake, None)
    expected = sorted([*range(400), *range(100_000, 100_400)])
    assert sorted(read_committed(lake).column("id").to_pylist()) == expected
    opened = Lake(lake)
    assert {w.id for w in opened.writers()} == {a.id, b.id}
    versions = opened.versions()
    assert len(versions) == 8  # four batches each, one version per batch
    assert interleaved(versions, a.id, b.id) or interleaved(versions, b.id, a.id), [
        v.writer for v in versions
    ]
    # A restart of either from its checkpoint replays nothing twice.
    add_input(tmp_path / "a", 4)
    again = lakesink.write_stream(
        stream(spark, tmp_path / "a"), lake, checkpoint_location=str(tmp_path / "chk-a"),
        trigger={"availableNow": True}, allow_other_queries=True,
    )  # fmt: skip
    again.awaitTermination(300)
    assert again.exception() is None
    assert sorted(read_committed(lake).column("id").to_pylist()) == sorted([*expected, *range(400, 500)])


@pytest.mark.s3
def test_two_queries_on_an_s3_lake(spark: Any, s3: Any, tmp_path: Path) -> None:
    from s3server import BUCKET

    lake = f"s3://{BUCKET}/two-writers"
    feed_and_run_two(spark, tmp_path, lake, s3.storage_options)
    expected = sorted([*range(400), *range(100_000, 100_400)])
    assert (
        sorted(read_committed(lake, storage_options=s3.storage_options).column("id").to_pylist()) == expected
    )
    assert len(Lake(lake, storage_options=s3.storage_options).writers()) == 2
    # Spark's batch read of the S3 lake, through lakesink (storage options as one JSON option).
    frame = (
        spark.read.format("lakesink")
        .option("storage_options", json.dumps(dict(s3.storage_options)))
        .load(lake)
    )
    assert sorted(r["id"] for r in frame.select("id").collect()) == expected


def test_without_the_option_a_second_query_is_refused_and_nothing_is_lost(
    spark: Any, tmp_path: Path, lake: str
) -> None:
    add_input(tmp_path / "a", 0)
    add_input(tmp_path / "b", 1000)
    assert run(spark, tmp_path / "a", lake, tmp_path / "chk-a").exception() is None
    with pytest.raises(OtherQueryError, match="allow_other_queries=True") as refused:
        run(spark, tmp_path / "b", lake, tmp_path / "chk-b")
    # ... and the way out of a lost checkpoint too (issue 35): continue the writer from the lake.
    assert f"`lakesink offsets {lake}`" in str(refused.value) and "continue_writer" in str(refused.value)
    # A second query on a format-2 lake is refused, allowed or not: the lake needs its upgrade.
    v2_lake = format2_query(tmp_path / "v2").lake
    with pytest.raises(FormatVersionError, match=f"`lakesink upgrade {v2_lake}`"):
        lakesink.write_stream(
            stream(spark, tmp_path / "b"), v2_lake, checkpoint_location=str(tmp_path / "chk-v2b"),
            allow_other_queries=True,
        )  # fmt: skip
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(100))


# Restart from the lake ----------------------------------------------------------------------


def replayed(spark: Any, limit_file: Path, start: int) -> Any:
    from replay_source import ReplaySource

    spark.dataSource.register(ReplaySource)
    source = spark.readStream.format("lakesink_test_replay").option("limit_file", str(limit_file))
    return source.option("start", str(start)).load()


def test_a_lost_checkpoint_continues_from_the_lake_without_gap_or_duplicate(
    spark: Any, tmp_path: Path, lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from lakesink.cli import main

    limit = tmp_path / "limit"
    limit.write_text("300")
    first = lakesink.write_stream(
        replayed(spark, limit, 0), lake, checkpoint_location=str(tmp_path / "chk-1"),
        trigger={"availableNow": True}, format_version=3,
    )  # fmt: skip
    first.awaitTermination(300)
    assert first.exception() is None, first.exception()
    capsys.readouterr()
    assert main(["offsets", lake]) == 0
    printed = capsys.readouterr().out.strip()
    assert json.loads(printed) == {"ev": {"0": 300}}  # where a new query starts: the next offset
    shutil.rmtree(tmp_path / "chk-1")  # the checkpoint is lost (or unusable after an upgrade)
    limit.write_text("500")

    def continuing(start: int, checkpoint: str, declared: str) -> Any:
        query = lakesink.write_stream(
            replayed(spark, limit, start), lake, checkpoint_location=str(tmp_path / checkpoint),
            trigger={"availableNow": True}, continue_writer=first.id, continue_offsets=declared,
        )  # fmt: skip
        try:
            query.awaitTermination(300)
        except Exception:  # noqa: BLE001 - refused: the test reads query.exception()
            pass
        return query

    before = sorted(os.listdir(lake))
    # Declared start offsets (continue_offsets) are judged at start(), in one line.
    with pytest.raises(CommitRefusedError, match=r"starts at 250, before 300 \(an overlap"):
        continuing(250, "chk-overlap", '{"ev": {"0": 250}}')
    with pytest.raises(CommitRefusedError, match=r"starts at 350, after 300 \(a gap"):
        continuing(350, "chk-gap", '{"ev": {"0": 350}}')
    # Undeclared, the offsets are known when Spark plans the first batch (this test source records
    # none there): refused then, and the query's wait raises lakesink's error itself (Spark's
    # wrapping stays in query.exception()).
    query = lakesink.write_stream(
        replayed(spark, limit, 250), lake, checkpoint_location=str(tmp_path / "chk-late"),
        trigger={"availableNow": True}, continue_writer=first.id,
    )  # fmt: skip
    late = "^writer .* the continuation names no start offsets"
    with pytest.raises(CommitRefusedError, match=late) as refused:
        query.awaitTermination(300)
    # Spark's wrapping of the worker's Python error: the foreachBatch door's (the default:
    # py4j's "Python Proxy"), or the data source door's.
    wrapping = re.compile("Python Proxy|PYTHON_DATA_SOURCE_ERROR")
    assert refused.value.__cause__ is None and wrapping.search(str(query.exception()))
    shown = "".join(traceback.format_exception(refused.value))
    assert not wrapping.search(shown) and len(shown.splitlines()) < 12, shown
    assert sorted(os.listdir(lake)) == before  # refused before any task wrote a file
    # Started where the lake says: every row once, and the old writer is retired.
    second = continuing(300, "chk-2", printed)
    assert second.exception() is None, second.exception()
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(500))
    writers = {w.id: w for w in Lake(lake).writers()}
    assert writers[first.id].continued_by == second.id and writers[second.id].continues == first.id
    # A writer is continued once: a second continuation of it is refused at start().
    with pytest.raises(CommitRefusedError, match=f"{first.id} was already continued by {second.id}"):
        continuing(300, "chk-twice", printed)
    # The continuing query restarts from its own checkpoint like any other.
    limit.write_text("600")
    again = continuing(300, "chk-2", printed)
    assert again.exception() is None, again.exception()
    assert sorted(read_committed(lake).column("id").to_pylist()) == list(range(600))
