"""The format-2 writer's driver side, frozen: the simulation's model of a driver of an older
lakesink still writing a lake when ``lakesink upgrade`` converts it (the upgrade world), and of
the lakes such a driver left (``format2_table``, ``tests/lakes.py``'s builders).

lakesink's own format-2 writer (``lakesink.commit.epochs.EpochCommitter``) was removed in
session 7 (issue 33, its step 2): writers of today refuse a format-2 lake and name `lakesink
upgrade`. This is that class as it was at commit 87873cc, with its protocol unchanged:

1. replay check: the epoch already has a record -> nothing to do; this attempt's files are
   garbage and are deleted (a recorded epoch written by *another* query is refused);
2. order and ownership: the previous epoch must be recorded, by this query;
3. record: create-if-absent, with a commit id unique to this call (the commit point);
4. checkpoint and sweep: derived work after the commit point, logged, never raised.

``abort`` deletes an uncommitted epoch's published files, never a file the log lists, and
nothing of an epoch whose record's create raised (``in_doubt``: it may still land).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lakesink.commit.observer import Observer, notify
from lakesink.maintenance.sweep import sweep
from lakesink_reader.errors import CommitError, quietly
from lakesink_reader.format.log import (
    DEFAULT_CHECKPOINT_INTERVAL,
    UPGRADE_FENCE_PREFIX,
    CommittedFile,
    EpochLog,
    EpochRecord,
)
from lakesink_reader.format.table import TableMetadata, probe_store
from lakesink_reader.names import TABLE_FILE
from lakesink_reader.storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitOutcome:
    """What :meth:`EpochCommitter.commit` did.

    ``committed``: this call's record is the epoch's. ``replayed``: the epoch was committed
    before (by this query); nothing changed. ``lost_race``: a twin of this commit (the same
    query, e.g. a second driver on the same checkpoint) recorded the epoch first.
    ``record`` is the epoch's record in the log.
    """

    status: Literal["committed", "replayed", "lost_race"]
    record: EpochRecord


class EpochCommitter:
    """Commits epochs of one epoch-mode table, for one streaming query.

    Parameters
    ----------
    storage
        The table root.
    query_id
        Spark's id of the streaming query (stable across restarts from one checkpoint);
        None outside a streaming query, which disables the ownership checks.
    checkpoint_interval
        Epochs between two checkpoint segments of the log.
    observer
        Told of ``before_record`` and ``after_record``.
    in_doubt
        The epochs whose record's create raised (its outcome unknown): ``abort`` keeps their
        files. This object's own set unless the caller hands one that outlives it (the driver
        builds a committer per call, and keeps the set in its run's memo).
    """

    def __init__(
        self,
        storage: Storage,
        *,
        query_id: str | None,
        checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL,
        observer: Observer | None = None,
        in_doubt: set[int] | None = None,
    ) -> None:
        self.storage = storage
        self.in_doubt = in_doubt if in_doubt is not None else set()
        self.query_id = query_id
        self.log = EpochLog(storage, checkpoint_interval=checkpoint_interval)
        self.observer = observer

    def committed(self, epoch: int) -> bool:
        """Whether ``epoch`` is committed already (a task of a replay then writes nothing)."""
        return self.log.has(epoch)

    def commit(
        self,
        epoch: int,
        files: Sequence[CommittedFile],
        *,
        source_offsets: Any = None,
        sweep_older_than: float | None = None,
    ) -> CommitOutcome:
        """Commit ``epoch`` with its published ``files``; see the module docstring for the steps.

        ``sweep_older_than``: after the commit point, run the orphan sweep
        (``lakesink.maintenance.sweep``) with this age -- a writer does so once per run, to
        remove what its crashed predecessors left. Raises CommitError (after deleting
        ``files``) when another query owns the epoch or the lake, or when the previous epoch
        has no record.
        """
        for f in files:
            if f.epoch != epoch:
                raise CommitError(f"file {f.name} of epoch {f.epoch} handed to the commit of epoch {epoch}")
        existing = self.log.record(epoch)
        if existing is not None:
            self._drop(files, keep=existing, why=f"epoch {epoch} is already committed")
            self._refuse_foreign(existing, epoch)
            self._derived_work(epoch, sweep_older_than)
            log.info("epoch %d of %s is already committed: replay skipped whole", epoch, self.storage.url)
            return CommitOutcome("replayed", existing)
        try:
            self._check_order(epoch)
        except CommitError:
            self._drop(files, keep=None, why=f"epoch {epoch} was refused")
            raise

        notify(self.observer, "before_record", epoch)
        ours = EpochRecord.new(epoch, files, source_offsets=source_offsets, query_id=self.query_id)
        try:
            won, record = self.log.append(ours)
        except Exception:
            self.in_doubt.add(epoch)  # the record may exist, or land later: keep every file
            raise
        self.in_doubt.discard(epoch)  # the log has a definitive answer for it now
        if not won:
            # Someone recorded the epoch between our check and our record: theirs is the truth.
            self._drop(files, keep=record, why=f"epoch {epoch} was committed concurrently")
            self._refuse_foreign(record, epoch)
            log.warning(
                "epoch %d of %s was committed concurrently by a twin of this query", epoch, self.storage.url
            )
            self._derived_work(epoch, sweep_older_than)
            return CommitOutcome("lost_race", record)
        notify(self.observer, "after_record", epoch)
        log.info(
            "committed epoch %d of %s: %d file(s), %d row(s)",
            epoch,
            self.storage.url,
            len(record.files),
            sum(f.rows for f in record.files),
        )
        self._derived_work(epoch, sweep_older_than)
        return CommitOutcome("committed", record)

    def abort(self, epoch: int, files: Iterable[CommittedFile]) -> None:
        """Delete the published files of an epoch that will not be committed now.

        A file the log lists is kept, whatever the caller believes: Spark aborts an epoch
        whose commit raised, and a commit can raise after its record landed (a lost answer).
        Nothing is deleted for an epoch ``in_doubt``: its record may land later still.
        """
        if epoch in self.in_doubt:
            log.warning(
                "abort of epoch %d of %s: its record's create was never answered (it may still land), "
                "so nothing is deleted; the replay of the epoch settles it",
                epoch,
                self.storage.url,
            )
            return
        try:
            record = self.log.record(epoch)
        except Exception:
            log.warning(
                "abort of epoch %d: cannot read its record, so nothing is deleted", epoch, exc_info=True
            )
            return
        self._drop(list(files), keep=record, why=f"epoch {epoch} was aborted")

    def _check_order(self, epoch: int) -> None:
        if epoch == 0:
            return
        previous = self.log.record(epoch - 1)
        if previous is None:
            if self.log.latest_epoch() is None:
                return  # an empty log: the lake's first epoch need not be 0
            # Readers find the newest epochs by walking the records after the last checkpoint
            # (docs/FORMAT.md), so the log must not have holes. Spark commits epochs in order:
            # a hole means another query (another checkpoint) is writing to this lake.
            raise CommitError(
                f"epoch {epoch - 1} of {self.storage.url} has no record, so epoch {epoch} cannot be "
                "committed: is another streaming query writing to this lake? Use one checkpoint per lake."
            )
        self._refuse_foreign(previous, epoch)

    def _refuse_foreign(self, record: EpochRecord, epoch: int) -> None:
        if record.query_id and record.query_id.startswith(UPGRADE_FENCE_PREFIX):
            # Whatever this committer's query id, even none: a batch "replayed" onto the fence
            # would have its files dropped as a replay's, and its rows lost.
            raise CommitError(
                f"{self.storage.url} was upgraded to lake format 3 (epoch {record.epoch} is the upgrade's "
                f"fence, {record.query_id}), so epoch {epoch} cannot be committed in format 2. Restart the "
                "query: it then writes the lake in format 3, from its checkpoint."
            )
        if record.query_id and self.query_id and record.query_id != self.query_id:
            raise CommitError(
                f"epoch {record.epoch} of {self.storage.url} was committed by streaming query "
                f"{record.query_id}, but query {self.query_id} is committing epoch {epoch} (a new "
                "checkpoint location, or a second query on this lake?). One lake takes one streaming "
                "query: write to a new lake path, or restart from the original checkpoint."
            )

    def _drop(self, files: Sequence[CommittedFile], *, keep: EpochRecord | None, why: str) -> None:
        listed = {f.name for f in keep.files} if keep is not None else set()
        for f in files:
            if f.name not in listed:
                quietly(lambda f=f: self.storage.delete(f.name), f"delete {f.name} ({why})")  # type: ignore[misc]

    def _derived_work(self, epoch: int, sweep_older_than: float | None) -> None:
        """After the commit point: never raises (see the module docstring)."""
        quietly(lambda: self.log.ensure_checkpoint(epoch), f"write the log checkpoint of epoch {epoch}")
        if sweep_older_than is not None:
            quietly(lambda: self._sweep(sweep_older_than), f"sweep {self.storage.url} after epoch {epoch}")

    def _sweep(self, older_than: float) -> None:
        # The store was checked when this run of the query started (``ensure_table``).
        report = sweep(self.storage, older_than=older_than, delete=True, check_store=False)
        if report.removed:
            log.warning(
                "the sweep of %s removed %d orphan(s) left by earlier runs: %s",
                self.storage.url,
                len(report.removed),
                ", ".join(f"{o.kind} {o.name}" for o in report.removed[:5]),
            )


def format2_table(storage: Storage, schema: Any, mode: Literal["epoch", "foreach"]) -> TableMetadata:
    """Create a format-2 table (its ``table.json``), as the format-2 writer's first task did, and
    return its metadata."""
    metadata = TableMetadata.new(mode, schema, format_version=2)
    probe_store(storage)
    if not storage.put_if_absent(TABLE_FILE, metadata.to_json()):
        raise FileExistsError(f"{storage.url} has a table.json already")
    return metadata
