"""``lakesink upgrade``: convert a format-1/2 lake to format 3 in place (docs/design/format-v3.md,
section 13).

Epoch-mode lakes, in order; every step is idempotent, so a run killed anywhere is completed by
the next one, and two runs at once agree:

1. **fence** the v2 epoch log: a record at ``latest + 1`` with no files and the query id
   ``lakesink-upgrade-<token>`` (an existing fence is reused), so that a running v2 writer
   fails at its next epoch (another query's record) instead of committing past the upgrade;
2. **import** every v2 record before the fence as an ``append`` commit at versions ``0..U-1``;
3. the ``upgrade`` commit at version ``U`` and a checkpoint at ``U`` (with its hint);
4. **the commit point**: table.json replaced (``put``) with ``format_version`` 3 and
   ``upgraded_from`` -- the only replace of table.json there is.

Everything written after the fence has bytes that are a pure function of the fenced v2 log
(tokens and times included): a rerun, or a concurrent run, creates the same bytes, and
``put_if_absent`` answers True for them. A kill before step 4 leaves a readable v2 lake (plus
a fence and a log nothing reads); after it, a format-3 lake. After the commit point the v2 log
is read again: a record after the fence (a v2 writer that slipped past it: one without a query
id skips v2's ownership check) is reported, loudly -- its files are not in the format-3 log.

Foreach lakes have no log under format 3 (section 14): only table.json is replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.commit.checkpoints import LIST_ROW_GROUP_ROWS, advance_hint
from lakesink_reader import jsondoc, limits
from lakesink_reader.errors import CommitConflictError, CorruptFileError
from lakesink_reader.format.log import UPGRADE_FENCE_PREFIX, EpochLog, EpochRecord
from lakesink_reader.format.table import probe_store, read_table_metadata
from lakesink_reader.format.v3.checkpoint import (
    LIST_SCHEMA,
    Changes,
    Checkpoint,
    checkpoint_name,
    encode_checkpoint,
    file_list_name,
    merge_file_list,
    read_checkpoint,
)
from lakesink_reader.format.v3.commits import AddFile, Commit, PendingCommit, encode_commit
from lakesink_reader.format.v3.logfiles import DEFAULT_CHECKPOINT_INTERVAL, READ_BATCH, commit_name, parallel
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.names import TABLE_FILE, epoch_record_name
from lakesink_reader.storage import Storage, open_storage

log = logging.getLogger(__name__)

Hook = Callable[[str], None]
Progress = Callable[[int, int], None]

#: The steps a ``hook`` is told of, in order (tests kill a run at each of them).
STEPS = (
    "fenced",
    "importing",
    "imported",
    "upgrade_committed",
    "checkpoint_listed",
    "checkpointed",
    "committed",
)

#: The writer id of imported v2 records without a query id (v1 lakes, v2's query-less commits).
UNKNOWN_WRITER = "v2-unknown"
#: The run token of every imported append (the per-run sweep of section 11 keys on runs).
IMPORT_RUN = "v2-import"
#: The query id prefix of a fence record; the rest is the upgrade's 16-hex op token.
FENCE_PREFIX = UPGRADE_FENCE_PREFIX
_FENCE = re.compile(re.escape(FENCE_PREFIX) + r"(?P<token>[0-9a-f]{16})")
_COMMIT_ID = re.compile(r"[0-9a-z-]{5,61}")
#: Fence creations lost to other records (a live v2 writer) before giving up.
MAX_FENCE_TRIES = 20


@dataclass(frozen=True)
class StrayRecord:
    """A v2 record after the fence: a v2 writer committed past it; its files are not in the v3 log."""

    epoch: int
    query_id: str | None
    files: tuple[str, ...]


@dataclass
class UpgradeReport:
    """What :func:`upgrade` did (or, with ``check``, would do).

    ``status``: "upgraded" (this run reached the commit point), "already_format_3" (nothing to
    do), "would_upgrade" (``check``). Epoch mode: the fence's epoch (``fence_created``: by this
    run, or for ``check``: one would be), the v2 epochs imported (``first_epoch`` ..
    ``fence_epoch - 1`` as versions ``0 .. upgrade_version - 1``), the upgrade's version and its
    checkpoint (None at version 0). ``strays``: records after the fence (see the module doc).
    """

    path: str
    mode: str
    from_format: int
    status: str
    table_id: str | None = None
    fence_epoch: int | None = None
    fence_created: bool = False
    first_epoch: int | None = None
    imported: int = 0
    upgrade_version: int | None = None
    checkpoint_version: int | None = None
    strays: list[StrayRecord] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.strays

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def strays_message(self) -> str:
        shown = "; ".join(
            f"epoch {s.epoch} (query {s.query_id or 'unknown'}, {len(s.files)} file(s): "
            f"{', '.join(s.files[:3])}{' ...' if len(s.files) > 3 else ''})"
            for s in self.strays[:5]
        )
        return (
            f"{self.path}: the format-2 epoch log has {len(self.strays)} record(s) after the upgrade's "
            f"fence at epoch {self.fence_epoch}: {shown}. A format-2 writer committed past the fence "
            "(a query without a query id); those rows are NOT in the format-3 lake. Stop that "
            "writer, and write the rows again (its files are still in the lake folder)"
        )


@dataclass(frozen=True)
class _Plan:
    """The format-3 log an epoch lake's fenced v2 log becomes."""

    table_id: str
    fence: EpochRecord
    op_token: str
    imports: tuple[Commit, ...]
    upgrade: Commit
    state: TableState
    changes: Changes
    strays: tuple[EpochRecord, ...]


