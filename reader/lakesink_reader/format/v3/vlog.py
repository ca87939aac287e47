"""The versioned log of a v3 lake on a ``Storage``, read.

Version ``v`` is committed exactly when ``_lakesink/log/<v:020d>.json`` exists; commits never
change (docs/design/format-v3.md, sections 3 and 7). Committing at the next version is the
writer's (``lakesink.commit.versions.VersionedLogWriter``, which extends this class): this
distribution only reads.

Beside vacuum (the design's section 7, issue 32): vacuum deletes the log as a prefix, so a read
proves where it started by re-reading its *base* (the commit it found present before it read
the commits after it) once it has read the headers after it (:meth:`VersionedLog.snapshot`).

Checkpoints (``checkpoint``, the design's section 5): :meth:`VersionedLog.open` starts from the
newest usable checkpoint and folds the commit headers after it. :meth:`VersionedLog.refresh`
takes a state from anywhere -- a checkpoint, or one kept across calls by a commit worker (the
design's cursor) -- checks it against the log and folds it forward.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lakesink_reader import limits
from lakesink_reader.errors import CorruptFileError
from lakesink_reader.format.v3.checkpoint import (
    Checkpoint,
    find_checkpoint,
    newest_listed_checkpoint,
)
from lakesink_reader.format.v3.commits import (
    Commit,
    CommitHeader,
    decode_commit,
    decode_header,
    header_line,
)
from lakesink_reader.format.v3.logfiles import (
    DEFAULT_CHECKPOINT_INTERVAL,
    LOG_DIR,
    READ_BATCH,
    commit_name,
    parallel,
    parse_commit_name,
    read_threads,
)
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)

#: What a header-only read fetches first (S3: one ranged GET); a longer header is read whole.
HEADER_READ_BYTES = 64 * 1024

#: The commit a read found present (version, token) before it read the commits after it: while
#: it stands with that token, vacuum deleted nothing above it (None: an empty log).
Base = tuple[int, str] | None


@dataclass(frozen=True)
class Snapshot:
    """The log read at one version: the checkpoint it started from (None: from the oldest
    commit), the headers of the commits after it, and the state they fold to."""

    checkpoint: Checkpoint | None
    headers: tuple[CommitHeader, ...]
    state: TableState

    @property
    def version(self) -> int:
        return self.state.version


class VersionedLog:
    """Read the versioned log of one table.

    Parameters
    ----------
    storage
        The table root.
    table_id
        The ``table_id`` of the table's table.json. A commit of another table id in the log is
        CorruptFileError: the lake was deleted and recreated under this reader.
    checkpoint_interval
        table.json's ``checkpoint_interval`` N: where checkpoints are looked for first. None:
        the hint and the listing find them.
    """

    def __init__(
        self,
        storage: Storage,
        table_id: str,
        *,
        checkpoint_interval: int | None = DEFAULT_CHECKPOINT_INTERVAL,
    ) -> None:
        if not table_id:
            raise ValueError("a versioned log needs the table id of table.json, got an empty one")
        if checkpoint_interval is not None and checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {checkpoint_interval}")
        self.storage = storage
        self.table_id = table_id
        self.checkpoint_interval = checkpoint_interval
        #: The newest checkpoint this object knows to exist (0: none): one probe per interval.
        self._checkpointed = 0

    # Reading -----------------------------------------------------------------------------------

    def open(self) -> TableState:
        """The state at the latest version: the newest usable checkpoint's, with the commit
        headers after it folded in (every header from the oldest commit without one)."""
        return self.snapshot().state

    def snapshot(self, at_most: int | None = None, *, also: Iterable[int] = ()) -> Snapshot:
        """The log read up to its latest version, or up to ``at_most``: the newest usable
        checkpoint at or below it and the commit headers after it, folded.

        Reads one checkpoint's small part (never its file list) and the headers after it, then
        the commit it started from once more: still there with its token, it proves that vacuum
        deleted nothing above it meanwhile (it deletes the log in ascending order, a prefix), so
        the first missing version is the end of the log, not a hole vacuum cut, and no commit
        folded was a stray created in the deleted part. Not there: the start was a checkpoint
        left below the log's truncation (a hint moved back by a writer's late put, an older
        vacuum that kept the hinted checkpoint) or was deleted while read; the log is read
        again from the newest checkpoint a listing shows.
        ``also``: more checkpoint versions to try (table.json's upgrade version).
        CorruptFileError when neither a checkpoint nor the commits from version 0 are there.
        """
        also = tuple(also)
        snap = self._snapshot(at_most, also)
        if self._base_present(snap):
            return snap
        log.warning(
            "%s: the log read from version %d was truncated under it (or that checkpoint is a leftover "
            "below the truncation): reading it again from the newest listed checkpoint",
            self._log_url(),
            snap.checkpoint.version if snap.checkpoint is not None else 0,
        )
        snap = self._snapshot(at_most, also, newest_listed=True)
        if self._base_present(snap):
            return snap
        raise CorruptFileError(
            f"{self._log_url()}: the log was truncated while it was read, twice; try again"
        )

    def _base_present(self, snap: Snapshot) -> bool:
        """Whether the commit ``snap`` started from is still there with its token (an empty log: True)."""
        if snap.checkpoint is not None:
            version, token = snap.checkpoint.version, snap.checkpoint.state.token
        elif snap.headers:
            version, token = snap.headers[0].version, snap.headers[0].token
        else:
            return True
        header = self.read_header(version)
        return header is not None and header.token == token

    def _snapshot(
        self, at_most: int | None, also: tuple[int, ...], *, newest_listed: bool = False
    ) -> Snapshot:

        if newest_listed:
            found = newest_listed_checkpoint(self.storage, self.table_id, at_most)
            state = TableState.empty(self.table_id) if found is None else found.state
            headers = self.read_headers(state.version + 1, at_most)
            return Snapshot(found, tuple(headers), self._fold(state, headers))
        found = find_checkpoint(
            self.storage, self.table_id, interval=self.checkpoint_interval, at_most=at_most, also=also
        )
        if found is None and self.read_header(0) is None:
            oldest = self._oldest_listed()
            if oldest is not None and oldest > 0:
                found = find_checkpoint(
                    self.storage,
                    self.table_id,
                    interval=self.checkpoint_interval,
                    at_most=at_most,
                    also=also,
                    listing=True,
                )
                if found is None:
                    raise CorruptFileError(
                        f"{self._log_url()} has no version 0 but has versions from {oldest}: its "
                        "oldest commits were removed, and it has no usable checkpoint"
                        + ("" if at_most is None else f" at or below version {at_most}")
                        + " to start from"
                    )
        state = TableState.empty(self.table_id) if found is None else found.state
        if found is not None:
            self._checkpointed = max(self._checkpointed, found.version)
        headers = self.read_headers(state.version + 1, at_most)
        return Snapshot(found, tuple(headers), self._fold(state, headers))

    def refresh(self, state: TableState) -> TableState:
        """``state`` brought to the latest version, once the log proves it still describes it.

        The commit at ``state.version`` is re-read: the same token means the same log, and the
        commits after it are folded in. When that commit is gone the log is read again from
        the start (:meth:`open`), whose table-id checks catch a recreated lake. CorruptFileError
        when that version holds another commit.
        """
        return self._start(state)[0]

    def _start(self, state: TableState | None) -> tuple[TableState, Base]:
        """Where a read (or a commit call) starts: ``state`` refreshed (or the log opened), and
        the base it stands on -- the commit it found present with the expected token *before* it
        read the commits after it (:data:`Base`)."""
        if state is None:
            return self._opened(self.snapshot())
        if state.table_id != self.table_id:
            raise ValueError(f"a state of table {state.table_id} handed to the log of table {self.table_id}")
        if state.version < 0:
            headers = self.read_headers(0)  # version 0 is read first, alone: it can be the base
            return self._fold(state, headers), (0, headers[0].token) if headers else None
        header = self.read_header(state.version)
        if header is None:
            log.info("version %d of %s is gone: reading the log again", state.version, self._log_url())
            return self._opened(self.snapshot())
        if header.token != state.token:
            raise CorruptFileError(
                f"{self._where(state.version)} holds commit {header.token}, not {state.token} that "
                "this writer's state was folded from: the log was replaced (the lake deleted and "
                "recreated?). Restart the writer so that it reads the lake afresh"
            )
        return self._fold(state, self.read_headers(state.version + 1)), (state.version, state.token or "")

    @staticmethod
    def _opened(snap: Snapshot) -> tuple[TableState, Base]:
        """A snapshot's state and base: its checkpoint's commit (the small part was read before
        the headers after it), else version 0 (read first, alone), else none (an empty log)."""
        if snap.checkpoint is not None:
            return snap.state, (snap.checkpoint.version, snap.checkpoint.state.token or "")
        if snap.headers:
            return snap.state, (snap.headers[0].version, snap.headers[0].token)
        return snap.state, None

    def read_header(self, version: int) -> CommitHeader | None:
        """The header of ``version``'s commit, without its actions; None when it does not exist.

        Reads the commit's first :data:`HEADER_READ_BYTES` only, and never parses the action lines.
        """
        name = commit_name(version)
        try:
            data = self.storage.read_bytes(name, limit=HEADER_READ_BYTES)
            if header_line(data) is None and len(data) >= HEADER_READ_BYTES:
                data = limits.read(self.storage, name, limits.COMMIT)  # a header longer than the first read
        except FileNotFoundError:
            return None
        header = decode_header(data, where=self._where(version))
        self._check_identity(header, version)
        return header

    def read_commit(self, version: int) -> Commit | None:
        """The whole commit of ``version``; None when it does not exist."""
        try:
            data = limits.read(self.storage, commit_name(version), limits.COMMIT)
        except FileNotFoundError:
            return None
        commit = decode_commit(data, where=self._where(version))
        self._check_identity(commit.header, version)
        return commit

    def read_headers(self, start: int, stop: int | None = None) -> list[CommitHeader]:
        """Headers of versions ``start, start+1, ...`` up to ``stop`` (inclusive) or to the
        first missing version, read in parallel rounds of 1, 2, 4, ... up to :data:`READ_BATCH`
        versions: a writer's cursor usually finds one new version or none, and should not
        read 16 absent ones to learn it."""
        found: list[CommitHeader] = []
        version = start
        size = 1
        while stop is None or version <= stop:
            end = version + size if stop is None else min(version + size, stop + 1)
            size = min(2 * size, READ_BATCH)
            for header in parallel(self.read_header, range(version, end), read_threads(self.storage)):
                if header is None:
                    return found  # later versions read meanwhile may exist; the log ends here
                found.append(header)
            version = end
        return found

    # Helpers -----------------------------------------------------------------------------------

    def _fold(self, state: TableState, headers: Sequence[CommitHeader]) -> TableState:
        for header in headers:
            try:
                state = state.fold(header)
            except CorruptFileError as exc:
                raise CorruptFileError(f"{self._where(header.version)}: {exc}") from exc
        return state

    def _check_identity(self, header: CommitHeader, version: int) -> None:
        where = self._where(version)
        if header.version != version:
            raise CorruptFileError(f"{where}: the commit says it is version {header.version}")
        if header.table_id != self.table_id:
            raise CorruptFileError(
                f"{where}: the commit belongs to table {header.table_id}, but this writer writes table "
                f"{self.table_id}: the lake was deleted and recreated since the writer read it. Restart "
                "the writer so that it reads the lake afresh"
            )

    def _oldest_listed(self) -> int | None:
        """The oldest version a listing of the log folder shows (None: an empty log). Only for
        a log without version 0: every other read of the log goes by version."""
        names = (f.name.rsplit("/", 1)[-1] for f in self.storage.list(LOG_DIR))
        versions = [v for v in (parse_commit_name(n) for n in names) if v is not None]
        return min(versions) if versions else None

    def _log_url(self) -> str:
        return f"{self.storage.url.rstrip('/')}/{LOG_DIR}"

    def _where(self, version: int) -> str:
        return f"{self.storage.url.rstrip('/')}/{commit_name(version)}"
