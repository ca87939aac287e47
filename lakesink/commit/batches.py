"""The batch commit of a format-3 lake: the driver turns one writer's batch into a lake version.

A writer is one streaming query (Spark's query id, kept in its checkpoint); a batch is Spark's
batch id of that query. Tasks publish their files under names unique to the attempt, as in
format 2 (``FileWriter``); the driver then commits the batch as one ``append`` of the
versioned log (``lakesink_reader.format.v3.vlog``), whose rules decide (docs/design/format-v3.md,
section 8): the writer's next batch commits; a batch it committed before is a replay, skipped
whole; a new writer at batch > 0 (a lake deleted and recreated under an old checkpoint), a
gap, or a second query without ``allow_other_queries`` is refused before anything is
created. The log entry is the commit point.

What happens to this attempt's published files:

- committed: they are the batch's;
- replayed / lost to a twin (a second driver of the same query): deleted, unless the log lists
  them (it cannot, as their names are this attempt's, but the rule is "never delete a listed
  file");
- refused: deleted, and the refusal raised (CommitRefusedError, a CommitError);
- unknown (the log entry's create was never answered): kept, and CommitStateUnknownError
  raised: the entry may exist, now or later (a request can be applied after its client gave
  up). Nothing may delete them until the batch's replay settles it; the sweep removes the
  loser's files once it is settled. An engine's abort of the batch may run in another process
  than this commit (Spark's does): the writer's run (``lakesink.writer.run``) never hands such
  a batch's files to :meth:`BatchCommitter.abort`, whatever it remembers; this object's own
  ``in_doubt`` set keeps them too, for a caller that aborts on the same object.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from lakesink.commit.observer import Observer, notify
from lakesink.commit.versions import AfterCommit, CommitResult, VersionedLogWriter
from lakesink_reader.errors import CommitRefusedError, CommitStateUnknownError, quietly
from lakesink_reader.format.v3.commits import AddFile, CommitHeader, Continuation, PendingCommit
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.storage import Storage

log = logging.getLogger(__name__)


class BatchCommitter:
    """Commits the batches of one writer (one streaming query) into one format-3 lake.

    Parameters
    ----------
    storage
        The table root.
    table_id
        table.json's ``table_id``: a log of another table is refused (the lake was recreated).
    writer_id
        Spark's query id: stable across restarts from the query's checkpoint.
    run
        A token of this run of the query (recorded with each commit, for ``status``).
    allow_other_queries
        This writer may start on a lake other writers write (its rows are different).
    checkpoint_interval
        The lake's checkpoint interval, ``TableMetadata.log_interval`` (table.json's, else the
        default): required, so that every writer and vacuum checkpoint at the same versions.
    observer
        Told of ``before_record`` and ``after_record`` (the names the epoch mode uses).
    after_commit
        What follows each commit that this writer makes: the derived views it keeps
        (``lakesink.views.derived.derived_views``), composed by the caller -- the committer
        knows nothing of them. None: no views.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        table_id: str,
        writer_id: str,
        run: str,
        checkpoint_interval: int,
        allow_other_queries: bool = False,
        observer: Observer | None = None,
        after_commit: AfterCommit | None = None,
    ) -> None:
        self.storage = storage
        #: batches whose commit through this object had an unknown outcome: its abort keeps them
        self.in_doubt: set[int] = set()
        self.writer_id = writer_id
        self.run = run
        self.allow_other_queries = allow_other_queries
        # table.json's interval: every writer (and vacuum) checkpoints at the same versions.
        self.log = VersionedLogWriter(
            storage,
            table_id,
            checkpoint_interval=checkpoint_interval,
            after_commit=after_commit,
        )
        self.observer = observer

    def commit(
        self,
        batch: int,
        files: Sequence[AddFile],
        *,
        source_offsets: Any = None,
        continues: Continuation | None = None,
        state: TableState | None = None,
        tasks_skipped: bool = False,
        schema: str | None = None,
    ) -> CommitResult:
        """Commit ``batch`` with this attempt's published ``files`` (see the module docstring).

        ``continues``: this writer's first batch takes over from another writer (its start
        offsets are checked against where that one ended). ``state``: the state a previous
        result of this writer left (the cursor): the log validates it and reads only the commits
        after it. ``tasks_skipped``: some task wrote nothing, taking the batch for a replay;
        unless the log holds the batch, it is refused rather than committed without their rows.
        ``schema``: the lake's new schema (encoded) the batch's files bring (``merge_schema``);
        left out when ``state`` shows the lake has it already (a run records it once).
        """
        if schema is not None and state is not None and state.schema_at(state.version) == schema:
            schema = None
        if tasks_skipped:
            state = self.log.refresh(state) if state is not None else self.log.open()
            known = state.writers.get(self.writer_id)
            if known is None or known.last_batch < batch:
                self._drop(files, listed=(), why=f"batch {batch} has tasks that wrote nothing")
                raise CommitRefusedError(
                    f"{self.storage.url}: tasks of batch {batch} of writer {self.writer_id} took it for a "
                    "replay and wrote nothing, but the log does not hold it (the lake was replaced while "
                    "the query ran?); nothing of it is committed. Restart the query"
                )
        pending = PendingCommit.append(
            continues=continues,
            writer_id=self.writer_id,
            batch=batch,
            run=self.run,
            adds=files,
            source_offsets=source_offsets,
            allow_other_queries=self.allow_other_queries,
            schema=schema,
        )
        notify(self.observer, "before_record", batch)
        try:
            result = self.log.commit(pending, state=state)
        except CommitStateUnknownError:
            self.in_doubt.add(batch)  # the entry may exist, or land later: keep every file
            raise
        except CommitRefusedError:
            self._drop(files, listed=(), why=f"batch {batch} was refused")
            raise
        except BaseException:
            # Nothing was committed (vlog's contract): this attempt's files are garbage.
            self._drop(files, listed=(), why=f"the commit of batch {batch} failed")
            raise
        self.in_doubt.discard(batch)  # the log has a definitive answer for it now
        if result.status == "committed":
            notify(self.observer, "after_record", batch)
            log.info(
                "committed batch %d of writer %s as version %d of %s: %d file(s), %d row(s)",
                batch, self.writer_id, result.version, self.storage.url,
                len(files), sum(f.rows for f in files),
            )  # fmt: skip
            return result
        self._drop(files, listed=self._listed(result), why=f"batch {batch} is already committed")
        self._check_replayed_offsets(pending, result)
        log.info("batch %d of writer %s was committed before (%s): skipped whole", batch, self.writer_id,
                 result.status)  # fmt: skip
        return result

    def abort(self, batch: int, files: Iterable[AddFile]) -> None:
        """The batch will not be committed now: delete this attempt's files, unless the log may
        hold them, now or later (a commit of the batch through this object whose outcome stayed
        unknown: its create may still be applied; the replay settles it and the sweep removes
        the loser's files). The caller must know that no commit call in another process was
        handed ``files`` (``lakesink.writer.run.WriterRun.abort`` knows it from the reports)."""
        if batch in self.in_doubt:
            log.warning(
                "abort of batch %d of %s: its commit's outcome is unknown (the log entry may still land), "
                "so nothing is deleted; the replay of the batch settles it",
                batch,
                self.storage.url,
            )
            return
        try:
            state = self.log.open()
        except Exception:
            log.warning("abort of batch %d: cannot read the log, so nothing is deleted", batch, exc_info=True)
            return
        writer = state.writers.get(self.writer_id)
        if writer is not None and writer.last_batch >= batch:
            # Committed after all (a commit whose answer was lost): its files are the log's now.
            log.warning(
                "abort of batch %d of %s: the log holds it, nothing is deleted", batch, self.storage.url
            )
            return
        self._drop(list(files), listed=(), why=f"batch {batch} was aborted")

    def _check_replayed_offsets(self, pending: PendingCommit, result: CommitResult) -> None:
        """A replay must be of the same batch: CommitRefusedError when the log recorded other
        source offsets for it. Spark re-plans a batch from its offset log, so a replay has the
        same offsets -- unless the checkpoint lost its offset and commit logs but kept its
        ``metadata`` (the query id): Spark then starts again at batch 0 over other input, and
        skipping those "replays" would drop rows or take others twice, silently."""
        ref = pending.writer
        if pending.source_offsets is None or ref is None:
            return
        recorded = self._commit_of(ref.batch, result)
        if recorded is None or recorded.source_offsets is None:
            return  # vacuumed away, or recorded without offsets: nothing to compare
        if _canonical(recorded.source_offsets) != _canonical(pending.source_offsets):
            raise CommitRefusedError(
                f"{self.storage.url}: batch {ref.batch} of writer {ref.id} was committed at version "
                f"{recorded.version} with source offsets {_canonical(recorded.source_offsets)}, and this "
                f"run replays it with {_canonical(pending.source_offsets)}: the query's checkpoint lost "
                "its offset log but kept its id, so its batches are not the ones the lake holds. "
                "Nothing of it is committed. Restart from the lake: a new checkpoint, the source "
                "started at `lakesink offsets`, and continue_writer (docs/guide/kafka.md, 'Restart from "
                "the lake')"
            )

    def _commit_of(self, batch: int, result: CommitResult) -> CommitHeader | None:
        """The header of the commit that holds this writer's ``batch`` (a replay's), or None."""
        if result.version is not None:
            return self.log.read_header(result.version)
        known = result.state.writers.get(self.writer_id)
        if known is None:
            return None
        # An older batch than the writer's last: walk back from its last commit (rare: only a
        # checkpoint that went back in time replays one).
        version = known.last_version
        while version >= known.first_version:
            header = self.log.read_header(version)
            if header is None:
                return None
            if header.writer is not None and header.writer.id == self.writer_id:
                if header.writer.batch == batch:
                    return header
                if header.writer.batch < batch:
                    return None
            version -= 1
        return None

    def _listed(self, result: CommitResult) -> set[str]:
        """The files of the commit that holds the batch, when the result names it (else none)."""
        if result.version is None:
            return set()
        commit = self.log.read_commit(result.version)
        return {a.path for a in commit.adds} if commit is not None else set()

    def _drop(self, files: Sequence[AddFile], *, listed: Iterable[str], why: str) -> None:
        drop_files(self.storage, files, why, keep=listed)


def drop_files(storage: Storage, files: Sequence[AddFile], why: str, *, keep: Iterable[str] = ()) -> None:
    """Delete an attempt's published ``files`` that nothing commits (but those in ``keep``),
    each best-effort: one that stays is the sweep's."""
    kept = set(keep)
    for f in files:
        if f.path not in kept:
            quietly(lambda f=f: storage.delete(f.path), f"delete {f.path} ({why})")  # type: ignore[misc]


def _canonical(offsets: Any) -> str:
    return json.dumps(offsets, sort_keys=True, separators=(",", ":"))
