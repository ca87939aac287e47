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


def test_files_are_created_with_the_cluster_umask(hdfs: str) -> None:
    """hdfs-native creates files with the mode it is given, unmasked, and folders 0755: lakesink
    gives it 0666 (folders 0777) less the cluster's umask (docs/FORMAT.md, "Trust")."""
    from lakesink_reader.storage.hdfs import HdfsStorage

    for umask, file_mode, folder_mode in (("022", 0o644, 0o755), ("077", 0o600, 0o700)):
        storage = open_storage(f"{hdfs}/lake-{umask}", {"config": {"fs.permissions.umask-mode": umask}})
        assert isinstance(storage, HdfsStorage)
        assert storage.put_if_absent("_lakesink/table.json", b"{}")
        staged = storage.stage("a=1/part.parquet")
        staged.write(b"x")
        assert storage.publish(staged.seal())
        modes = {
            name: storage.client.get_file_info(storage.path_of(name)).permission
            for name in ("_lakesink/table.json", "a=1/part.parquet", "a=1", "_lakesink")
        }
        assert modes == {
            "_lakesink/table.json": file_mode,
            "a=1/part.parquet": file_mode,
            "a=1": folder_mode,
            "_lakesink": folder_mode,
        }, umask
