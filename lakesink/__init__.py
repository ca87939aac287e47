"""lakesink: an exactly-once Parquet file-lake sink for Spark Structured Streaming.

The layers, each a sub-package (README "Development" draws the tree):

- ``format``: the lake contract of docs/FORMAT.md -- names, table metadata, the epoch log;
- ``storage``: backends (local disk, S3) behind one small seam;
- ``commit``: the commit protocol, without Spark -- how a file is published, an epoch committed;
- ``maintenance``: the orphan sweep and ``verify``;
- ``spark``: Spark's hooks mapped onto ``commit`` (``LakeForeachWriter``, ``format("lakesink")``);
- ``cli``: the ``lakesink`` command.

Importing ``lakesink`` loads none of them: the names below are imported when first used, so
the reader (``lakesink_reader``) can use ``format`` and ``storage`` without loading any writer
module, and nothing here imports pyspark until a Spark entry point is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lakesink.errors import (
    CommitError,
    CorruptFileError,
    FormatVersionError,
    LakeSinkError,
    ModeMismatchError,
    NotALakeError,
    OtherQueryError,
    SchemaMismatchError,
    StorageError,
    TableNotFoundError,
    WorkerPythonError,
    missing_extra,
)

if TYPE_CHECKING:
    from lakesink.commit.files import WriteOptions
    from lakesink.format.names import FORMAT_VERSION
    from lakesink.spark.foreach import LakeForeachWriter
    from lakesink.spark.start import register, write_stream

__version__ = "0.2.0"

#: Public names imported on first use, and the module each comes from.
_LAZY = {
    "FORMAT_VERSION": "lakesink.format.names",
    "WriteOptions": "lakesink.commit.files",
    "LakeForeachWriter": "lakesink.spark.foreach",
    "register": "lakesink.spark.start",
    "write_stream": "lakesink.spark.start",
}

__all__ = [
    "FORMAT_VERSION",
    "CommitError",
    "CorruptFileError",
    "FormatVersionError",
    "LakeForeachWriter",
    "LakeSinkError",
    "ModeMismatchError",
    "NotALakeError",
    "OtherQueryError",
    "SchemaMismatchError",
    "StorageError",
    "TableNotFoundError",
    "WorkerPythonError",
    "WriteOptions",
    "register",
    "write_stream",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lakesink' has no attribute {name!r}")
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # A reader-only install (no extras) has no pyspark: name the extra, not a bare module.
        if (exc.name or "").split(".")[0] == "pyspark":
            raise missing_extra("spark", f"lakesink.{name}") from exc
        raise
    return getattr(found, name)
