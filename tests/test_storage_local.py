"""The storage contract (lakesink.storage_contract) on local disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lakesink.storage_contract import StorageContract
from lakesink_reader import CorruptFileError
from lakesink_reader.storage import Storage, open_storage
from lakesink_reader.storage.base import sealed_copy
from lakesink_reader.storage.local import LocalStorage


class TestLocalStorage(StorageContract):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return open_storage(str(tmp_path / "lake"))


def test_descriptors_are_closed_on_every_path(tmp_path: Path) -> None:
    """Every call opens the folders of a name from the root's descriptor (docs/FORMAT.md,
    "Trust"): none may be left open, when the call succeeds or when it refuses a link or misses."""
    storage = LocalStorage(str(tmp_path / "lake"))
    (tmp_path / "outside").mkdir()
    storage.put_if_absent("a/b/kept.json", b"1")
    (tmp_path / "lake" / "a" / "link").symlink_to(tmp_path / "outside")

    def calls(i: int) -> None:
        staged = storage.stage(f"a/b/f{i}.json")
        staged.write(b"x")
        storage.publish(staged.seal())
        version = storage.version(f"a/b/f{i}.json")
        assert version is not None and storage.exists(f"a/b/f{i}.json")
        sealed = sealed_copy(storage, f"a/b/f{i}.json", b"y")
        assert storage.supersede(sealed, version)
        assert storage.read_bytes(f"a/b/f{i}.json") == b"y" and len(storage.list("a/b")) == i + 2
        storage.put(f"a/b/hint{i}", b"z")
        storage.delete(f"a/b/hint{i}")
        for refused in (storage.read_bytes, storage.exists, storage.list, storage.delete, storage.stage):
            with pytest.raises(CorruptFileError, match="symbolic link"):
                refused("a/link/x.json")
        with pytest.raises(FileNotFoundError):
            storage.read_bytes("a/missing/x.json")
        assert storage.list("a/missing") == [] and not storage.exists("a/b/missing")

    calls(0)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(1, 200):
        calls(i)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_fifo_in_a_lake_is_refused_without_waiting(tmp_path: Path) -> None:
    """A FIFO opened for reading waits for a writer: a lake's writer could hang its readers.
    Opened ``O_NONBLOCK``, it is refused as no regular file."""
    storage = LocalStorage(str(tmp_path / "lake"))
    storage.put_if_absent("_lakesink/table.json", b"{}")
    os.mkfifo(tmp_path / "lake" / "_lakesink" / "log")
    with pytest.raises(CorruptFileError, match="not a regular file"):
        storage.read_bytes("_lakesink/log")
