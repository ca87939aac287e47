"""Where bytes go: the storage seam (``base``) and its backends, picked by the table's URL."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlparse

from lakesink.storage.base import Sealed, StagedEntry, StagedFile, Storage, StoredFile

__all__ = ["Sealed", "StagedEntry", "StagedFile", "Storage", "StoredFile", "open_storage"]

_S3_SCHEMES = ("s3", "s3a")


def open_storage(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The backend for ``url``: a local path / ``file://`` URL, or ``s3://bucket/prefix``.

    Raises ValueError naming the URL for schemes lakesink does not write (yet), and
    TypeError/ValueError naming bad storage options (never their values).
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise ValueError(f"lake path must be a non-empty string or path, got {url!r}")
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and url[1:2] == ":"):
        from lakesink.storage.local import LocalStorage
        from lakesink.storage.options import check_local_options

        check_local_options(storage_options, url)
        if scheme != "file":
            return LocalStorage(url)
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URL {url!r} names the host {parsed.netloc!r}: use file:///path")
        return LocalStorage(unquote(parsed.path))
    if scheme in _S3_SCHEMES:
        try:
            from lakesink.storage.s3 import S3Storage
        except ImportError as exc:
            from lakesink.errors import missing_extra

            raise missing_extra("s3", f"the S3 lake {url!r}") from exc
        return S3Storage(url, storage_options)
    if scheme in ("hdfs", "viewfs"):
        raise ValueError(
            f"{url!r}: HDFS is not supported yet. The commit protocol needs only a "
            "no-clobber rename (HDFS rename fails if the target exists); see README "
            "'Storage support' for what an HDFS backend must implement."
        )
    raise ValueError(
        f"unsupported lake URL scheme {scheme!r} in {url!r}: use a local path, file://, or s3://"
    )
