"""Committing at the next version of a lake's versioned log: the commit point of every writer
and of maintenance (docs/design/format-v3.md, sections 3 and 7).

Version ``v`` is created with ``put_if_absent`` only by a call that has read version ``v-1`` (or
found the log empty and creates 0), so the log is contiguous; commits never change.

A commit call (:meth:`VersionedLogWriter.commit`) checks its commit against the state at the
latest version (``state.check_commit``), then creates it at the next version. Losing that
version to another commit, it reads the commits that won, folds them into its state, checks
again -- a continuation or a retirement may now refuse it, a twin may have committed its batch
-- and tries the next version, with the same token, up to a bound.

The rule that keeps a lost answer from committing a batch twice: **a call never moves on to
version v+1 before it has a definitive answer for v**. A create whose answer is lost is retried
with the same bytes at the same version; ``put_if_absent`` reads an existing object back, so
the retry answers True for our own earlier create and False only for another commit's bytes.
Our bytes for ``v`` can therefore land only at ``v``, once. An answer that stays unknown raises
CommitStateUnknownError; every other exception of a commit call means that it committed nothing.

Beside vacuum (the design's section 7, issue 32): "version v is absent" may mean "vacuumed", and
a create there succeeds. Vacuum deletes the log as a prefix, so a call proves its create was
not in the deleted part by re-reading its *base* (the commit it found present before it read
the commits after it) once the create succeeded; when the base is gone it reads the log again
and finds its commit there, or removes the stray it created and goes on at the latest version.

A commit at a multiple of the checkpoint interval writes the checkpoint after its commit point,
as derived work that never raises, then the caller's ``after_commit`` (the views).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from lakesink.commit.checkpoints import write_checkpoint
from lakesink_reader.errors import (
    CommitConflictError,
    CommitError,
    CommitRefusedError,
    CommitStateUnknownError,
    CorruptFileError,
    NotALakeError,
    StorageError,
    TableNotFoundError,
)
from lakesink_reader.format.v3.checkpoint import Checkpoint, checkpoint_name, due_checkpoint, read_hint
from lakesink_reader.format.v3.commits import Commit, CommitHeader, PendingCommit, encode_commit
from lakesink_reader.format.v3.logfiles import DEFAULT_CHECKPOINT_INTERVAL, commit_name, parallel
from lakesink_reader.format.v3.state import Decision, TableState, check_commit, removed_paths
from lakesink_reader.format.v3.vlog import Base, Snapshot, VersionedLog
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How long a commit call keeps trying.

    ``max_lost_races``: versions it may lose to other commits before CommitConflictError,
    sleeping ``race_backoff`` * 2^n (at most ``race_backoff_max``) between them.
    ``create_attempts``: tries of one create whose answer is lost or failed, at the same
    version with the same bytes, before CommitStateUnknownError; ``create_backoff`` likewise.
    Every sleep is jittered (50-100 %), so that racing writers drift apart.
    """

    max_lost_races: int = 20
    race_backoff: float = 0.01
    race_backoff_max: float = 1.0
    create_attempts: int = 5
    create_backoff: float = 0.05
    create_backoff_max: float = 2.0

    def __post_init__(self) -> None:
        if self.max_lost_races < 0 or self.create_attempts < 1:
            raise ValueError(
                f"max_lost_races must be >= 0 and create_attempts >= 1, got {self.max_lost_races} "
                f"and {self.create_attempts}"
            )


def _delay(base: float, cap: float, attempt: int, rng: random.Random) -> float:
    return min(cap, base * (1 << attempt)) * rng.uniform(0.5, 1.0)


CommitStatus = Literal["committed", "replayed", "lost_race"]


@dataclass(frozen=True)
class CommitResult:
    """What a commit call did.

    ``committed``: this call's commit is ``version``. ``replayed``: its effect was in the log
    before the call (the writer's batch, the op); nothing changed. ``lost_race``: a concurrent
    commit with the same effect (a twin driver of the same query) won during the call.
    ``version``: where the effect is, when the log says (a replay of an older batch: None).
    ``state``: the state at the latest version the call saw, its own commit included -- the
    state a next call can start from (:meth:`VersionedLog.refresh`). ``lost_races``: versions
    this call lost to other commits.
    """

    status: CommitStatus
    version: int | None
    state: TableState
    lost_races: int


