"""Opening a format-3 epoch-mode lake's versioned log: the checks every command that reads or
commits to the log makes first, in one place.

The writer's maintenance (``lakesink.maintenance.compact.open_v3``) adds the views' hook to
the log it gets here; the views' own sync and check, which only read, use it as it is.
"""

from __future__ import annotations

from lakesink_reader.errors import FormatVersionError
from lakesink_reader.format.table import TableMetadata, read_table_metadata
from lakesink_reader.format.v3.checkpoint import listed_log, read_hint
from lakesink_reader.format.v3.logfiles import parse_commit_name
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.storage.base import Storage


def open_epoch_log(storage: Storage, what: str) -> tuple[TableMetadata, VersionedLog]:
    """The metadata and versioned log (no ``after_commit`` hook) of a format-3 epoch-mode lake;
    FormatVersionError for another format, ValueError for a foreach lake. ``what`` names the
    command, for the errors."""
    metadata = read_table_metadata(storage)  # refuses a folder that is not a lake
    if metadata.format_version < 3:
        raise FormatVersionError(
            f"{what} needs lake format 3: {storage.url} is format {metadata.format_version}, which has no "
            "versioned log to commit to (its epoch log records appends only): convert it with "
            f"`lakesink upgrade {storage.url}` first"
        )
    if metadata.mode != "epoch":
        raise ValueError(
            f"{what} needs an epoch-mode lake: {storage.url} is a {metadata.mode} lake, whose files are "
            "committed by their names, not by a log (docs/design/format-v3.md, section 14)"
        )
    return metadata, VersionedLog(storage, metadata.table_id or "", checkpoint_interval=metadata.log_interval)


def oldest_commit(storage: Storage, vlog: VersionedLog) -> int | None:
    """The oldest commit of the log's contiguous run up to its latest version; None: empty.

    A log never truncated (no hint: vacuum writes it before it deletes anything) starts at 0
    when version 0 is there. Otherwise one listing, and the run is walked down from the newest
    listed commit: commits below a gap are leftovers no version from the run on needs -- an
    entry vacuum's truncation could not delete (an older lakesink went on past a failed delete)
    or a stray a committer created where the log had been deleted (it removes it, best-effort)
    -- and the next vacuum deletes them; they must not wedge it."""
    if read_hint(storage) is None and vlog.read_header(0) is not None:
        return 0
    names = (entry.name.rsplit("/", 1)[-1] for entry in listed_log(storage))
    listed = {v for v in (parse_commit_name(n) for n in names) if v is not None}
    if not listed:
        return None
    oldest = max(listed)
    while oldest - 1 in listed:
        oldest -= 1
    return oldest
