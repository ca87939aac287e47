"""The store's conditional writes are checked at every writer start, not only when a lake is made.

A lake outlives the endpoint it was created through: here a lake is written through an honest
endpoint, then the same lake is reached through a proxy that drops ``If-None-Match`` (as a
gateway or a store without conditional writes does). Every writer run and every writing
command must then refuse, and leave the lake as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from netfaults import Action, FaultProxy, Rule
from s3server import BUCKET, S3Server

from lakesink import LakeForeachWriter, StorageError
from lakesink.maintenance import sweep
from lakesink_reader import read_committed
from lakesink_reader.format.table import probe_store
from lakesink_reader.storage.local import LocalStorage

pytestmark = [pytest.mark.spark, pytest.mark.s3]

REFUSED = r"does not honour If-None-Match: \* on (PutObject|CompleteMultipartUpload)"


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint_url) as started:
        yield started


def through(proxy: FaultProxy, s3: S3Server) -> dict[str, Any]:
    return {**s3.storage_options, "endpoint_url": proxy.endpoint_url,
            "config_kwargs": {"retries": {"max_attempts": 2}}}  # fmt: skip


def add_input(folder: Path, start: int, rows: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ids = pa.array(range(start, start + rows), pa.int64())
    pq.write_table(pa.table({"id": ids}), folder / f"in-{start:06d}.parquet")


def ids(lake: str, s3: S3Server) -> list[int]:
    return sorted(read_committed(lake, storage_options=s3.storage_options).column("id").to_pylist())


def probe_objects(s3: S3Server, prefix: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/_lakesink/")
    return [o["Key"] for o in listed.get("Contents", []) if "/probe-" in o["Key"]]


def test_an_epoch_lake_reached_through_a_store_that_overwrites_is_refused(
    spark: Any, s3: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    import lakesink

    lake, folder = f"s3://{BUCKET}/epoch", tmp_path / "in"

    def run() -> Any:
        df = spark.readStream.schema("id long").parquet(str(folder))
        query = lakesink.write_stream(
            df, lake, checkpoint_location=str(tmp_path / "chk"), storage_options=through(proxy, s3),
            trigger={"availableNow": True},
        )  # fmt: skip
        try:
            query.awaitTermination(300)
        except Exception:  # noqa: BLE001 - a failed run: the test reads query.exception()
            pass
        return query

    add_input(folder, 0, 100)
    assert run().exception() is None  # created through the honest endpoint (probed at creation)
    # The next run of the same query, through an honest store: checked once more, and nothing
    # of the probe stays behind.
    add_input(folder, 100, 100)
    proxy.clear_log()
    assert run().exception() is None
    assert proxy.requests("CompleteMultipartUpload") >= 1 and probe_objects(s3, "epoch") == []
    assert ids(lake, s3) == list(range(200))
    # Then the endpoint stops honouring If-None-Match.
    rule = proxy.add_rule(Rule(Action.STRIP_IF_NONE_MATCH))
    add_input(folder, 200, 100)
    failed = run()
    assert failed.exception() is not None and "If-None-Match" in str(failed.exception())
    assert rule.fired > 0
    assert ids(lake, s3) == list(range(200))  # nothing of the third run was committed
    proxy.clear_rules()
    assert run().exception() is None  # the store honours it again: the run goes on from there
    assert ids(lake, s3) == list(range(300))


def test_a_foreach_lake_and_orphans_delete_are_refused_through_a_store_that_overwrites(
    spark: Any, s3: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    lake, folder = f"s3://{BUCKET}/foreach", tmp_path / "in"
    add_input(folder, 0, 50)
    df = spark.readStream.schema("id long").parquet(str(folder))
    writer = LakeForeachWriter(lake, schema=df.schema, storage_options=through(proxy, s3))
    query = (df.writeStream.foreach(writer).option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    rule = proxy.add_rule(Rule(Action.STRIP_IF_NONE_MATCH))
    with pytest.raises(StorageError, match=REFUSED + r".*AWS S3, MinIO"):
        LakeForeachWriter(lake, schema=df.schema, storage_options=through(proxy, s3))  # the next run
    with pytest.raises(StorageError, match=REFUSED):
        sweep(lake, older_than=0, delete=True, storage_options=through(proxy, s3))
    assert rule.fired > 0
    dry = sweep(lake, older_than=0, storage_options=through(proxy, s3))  # lists, writes nothing: allowed
    assert dry.ok
    assert ids(lake, s3) == list(range(50)) and probe_objects(s3, "foreach") == []


class ClobberingStorage(LocalStorage):
    """A mount that only emulates link(2): its "no-clobber" publish replaces the target (FUSE, SMB)."""

    def publish(self, sealed: Any) -> bool:
        os.replace(self.path_of(sealed.staged), self.path_of(sealed.name))
        return True


def test_the_local_backend_checks_that_publishing_never_replaces_a_file(tmp_path: Path) -> None:
    probe_store(LocalStorage(str(tmp_path / "honest")))  # POSIX: passes, leaves nothing
    assert os.listdir(tmp_path / "honest" / "_lakesink") == []
    with pytest.raises(StorageError, match=r"replaced an existing file on a no-clobber publish.*POSIX"):
        probe_store(ClobberingStorage(str(tmp_path / "fuse")))
    assert os.listdir(tmp_path / "fuse" / "_lakesink") == []
