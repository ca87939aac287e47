"""The storage contract (lakesink.storage_contract) on HDFS: the session's MiniDFSCluster."""

from __future__ import annotations

import pytest

from lakesink.storage_contract import StorageContract
from lakesink_reader.storage import Storage, open_storage

pytestmark = pytest.mark.hdfs


class TestHdfsStorage(StorageContract):
    @pytest.fixture
    def storage(self, hdfs: str) -> Storage:
        return open_storage(f"{hdfs}/lake")  # the fixture gives each test its own folder
