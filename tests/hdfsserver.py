"""A real HDFS (a MiniDFSCluster on 127.0.0.1), one per test session; a fresh folder per test.

The launcher is ``devtools.hdfs`` (its jars come from ``make hdfs-jars``, a prerequisite of
``make test``). Clients -- hdfs-native in the storage backend and the reader, Spark's own
Hadoop client for checkpoints -- speak Hadoop RPC to it, as they would to a real NameNode.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from devtools.hdfs import HdfsServer, start_hdfs, stop_hdfs

__all__ = ["HdfsServer", "hdfs", "hdfs_server"]


@pytest.fixture(scope="session")
def hdfs_server() -> Iterator[HdfsServer]:
    server = start_hdfs()
    try:
        yield server
    finally:
        stop_hdfs(server)


@pytest.fixture
def hdfs(hdfs_server: HdfsServer) -> str:
    """``hdfs://127.0.0.1:PORT/tests/<fresh folder>``: a folder of its own for each test."""
    return f"{hdfs_server.url}/tests/{uuid.uuid4().hex[:12]}"
