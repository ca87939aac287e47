"""The commit-protocol contract, run over every storage backend (local disk, S3 on moto).

A backend passes when: nothing is visible before publish; nothing staged is left after
success or failure; a published file is never overwritten; of concurrent attempts at one
name exactly one wins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from lakesink.commit import ParquetStage, WriteOptions, publish
from lakesink.storage import Storage, open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
NAME = "part-00003-epoch-000000000007-00000000deadbeef.parquet"


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.record_batch([ids, pa.array([f"p{i}" for i in range(start, start + rows)])], schema=SCHEMA)


def local_storage(tmp_path) -> Iterator[Storage]:  # type: ignore[no-untyped-def]
    yield open_storage(str(tmp_path / "lake"))


def s3_storage(s3) -> Iterator[Storage]:  # type: ignore[no-untyped-def]
    from s3server import BUCKET

    yield open_storage(f"s3://{BUCKET}/lake", s3.storage_options)


BACKENDS: dict[str, Callable[..., Iterator[Storage]]] = {"local": local_storage, "s3": s3_storage}


@pytest.fixture(params=sorted(BACKENDS))
def storage(request, tmp_path) -> Iterator[Storage]:  # type: ignore[no-untyped-def]
    make = BACKENDS[request.param]
    if request.param == "s3":
        request.applymarker(pytest.mark.s3)
        yield from make(request.getfixturevalue("s3"))
    else:
        yield from make(tmp_path)


def visible(storage: Storage) -> list[str]:
    """Names a plain reader would pick up: no '.'/'_' prefix, no staged suffix."""
    return sorted(
        f.name for f in storage.list("") if not f.name.startswith((".", "_")) and f.name.endswith(".parquet")
    )


def leftovers(storage: Storage) -> list[str]:
    staged = [f.name for f in storage.list("") if ".uncommitted" in f.name]
    return staged + [u.name for u in storage.pending_uploads("")]


def read_ids(storage: Storage, name: str) -> list[int]:
    import pyarrow.parquet as pq

    fs, base = storage.arrow_filesystem()
    return pq.read_table(f"{base.rstrip('/')}/{name}", filesystem=fs).column("id").to_pylist()


def test_nothing_visible_before_publish(storage: Storage) -> None:
    stage = ParquetStage(storage, NAME, SCHEMA, WriteOptions(row_group_bytes=4096))
    for i in range(20):
        stage.write(batch(i * 500, 500))
        assert visible(storage) == []
    sealed = stage.seal()
    assert sealed is not None and visible(storage) == [] and not storage.exists(NAME)
    assert publish(storage, sealed) is True
    assert visible(storage) == [NAME]
    assert read_ids(storage, NAME) == list(range(10_000))
    assert leftovers(storage) == []


def test_discard_leaves_nothing(storage: Storage) -> None:
    stage = ParquetStage(storage, NAME, SCHEMA, WriteOptions(row_group_bytes=4096))
    stage.write(batch(0, 5_000))
    stage.discard()
    stage.discard()  # idempotent
    assert visible(storage) == [] and leftovers(storage) == []
    sealed_stage = ParquetStage(storage, NAME, SCHEMA)
    sealed_stage.write(batch(0, 10))
    sealed = sealed_stage.seal()
    assert sealed is not None
    storage.discard(sealed)
    assert visible(storage) == [] and leftovers(storage) == []


def test_empty_stage_publishes_nothing(storage: Storage) -> None:
    stage = ParquetStage(storage, NAME, SCHEMA)
    assert stage.seal() is None
    assert visible(storage) == [] and leftovers(storage) == []


def test_published_file_is_never_overwritten(storage: Storage) -> None:
    first = ParquetStage(storage, NAME, SCHEMA)
    first.write(batch(0, 10))
    sealed = first.seal()
    assert sealed is not None and publish(storage, sealed)
    second = ParquetStage(storage, NAME, SCHEMA)
    second.write(batch(100, 10))
    sealed2 = second.seal()
    assert sealed2 is not None
    assert publish(storage, sealed2) is False
    assert read_ids(storage, NAME) == list(range(10))
    assert leftovers(storage) == []


def test_concurrent_attempts_leave_exactly_one_file(storage: Storage) -> None:
    attempts = 6
    sealed = []
    for n in range(attempts):
        stage = ParquetStage(storage, NAME, SCHEMA)
        stage.write(batch(n * 1000, 100))
        sealed.append(stage.seal())
    results: list[bool] = []
    barrier = threading.Barrier(attempts)

    def race(s) -> None:  # type: ignore[no-untyped-def]
        barrier.wait()
        results.append(publish(storage, s))

    threads = [threading.Thread(target=race, args=(s,)) for s in sealed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * (attempts - 1) + [True]
    assert visible(storage) == [NAME]
    winner = read_ids(storage, NAME)
    assert winner in [list(range(n * 1000, n * 1000 + 100)) for n in range(attempts)]
    assert leftovers(storage) == []


def test_put_if_absent_creates_once(storage: Storage) -> None:
    assert storage.put_if_absent("_lakesink/epochs/x.json", b"one") is True
    assert storage.put_if_absent("_lakesink/epochs/x.json", b"two") is False
    assert storage.read_bytes("_lakesink/epochs/x.json") == b"one"
    assert [f.name for f in storage.list("_lakesink/epochs")] == ["_lakesink/epochs/x.json"]
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("_lakesink/epochs/missing.json")
    storage.delete("_lakesink/epochs/x.json")
    storage.delete("_lakesink/epochs/x.json")
    assert not storage.exists("_lakesink/epochs/x.json")
