"""HDFS lakes on a real HDFS (a MiniDFSCluster on 127.0.0.1): lost answers at the wire, both
writer modes from Spark with the checkpoint on HDFS too, the reader without Java, orphans and verify.

The storage contract itself runs over HDFS in tests/test_storage_contract.py.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from hdfsfaults import Action, NameNodeProxy, Rule
from hdfsserver import HdfsServer

from lakesink.commit import FileWriter
from lakesink.errors import StorageError
from lakesink.storage import open_storage
from lakesink.storage.hdfs import HdfsSealed, HdfsStorage

pytestmark = pytest.mark.hdfs

SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.string())])
NAME = "part-00000-epoch-000000000001-00000000cafef00d.parquet"


def batch(start: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(range(start, start + rows), pa.int64()),
            pa.array([f"r{i}" for i in range(start, start + rows)]),
        ],
        schema=SCHEMA,
    )


def sealed_file(storage: HdfsStorage, start: int, rows: int) -> HdfsSealed:
    writer = FileWriter(storage, NAME, SCHEMA)
    writer.write(batch(start, rows))
    sealed = writer.seal()
    assert isinstance(sealed, HdfsSealed)
    return sealed


@pytest.fixture
def proxy(hdfs_server: HdfsServer) -> Iterator[NameNodeProxy]:
    with NameNodeProxy(hdfs_server.port) as p:
        yield p


def via(proxy: NameNodeProxy, hdfs: str) -> HdfsStorage:
    """A storage of the lake ``hdfs`` whose NameNode calls pass through ``proxy``."""
    path = hdfs.split("/", 3)[3]
    return HdfsStorage(f"{proxy.url}/{path}")


def ids(storage: HdfsStorage, name: str = NAME) -> list[int]:
    import pyarrow.parquet as pq

    fs, base = storage.arrow_filesystem()
    return sorted(pq.read_table(f"{base}/{name}", filesystem=fs).column("id").to_pylist())


# Lost answers, injected at the wire --------------------------------------------------------


def test_hdfs_native_reports_a_rename_whose_answer_was_lost_as_a_failure(
    hdfs: str, proxy: NameNodeProxy
) -> None:
    """Why the backend must look after a failed rename: the client's own retry misreports it."""
    storage = via(proxy, hdfs)
    sealed = sealed_file(storage, 0, 10)
    proxy.rules.append(Rule("rename2"))
    with pytest.raises(OSError) as caught:
        storage.client.rename(storage.path_of(sealed.staged), storage.path_of(NAME), False)
    print(f"hdfs-native said: {type(caught.value).__name__}: {caught.value}")
    assert proxy.rules[0].fired == 1
    assert ids(storage) == list(range(10))  # and yet the rename took effect


def test_a_publish_whose_answer_was_lost_is_recognised_as_our_own(hdfs: str, proxy: NameNodeProxy) -> None:
    storage = via(proxy, hdfs)
    sealed = sealed_file(storage, 0, 10)
    proxy.rules.append(Rule("rename2"))
    assert storage.publish(sealed) is True
    assert proxy.rules[0].fired == 1
    assert ids(storage) == list(range(10))
    assert storage.staged("") == []
    assert storage.publish(sealed) is True  # and a retry of the publish itself says the same


def test_a_refused_publish_whose_answer_was_lost_stays_refused(hdfs: str, proxy: NameNodeProxy) -> None:
    storage = via(proxy, hdfs)
    assert storage.publish(sealed_file(storage, 0, 10)) is True
    loser = sealed_file(storage, 100, 10)
    proxy.rules.append(Rule("rename2"))
    assert storage.publish(loser) is False  # another attempt's file stands there
    assert proxy.rules[0].fired == 1
    assert ids(storage) == list(range(10))
    assert [e.name for e in storage.staged("")] == [NAME]  # the loser's data is kept for discard()
    storage.discard(loser)
    assert storage.staged("") == []


def test_a_rename_that_never_reached_the_namenode_is_tried_again(hdfs: str, proxy: NameNodeProxy) -> None:
    storage = via(proxy, hdfs)
    sealed = sealed_file(storage, 0, 10)
    proxy.rules.append(Rule("rename2", Action.RESET, times=2))  # the client's retry is reset too
    assert storage.publish(sealed) is True
    assert proxy.rules[0].fired == 2
    assert ids(storage) == list(range(10)) and storage.staged("") == []


def test_a_create_if_absent_whose_answer_was_lost_is_our_own(hdfs: str, proxy: NameNodeProxy) -> None:
    storage = via(proxy, hdfs)
    proxy.rules.append(Rule("rename2"))
    record = json.dumps({"commit": uuid.uuid4().hex}).encode()
    assert storage.put_if_absent("_lakesink/epochs/1.json", record) is True
    assert proxy.rules[0].fired == 1
    assert storage.read_bytes("_lakesink/epochs/1.json") == record
    assert storage.put_if_absent("_lakesink/epochs/1.json", b"other") is False
    assert storage.staged("_lakesink/epochs") == []


