"""reader: read lakesink tables from pyarrow, pandas, DuckDB or polars -- no Spark, no Java.

>>> from reader import read_committed
>>> table = read_committed("/data/lake/events", columns=["id"])
"""

from lakesink.errors import (
    CorruptFileError,
    FormatVersionError,
    LakeSinkError,
    NotALakeError,
    TableNotFoundError,
)
from reader.lake import (
    Isolation,
    Lake,
    LakeFile,
    ReadResult,
    SkippedFile,
    SkippedFilesWarning,
    read_all,
    read_committed,
)

__all__ = [
    "CorruptFileError",
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
    "read_all",
    "read_committed",
]
