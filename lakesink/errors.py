"""The exceptions lakesink raises beyond the builtins (FileNotFoundError, PermissionError, ...)."""

from __future__ import annotations


class LakeSinkError(Exception):
    """Root of every lakesink-specific error."""


class NotALakeError(LakeSinkError):
    """The path exists (or may exist) but holds no lakesink table metadata."""


class TableNotFoundError(LakeSinkError, FileNotFoundError):
    """Nothing exists at the table path (or the bucket is missing)."""


class SchemaMismatchError(LakeSinkError):
    """The stream's schema differs from the schema the table was created with."""


class ModeMismatchError(LakeSinkError):
    """A writer of one mode (foreach / epoch) was pointed at a table of the other mode."""


class FormatVersionError(LakeSinkError):
    """The table was written with a lake format version this code does not understand."""


class CorruptFileError(LakeSinkError):
    """A committed data file (or a metadata file) cannot be read: the lake is damaged."""


class CommitError(LakeSinkError):
    """Publishing staged data failed; the staged data was discarded (or is reported)."""


class StorageError(LakeSinkError):
    """The storage backend failed in a way no builtin exception describes well."""
