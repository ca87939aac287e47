"""The storage contract (lakesink.storage_contract) on local disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakesink.storage_contract import StorageContract
from lakesink_reader.storage import Storage, open_storage


class TestLocalStorage(StorageContract):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return open_storage(str(tmp_path / "lake"))
