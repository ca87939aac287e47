"""The storage contract: what every backend of :class:`lakesink_reader.storage.base.Storage` must do,
as a pytest suite that each backend's tests subclass (as fsspec's ``tests/abstract`` does).

A backend passes when: nothing is visible before publish; nothing staged is left after
success or failure; a published file is never overwritten; of concurrent attempts at one
name exactly one wins; a repeated publish or create-if-absent (a retry after a lost answer)
reports its own success; staged data is listed and dropped the same way everywhere; a read
with a ``limit`` returns the file's head and no more; listings page past 1,000 entries.

A backend's suite is a few lines::

    class TestMyStorage(StorageContract):
        @pytest.fixture
        def storage(self, tmp_path):
            return open_storage("my://...")  # an empty lake root, fresh for each test

and names what its store cannot do, with why, in ``cannot`` (the test of that behaviour is
skipped with that reason): ``{"conditional_supersede": "..."}``. Needs pytest (the ``test``
extra); lakesink itself never imports this module.
"""

from __future__ import annotations

import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.commit import FileWriter, WriteOptions
from lakesink_reader.storage.base import Sealed, Storage

_FIELDS: list[tuple[str, pa.DataType]] = [("id", pa.int64()), ("payload", pa.string())]
SCHEMA = pa.schema(_FIELDS)
NAME = "part-00003-epoch-000000000007-00000000deadbeef.parquet"
#: What a backend may declare it cannot do (keys of ``StorageContract.cannot``).
CAPABILITIES = ("conditional_supersede",)


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.record_batch([ids, pa.array([f"p{i}" for i in range(start, start + rows)])], schema=SCHEMA)


def visible(storage: Storage) -> list[str]:
    """Names a plain reader would pick up: no '.'/'_' prefix, no staged suffix."""
    return sorted(
        f.name for f in storage.list("") if not f.name.startswith((".", "_")) and f.name.endswith(".parquet")
    )


def leftovers(storage: Storage) -> list[str]:
    """Staged data of any kind, as the storage itself lists it (files, uploads and markers)."""
    return sorted(s.name for folder in ("", "_lakesink") for s in storage.staged(folder))


def read_ids(storage: Storage, name: str) -> list[int]:
    fs, base = storage.arrow_filesystem()
    ids = pq.read_table(f"{base.rstrip('/')}/{name}", filesystem=fs).column("id").to_pylist()
    return [int(i) for i in ids if i is not None]


def sealed_file(storage: Storage, start: int, rows: int, name: str = NAME) -> Sealed:
    writer = FileWriter(storage, name, SCHEMA)
    writer.write(batch(start, rows))
    sealed = writer.seal()
    assert sealed is not None
    return sealed


