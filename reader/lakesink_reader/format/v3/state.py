"""The state of a v3 lake at one version, and the rules a new commit must pass against it.

The state at version ``v`` is the fold of commits ``0..v`` (docs/design/format-v3.md, section
4): which writers there are and how far each got, which maintenance ops committed or were
abandoned, the retention floor, and counts. It folds from commit *headers* alone, so opening a
lake and checking a commit never read file lists; the live files themselves fold from whole
commits into :class:`LiveFiles`, kept apart because they are big.

A commit that breaks a rule of the fold is CorruptFileError naming its version. The rules a
*new* commit must pass -- the table of section 8 for appends, the conflict rule of section 10
for compactions -- are pure functions of the state: "commit", "replay" (this commit's effect is
already in the log), or an exception saying why not (CommitRefusedError: a rule says no;
CommitConflictError: a concurrent commit won, a fresh try may pass). Nothing here touches
storage; ``vlog`` applies all of this to a log.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lakesink_reader import jsondoc
from lakesink_reader.errors import CommitConflictError, CommitRefusedError, CorruptFileError
from lakesink_reader.format.schemas import decode_schema, fit_problems
from lakesink_reader.format.v3.commits import (
    HISTOGRAM_BUCKETS,
    AddFile,
    Commit,
    CommitCounts,
    CommitHeader,
    CommitKind,
    OffsetsCheck,
    PendingCommit,
    WriterRef,
)

#: What a check decides: create the commit, or skip it because its effect is in the log already.
Decision = Literal["commit", "replay"]
OpOutcome = Literal["committed", "abandoned"]

#: Kafka's ``startingOffsets`` sentinels: not offsets, so a continuation cannot be checked by them.
_KAFKA_LATEST, _KAFKA_EARLIEST = -1, -2


@dataclass(frozen=True)
class WriterState:
    """One writer (streaming query) of the lake: its first and last batch, and its lineage.

    ``offsets``: the source offsets of the end of ``last_batch`` (None when unknown).
    ``continues``: the writer this one continues; ``continued_by``/``retired_version``: the
    writer that continued this one, and the version of that continuation -- after which this
    writer may not commit again.
    """

    id: str
    tag: str
    run: str
    first_batch: int
    first_version: int
    last_batch: int
    last_version: int
    committed_at: float
    offsets: Any
    allow_other_queries: bool
    continues: str | None = None
    continued_by: str | None = None
    retired_version: int | None = None

    @property
    def retired(self) -> bool:
        return self.continued_by is not None

    def describe(self) -> str:
        """One line for error messages: id, last batch, version and time."""
        when = datetime.datetime.fromtimestamp(self.committed_at, datetime.UTC).isoformat(timespec="seconds")
        return f"{self.id} (last batch {self.last_batch}, at version {self.last_version}, {when})"


@dataclass(frozen=True)
class OpState:
    """A maintenance op the log knows: committed at ``version``, or abandoned by the commit at
    ``version`` (``kind`` None then: an op that never committed has no known kind)."""

    kind: CommitKind | None
    version: int
    outcome: OpOutcome


@dataclass(frozen=True)
class StateCounts:
    """Live files, rows and bytes, and the live files per size bucket (``commits.size_bucket``)."""

    files: int = 0
    rows: int = 0
    bytes: int = 0
    histogram: tuple[int, ...] = (0,) * HISTOGRAM_BUCKETS

    def plus(self, delta: CommitCounts) -> StateCounts:
        """The counts after a commit with ``delta``; ValueError if any would go negative."""
        histogram = tuple(
            have + added - removed
            for have, added, removed in zip(
                self.histogram, delta.add_histogram, delta.remove_histogram, strict=True
            )
        )
        after = StateCounts(
            self.files + delta.add_files - delta.remove_files,
            self.rows + delta.add_rows - delta.remove_rows,
            self.bytes + delta.add_bytes - delta.remove_bytes,
            histogram,
        )
        if min(after.files, after.rows, after.bytes, *after.histogram) < 0:
            raise ValueError(f"it removes more than is live: counts would become {after}")
        return after


@dataclass(frozen=True)
class TableState:
    """The small state of a table at ``version`` (-1: before the first commit).

    ``token`` is the token of the commit at ``version``: re-reading that commit and finding the
    same token proves that a state kept across calls still describes this log.
    """

    table_id: str
    version: int = -1
    token: str | None = None
    committed_at: float | None = None
    writers: Mapping[str, WriterState] = field(default_factory=dict)
    ops: Mapping[str, OpState] = field(default_factory=dict)
    retained_from: int = 0
    counts: StateCounts = StateCounts()
    #: (version, schema) of each commit that changed the schema, oldest first (encoded as the
    #: commit carries it); before the first, the schema is table.json's.
    schemas: tuple[tuple[int, str], ...] = ()

    def schema_at(self, version: int) -> str | None:
        """The encoded schema the lake had at ``version``; None: table.json's."""
        found = None
        for changed, schema in self.schemas:
            if changed <= version:
                found = schema
        return found

    @classmethod
    def empty(cls, table_id: str) -> TableState:
        """The state of a table whose log has no commit yet."""
        return cls(table_id)

    def fold(self, header: CommitHeader) -> TableState:
        """The state after the commit ``header`` (of version ``self.version + 1``).

        CorruptFileError naming the version when the commit cannot follow this state.
        """
        version = header.version
        if header.table_id != self.table_id:
            raise CorruptFileError(
                f"log version {version} belongs to table {header.table_id}, not to this table "
                f"{self.table_id}: was the lake deleted and recreated while it was read?"
            )
        if version != self.version + 1:
            raise CorruptFileError(
                f"log version {version} cannot follow version {self.version}: the log must be contiguous"
            )
        writers, ops = dict(self.writers), dict(self.ops)
        retained_from = self.retained_from
        try:
            if header.kind == "append":
                _fold_append(writers, header)
            else:
                _fold_op(ops, header)
                if header.op is not None and header.op.retained_from is not None:
                    retained_from = max(retained_from, header.op.retained_from)
            counts = self.counts.plus(header.counts)
        except ValueError as exc:
            raise CorruptFileError(
                f"log version {version} ({header.kind}, token {header.token}): {exc}"
            ) from exc
        schemas = self.schemas + (((version, header.schema),) if header.schema is not None else ())
        return TableState(
            self.table_id,
            version,
            header.token,
            header.committed_at,
            writers,
            ops,
            retained_from,
            counts,
            schemas,
        )

    def writer(self, id_or_tag: str) -> WriterState | None:
        """The writer with this id, or else with this 16-hex tag; None when there is none.

        ValueError naming them when a tag is shared by several writers.
        """
        if id_or_tag in self.writers:
            return self.writers[id_or_tag]
        tagged = [w for w in self.writers.values() if w.tag == id_or_tag]
        if len(tagged) > 1:
            raise ValueError(f"tag {id_or_tag!r} names several writers: {', '.join(w.id for w in tagged)}")
        return tagged[0] if tagged else None


