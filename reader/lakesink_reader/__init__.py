"""lakesink_reader: read lakesink tables from pyarrow, pandas, DuckDB or polars -- no Spark, no Java.

>>> from lakesink_reader import read_committed
>>> table = read_committed("/data/lake/events", columns=["id"])

It needs only pyarrow (``pip install ./reader``: the lakesink-reader distribution); S3 lakes need
the ``s3`` extra, HDFS lakes the ``hdfs`` extra, ``to_pandas`` the ``pandas`` extra. It imports
no writer module of lakesink. This distribution also holds the lake contract the writers use
(``lakesink_reader.format``, ``lakesink_reader.storage``, ``lakesink_reader.errors``).

The reader's names are imported when first used: a writer process that imports only the lake
contract (Spark's data source lookup, for one) loads no pyarrow through this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lakesink_reader.errors import (
    CorruptFileError,
    DecodeBudgetError,
    FormatVersionError,
    LakeSinkError,
    NotALakeError,
    TableNotFoundError,
    VersionNotRetainedError,
)

if TYPE_CHECKING:
    from lakesink_reader.lake import (
        Changes,
        FileState,
        Isolation,
        Lake,
        LakeFile,
        ReadResult,
        SkippedFile,
        SkippedFilesWarning,
        read_all,
        read_committed,
    )
    from lakesink_reader.v3 import VersionInfo

#: Public names imported on first use, and the module each comes from.
_READER = (
    "Changes",
    "FileState",
    "Isolation",
    "Lake",
    "LakeFile",
    "ReadResult",
    "SkippedFile",
    "SkippedFilesWarning",
    "read_all",
    "read_committed",
)
_LAZY = {**dict.fromkeys(_READER, "lakesink_reader.lake"), "VersionInfo": "lakesink_reader.v3"}

__all__ = [
    "Changes",
    "CorruptFileError",
    "DecodeBudgetError",
    "FileState",
    "FormatVersionError",
    "Isolation",
    "Lake",
    "LakeFile",
    "LakeSinkError",
    "NotALakeError",
    "ReadResult",
    "SkippedFile",
    "SkippedFilesWarning",
    "TableNotFoundError",
    "VersionInfo",
    "VersionNotRetainedError",
    "read_all",
    "read_committed",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lakesink_reader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