def upgrade(
    path_or_storage: str | Storage,
    *,
    check: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    check_store: bool = True,
    progress: Progress | None = None,
    hook: Hook | None = None,
) -> UpgradeReport:
    """Convert the lake at ``path_or_storage`` to format 3 in place (see the module doc).

    ``check``: only say what would be done; nothing is written. ``check_store``: before writing,
    check that the store honours create-if-absent. ``progress(done, total)`` per imported
    version; ``hook(step)`` at each of :data:`STEPS` (tests).

    A lake that is format 3 already is left alone (``status`` "already_format_3"); for an
    upgraded one the v2 log is read again for records after the fence. Records after the fence
    make ``report.ok`` False (and are logged as an error); the lake is upgraded all the same.
    CorruptFileError when the v2 log cannot be converted (a gap, a file listed twice) or when the
    format-3 log holds other commits than the ones derived.
    """
    storage = (
        open_storage(path_or_storage, storage_options)
        if isinstance(path_or_storage, str)
        else path_or_storage
    )
    metadata = read_table_metadata(storage)  # refuses a folder that is not a lake
    raw = limits.read(storage, TABLE_FILE, limits.TABLE)
    doc = _table_doc(raw, storage)
    report = UpgradeReport(storage.url, metadata.mode, metadata.format_version, "would_upgrade")
    report.table_id = metadata.table_id
    if metadata.format_version >= 3:
        report.status = "already_format_3"
        upgraded = doc.get("upgraded_from")
        fence = upgraded.get("fence_epoch") if isinstance(upgraded, dict) else None
        if isinstance(upgraded, dict):
            report.from_format = int(upgraded.get("format_version", metadata.format_version))
            report.upgrade_version = upgraded.get("upgrade_version")
        if metadata.mode == "epoch" and type(fence) is int:
            report.fence_epoch = fence
            report.strays = _strays_after(EpochLog(storage), fence)
            _shout(report)
        return report
    table_id = metadata.table_id or _derived_table_id(raw)
    report.table_id = table_id
    if metadata.mode == "foreach":
        if not check:
            if check_store:
                probe_store(storage)
            _commit_point(storage, doc, table_id, metadata.format_version, None, None, time.time())
            report.status = "upgraded"
            _call(hook, "committed")
        return report

    v2 = EpochLog(storage)
    records = v2.records()
    fence_at = _fence_index(records)
    if fence_at is None:
        report.fence_epoch = records[-1].epoch + 1 if records else 0
        report.fence_created = True
        if check:
            report.first_epoch = records[0].epoch if records else None
            report.imported = len(records)
            report.upgrade_version = len(records)
            report.checkpoint_version = len(records) or None
            return report
        if check_store:
            probe_store(storage)
        records, fence_at, report.fence_created = _fence(storage, v2, records)
    elif not check and check_store:
        probe_store(storage)
    plan = _plan(records, fence_at, table_id, storage)
    report.fence_epoch = plan.fence.epoch
    report.first_epoch = records[0].epoch if plan.imports else None
    report.imported = len(plan.imports)
    report.upgrade_version = plan.upgrade.version
    report.checkpoint_version = plan.upgrade.version or None
    if check:
        report.strays = [_stray(r) for r in plan.strays]
        return report
    _call(hook, "fenced")

    # Before each batch of creates: a run that finds the lake upgraded (by a concurrent run)
    # stops. Writers and vacuum may have moved the format-3 log on since -- truncated it even
    # -- and a create-if-absent of a vacuumed version would succeed: a stray below the log's
    # checkpoint, which nothing needs and which the next vacuum has to remove again.
    try:
        _write_commits(storage, plan.imports, progress, hook)
        _call(hook, "imported")
        _write_commits(storage, (plan.upgrade,), None, None)
        _call(hook, "upgrade_committed")
        if plan.upgrade.version > 0:
            _check_not_upgraded(storage)
            _write_checkpoint(storage, plan, hook)
    except _UpgradedMeanwhile:
        log.info("%s was upgraded by another run meanwhile: this run stops", storage.url)
        report.status = "already_format_3"
        return report
    _call(hook, "checkpointed")
    _commit_point(
        storage,
        doc,
        table_id,
        metadata.format_version,
        plan.fence.epoch,
        plan.upgrade.version,
        plan.fence.committed_at,
    )
    report.status = "upgraded"
    log.info(
        "upgraded %s to format 3: %d v2 epoch(s) imported, the upgrade is version %d (fence epoch %d)",
        storage.url,
        len(plan.imports),
        plan.upgrade.version,
        plan.fence.epoch,
    )
    _call(hook, "committed")
    report.strays = _strays_after(v2, plan.fence.epoch)
    _shout(report)
    return report


