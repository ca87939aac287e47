"""The storage contract (lakesink.storage.contract) on local disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.storage import Storage, open_storage
from lakesink.storage.contract import StorageContract


class TestLocalStorage(StorageContract):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return open_storage(str(tmp_path / "lake"))
