"""pyiceberg's FileIO for ``hdfs://`` lakes over hdfs-native: the Iceberg view read without libhdfs.

pyiceberg reaches ``hdfs://`` through PyArrow's ``HadoopFileSystem``, which loads libhdfs (the
JNI library of a Hadoop distribution: a JVM in the reader's process). lakesink's HDFS storage
speaks Hadoop RPC with hdfs-native, a Rust client, and hdfs-native ships an fsspec file system;
pyiceberg's ``FsspecFileIO`` takes fsspec file systems by scheme, but names none for ``hdfs``.
This FileIO adds it, one client per NameNode (host and port from each location)::

    from pyiceberg.table import StaticTable
    table = StaticTable.from_metadata(
        "hdfs://namenode:8020/data/lake",
        properties={"py-io-impl": "lakesink.views.iceberg_fileio.HdfsNativeFileIO"},
    )
    table.scan().to_arrow()
    polars.scan_iceberg(table, reader_override="pyiceberg")  # polars' own reader has no hdfs://

It needs lakesink's ``iceberg`` and ``hdfs`` extras (pyiceberg, hdfs-native). Every other
scheme is pyiceberg's own ``FsspecFileIO``.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import ParseResult

from pyiceberg.io.fsspec import FsspecFileIO

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

#: The schemes hdfs-native's fsspec file systems serve.
SCHEMES = ("hdfs", "viewfs")


class HdfsNativeFileIO(FsspecFileIO):  # type: ignore[misc]
    """``FsspecFileIO`` with ``hdfs://`` and ``viewfs://`` served by hdfs-native."""

    def __init__(self, properties: Any) -> None:
        super().__init__(properties)
        self._clients = threading.local()  # FsspecFileIO caches its file systems per thread too

    def _get_fs_from_uri(self, uri: ParseResult, location: str = "") -> AbstractFileSystem:
        if uri.scheme not in SCHEMES:
            return super()._get_fs_from_uri(uri, location)
        if not hasattr(self._clients, "get"):
            self._clients.get = lru_cache(_hdfs_native)
        return self._clients.get(uri.scheme, uri.hostname, uri.port)  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_clients", None)  # thread-local: rebuilt where it is unpickled
        return state  # type: ignore[no-any-return]

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._clients = threading.local()


def _hdfs_native(scheme: str, host: str | None, port: int | None) -> AbstractFileSystem:
    """hdfs-native's file system of one NameNode (or the default one: ``hdfs:///path``)."""
    # Here, not at the top: hdfs-native is the hdfs extra's, and this FileIO serves s3:// and
    # local lakes without it.
    from hdfs_native.fsspec import HdfsFileSystem, ViewfsFileSystem

    kind = HdfsFileSystem if scheme == "hdfs" else ViewfsFileSystem
    return kind(host, port)  # type: ignore[no-any-return]