# The fence ----------------------------------------------------------------------------------------


def fence_token(record: EpochRecord) -> str | None:
    """The upgrade op token of a fence record; None for any other record."""
    match = _FENCE.fullmatch(record.query_id or "")
    return match.group("token") if match and not record.files else None


def _fence_index(records: Sequence[EpochRecord]) -> int | None:
    return next((i for i, r in enumerate(records) if fence_token(r) is not None), None)


def _fence(storage: Storage, v2: EpochLog, records: list[EpochRecord]) -> tuple[list[EpochRecord], int, bool]:
    """Create the fence at ``latest + 1`` (or find the one a concurrent upgrade created): the
    records read then, the fence's index among them, and whether this call created it."""
    for _ in range(MAX_FENCE_TRIES):
        epoch = records[-1].epoch + 1 if records else 0
        token = uuid.uuid4().hex[:16]
        fence = EpochRecord(epoch, time.time(), (), None, FENCE_PREFIX + token, uuid.uuid4().hex)
        doc = {"format_version": 2, **fence.to_doc(), "upgrade_to_format": 3}
        if storage.put_if_absent(epoch_record_name(epoch), json.dumps(doc).encode()):
            log.info("fenced the epoch log of %s at epoch %d (upgrade %s)", storage.url, epoch, token)
            return [*records, fence], len(records), True
        records = v2.records()  # a v2 writer's record, or a concurrent upgrade's fence
        found = _fence_index(records)
        if found is not None:
            return records, found, False
    raise CommitConflictError(
        f"{storage.url}: the fence of the epoch log lost {MAX_FENCE_TRIES} epochs in a row to new records: "
        "a format-2 writer is committing fast. Nothing is upgraded; run `lakesink upgrade` again"
    )


