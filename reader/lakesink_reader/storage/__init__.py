"""Where bytes go: the storage seam (``base``) and its backends, picked by the table's URL."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlparse

from lakesink_reader.errors import missing_extra
from lakesink_reader.lru import LruMemo
from lakesink_reader.redact import redacted
from lakesink_reader.storage.base import Sealed, StagedEntry, StagedFile, Storage, StoredFile
from lakesink_reader.storage.local import LocalStorage
from lakesink_reader.storage.options import check_local_options, check_storage_options

__all__ = ["Sealed", "StagedEntry", "StagedFile", "Storage", "StoredFile", "open_storage"]

_S3_SCHEMES = ("s3", "s3a")


#: S3 and HDFS storages of this process, so that Spark's reused Python workers build a client
#: once (boto3: about 0.2 CPU-s, mostly parsing botocore's service model; HDFS: a NameNode
#: connection) rather than once per task and per commit. Keyed by everything a client is made
#: of: the URL, the options, the environment (AWS_*, HADOOP_*); only time is saved (a storage
#: holds no fact about its lake); the :data:`MAX_STORAGES` used last are kept.
_CacheKey = tuple[str, str, str, tuple[tuple[str, str], ...]]
MAX_STORAGES = 32
_CACHE: LruMemo[_CacheKey, Storage] = LruMemo(MAX_STORAGES)


def _cached(key: _CacheKey, make: Callable[[], Storage]) -> Storage:
    return _CACHE.get(key, make)


def _s3_storage(url: str, storage_options: Mapping[str, Any] | None) -> Storage:
    try:
        # Here, not at the top: the ``s3`` extra (botocore), and only for an S3 lake.
        from lakesink_reader.storage.s3 import S3Storage
    except ImportError as exc:
        raise missing_extra("s3", f"the S3 lake {redacted(url)!r}") from exc
    options = json.dumps(check_storage_options(storage_options, url), sort_keys=True, default=repr)
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _cached(("s3", url, options, environment), lambda: S3Storage(url, storage_options))


def _hdfs_storage(url: str, storage_options: Mapping[str, Any] | None) -> Storage:
    """One HdfsStorage per URL, options and Hadoop environment in each process (a client and
    its NameNode connection are reused by every task of a Spark worker)."""
    try:
        # Here, not at the top: the ``hdfs`` extra (hdfs-native), and only for an HDFS lake.
        from lakesink_reader.storage.hdfs import HdfsStorage, hdfs_settings
    except ImportError as exc:
        raise missing_extra("hdfs", f"the HDFS lake {redacted(url)!r}") from exc
    options = json.dumps(hdfs_settings(storage_options, url), sort_keys=True)
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("HADOOP_")))
    return _cached(("hdfs", url, options, environment), lambda: HdfsStorage(url, storage_options))


def _local_storage(url: str, storage_options: Mapping[str, Any] | None) -> Storage:
    check_local_options(storage_options, url)
    parsed = urlparse(url)
    if parsed.scheme.lower() != "file":
        return LocalStorage(url)
    if parsed.netloc not in ("", "localhost"):
        host = parsed.netloc.rpartition("@")[2]
        raise ValueError(f"file:// URL {redacted(url)!r} names the host {host!r}: use file:///path")
    return LocalStorage(unquote(parsed.path))


#: The backend of each URL scheme ("": a local path). A new backend is one module implementing
#: ``base.Storage``, one entry here, and a suite subclassing ``storage.contract.StorageContract``.
BACKENDS: dict[str, Callable[[str, Mapping[str, Any] | None], Storage]] = {
    "": _local_storage,
    "file": _local_storage,
    **dict.fromkeys(_S3_SCHEMES, _s3_storage),
    "hdfs": _hdfs_storage,
    "viewfs": _hdfs_storage,
}


def open_storage(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The backend for ``url``: a local path / ``file://`` URL, ``s3://bucket/prefix`` or ``hdfs://nn:port/path``.

    Raises ValueError naming the URL for schemes lakesink does not write (yet), and
    TypeError/ValueError naming bad storage options (never their values).
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise ValueError(f"lake path must be a non-empty string or path, got {url!r}")
    scheme = urlparse(url).scheme.lower()
    if len(scheme) == 1 and url[1:2] == ":":
        scheme = ""  # a Windows drive letter, not a scheme
    backend = BACKENDS.get(scheme)
    if backend is None:
        raise ValueError(
            f"unsupported lake URL scheme {scheme!r} in {redacted(url)!r}: "
            "use a local path, file://, s3:// or hdfs://"
        )
    return backend(url, storage_options)
