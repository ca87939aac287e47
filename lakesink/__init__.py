"""lakesink: an exactly-once Parquet file-lake sink for Spark Structured Streaming.

The layers, each a sub-package (docs/guide/development.md draws the tree):

- the lake contract of docs/FORMAT.md (``lakesink_reader.format``) and the storage backends
  behind one small seam (``lakesink_reader.storage``) are the lakesink-reader distribution's,
  which readers install without this one;
- ``commit``: the commit protocol, without Spark -- how a file is published, an epoch committed;
- ``views``: the derived views (``_delta_log/``, ``_spark_metadata/``) kept after each commit;
- ``maintenance``: compaction, vacuum, the orphan sweep, ``verify``, ``upgrade``;
- ``spark``: Spark's hooks mapped onto ``commit`` (``LakeForeachWriter``, ``format("lakesink")``);
- ``cli``: the ``lakesink`` command.

Importing ``lakesink`` loads none of them: the names below are imported when first used, and
nothing here imports pyspark until a Spark entry point is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lakesink_reader.errors import (
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
    from lakesink.spark.follow import follow_lake
    from lakesink.spark.foreach import LakeForeachWriter
    from lakesink.spark.start import register, write_stream
    from lakesink_reader.names import FORMAT_VERSION

__version__ = "0.2.0"

#: Public names imported on first use, and the module each comes from.
_LAZY = {
    "FORMAT_VERSION": "lakesink_reader.names",
    "WriteOptions": "lakesink.commit.files",
    "LakeForeachWriter": "lakesink.spark.foreach",
    "follow_lake": "lakesink.spark.follow",
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
    "follow_lake",
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
            raise missing_extra("spark", f"lakesink.{name}", "lakesink") from exc
        raise
    return getattr(found, name)