def _fold_append(writers: dict[str, WriterState], header: CommitHeader) -> None:
    ref = header.writer
    assert ref is not None  # an append always has one (commits._check_header_fields)
    version = header.version
    known = writers.get(ref.id)
    if known is not None:
        if known.retired:
            raise ValueError(
                f"writer {ref.id} commits batch {ref.batch} after it was continued by "
                f"{known.continued_by} at version {known.retired_version}"
            )
        if ref.batch <= known.last_batch:
            raise ValueError(
                f"writer {ref.id} commits batch {ref.batch} again (its last batch is {known.last_batch}, "
                f"at version {known.last_version}): a batch commits once"
            )
        if header.continues is not None:
            raise ValueError(f"writer {ref.id} continues another writer after its own first commit")
        writers[ref.id] = replace(
            known,
            run=ref.run,
            last_batch=ref.batch,
            last_version=version,
            committed_at=header.committed_at,
            offsets=header.source_offsets,
        )
        return
    continues = header.continues
    if continues is not None:
        old = writers.get(continues.writer)
        if old is None:
            raise ValueError(f"writer {ref.id} continues {continues.writer}, which this log does not know")
        if old.retired:
            raise ValueError(
                f"writer {ref.id} continues {old.id}, which {old.continued_by} continued already "
                f"at version {old.retired_version}"
            )
        writers[old.id] = replace(old, continued_by=ref.id, retired_version=version)
    writers[ref.id] = WriterState(
        id=ref.id,
        tag=ref.tag,
        run=ref.run,
        first_batch=ref.batch,
        first_version=version,
        last_batch=ref.batch,
        last_version=version,
        committed_at=header.committed_at,
        offsets=header.source_offsets,
        allow_other_queries=bool(header.allow_other_queries),
        continues=continues.writer if continues is not None else None,
    )