# The derived log ----------------------------------------------------------------------------------


def _plan(records: Sequence[EpochRecord], fence_at: int, table_id: str, storage: Storage) -> _Plan:
    """The commits the fenced log becomes, folded (a v2 log that cannot fold is refused here,
    before anything of it is written)."""
    fence = records[fence_at]
    before = records[:fence_at]
    for previous, record in zip(before, [*before[1:], fence], strict=True):
        if record.epoch != previous.epoch + 1:
            raise CorruptFileError(
                f"{storage.url}: the epoch log has a gap between epochs {previous.epoch} and {record.epoch}; "
                "records are contiguous in a sound log. Nothing is upgraded"
            )
    token = fence_token(fence)
    assert token is not None
    imports = tuple(_import(r, version, table_id) for version, r in enumerate(before))
    upgrade = PendingCommit.upgrade(
        op_token=token, fence_epoch=fence.epoch, token=f"upgrade-{token}", committed_at=fence.committed_at
    ).at(len(imports), table_id)
    state = TableState.empty(table_id)
    changes = Changes.empty()
    try:
        for commit in (*imports, upgrade):
            state = state.fold(commit.header)
            changes.apply(commit)
    except CorruptFileError as exc:
        raise CorruptFileError(f"{storage.url}: the epoch log cannot be converted: {exc}") from exc
    return _Plan(table_id, fence, token, imports, upgrade, state, changes, tuple(records[fence_at + 1 :]))


def _import(record: EpochRecord, version: int, table_id: str) -> Commit:
    """The append commit of one v2 record: a pure function of the record."""
    adds = [AddFile(f.name, f.rows, f.size, f.partition, record.epoch, None) for f in record.files]
    return PendingCommit.append(
        writer_id=record.query_id or UNKNOWN_WRITER,
        batch=record.epoch,
        run=IMPORT_RUN,
        adds=adds,
        source_offsets=record.source_offsets,
        token=import_token(record),
        committed_at=record.committed_at,
    ).at(version, table_id)


def import_token(record: EpochRecord) -> str:
    """``v2-<commit_id>``; for a record without a usable commit id (format 1), ``v1-`` and a hash
    of the record."""
    if record.commit_id is not None and _COMMIT_ID.fullmatch(record.commit_id):
        return f"v2-{record.commit_id}"
    text = json.dumps(record.to_doc(), sort_keys=True, separators=(",", ":"))
    return "v1-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _derived_table_id(raw: bytes) -> str:
    """A format-1 table.json has no table id: one derived from its bytes (every run agrees)."""
    return hashlib.sha256(raw).hexdigest()[:32]


def _write_commits(
    storage: Storage, commits: Sequence[Commit], progress: Progress | None, hook: Hook | None
) -> None:
    def create(commit: Commit) -> None:
        if not storage.put_if_absent(commit_name(commit.version), encode_commit(commit)):
            raise CorruptFileError(
                f"{storage.url}/{commit_name(commit.version)} holds another commit than the one the upgrade "
                "derives from the epoch log: the format-3 log was written by something else. Nothing "
                "is upgraded (table.json still says format 2)"
            )

    for start in range(0, len(commits), READ_BATCH):
        chunk = commits[start : start + READ_BATCH]
        _check_not_upgraded(storage)
        parallel(create, chunk)
        if progress is not None:
            progress(start + len(chunk), len(commits))
        _call(hook, "importing")


class _UpgradedMeanwhile(Exception):
    """table.json says format 3: another run completed the upgrade while this one ran."""


def _check_not_upgraded(storage: Storage) -> None:
    if _table_doc(limits.read(storage, TABLE_FILE, limits.TABLE), storage).get("format_version") == 3:
        raise _UpgradedMeanwhile


