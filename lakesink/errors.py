"""lakesink's exceptions, where writer code has always found them: the same classes as
``lakesink_reader.errors`` (the lake contract's distribution defines them, as readers raise
them too)."""

from lakesink_reader.errors import (
    CommitConflictError,
    CommitError,
    CommitRefusedError,
    CommitStateUnknownError,
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
    quietly,
)

__all__ = [
    "CommitConflictError",
    "CommitError",
    "CommitRefusedError",
    "CommitStateUnknownError",
    "CorruptFileError",
    "FormatVersionError",
    "LakeSinkError",
    "ModeMismatchError",
    "NotALakeError",
    "OtherQueryError",
    "SchemaMismatchError",
    "StorageError",
    "TableNotFoundError",
    "WorkerPythonError",
    "missing_extra",
    "quietly",
]
