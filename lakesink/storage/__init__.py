"""Pick the storage backend for a table URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from lakesink.storage.base import PendingUpload, Sealed, StagedFile, Storage, StoredFile

__all__ = ["PendingUpload", "Sealed", "StagedFile", "Storage", "StoredFile", "open_storage"]

_S3_SCHEMES = ("s3", "s3a")


def open_storage(url: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The backend for ``url``: a local path / ``file://`` URL, or ``s3://bucket/prefix``.

    Raises ValueError naming the URL for schemes lakesink does not write (yet).
    """
    if not isinstance(url, str) or not url:
        raise ValueError(f"lake path must be a non-empty string, got {url!r}")
    scheme = urlparse(url).scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and url[1:2] == ":"):
        from lakesink.storage.local import LocalStorage

        return LocalStorage(urlparse(url).path if scheme == "file" else url)
    if scheme in _S3_SCHEMES:
        from lakesink.storage.s3 import S3Storage

        return S3Storage(url, storage_options or {})
    if scheme in ("hdfs", "viewfs"):
        raise ValueError(
            f"{url!r}: HDFS is not supported yet. The commit protocol needs only a "
            "no-clobber rename (HDFS rename fails if the target exists); see README "
            "'Storage support' for what an HDFS backend must implement."
        )
    raise ValueError(
        f"unsupported lake URL scheme {scheme!r} in {url!r}: use a local path, file://, or s3://"
    )
