"""``spark.readStream.format("lakesink").load(path)``: a lake as a streaming source (issue 34).

Lake A is written Spark-free (as a writer commits), streamed into lake B by a real query
(``lakesink.write_stream``, ``availableNow``), and B is compared with ``read_committed(A)``:
every row once, through compaction (its outputs are no new data), restarts from the
checkpoint, limits that split a version, and the refusals that name the way out."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lakes import v3_table
from test_reader_v3 import W1, Writer

import lakesink
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import compact, vacuum
from lakesink_reader import Lake, read_committed

pytestmark = pytest.mark.spark


def ids(lake: str) -> list[int]:
    return sorted(read_committed(lake).column("id").to_pylist())


def lake_a(path: str, batches: int, *, first: int = 0, writer: Writer | None = None) -> Writer:
    """Lake A: ``batches`` appends of 2 files x 10 ids each (ids first.. on)."""
    if writer is None:
        storage, table_id = v3_table(path, checkpoint_interval=3)
        writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=3), W1)
    for batch in range(batches):
        writer.append(first + batch * 100)
    return writer


def follow(
    spark: Any,
    source: str,
    sink: str,
    checkpoint: Path,
    sink_options: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    """Stream lake ``source`` into lake ``sink`` until it has read what ``source`` holds
    (``options``: the stream's; ``sink_options``: write_stream's)."""
    reader = spark.readStream.format("lakesink")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = lakesink.write_stream(
        reader.load(source),
        sink,
        checkpoint_location=str(checkpoint),
        trigger={"availableNow": True},
        **(sink_options or {}),
    )
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return query


def batches_of(sink: str) -> int:
    """The micro-batches the downstream query committed (its writer's batches)."""
    (writer,) = Lake(sink).writers()
    return writer.last_batch + 1


def test_a_lake_streams_into_the_next_one_exactly_once_through_compaction_and_restarts(
    spark: Any, tmp_path: Path
) -> None:
    lakesink.register(spark)
    a, b, chk = str(tmp_path / "a"), str(tmp_path / "b"), tmp_path / "chk"
    writer = lake_a(a, 3)
    follow(spark, a, b, chk)
    assert ids(b) == ids(a) == sorted(i + j for i in (0, 100, 200) for j in range(20))
    # A compaction rewrites A's rows (no new data), then new appends: the restarted query reads
    # the appends only.
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    lake_a(a, 2, first=300, writer=writer)
    follow(spark, a, b, chk)
    assert ids(b) == ids(a) and len(ids(b)) == 100
    # Nothing new: a restart reads nothing and commits no rows.
    follow(spark, a, b, chk)
    assert ids(b) == ids(a) and len(ids(b)) == 100


def test_limits_split_versions_and_a_new_query_starts_from_the_lake_as_it_is(
    spark: Any, tmp_path: Path
) -> None:
    lakesink.register(spark)
    a = str(tmp_path / "a")
    writer = lake_a(a, 2)
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 2
    # Vacuumed below the compaction: a new query reads the lake as it is at its oldest retained
    # version (the compacted file), then each later version's appends.
    assert vacuum(a, retain=0, delete=True, force=True, check_store=False).ok
    lake_a(a, 2, first=500, writer=writer)
    one_file = str(tmp_path / "one-file")
    follow(spark, a, one_file, tmp_path / "chk-1", maxFilesPerTrigger=1)
    assert ids(one_file) == ids(a) and len(ids(a)) == 80
    # One file a micro-batch: the compacted file, then the four files of two appends.
    assert batches_of(one_file) == 5
    # From a version on (the appends of versions 4..), and from the newest on (nothing yet).
    from_version = str(tmp_path / "from-version")
    follow(spark, a, from_version, tmp_path / "chk-2", startingVersion=4)
    assert ids(from_version) == list(range(500, 520)) + list(range(600, 620))
    latest = str(tmp_path / "latest")
    follow(spark, a, latest, tmp_path / "chk-3", startingVersion="latest")
    assert Lake(latest).files() == []
    lake_a(a, 1, first=900, writer=writer)
    follow(spark, a, latest, tmp_path / "chk-3", startingVersion="latest")
    assert ids(latest) == list(range(900, 920))


def test_a_vacuumed_version_and_bad_options_are_refused_naming_the_way_out(
    spark: Any, tmp_path: Path
) -> None:
    lakesink.register(spark)
    a = str(tmp_path / "a")
    lake_a(a, 3)
    # Refused in the user's process, in one line (issue 53, item 3), not in Spark's traceback.
    with pytest.raises(ValueError, match=r"unknown option.*startingversoin.*spark.readStream") as refused:
        follow(spark, a, str(tmp_path / "b"), tmp_path / "chk", startingVersoin=1)
    assert "\n" not in str(refused.value) and "Traceback" not in str(refused.value)
    with pytest.raises(ValueError, match="maxFilesPerTrigger must be a whole number >= 1, got '0'"):
        follow(spark, a, str(tmp_path / "b"), tmp_path / "chk", maxFilesPerTrigger=0)
    with pytest.raises(ValueError, match="versionAsOf must be a version number >= 0") as refused:
        spark.read.format("lakesink").option("versionAsOf", "abc").load(a)
    assert "\n" not in str(refused.value)
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 3
    assert vacuum(a, retain=0, delete=True, force=True, check_store=False).ok
    with pytest.raises(Exception, match=r"needs version 1 .* vacuum removed.*startingVersion"):
        follow(spark, a, str(tmp_path / "b"), tmp_path / "chk-v", startingVersion=1)
    b = str(tmp_path / "b")
    assert not os.path.exists(b) or Lake(b).files() == []  # refused before any row was written


def test_a_stream_behind_a_vacuum_reads_on_exactly_once_or_names_both_ways_back(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 53, item 6, end to end: lake A -> lake B, the downstream stopped while vacuum removed
    the version it needs. Restarted from its checkpoint, it reads on exactly once (the versions'
    files are still live). Behind a compaction too, it stops naming two ways back, and each works
    as the message says: every row of A once into a new lake; or B kept, the vacuumed versions'
    rows skipped and none twice, B's sink taking the new checkpoint with allow_other_queries."""
    lakesink.register(spark)
    a, b, chk = str(tmp_path / "a"), str(tmp_path / "b"), tmp_path / "chk"
    writer = lake_a(a, 3)  # versions 0..2
    follow(spark, a, b, chk)
    lake_a(a, 2, first=300, writer=writer)  # versions 3, 4
    assert vacuum(a, retain=0, delete=True, force=True, check_store=False).ok  # 5: its commit
    assert Lake(a).versions()[0].version == 4  # the stream's next version, 3, is gone
    follow(spark, a, b, chk)
    assert ids(b) == ids(a) and len(ids(a)) == 100

    lake_a(a, 2, first=500, writer=writer)  # versions 6, 7
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 8
    lake_a(a, 1, first=700, writer=writer)  # version 9
    assert vacuum(a, retain=0, delete=True, force=True, check_store=False).ok  # 10
    assert Lake(a).versions()[0].version == 9
    with pytest.raises(Exception, match=r"needs version 6 .*compaction at version 8") as refused:
        follow(spark, a, b, chk)
    assert "startingVersion=9, and on a lakesink sink allow_other_queries=True" in str(refused.value)
    assert ids(b) == sorted(set(ids(b))) and len(ids(b)) == 100  # nothing of it written

    # Every row once: a new checkpoint into a new lake, without startingVersion.
    rebuilt = str(tmp_path / "b-rebuilt")
    follow(spark, a, rebuilt, tmp_path / "chk-rebuilt")
    assert ids(rebuilt) == ids(a) and len(ids(a)) == 160

    # B kept: a new checkpoint from version 9 on. B's sink refuses it as a new query over the
    # same lake, naming the option; with it, B holds each row of A once but versions 6 and 7's.
    with pytest.raises(Exception, match="allow_other_queries=True"):
        follow(spark, a, b, tmp_path / "chk-kept", startingVersion=9)
    # continue_writer checks that the new query starts where the old one ended: it does not.
    (old,) = Lake(b).writers()
    with pytest.raises(Exception, match=f"does not start where writer {old.id} ended"):
        follow(spark, a, b, tmp_path / "chk-continue", {"continue_writer": old.id}, startingVersion=9)
    follow(spark, a, b, tmp_path / "chk-kept", {"allow_other_queries": True}, startingVersion=9)
    skipped = set(range(500, 520)) | set(range(600, 620))
    assert ids(b) == [i for i in ids(a) if i not in skipped] and len(ids(b)) == 120


FOLLOWER = Path(__file__).resolve().parent / "lake_follower.py"


def follower(
    source: str, sink: str, checkpoint: Path, log: Path, *, until_killed: bool
) -> subprocess.Popen[bytes]:
    """The downstream job (tests/lake_follower.py) in its own process group: killed whole."""
    cmd = [sys.executable, str(FOLLOWER), "--source", source, "--sink", sink,
           "--checkpoint", str(checkpoint), "--max-files", str(MAX_FILES)]  # fmt: skip
    if until_killed:
        cmd.append("--until-killed")
    root = FOLLOWER.parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "reader"), str(FOLLOWER.parent)]),
    }
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


