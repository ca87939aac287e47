"""lakesink_reader: read lakesink tables from pyarrow, pandas, DuckDB or polars -- no Spark, no Java.

>>> from lakesink_reader import read_committed
>>> table = read_committed("/data/lake/events", columns=["id"])

It needs only pyarrow (``pip install lakesink``); S3 lakes need the ``s3`` extra and
``to_pandas`` the ``pandas`` extra. It imports no writer module of lakesink.
"""

from lakesink_reader.errors import (
    CorruptFileError,
    FormatVersionError,
    LakeSinkError,
    NotALakeError,
    TableNotFoundError,
)
from lakesink_reader.lake import (
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

__all__ = [
    "CorruptFileError",
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
    "read_all",
    "read_committed",
]