class StorageContract:
    """The contract's tests; a subclass supplies the ``storage`` fixture (see the module)."""

    #: What this backend's store cannot do, each with why (see CAPABILITIES).
    cannot: ClassVar[dict[str, str]] = {}

    @pytest.fixture
    def storage(self) -> Any:
        raise NotImplementedError("a backend's suite defines the `storage` fixture: an empty lake root")

    def skip_unless(self, capability: str) -> None:
        assert capability in CAPABILITIES, capability
        if capability in self.cannot:
            pytest.skip(self.cannot[capability])

    def test_nothing_visible_before_publish(self, storage: Storage) -> None:
        writer = FileWriter(storage, NAME, SCHEMA, WriteOptions(row_group_bytes=4096))
        for i in range(20):
            writer.write(batch(i * 500, 500))
            assert visible(storage) == []
        assert leftovers(storage) == [NAME]  # staged, and listed as such
        published = writer.publish()
        assert published is not None and published.won and published.rows == 10_000
        assert visible(storage) == [NAME]
        assert read_ids(storage, NAME) == list(range(10_000))
        assert leftovers(storage) == []

    def test_discard_leaves_nothing(self, storage: Storage) -> None:
        writer = FileWriter(storage, NAME, SCHEMA, WriteOptions(row_group_bytes=4096))
        writer.write(batch(0, 5_000))
        writer.discard()
        writer.discard()  # idempotent
        assert visible(storage) == [] and leftovers(storage) == []
        sealed = sealed_file(storage, 0, 10)
        storage.discard(sealed)
        storage.discard(sealed)
        assert visible(storage) == [] and leftovers(storage) == []

    def test_a_failing_block_discards_and_its_error_propagates(self, storage: Storage) -> None:
        with (
            pytest.raises(RuntimeError, match="upstream failed"),
            FileWriter(storage, NAME, SCHEMA, WriteOptions(row_group_bytes=1024)) as writer,
        ):
            writer.write(batch(0, 1_000))
            raise RuntimeError("upstream failed")
        assert visible(storage) == [] and leftovers(storage) == []
        with FileWriter(storage, NAME, SCHEMA) as writer:
            writer.write(batch(0, 3))
        assert read_ids(storage, NAME) == [0, 1, 2]

    def test_empty_file_publishes_nothing(self, storage: Storage) -> None:
        writer = FileWriter(storage, NAME, SCHEMA)
        assert writer.seal() is None and writer.publish() is None
        assert visible(storage) == [] and leftovers(storage) == []

    def test_published_file_is_never_overwritten_and_a_loser_keeps_its_staged_data(
        self, storage: Storage
    ) -> None:
        first = sealed_file(storage, 0, 10)
        assert storage.publish(first) is True
        assert storage.publish(first) is True  # again, as a retry after a lost answer would
        assert pickle.loads(pickle.dumps(first)) == first  # sealed tokens travel between processes
        second = sealed_file(storage, 100, 10)
        assert storage.publish(second) is False
        assert read_ids(storage, NAME) == list(range(10))
        assert leftovers(storage) == [NAME]  # the loser's data waits for discard() or supersede()
        storage.discard(second)
        assert leftovers(storage) == []

    def test_supersede_replaces_only_the_version_it_saw(self, storage: Storage) -> None:
        assert storage.version(NAME) is None
        assert storage.publish(sealed_file(storage, 0, 3)) is True
        seen = storage.version(NAME)
        assert seen is not None and storage.version(NAME) == seen
        bigger = sealed_file(storage, 0, 10)
        assert storage.publish(bigger) is False
        assert storage.supersede(bigger, seen) is True
        assert read_ids(storage, NAME) == list(range(10)) and storage.version(NAME) != seen
        assert leftovers(storage) == []

    def test_supersede_of_a_changed_file_fails_and_keeps_the_staged_data(self, storage: Storage) -> None:
        """A compare-and-swap."""
        self.skip_unless("conditional_supersede")
        assert storage.publish(sealed_file(storage, 0, 3)) is True
        stale = storage.version(NAME)
        assert stale is not None
        assert storage.supersede(sealed_file(storage, 0, 5), stale) is True
        late = sealed_file(storage, 0, 4)
        assert storage.supersede(late, stale) is False  # the file is no longer the one it saw
        assert read_ids(storage, NAME) == list(range(5))
        storage.discard(late)
        assert leftovers(storage) == []

    def test_concurrent_attempts_leave_exactly_one_file(self, storage: Storage) -> None:
        attempts = 6
        sealed = [sealed_file(storage, n * 1000, 100) for n in range(attempts)]
        results: list[bool] = []
        barrier = threading.Barrier(attempts)

        def race(s: Sealed) -> None:
            barrier.wait()
            won = storage.publish(s)
            if not won:
                storage.discard(s)
            results.append(won)

        threads = [threading.Thread(target=race, args=(s,)) for s in sealed]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False] * (attempts - 1) + [True]
        assert visible(storage) == [NAME]
        assert read_ids(storage, NAME) in [list(range(n * 1000, n * 1000 + 100)) for n in range(attempts)]
        assert leftovers(storage) == []

    def test_foreign_sealed_tokens_are_refused_naming_both(self, storage: Storage) -> None:
        with pytest.raises(TypeError, match=r"Sealed 'x.parquet'.*another storage backend"):
            storage.publish(Sealed("x.parquet", 1))
        with pytest.raises(TypeError, match="another storage backend"):
            storage.discard(Sealed("x.parquet", 1))

    def test_put_if_absent_creates_once_and_recognises_its_own_retry(self, storage: Storage) -> None:
        name = "_lakesink/epochs/x.json"
        assert storage.put_if_absent(name, b"one") is True
        assert storage.put_if_absent(name, b"one") is True  # a retry whose first answer was lost
        assert storage.put_if_absent(name, b"two") is False
        assert storage.read_bytes(name) == b"one"
        assert [f.name for f in storage.list("_lakesink/epochs")] == [name]
        with pytest.raises(FileNotFoundError):
            storage.read_bytes("_lakesink/epochs/missing.json")
        storage.put("_lakesink/hint.json", b"1")
        storage.put("_lakesink/hint.json", b"2")  # put replaces: only for hints
        assert storage.read_bytes("_lakesink/hint.json") == b"2"
        storage.delete(name)
        storage.delete(name)
        assert not storage.exists(name) and leftovers(storage) == []

    def test_a_limited_read_returns_the_head_of_the_file(self, storage: Storage) -> None:
        name = "_lakesink/log/00000000000000000000.json"
        storage.put(name, b"header\nactions\n")
        assert storage.read_bytes(name, limit=7) == b"header\n"  # the bound, not a byte more
        assert storage.read_bytes(name, limit=1) == b"h"
        assert storage.read_bytes(name, limit=15) == b"header\nactions\n"  # exactly the file
        assert storage.read_bytes(name, limit=64 * 1024) == b"header\nactions\n"  # a shorter file: all
        assert storage.read_bytes(name, first_contact=True, limit=3) == b"hea"
        storage.put("_lakesink/log/empty.json", b"")
        assert storage.read_bytes("_lakesink/log/empty.json", limit=8) == b""
        assert storage.read_bytes("_lakesink/log/empty.json") == b""
        with pytest.raises(FileNotFoundError):
            storage.read_bytes("_lakesink/log/missing.json", limit=8)

    def test_staged_data_of_a_dead_writer_is_listed_with_its_age_and_dropped(self, storage: Storage) -> None:
        started = time.time()
        dead = FileWriter(storage, NAME, SCHEMA, WriteOptions(row_group_bytes=1024))
        dead.write(batch(0, 1_000))  # a row group is in storage; the writer never finishes
        [entry] = storage.staged("")
        assert entry.name == NAME and entry.kind in ("staged_file", "multipart_upload")
        assert entry.started is not None and started - 60 < entry.started < time.time() + 60
        storage.drop_staged(entry)
        storage.drop_staged(entry)  # already gone: fine
        assert leftovers(storage) == [] and visible(storage) == []
        dead.discard()  # the dead writer's own cleanup, had it lived, is harmless now

    def test_root_checks_and_conditional_writes(self, storage: Storage) -> None:
        storage.check_conditional_writes("_lakesink/probe-contract")  # moto and POSIX honour it
        storage.put_if_absent("_lakesink/table.json", b"{}")
        assert storage.root_exists()
        assert leftovers(storage) == [] and [f.name for f in storage.list("_lakesink")] == [
            "_lakesink/table.json"
        ]

    def test_folders_are_listed_one_level_at_a_time(self, storage: Storage) -> None:
        for name in (
            "day=1/label=a/f.parquet",
            "day=1/label=b%2Fc/f.parquet",
            "day=2/label=a/g.parquet",
            "r.parquet",
        ):
            storage.put(name, b"x")
        storage.put("_lakesink/table.json", b"{}")
        assert sorted(storage.folders("")) == ["_lakesink", "day=1", "day=2"]
        assert sorted(storage.folders("day=1")) == ["day=1/label=a", "day=1/label=b%2Fc"]
        assert storage.folders("day=1/label=a") == []  # files only below
        assert storage.folders("nothing-here") == []
        assert [f.name for f in storage.list("day=2/label=a")] == ["day=2/label=a/g.parquet"]

    def test_listing_pages_past_a_thousand_entries(self, storage: Storage) -> None:
        names = [f"part-{p:05d}-epoch-000000000000.parquet" for p in range(1_050)]
        # Many at once: an HDFS close waits ~0.3 s for the NameNode to learn that the DataNode has
        # the block (the client retries completeFile), so 1,050 files one by one would take minutes.
        with ThreadPoolExecutor(48) as pool:
            list(pool.map(lambda n: storage.put(n, b"x"), names))
        storage.put("_lakesink/table.json", b"{}")  # a sub-folder is not listed with the root
        listed = storage.list("")
        assert sorted(f.name for f in listed) == sorted(names)
        assert all(f.size == 1 and f.modified is not None and f.modified > time.time() - 600 for f in listed)
        assert storage.list("nothing-here") == []