def test_a_staged_create_whose_answer_was_lost_starts_a_new_staged_file(
    hdfs: str, proxy: NameNodeProxy
) -> None:
    storage = via(proxy, hdfs)
    proxy.rules.append(Rule("create"))
    writer = FileWriter(storage, NAME, SCHEMA)
    writer.write(batch(0, 5))
    assert writer.publish() is not None
    assert proxy.rules[0].fired == 1
    assert ids(storage) == list(range(5)) and storage.staged("") == []


# The backend on its own ------------------------------------------------------------------


def test_the_probe_passes_and_leaves_nothing(hdfs: str) -> None:
    storage = open_storage(hdfs)
    storage.check_conditional_writes()
    assert storage.list("_lakesink") == [] and storage.staged("_lakesink") == []


def test_errors_name_the_path_without_java_stack_traces(hdfs: str) -> None:
    storage = open_storage(hdfs)
    with pytest.raises(FileNotFoundError) as caught:
        storage.read_bytes("missing.json")
    assert "missing.json" in str(caught.value) and "\tat org.apache" not in str(caught.value)
    storage.put("file", b"x")
    assert storage.list("file") == []  # a file is not a folder
    assert not open_storage(f"{hdfs}/nothing").root_exists()


def test_an_unreachable_namenode_fails_at_once_when_a_lake_is_opened() -> None:
    from devtools.moto import free_port
    from lakesink_reader import read_committed

    with pytest.raises(StorageError, match=r"cannot reach the HDFS NameNode of hdfs://127\.0\.0\.1:\d+/lake"):
        read_committed(f"hdfs://127.0.0.1:{free_port()}/lake")


def test_urls_and_options_are_checked() -> None:
    assert HdfsStorage("hdfs://nn:8020/a/b/").url == "hdfs://nn:8020/a/b"
    assert HdfsStorage("hdfs:///a/b").url == "hdfs:///a/b"  # fs.defaultFS from HADOOP_CONF_DIR
    with pytest.raises(ValueError, match="unknown HDFS storage_options"):
        open_storage("hdfs://nn:8020/x", {"endpoint_url": "http://x"})
    with pytest.raises(ValueError, match="HADOOP_USER_NAME"):
        open_storage("hdfs://me@nn:8020/x")
    with pytest.raises(ValueError, match=r"no NameNode found for hdfs://nn: give its port"):
        open_storage("hdfs://nn/x").exists("y")  # no port, and no nameservice 'nn' configured


# Both writer modes, from Spark in local mode, the checkpoint on HDFS too --------------------


def parquet_source(spark, folder: Path, batches: int, rows: int):  # type: ignore[no-untyped-def]
    """A replayable stream of ``batches`` local Parquet files of ``rows`` rows each, one per trigger."""
    for i in range(batches):
        spark.range(i * rows, (i + 1) * rows).selectExpr(
            "id", "concat('row-', cast(id as string)) as label"
        ).coalesce(1).write.parquet(str(folder / f"b{i}"))
        for part in (folder / f"b{i}").glob("part-*.parquet"):
            part.rename(folder / f"input-{i}.parquet")
    schema = spark.read.parquet(str(folder)).schema
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(folder)).repartition(2)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["foreach", "epoch"])
def test_both_writer_modes_write_an_hdfs_lake_exactly_once(
    spark, hdfs: str, tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    import lakesink
    from lakesink import LakeForeachWriter
    from lakesink.cli import main
    from lakesink_reader import Lake, SkippedFilesWarning, read_all, read_committed

    lake, checkpoint = f"{hdfs}/lake", f"{hdfs}/chk"
    df = parquet_source(spark, tmp_path / "in", batches=2, rows=1_500)
    if mode == "epoch":
        query = lakesink.write_stream(
            df, lake, checkpoint_location=checkpoint, trigger={"availableNow": True}
        )
    else:
        query = (
            df.writeStream.foreach(LakeForeachWriter(lake, schema=df.schema))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    expected = list(range(3_000))

    assert sorted(read_committed(lake).column("id").to_pylist()) == expected  # no JVM: hdfs-native
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedFilesWarning)
        assert sorted(read_all(lake).column("id").to_pylist()) == expected
    files = Lake(lake).files()
    assert {f.epoch for f in files} == {0, 1} and all(f.state == "committed" for f in files)
    storage = open_storage(checkpoint)
    assert storage.exists("metadata") and storage.list("commits")  # Spark's checkpoint is on HDFS
    assert spark.read.parquet(lake).count() == 3_000  # Spark's own reader sees no staged file

    # A dead task's staged file: read_all reports it, orphans finds and removes it, verify passes.
    dead = FileWriter(open_storage(lake), "part-00000-epoch-000000000007.parquet", SCHEMA)
    dead.write(batch(0, 10))
    dead.seal()
    assert sorted(read_committed(lake).column("id").to_pylist()) == expected
    assert main(["orphans", lake, "--older-than", "0", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in found["findings"]] == ["part-00000-epoch-000000000007.parquet"]
    assert main(["orphans", lake, "--older-than", "0", "--delete", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == ["part-00000-epoch-000000000007.parquet"]
    assert open_storage(lake).staged("") == []
    assert main(["verify", lake]) == 0
    assert sorted(read_all(lake).column("id").to_pylist()) == expected