#: Files of lake A a downstream micro-batch may read (maxFilesPerTrigger).
MAX_FILES = 3


@pytest.mark.chaos
@pytest.mark.long  # ~2 min (two driver starts): make chaos
@pytest.mark.timeout(600)
def test_the_downstream_killed_while_the_upstream_is_written_compacted_and_vacuumed_reads_every_row_once(
    tmp_path: Path,
) -> None:
    """Lake A -> (a deterministic transform) -> lake B, the downstream driver killed -9 between
    micro-batches or inside one, while A takes appends and compactions; vacuumed before the
    downstream starts (it starts from A's compacted snapshot) and while it runs. B ends with
    every row of A once, and no micro-batch read more than MAX_FILES of A's files."""
    a, b, chk = str(tmp_path / "a"), str(tmp_path / "b"), tmp_path / "chk"
    writer = lake_a(a, 4)
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 4
    time.sleep(1.5)
    assert vacuum(a, retain=1, delete=True, force=True, check_store=False).removed  # versions 0..3's files
    appended = [4]
    stop = threading.Event()
    failures: list[BaseException] = []

    def upstream() -> None:  # appends, a compaction every 4 of them, a vacuum every 8
        try:
            while not stop.is_set():
                lake_a(a, 1, first=appended[0] * 100, writer=writer)
                appended[0] += 1
                if appended[0] % 4 == 0:
                    compact(a, target_file_size=1 << 30, min_files=2, check_store=False)
                if appended[0] % 8 == 0:
                    assert vacuum(a, retain=120, delete=True, force=True, check_store=False).ok
                time.sleep(0.4)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    thread = threading.Thread(target=upstream, name="upstream", daemon=True)
    thread.start()
    log = tmp_path / "follower.log"
    try:
        run = follower(a, b, chk, log, until_killed=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and run.poll() is None:
            if os.path.exists(os.path.join(b, "_lakesink")) and Lake(b).writers() and batches_of(b) >= 3:
                break
            time.sleep(0.5)
        assert run.poll() is None, log.read_text()[-3000:]
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(60)
    finally:
        stop.set()
        thread.join(60)
    assert not failures, failures
    assert batches_of(b) >= 3 and len(ids(b)) < len(ids(a))  # killed with rows still to read
    compact(a, target_file_size=1 << 30, min_files=2, check_store=False)
    finish = follower(a, b, chk, log, until_killed=False)
    assert finish.wait(240) == 0, log.read_text()[-3000:]
    assert ids(b) == ids(a), "lake B does not hold every row of lake A once"
    labels = read_committed(b, columns=["label"]).column("label").to_pylist()
    assert all(label == label.upper() for label in labels)
    # Admission: each downstream micro-batch (one commit of B, which records the source's end
    # offset) read at most MAX_FILES of A's files: count them between consecutive offsets.
    files_of = {v.version: v.add_files if v.kind == "append" else 0 for v in Lake(a).versions()}
    files_of[4] = 1  # the stream's first version, read as a snapshot: the compacted file
    ends = [(4, 0)] + [
        (v.source_offsets[0]["version"], v.source_offsets[0]["index"])
        for v in Lake(b).versions()
        if v.kind == "append"
    ]
    read = [
        sum(files_of.get(v, 0) for v in range(p[0], q[0])) - p[1] + q[1] for p, q in itertools.pairwise(ends)
    ]
    assert sum(read) == sum(files_of.values()) and max(read) <= MAX_FILES, read


def test_a_schema_change_upstream_stops_the_stream_naming_the_columns(spark: Any, tmp_path: Path) -> None:
    """A writer of A adds a column (merge_schema) after the stream took A's schema: the stream
    stops naming the column and the way on, before it reads a row of the new version."""
    import pyarrow as pa
    from lakes import SCHEMA

    from lakesink_reader.format.schemas import encode_schema

    lakesink.register(spark)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    writer = lake_a(a, 1)
    stream = spark.readStream.format("lakesink").option("maxFilesPerTrigger", 5).load(a)  # A's schema now
    writer.options["schema"] = encode_schema(pa.schema([*SCHEMA, pa.field("note", pa.string())]))
    writer.append(100)
    query = lakesink.write_stream(
        stream, b, checkpoint_location=str(tmp_path / "chk"), trigger={"availableNow": True}
    )
    with pytest.raises(Exception, match=r"column\(s\) \['note'\] are new or changed.*merge_schema=True"):
        query.awaitTermination(120)
    assert not os.path.exists(b) or Lake(b).files() == []


def test_the_sources_offsets_without_spark(tmp_path: Path) -> None:
    """The driver's side alone (no query): startingTimestamp, maxBytesPerTrigger splitting a
    version, and availableNow's cap at the version newest when it started."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

    from lakesink.spark.streaming import LakeStreamReader, parse_stream_options

    a = str(tmp_path / "a")
    writer = lake_a(a, 2)
    lake = Lake(a)
    second = lake.versions()[1]
    stamp = dt.datetime.fromtimestamp(second.committed_at, dt.UTC).isoformat()
    reader = LakeStreamReader(parse_stream_options({"path": a, "startingTimestamp": stamp}), lake.schema, ())
    assert reader.initialOffset() == {"version": 1, "index": 0}  # the first version at or after it
    size = max(f.size or 0 for f in lake.files())
    reader = LakeStreamReader(
        parse_stream_options({"path": a, "maxBytesPerTrigger": str(size)}), lake.schema, ()
    )
    start = reader.initialOffset()
    assert start == {"version": 0, "index": 0, "snapshot": True}
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert first == {"version": 0, "index": 1, "snapshot": True}  # one file: the limit splits version 0
    assert [p.names for p in reader.partitions(start, first)] == [
        (lake.at(version=0).since(version=-1).files()[0].name,)
    ]
    reader.prepareForTriggerAvailableNow()
    lake_a(a, 1, first=500, writer=writer)  # committed after availableNow started: not read
    end = reader.latestOffset(first, ReadAllAvailable())
    assert end == {"version": 2, "index": 0}
    names = [n for p in reader.partitions(first, end) for n in p.names]
    assert len(names) == 3 and all("-b000000000002-" not in n for n in names)
    assert reader.latestOffset(end, ReadMaxBytes(size)) == end  # nothing more before the cap


def test_a_stream_behind_a_vacuum_reads_on_from_the_oldest_retained_version_without_spark(
    tmp_path: Path,
) -> None:
    """Issue 53, item 6, the driver's side: positions in versions vacuum removed -- inside a
    version, and inside the stream's first snapshot -- read on from the live files of the oldest
    retained version, the same files in the same order as before the vacuum. Once a compaction
    committed after the position, it is refused naming both ways back."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from lakesink.spark.streaming import LakeStreamReader, parse_stream_options

    a = str(tmp_path / "a")
    writer = lake_a(a, 4)  # versions 0..3, two files each
    before = Lake(a).at(version=3).since(version=-1).files()  # in the stream's order
    snapshot_0 = Lake(a).at(version=0).files()

    def read(start: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        reader = LakeStreamReader(parse_stream_options({"path": a}), Lake(a).schema, ())
        end = reader.latestOffset(start, ReadAllAvailable())
        return end, [n for p in reader.partitions(start, end) for n in p.names]

    assert vacuum(a, retain=0, delete=True, force=True, check_store=False).ok
    assert Lake(a).versions()[0].version == 3  # versions 0..2 are gone (4: the vacuum's commit)
    with pytest.raises(ValueError, match="not all retained"):  # what the stream reads it with, refused
        Lake(a).at(version=3).since(version=0).files()
    # Inside version 1 (its first file read): its second file, then versions 2 and 3.
    end, names = read({"version": 1, "index": 1})
    assert end == {"version": 5, "index": 0}
    assert names == [f.name for f in before[3:]]
    # Inside the first snapshot (the lake at version 0, one of its two files read).
    end, names = read({"version": 0, "index": 1, "snapshot": True})
    assert names == [snapshot_0[1].name] + [f.name for f in before[2:]]

    # A compaction after the position: its output mixes rows read and not read.
    assert compact(a, target_file_size=1 << 30, min_files=2, check_store=False).version == 5
    lake_a(a, 1, first=400, writer=writer)  # version 6
    assert vacuum(a, retain=0, delete=True, force=True, check_store=False).ok
    with pytest.raises(ValueError) as refused:
        read({"version": 2, "index": 0})
    message = str(refused.value)
    assert "needs version 2" in message and "the compaction at version 5" in message, message
    assert "new checkpoint location into a new output lake, without startingVersion" in message
    assert "startingVersion=6, and on a lakesink sink allow_other_queries=True" in message
    assert "skip the rows of versions 2..5" in message and "\n" not in message
    # From the compaction's own version on: it took only files of versions before it.
    end, names = read({"version": 5, "index": 0})
    assert end == {"version": 8, "index": 0} and names == [f.name for f in Lake(a).since(version=5).files()]