def _fold_op(ops: dict[str, OpState], header: CommitHeader) -> None:
    op = header.op
    assert op is not None  # every commit but an append has one (commits._check_header_fields)
    known = ops.get(op.token)
    if known is not None:
        raise ValueError(f"op {op.token} was already {known.outcome} at version {known.version}")
    ops[op.token] = OpState(header.kind, header.version, "committed")
    # An abandon settles an op that never committed. One that did (or was abandoned before)
    # stays as it is: the abandon came from a sweep that read an older state.
    if op.abandons is not None and op.abandons not in ops:
        ops[op.abandons] = OpState(None, header.version, "abandoned")


# Live files -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveFile:
    """A file of the live set: what its add said, and the version that added it.

    ``stats``: the add's stats as their canonical JSON text (``AddFile.stats``, or a checkpoint
    list's ``stats`` column), or None; :attr:`stats_object` decodes them.
    """

    path: str
    rows: int
    size: int
    added_version: int
    writer: str | None
    batch: int | None
    partition: int | None
    stats: str | None = None

    @property
    def stats_object(self) -> Any:
        """The stats decoded (None when there are none); ValueError when the text is not JSON."""
        return None if self.stats is None else jsondoc.loads(self.stats)

    @classmethod
    def added(cls, add: AddFile, version: int, writer: WriterRef | None) -> LiveFile:
        """The live file ``add`` of the commit at ``version`` (by ``writer``; None for an op)."""
        return cls(
            add.path, add.rows, add.size, version, writer.id if writer is not None else None,
            add.batch, add.partition, add.stats,
        )  # fmt: skip


class LiveFiles:
    """The live files at one version, folded from whole commits.

    A mutable accumulator rather than a value like :class:`TableState`: at a million live
    files, copying the set per commit is not an option.
    """

    def __init__(self, files: Iterable[LiveFile] = ()) -> None:
        self._files = {f.path: f for f in files}

    def apply(self, commit: Commit) -> None:
        """Remove and add ``commit``'s files; CorruptFileError (nothing changed) when it adds a
        live path or removes one that is not live."""
        version = commit.version
        for removed in commit.removes:
            if removed.path not in self._files:
                raise CorruptFileError(f"log version {version} removes {removed.path}, which is not live")
        for added in commit.adds:
            if added.path in self._files:
                raise CorruptFileError(
                    f"log version {version} adds {added.path}, which is live since version "
                    f"{self._files[added.path].added_version}"
                )
        writer = commit.header.writer
        for removed in commit.removes:
            del self._files[removed.path]
        for added in commit.adds:
            self._files[added.path] = LiveFile.added(added, version, writer)

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, path: object) -> bool:
        return path in self._files

    def __iter__(self) -> Iterator[LiveFile]:
        """The live files, sorted by path (the order of a checkpoint's file list)."""
        return iter(sorted(self._files.values(), key=lambda f: f.path))

    def get(self, path: str) -> LiveFile | None:
        return self._files.get(path)


# The rules for a new commit ---------------------------------------------------------------------