def _write_checkpoint(storage: Storage, plan: _Plan, hook: Hook | None) -> None:
    """The checkpoint at the upgrade's version, with a token and time derived from the plan."""
    version, state = plan.upgrade.version, plan.state
    token = hashlib.sha256(f"{plan.table_id}:{version}".encode()).hexdigest()[:32]
    name = file_list_name(version, token)
    where = f"{storage.url.rstrip('/')}/{name}"
    existing = read_checkpoint(storage, plan.table_id, version)
    if existing is None:
        tables: list[pa.Table] = []
        merge_file_list((), plan.changes, tables.append, where=where)
        table = pa.concat_tables(tables) if tables else LIST_SCHEMA.empty_table()
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, LIST_SCHEMA, compression="zstd") as writer:
            writer.write_table(table, row_group_size=LIST_ROW_GROUP_ROWS)
        data = sink.getvalue().to_pybytes()
        if not storage.put_if_absent(name, data):
            # Written by a run of another pyarrow (killed before its small part): use it if sound.
            data = storage.read_bytes(name)
            if pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows != state.counts.files:
                raise CorruptFileError(f"{where} exists with another row count than {state.counts.files}")
        _call(hook, "checkpoint_listed")
        checkpoint = Checkpoint(state, token, plan.fence.committed_at, name, state.counts.files, len(data))
        if not storage.put_if_absent(checkpoint_name(version), encode_checkpoint(checkpoint)):
            existing = read_checkpoint(storage, plan.table_id, version)
            if existing is None:
                raise CorruptFileError(f"{storage.url}/{checkpoint_name(version)} exists but cannot be read")
    if existing is not None and (existing.token != token or existing.state != state):
        raise CorruptFileError(
            f"{storage.url}/{checkpoint_name(version)} is not the checkpoint the upgrade derives: the "
            "format-3 log was written by something else. Nothing is upgraded"
        )
    advance_hint(storage, version)


# The commit point ---------------------------------------------------------------------------------


def _table_doc(raw: bytes, storage: Storage) -> dict[str, Any]:
    try:
        doc = jsondoc.loads(raw)
    except ValueError as exc:
        raise CorruptFileError(f"{storage.url}/{TABLE_FILE}: not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptFileError(f"{storage.url}/{TABLE_FILE}: not a JSON object")
    return doc


def _commit_point(
    storage: Storage,
    doc: Mapping[str, Any],
    table_id: str,
    from_format: int,
    fence_epoch: int | None,
    upgrade_version: int | None,
    upgraded_at: float,
) -> None:
    """Replace table.json with its format-3 form: the upgrade's commit point (``put``: atomic
    on every backend). Skipped when a concurrent run got there first."""
    current = _table_doc(limits.read(storage, TABLE_FILE, limits.TABLE), storage)
    if current.get("format_version") == 3:
        return
    new = dict(doc)
    new["format_version"] = 3
    new["table_id"] = table_id
    if doc.get("mode") == "epoch":
        new.setdefault("checkpoint_interval", DEFAULT_CHECKPOINT_INTERVAL)
    new["upgraded_from"] = {
        "format_version": from_format,
        "fence_epoch": fence_epoch,
        "upgrade_version": upgrade_version,
        "upgraded_at": upgraded_at,
    }
    storage.put(TABLE_FILE, json.dumps(new, indent=2).encode())


# After it -------------------------------------------------------------------------------------------


def _strays_after(v2: EpochLog, fence_epoch: int) -> list[StrayRecord]:
    return [_stray(r) for r in v2.records(epochs=(fence_epoch + 1, 1 << 62))]


def _stray(record: EpochRecord) -> StrayRecord:
    return StrayRecord(record.epoch, record.query_id, tuple(f.name for f in record.files))


def _shout(report: UpgradeReport) -> None:
    if report.strays:
        log.error("%s", report.strays_message())


def _call(hook: Hook | None, step: str) -> None:
    if hook is not None:
        hook(step)


__all__ = ["STEPS", "StrayRecord", "UpgradeReport", "fence_token", "import_token", "upgrade"]
