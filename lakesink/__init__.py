"""lakesink: an exactly-once Parquet file-lake sink for Spark Structured Streaming.

Importing this package never imports pyspark: the Spark-facing entry points that need it
(``register``, ``write_stream``) import it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakesink.commit import WriteOptions
from lakesink.errors import (
    CommitError,
    CorruptFileError,
    FormatVersionError,
    LakeSinkError,
    ModeMismatchError,
    NotALakeError,
    SchemaMismatchError,
    StorageError,
    TableNotFoundError,
)
from lakesink.foreach import LakeForeachWriter
from lakesink.layout import FORMAT_VERSION

if TYPE_CHECKING:
    from lakesink.spark import register, write_stream

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "CommitError",
    "CorruptFileError",
    "FormatVersionError",
    "LakeForeachWriter",
    "LakeSinkError",
    "ModeMismatchError",
    "NotALakeError",
    "SchemaMismatchError",
    "StorageError",
    "TableNotFoundError",
    "WriteOptions",
    "register",
    "write_stream",
]


def __getattr__(name: str) -> Any:
    if name in ("register", "write_stream"):
        from lakesink import spark

        return getattr(spark, name)
    raise AttributeError(f"module 'lakesink' has no attribute {name!r}")