def check_commit(
    state: TableState, pending: PendingCommit, removed_after_base: Mapping[str, int] | None = None
) -> Decision:
    """Whether ``pending`` may commit at ``state.version + 1``: the rule of its kind.

    ``removed_after_base``: for a compaction, the paths removed by the commits after its base
    version up to ``state.version`` (see :func:`removed_paths`). Upgrades are not checked
    here: they write commits whose bytes are derived from the fenced v2 log (section 13).
    """
    if pending.kind == "append":
        return check_append(state, pending)
    if pending.kind == "compact":
        return check_compaction(state, pending, removed_after_base or {})
    if pending.kind == "abandon":
        return check_abandon(state, pending)
    if pending.kind == "vacuum":
        return check_vacuum(state, pending)
    raise ValueError(f"{pending.kind} commits are not checked against a state; they are derived, not raced")


def check_append(state: TableState, pending: PendingCommit) -> Decision:
    """The rules of section 8 for an append of ``(W, b)``, in the order of its table, and then,
    for a batch that changes the schema, that the lake's schema still fits in its new one
    (another writer may have changed it since this one planned the batch).

    Every batch runs the whole table, batch 0 included: v2 skipped its ownership checks at
    epoch 0, so a second query on a recreated lake recorded its epochs there.
    """
    decision = _check_append_rules(state, pending)
    if decision == "commit" and pending.schema is not None and state.schemas:
        version, latest = state.schemas[-1]
        problems = fit_problems(decode_schema(latest, "the log"), decode_schema(pending.schema, "the commit"))
        if problems:
            raise CommitRefusedError(
                f"batch {pending.writer.batch if pending.writer else '?'} would change the lake's schema, "
                f"which another writer changed at version {version} since this batch was planned: "
                f"{'; '.join(problems)}. Nothing of it is committed; restart the query (it merges "
                "with the lake's schema as it is now)"
            )
    return decision


def _check_append_rules(state: TableState, pending: PendingCommit) -> Decision:
    ref = pending.writer
    if ref is None:
        raise ValueError(f"check_append needs an append, got a {pending.kind} commit")
    batch = ref.batch
    known = state.writers.get(ref.id)
    if known is not None:
        if known.retired:
            raise CommitRefusedError(
                f"writer {known.id} was continued by {known.continued_by} at version "
                f"{known.retired_version}; this checkpoint is stale and may not write batch {batch}. "
                f"Run the query of writer {known.continued_by} instead (its checkpoint), or start a new "
                f"checkpoint with continue_writer={known.continued_by}"
            )
        if batch <= known.last_batch:
            return "replay"
        if batch == known.last_batch + 1:
            return "commit"
        raise CommitRefusedError(
            f"writer {known.id} cannot commit batch {batch}: batches {known.last_batch + 1}..{batch - 1} "
            f"are missing from the lake (its last batch is {known.last_batch}, at version "
            f"{known.last_version}). Was the lake restored from a backup or recreated? Restore the "
            f"missing versions, or start a new checkpoint with continue_writer={known.id}"
        )
    others = [w for w in state.writers.values() if not w.retired]
    if batch > 0:
        raise CommitRefusedError(
            f"writer {ref.id} is new to this lake but commits batch {batch}: the lake has none of its "
            f"batches 0..{batch - 1}. The lake was deleted and recreated under an old checkpoint, or "
            f"the checkpoint belongs to another lake. Start the query with a new checkpoint location "
            f"(it re-reads its input), or continue a writer of this lake with continue_writer="
            + (f"<id> (its writers: {_describe(others)})" if others else "<id> (it has none)")
        )
    clash = [w for w in state.writers.values() if w.tag == ref.tag]
    if clash:
        raise CommitRefusedError(
            f"writer {ref.id} has the tag {ref.tag} of writer {clash[0].id} (the first 16 hex digits of "
            "their ids), which names their data files: start the query with a new checkpoint location"
        )
    if pending.continues is not None:
        _check_continuation(state, pending)
        return "commit"
    if others and not pending.allow_other_queries:
        raise CommitRefusedError(
            f"writer {ref.id} is a new streaming query, and this lake has writers already: "
            f"{_describe(others)}. A new checkpoint re-reads its input from the start, so it is refused "
            "unless you say what it is: allow_other_queries=True if this query writes different rows "
            "beside them, or continue_writer=<id> if it replaces one of them (with its offsets from "
            "`lakesink offsets`)"
        )
    return "commit"


def _describe(writers: Iterable[WriterState]) -> str:
    return "; ".join(w.describe() for w in writers)