#: Called after each commit's commit point with the commit and the state after it.
AfterCommit = Callable[[Commit, TableState], None]


def _may_be_lost_answer(exc: Exception) -> bool:
    """Whether a failed request may have been applied: an I/O or storage failure (a timeout, a
    reset, a 5xx), but not a refusal (denied, missing) nor a bug, which a retry cannot fix."""
    refused = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError)
    return isinstance(exc, OSError | StorageError) and not isinstance(exc, refused)


class VersionedLogWriter(VersionedLog):
    """Read and commit the versioned log of one table.

    Parameters
    ----------
    storage
        The table root.
    table_id
        The ``table_id`` of the table's table.json. A commit of another table id in the log is
        CorruptFileError: the lake was deleted and recreated under this writer.
    retry
        How long a commit call keeps trying (:class:`RetryPolicy`).
    after_commit
        More derived work after each commit point of this object's calls (after the
        checkpoint). Its failures are logged, never raised: the commit stands whatever it does.
    checkpoint_interval
        table.json's ``checkpoint_interval`` N: a commit at a version ``c % N == 0`` (c > 0)
        writes the checkpoint at ``c``, and so does the first commit of this object past a
        ``c`` whose checkpoint is missing. None: no checkpoints are written, nor probed for
        (the hint and the listing still find them).
    sleep, rng
        For the backoff; tests pass their own.
    """

    def __init__(
        self,
        storage: Storage,
        table_id: str,
        *,
        retry: RetryPolicy | None = None,
        after_commit: AfterCommit | None = None,
        checkpoint_interval: int | None = DEFAULT_CHECKPOINT_INTERVAL,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(storage, table_id, checkpoint_interval=checkpoint_interval)
        self.retry = retry or RetryPolicy()
        self.after_commit = after_commit
        self._sleep = sleep
        self._rng = rng or random.Random()

    # Committing --------------------------------------------------------------------------------

    def commit(self, pending: PendingCommit, *, state: TableState | None = None) -> CommitResult:
        """Create ``pending`` at the next version, unless a rule says otherwise.

        ``state``: where to start (a checkpoint's, or the ``state`` of a previous result), else
        the log is opened. Raises CommitRefusedError when a rule refuses the commit,
        CommitConflictError when it lost too many versions in a row or a concurrent commit
        conflicts with it (a compaction's input removed), CommitStateUnknownError when the
        answer to its create stayed unknown: it may be committed. Any other exception: this
        call committed nothing.
        """
        if pending.kind == "upgrade":
            raise ValueError(
                "upgrade commits are not raced for a version: `lakesink upgrade` writes them at versions "
                "derived from the fenced v2 log"
            )
        current, base = self._start(state)
        removed = self._removed_after_base(pending, current)
        seen: list[CommitHeader] = []  # the commits that won versions this call tried
        lost = 0
        first_checked = False
        while True:
            decision: Decision = check_commit(current, pending, removed)
            if decision == "replay":
                return self._skipped(pending, current, seen, lost)
            if lost >= self.retry.max_lost_races:
                raise CommitConflictError(
                    f"{self._log_url()}: the {pending.kind} commit {pending.token} lost {lost} versions in a "
                    f"row to other commits (the last one {current.version}); nothing of it is committed. "
                    "Retry it: fewer writers at once, or a larger RetryPolicy.max_lost_races"
                )
            commit = pending.at(current.version + 1, self.table_id)
            if commit.version == 0 and not first_checked:
                self._check_first_commit_table()
                first_checked = True
            after = self._fold(
                current, [commit.header]
            )  # before the create: a commit that cannot fold is never made
            if self._create(commit):
                if not self._base_stands(base):
                    # Our create may have landed in the part of the log vacuum deleted: is it there?
                    snap = self._in_doubt(commit)
                    stands = self._stands(commit, pending, snap, removed)
                    current, base = self._opened(snap)
                    if stands is None:  # in the deleted part: not committed; a lost race
                        lost += 1
                        seen += snap.headers
                        if pending.kind == "compact":  # CorruptFileError when truncated past its base
                            removed = self._removed_after_base(pending, current)
                        continue
                    if not stands:
                        return self._skipped(pending, current, [*seen, *snap.headers], lost + 1)
                log.info(
                    "committed version %d of %s: %s, %d file(s) added, %d removed",
                    commit.version,
                    self._log_url(),
                    _what(pending),
                    commit.header.counts.add_files,
                    commit.header.counts.remove_files,
                )
                self._after_commit(commit, after)
                return CommitResult("committed", commit.version, after, lost)
            lost += 1
            log.debug(
                "version %d of %s went to another commit (%d lost)", commit.version, self._log_url(), lost
            )
            self._sleep(_delay(self.retry.race_backoff, self.retry.race_backoff_max, lost - 1, self._rng))
            winners = self.read_headers(commit.version)
            if not winners:
                raise CorruptFileError(
                    f"{self._where(commit.version)} was reported to exist, then could not be read"
                )
            if pending.kind == "compact":
                removed.update(removed_paths(self._whole(winners)))
            current = self._fold(current, winners)
            seen += winners

    def _base_stands(self, base: Base) -> bool:
        """After our create of version v succeeded: whether it is a commit of the log (True), or
        may have landed in the part vacuum deleted (False: :meth:`_in_doubt` decides).

        "v was absent" means "never committed" or "committed, then vacuumed". Vacuum deletes
        commits strictly in ascending version order and stops at the first delete that fails
        (``lakesink.maintenance.vacuum``), so whatever it deleted is a prefix of the log: v gone
        implies every version below v gone. The base -- a commit this call found present with
        its token *before* it read the commits after it -- still present with that token now
        therefore proves that nothing above it was deleted before now: v was never committed
        before our create, and the commits we folded between were the log's, not strays. One
        header read per commit. An empty log has no base: a log vacuum truncated has the hint
        (vacuum moves it before it deletes anything, and nothing deletes it).
        """

        try:
            if base is None:
                return read_hint(self.storage) is None
            header = self.read_header(base[0])
        except Exception:
            log.warning("re-reading version %s of %s failed", base, self._log_url(), exc_info=True)
            return False
        return header is not None and header.token == base[1]

    def _in_doubt(self, commit: Commit) -> Snapshot:
        """The log read afresh after a create whose base vanished; CommitStateUnknownError when
        it cannot be read (our commit may stand)."""
        log.info(
            "the base of version %d of %s vanished while it was created (a vacuum ran): reading the "
            "log again to see whether it stands",
            commit.version,
            self._log_url(),
        )
        try:
            return self.snapshot()
        except Exception as exc:
            raise CommitStateUnknownError(
                f"{self._where(commit.version)}: commit {commit.header.token} ({_what(commit.header)}) was "
                "created while a vacuum truncated the log, and the log cannot be read to tell whether it "
                f"stands ({exc!r}). Keep its files: a replay of the batch finds it committed, or commits it"
            ) from exc

    def _stands(
        self, commit: Commit, pending: PendingCommit, snap: Snapshot, removed: dict[str, int]
    ) -> bool | None:
        """Whether our created ``commit`` is the log's, from a snapshot read after the create:
        True (ours: the log reads it at its version, or the state a checkpoint above it holds
        has its effect at its version), False (the effect is there, a twin's), None (it landed
        in the deleted part: a stray, deleted here best-effort; nothing reads a commit below the
        newest checkpoint, and vacuum removes it)."""
        v = commit.version
        for header in snap.headers:
            if header.version == v:
                if header.token == commit.header.token:
                    return True
                break
        try:
            replay = check_commit(snap.state, pending, removed) == "replay"
        except (CommitError, ValueError):  # refused or conflicting now: not there; the loop raises it
            replay = False
        if replay:
            state = snap.state
            if pending.writer is not None:
                w = state.writers.get(pending.writer.id)
                return w is not None and w.last_batch == pending.writer.batch and w.last_version == v
            op = state.ops.get(pending.op.token) if pending.op is not None else None
            return op is not None and op.version == v
        log.warning(
            "version %d of %s was created where vacuum had deleted the log (the log is at %d now): "
            "%s is not committed there; removing it and trying again at the latest version",
            v,
            self._log_url(),
            snap.state.version,
            _what(pending),
        )
        try:
            stray = self.read_header(v)
            if stray is not None and stray.token == commit.header.token:
                self.storage.delete(commit_name(v))
        except Exception:
            log.warning("could not remove the stray %s (vacuum will)", self._where(v), exc_info=True)
        return None

    def _check_first_commit_table(self) -> None:
        """Before the create of version 0: table.json must still name this writer's table.

        Every later version is checked against the log itself (a commit of another table id is
        CorruptFileError, ``_check_identity``), but an empty log proves nothing: a lake deleted
        and recreated since this writer read its table.json has a new ``table_id`` and no
        commit yet, and a version 0 of the old id would make it unreadable to everyone. One
        read, once per lake. (A recreation *during* this call, between the read and the create,
        is outside the fault model: FORMAT.md, fault 12.)
        """
        # Here, not at the top: table.json's module loads pyarrow.
        from lakesink_reader.format.table import read_table_metadata

        try:
            found = read_table_metadata(self.storage).table_id
        except (TableNotFoundError, NotALakeError) as exc:
            raise CommitRefusedError(
                f"{self.storage.url}: the lake's table.json is gone ({exc}); the lake was deleted "
                "since this writer read it. Nothing is committed: restart the writer"
            ) from exc
        if found != self.table_id:
            raise CommitRefusedError(
                f"{self.storage.url}: table.json names table {found}, but this writer read table "
                f"{self.table_id}: the lake was deleted and recreated since. Nothing is committed: "
                "restart the writer (a streaming query with a new checkpoint location, unless its "
                "next batch is its first)"
            )

    def _create(self, commit: Commit) -> bool:
        """Create ``commit`` at its version: True when it is there, False when another commit is.

        Never returns without a definitive answer for this version: a failed or unanswered
        create is retried with the same bytes (``put_if_absent`` reads back an existing
        object), and an answer that stays unknown is CommitStateUnknownError.
        """
        name, data = commit_name(commit.version), encode_commit(commit)
        failures: list[Exception] = []
        for attempt in range(self.retry.create_attempts):
            try:
                return self.storage.put_if_absent(name, data)
            except Exception as exc:
                if not _may_be_lost_answer(exc):
                    if not failures:
                        raise  # refused (or a bug), so not applied: a plain failure of this call
                    raise self._unknown(commit, [*failures, exc]) from exc  # an earlier try may have landed
                failures.append(exc)
                log.warning(
                    "creating version %d of %s failed (%r); it may have been applied: trying the same "
                    "bytes again (%d of %d)",
                    commit.version,
                    self._log_url(),
                    exc,
                    attempt + 1,
                    self.retry.create_attempts,
                )
            if attempt + 1 < self.retry.create_attempts:
                self._sleep(
                    _delay(self.retry.create_backoff, self.retry.create_backoff_max, attempt, self._rng)
                )
        raise self._unknown(commit, failures) from failures[-1]

    def _unknown(self, commit: Commit, failures: Sequence[Exception]) -> CommitStateUnknownError:
        return CommitStateUnknownError(
            f"{self._where(commit.version)}: the create of commit {commit.header.token} "
            f"({_what(commit.header)}) failed {len(failures)} time(s), the last with {failures[-1]!r}; it "
            "may have been applied. Keep its files: a replay of the batch finds it committed, or "
            "commits it"
        )

    def _skipped(
        self, pending: PendingCommit, state: TableState, seen: Sequence[CommitHeader], lost: int
    ) -> CommitResult:
        """The result of a commit whose effect is in the log: replayed, or (when it got there
        during this call, among the commits that won our versions) a lost race."""
        status: CommitStatus = "lost_race" if lost else "replayed"
        version: int | None = None
        if pending.writer is not None:
            ref = pending.writer
            twins = [
                h.version
                for h in seen
                if h.writer is not None and h.writer.id == ref.id and h.writer.batch == ref.batch
            ]
            known = state.writers.get(ref.id)
            if twins:
                version = twins[0]
            elif known is not None and known.last_batch == ref.batch:
                version = known.last_version
        elif pending.op is not None:
            op = state.ops.get(pending.op.token) or state.ops.get(pending.op.abandons or "")
            version = op.version if op is not None else None
        log.info("%s of %s is in the log already (%s): skipped", _what(pending), self._log_url(), status)
        return CommitResult(status, version, state, lost)

    def _removed_after_base(self, pending: PendingCommit, state: TableState) -> dict[str, int]:
        """For a compaction: the paths removed after its base version (its conflicts)."""
        if pending.kind != "compact" or pending.op is None or pending.op.base_version is None:
            return {}
        base = pending.op.base_version
        if base > state.version:
            raise ValueError(
                f"compaction {pending.op.token} is based on version {base}, but the log's latest is "
                f"{state.version}"
            )
        headers = self.read_headers(base + 1, state.version)
        if len(headers) != state.version - base:
            raise CorruptFileError(
                f"{self._log_url()}: versions {base + 1}..{state.version} vanished while read"
            )
        return removed_paths(self._whole(headers))

    def _whole(self, headers: Sequence[CommitHeader]) -> list[Commit]:
        """The whole commits of those ``headers`` that remove files (the others cannot conflict)."""
        wanted = [h.version for h in headers if h.counts.remove_files]
        commits = parallel(self.read_commit, wanted)
        missing = [v for v, c in zip(wanted, commits, strict=True) if c is None]
        if missing:
            raise CorruptFileError(f"{self._where(missing[0])} vanished while the log was read")
        return [c for c in commits if c is not None]

    def _after_commit(self, commit: Commit, state: TableState) -> None:
        """Derived work after a commit point: the checkpoint, then ``after_commit``. Never raises."""
        try:
            self.checkpoint_if_due(commit.version, state)
        except Exception:
            log.warning(
                "writing the checkpoint due after version %d of %s failed; the commit stands, and a "
                "later commit or reader uses an older checkpoint or the commits",
                commit.version,
                self._log_url(),
                exc_info=True,
            )
        if self.after_commit is None:
            return
        try:
            self.after_commit(commit, state)
        except Exception:
            log.warning(
                "derived work after version %d of %s failed; the commit stands",
                commit.version,
                self._log_url(),
                exc_info=True,
            )

    def checkpoint_if_due(self, version: int, state: TableState | None = None) -> Checkpoint | None:
        """After committing ``version``: write the newest checkpoint due at or below it, when it
        is ``version`` itself or a missing older one (probed once per interval per object).
        ``state``: the state at ``version``, checked against the one the checkpoint derives.
        Returns the checkpoint written or found; None when none is due. May raise (its caller,
        the commit, logs it)."""

        if self.checkpoint_interval is None:
            return None
        due = due_checkpoint(version, self.checkpoint_interval)
        if due is None or due <= self._checkpointed:
            return None
        if due != version and self.storage.exists(checkpoint_name(due)):
            self._checkpointed = due
            return None
        written = write_checkpoint(
            self.storage,
            self.table_id,
            due,
            interval=self.checkpoint_interval,
            expected=state if due == version else None,
            read_commit=self.read_commit,
        )
        self._checkpointed = due
        return written


def _what(commit: PendingCommit | CommitHeader) -> str:
    """``append of batch 7 of writer W`` / ``compact op T``, for messages."""
    if commit.writer is not None:
        return f"append of batch {commit.writer.batch} of writer {commit.writer.id}"
    return f"{commit.kind} op {commit.op.token if commit.op else '?'}"
