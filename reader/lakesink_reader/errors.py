"""The exceptions lakesink raises beyond the builtins (FileNotFoundError, PermissionError, ...),
and the one rule about errors during cleanup: they never replace the error being handled."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("lakesink")


#: The most characters of an exception's text that :func:`one_line` keeps. A decoder's text can
#: be as long as the input makes it (pydantic's lists every error: 42 MB for a crafted Iceberg
#: metadata file of 200,000 refs), and splitting all of it into words took 400 MiB.
ONE_LINE_CHARS = 1_000


def one_line(exc: BaseException) -> str:
    """``exc``'s text on one line: pyarrow's (and others') may span several, and an error that
    lakesink reports -- a refusal, a reason a file is skipped, the CLI's exit 2 -- is one line;
    its first ``ONE_LINE_CHARS`` characters, then `` ...``."""
    text = str(exc)
    head = " ".join(text[:ONE_LINE_CHARS].split())
    return head if len(text) <= ONE_LINE_CHARS else f"{head} ..."


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


class VersionNotRetainedError(LakeSinkError, ValueError):
    """A read selects versions of a format-3 lake that vacuum no longer retains (its message
    names the retained range). A ValueError too: a selection outside the readable range."""


class CorruptFileError(LakeSinkError):
    """A committed data file (or a metadata file) is missing or cannot be read: the lake is damaged."""


class DataFileError(CorruptFileError):
    """A data file cannot be read within the bounds of ``lakesink_reader.datafiles``; ``name``
    is the file (relative to the lake): one that is no Parquet file, whose footer is too large,
    or the heaviest of a read past its budget (:class:`DecodeBudgetError`)."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


class DecodeBudgetError(DataFileError):
    """A read's data files would decode to more than its budget (``datafiles.EXPANSION`` times
    what they hold, plus ``datafiles.FLOOR``); ``name`` is the file that weighs most."""


class CommitError(LakeSinkError):
    """An epoch or file could not be committed; nothing of it is visible to ``read_committed``."""


class OtherQueryError(CommitError):
    """Another streaming query (another checkpoint) writes the lake: refused, before it writes."""


class WorkerPythonError(LakeSinkError):
    """Spark would start its Python workers with an interpreter that cannot run lakesink."""


class StorageError(LakeSinkError):
    """The storage backend failed in a way no builtin exception describes well."""


class CommitConflictError(CommitError):
    """Nothing was committed: concurrent commits won (too many lost races, or a compaction
    whose input another commit removed). Retrying -- a fresh call, from the lake's new state --
    is safe."""


class CommitStateUnknownError(CommitError):
    """The commit may have landed: the answer to its create stayed unknown. Unlike its parent
    class, this says nothing about visibility. Keep its files and let the replay of the batch
    decide (it finds the commit, or makes it)."""


class CommitRefusedError(CommitError):
    """A rule of the log says no (a stale checkpoint, missing batches, another writer). Nothing
    was committed; retrying without changing something is pointless -- the message says what."""


def quietly(cleanup: Callable[[], Any], what: str) -> None:
    """Run a cleanup step, logging (never raising) its failure: the caller's own outcome wins.

    ``what`` completes "could not ...": e.g. ``"delete the staged file x"``.
    """
    try:
        cleanup()
    except Exception:
        log.warning("could not %s; the orphan sweep will remove what is left", what, exc_info=True)


def missing_extra(extra: str, what: str, distribution: str = "lakesink-reader") -> ImportError:
    """The ImportError for a feature whose optional dependencies are not installed: the extra of
    ``distribution`` that has them (the reader's s3/hdfs/pandas; the writer's spark)."""
    return ImportError(
        f"{what} needs the {extra!r} extra of {distribution}: pip install '{distribution}[{extra}]'"
    )