def _check_continuation(state: TableState, pending: PendingCommit) -> None:
    continues, ref = pending.continues, pending.writer
    assert continues is not None and ref is not None
    old = state.writers.get(continues.writer)
    if old is None:
        raise CommitRefusedError(
            f"continue_writer={continues.writer!r} is not a writer of this lake "
            + (f"(its writers: {_describe(state.writers.values())})" if state.writers else "(it has none)")
        )
    if old.retired:
        raise CommitRefusedError(
            f"writer {old.id} was already continued by {old.continued_by} at version {old.retired_version}; "
            f"a writer is continued once. Continue {old.continued_by} instead"
        )
    if (old.last_batch, old.last_version) != (continues.after_batch, continues.after_version):
        raise CommitRefusedError(
            f"writer {old.id} committed since writer {ref.id} set out to continue it: its last batch is "
            f"{old.last_batch} at version {old.last_version}, not {continues.after_batch} at version "
            f"{continues.after_version}. Stop the query of {old.id} first, then read its offsets again"
        )
    problems = continuation_problems(old.offsets, continues.offsets)
    if problems:
        raise CommitRefusedError(
            f"writer {ref.id} does not start where writer {old.id} ended (batch {old.last_batch}, version "
            f"{old.last_version}): {'; '.join(problems)}. Start the source at the offsets of "
            f"`lakesink offsets PATH --writer {old.id}`"
        )


def offsets_check_kind(recorded: Any, start: Any) -> OffsetsCheck:
    """How :func:`continuation_problems` compares these offsets: "kafka" when every source's
    offsets on both sides are Kafka-shaped (``{topic: {partition: int}}``), else "equal"."""
    same_shape = isinstance(recorded, list) and isinstance(start, list) and len(recorded) == len(start) > 0
    if same_shape and all(
        _kafka_shaped(r) and _kafka_shaped(s) for r, s in zip(recorded, start, strict=True)
    ):
        return "kafka"
    return "equal"


def continuation_problems(recorded: Any, start: Any) -> list[str]:
    """Why ``start`` (a new writer's start offsets, one entry per source) does not continue
    ``recorded`` (the end offsets of the continued writer's last batch); empty when it does.

    Kafka-shaped offsets are compared per topic-partition: each of ``recorded`` must start
    exactly where it ended (earlier: rows twice; later or absent: rows lost); a partition
    ``recorded`` lacks must start at -2 (earliest). Other offsets must be equal as JSON.
    """
    if recorded is None:
        return ["the continued writer recorded no source offsets, so no start can be checked against them"]
    if start is None:
        return ["the continuation names no start offsets"]
    if not isinstance(recorded, list) or not isinstance(start, list):
        return [f"offsets must be lists, one entry per source; got {_text(recorded)} and {_text(start)}"]
    if len(recorded) != len(start):
        return [f"the continued writer had {len(recorded)} source(s), the new query has {len(start)}"]
    problems: list[str] = []
    for index, (ended, starts) in enumerate(zip(recorded, start, strict=True)):
        if _kafka_shaped(ended) and _kafka_shaped(starts):
            problems += _kafka_problems(index, ended, starts)
        elif ended != starts:
            problems.append(
                f"source {index}: starts at {_text(starts)}, but the writer ended at {_text(ended)}"
            )
    return problems


def _kafka_shaped(offsets: Any) -> bool:
    return isinstance(offsets, dict) and all(
        isinstance(parts, dict) and all(isinstance(p, str) and type(o) is int for p, o in parts.items())
        for parts in offsets.values()
    )


def _kafka_problems(
    index: int, ended: dict[str, dict[str, int]], starts: dict[str, dict[str, int]]
) -> list[str]:
    problems = []
    for topic, partitions in sorted(ended.items()):
        for partition, end in sorted(partitions.items()):
            where = f"source {index} {topic}-{partition}"
            begin = starts.get(topic, {}).get(partition)
            if begin is None:
                problems.append(f"{where}: missing from the start offsets (a gap: {end} is next)")
            elif begin in (_KAFKA_LATEST, _KAFKA_EARLIEST):
                problems.append(f"{where}: starts at {begin} (latest/earliest), not at the offset {end}")
            elif begin < end:
                problems.append(f"{where}: starts at {begin}, before {end} (an overlap: rows twice)")
            elif begin > end:
                problems.append(f"{where}: starts at {begin}, after {end} (a gap: rows lost)")
    for topic, partitions in sorted(starts.items()):
        for partition, begin in sorted(partitions.items()):
            # A partition added since: from its beginning. Spark records -2 (earliest) resolved,
            # as 0 for a partition whose log still starts there.
            if partition not in ended.get(topic, {}) and begin not in (_KAFKA_EARLIEST, 0):
                problems.append(
                    f"source {index} {topic}-{partition}: new since the writer ended, so it must start "
                    f"at -2 (earliest) or 0, not {begin}"
                )
    return problems


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def removed_paths(commits: Iterable[Commit]) -> dict[str, int]:
    """Each path the ``commits`` remove, with the version that removed it."""
    return {r.path: commit.version for commit in commits for r in commit.removes}


def check_compaction(
    state: TableState, pending: PendingCommit, removed_after_base: Mapping[str, int]
) -> Decision:
    """The conflict rule of section 10 for a compaction based on ``op.base_version``.

    It conflicts (CommitConflictError) only when a commit after its base removed one of its
    inputs, or abandoned it; appends never conflict with it. ``removed_after_base`` holds the
    paths removed by the commits ``base_version + 1 .. state.version``.
    """
    op = pending.op
    if pending.kind != "compact" or op is None or op.base_version is None:
        raise ValueError(f"check_compaction needs a compaction, got a {pending.kind} commit")
    if op.base_version > state.version:
        raise ValueError(
            f"compaction {op.token} is based on version {op.base_version}, after {state.version}"
        )
    known = state.ops.get(op.token)
    if known is not None and known.outcome == "committed":
        return "replay"
    if known is not None:
        raise CommitConflictError(
            f"compaction {op.token} was abandoned at version {known.version} (a sweep found it idle): "
            "nothing of it is committed, and its output files are garbage. Run the compaction again"
        )
    conflicts = sorted(
        (p, removed_after_base[p]) for p in (r.path for r in pending.removes) if p in removed_after_base
    )
    if conflicts:
        shown = ", ".join(f"{path} (removed at version {version})" for path, version in conflicts[:5])
        more = f" and {len(conflicts) - 5} more" if len(conflicts) > 5 else ""
        raise CommitConflictError(
            f"compaction {op.token} based on version {op.base_version} conflicts with later commits that "
            f"removed {len(conflicts)} of its inputs: {shown}{more}. Nothing of it is committed; run the "
            "compaction again from the current version"
        )
    return "commit"


def check_abandon(state: TableState, pending: PendingCommit) -> Decision:
    """An abandon of op T: "replay" when T is abandoned already (or this abandon committed);
    CommitRefusedError when T committed -- its files are live, not garbage."""
    op = pending.op
    if pending.kind != "abandon" or op is None or op.abandons is None:
        raise ValueError(f"check_abandon needs an abandon, got a {pending.kind} commit")
    if op.token in state.ops:
        return "replay"
    target = state.ops.get(op.abandons)
    if target is None:
        return "commit"
    if target.outcome == "abandoned":
        return "replay"
    raise CommitRefusedError(
        f"op {op.abandons} committed at version {target.version}: it cannot be abandoned, and its "
        "files are settled by that commit"
    )


def check_vacuum(state: TableState, pending: PendingCommit) -> Decision:
    """A vacuum commit: its retention floor must be a version the log has."""
    op = pending.op
    if pending.kind != "vacuum" or op is None or op.retained_from is None:
        raise ValueError(f"check_vacuum needs a vacuum, got a {pending.kind} commit")
    if op.token in state.ops:
        return "replay"
    if op.retained_from > state.version:
        raise CommitRefusedError(
            f"vacuum {op.token} would retain versions from {op.retained_from}, after the latest version "
            f"{state.version}: the latest version stays readable"
        )
    return "commit"
