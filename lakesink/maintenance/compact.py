"""Compaction of a format-3 lake: small committed files rewritten into larger ones, as one commit.

One run is one op with a token T (docs/design/format-v3.md, section 10):

1. a lease ``_lakesink/ops/<T>.json`` is put (refreshed while the run lasts, deleted at its
   end): a hint for whoever abandons stale ops, never a lock;
2. the live files at the latest version B are streamed (checkpoint list, minus/plus the commits
   after it); files under ``target_file_size / 2`` are picked, oldest ``added_version`` first,
   up to ``max_input`` bytes, and cut into bins of about ``target_file_size``; bins of fewer
   than ``min_files`` files are left alone;
3. each bin is rewritten by one ``FileWriter`` (staged, then published as
   ``c<T>-<seq>-<attempt>.parquet``): rows in input order, stats recomputed from the new footer;
4. one ``compact`` commit (removes = inputs, adds = outputs) at the next version through
   ``VersionedLogWriter``, whose conflict rule refuses it when a commit after B removed an input or
   abandoned T (CommitConflictError): T then deletes its own outputs.

Until that commit the outputs are published files no version lists: ``read_committed`` never
sees them, so a kill -9 anywhere loses or duplicates no committed row. What a killed run leaves
(its outputs, staged data, its lease) is garbage once T is *abandoned*: the next compaction
(``abandon_older_than``) commits ``abandon(T)`` for an op the log does not know whose lease
(or, without one, newest file) is older than that age, and then deletes T's files -- after the
abandon, T's commit is impossible, whichever of the two reaches the log first wins.

Memory: the picked files' entries (~200 B each, at most ``max_input`` bytes' worth), one
row group of the checkpoint's file list (65,536 entries) plus the changes after it, and per
bin ``write_options.row_group_bytes`` of buffered Arrow (64 MiB by default) plus the input
batch being read plus pyarrow's encoder and reader buffers -- not the bin's size, nor the
table's (``tests/test_compact.py`` measures it).
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from lakesink.commit.files import FileWriter, WriteOptions
from lakesink.commit.versions import VersionedLogWriter
from lakesink.views.derived import maintenance_views
from lakesink_reader import jsondoc, limits
from lakesink_reader.datafiles import open_file
from lakesink_reader.errors import (
    CommitConflictError,
    CommitRefusedError,
    CommitStateUnknownError,
    CorruptFileError,
    LakeSinkError,
    quietly,
)
from lakesink_reader.format.opening import open_epoch_log
from lakesink_reader.format.schemas import read_as, schema_at
from lakesink_reader.format.table import TableMetadata, probe_store
from lakesink_reader.format.v3.checkpoint import (
    derive_changes,
    iter_file_list,
    merge_file_list,
    open_file_list,
    usable_base,
)
from lakesink_reader.format.v3.commits import (
    COMPACT_TRIGGERS,
    AddFile,
    PendingCommit,
    RemoveFile,
    new_op_token,
)
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import Snapshot, VersionedLog
from lakesink_reader.names import (
    OPS_DIR,
    compaction_file_name,
    new_attempt_id,
    parse_compaction_file,
)
from lakesink_reader.storage import StagedEntry, Storage, open_storage

log = logging.getLogger(__name__)

MIB = 1 << 20
DEFAULT_TARGET_FILE_SIZE = 128 * MIB
DEFAULT_MIN_FILES = 5
DEFAULT_MAX_INPUT = 16 << 30
#: The most input files of one compaction: its commit removes them and adds fewer (bins of at
#: least ``min_files`` >= 2), within the most actions a commit may hold
#: (``limits.COMMIT_ACTIONS``, 200,000); a lake of more small files takes more runs.
MAX_INPUT_FILES = 100_000
#: An op the log does not know, idle this long (lease or newest file), is abandoned.
DEFAULT_ABANDON_AGE = 3600.0
#: How often a running compaction refreshes its lease.
LEASE_REFRESH = 60.0

#: Called at the run's steps ("lease", "published", "before_commit", "committed"); tests use
#: it to pause or kill a compaction at a known point.
Hook = Callable[[str], None]
Progress = Callable[[int, int], None]
CompactStatus = Literal["committed", "nothing_to_do", "dry_run"]


@dataclass(frozen=True)
class InputFile:
    """A live file picked for rewriting."""

    path: str
    rows: int
    size: int
    added_version: int


@dataclass(frozen=True)
class Bin:
    """Files rewritten into one output, in this order."""

    inputs: tuple[InputFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.inputs)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.inputs)


@dataclass(frozen=True)
class AbandonedOp:
    """An op of a dead (or idle) run: abandoned in the log (or already), its files removed."""

    token: str
    version: int | None  # the abandon commit (None: a dry run, or abandoned before this run)
    removed: tuple[str, ...]


@dataclass
class CompactReport:
    """What a compaction did (or, with ``dry_run``, would do).

    ``status``: ``committed`` (``version`` is its commit), ``nothing_to_do`` (no bin had
    ``min_files`` small files), ``dry_run``. ``live_files``: live files at ``base_version``.
    """

    path: str
    token: str
    base_version: int
    status: CompactStatus
    live_files: int
    bins: list[Bin] = field(default_factory=list)
    outputs: list[AddFile] = field(default_factory=list)
    version: int | None = None
    abandoned: list[AbandonedOp] = field(default_factory=list)

    @property
    def input_files(self) -> int:
        return sum(len(b.inputs) for b in self.bins)

    @property
    def input_bytes(self) -> int:
        return sum(b.size for b in self.bins)


def compact(
    path_or_storage: str | Storage,
    *,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    min_files: int = DEFAULT_MIN_FILES,
    max_input: int = DEFAULT_MAX_INPUT,
    dry_run: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    write_options: WriteOptions | None = None,
    abandon_older_than: float | None = DEFAULT_ABANDON_AGE,
    check_store: bool = True,
    progress: Progress | None = None,
    hook: Hook | None = None,
    lease_refresh: float = LEASE_REFRESH,
    trigger: str | None = None,
    tier_ratio: int | None = None,
) -> CompactReport:
    """Rewrite the small live files of the format-3 lake at ``path_or_storage`` as one commit.

    Parameters
    ----------
    target_file_size
        Bytes an output aims at; files under half of it are inputs.
    min_files
        A bin of fewer inputs is left alone (at least 2).
    max_input
        Bytes read at most in one run (the oldest small files first).
    dry_run
        Only pick the bins: nothing is written, abandoned or deleted.
    write_options
        How outputs are written (``WriteOptions``: row group size bounds the memory).
    abandon_older_than
        Seconds: first abandon ops the log does not know whose lease (or newest file) is older,
        and delete their files (a killed compaction's). None: skip that.
    check_store
        Before writing, check that the store honours create-if-absent (issue 27).
    progress, hook
        ``progress(done, total)`` per bin; ``hook(step)`` at the run's steps (tests).
    tier_ratio
        Only join files of about the same size: sizes within one power of ``tier_ratio`` (2 or
        more; auto-compaction passes its bin size, 8). Without it a bin takes the oldest small
        files whatever their sizes, so a lake compacted often rewrites its earlier outputs with
        each few new files until they reach half the target -- write amplification that grows
        with the stream's age (``bench/auto_compact_thresholds.py``). With it each byte is
        rewritten about once per tier (log base ``tier_ratio`` of target / file size).
    trigger
        ``"auto"`` when a writer's driver runs it by itself (``auto_compact``): the commit says
        so, and ``lakesink history`` shows an auto-compaction. None for any other.

    Raises
    ------
    FormatVersionError
        The lake is not format 3 (compaction needs the versioned log).
    CommitConflictError
        A commit after the base version removed an input (another compaction), or abandoned
        this op: nothing is committed and this run's outputs are deleted. Run it again.
    CommitStateUnknownError
        The commit's create was never answered: it may be committed; the outputs are kept
        (a later compaction's abandon settles them if not).
    """
    if trigger is not None and trigger not in COMPACT_TRIGGERS:
        raise ValueError(f"trigger must be None or one of {list(COMPACT_TRIGGERS)}, got {trigger!r}")
    if min_files < 2:
        raise ValueError(f"min_files must be >= 2 (a bin of one file rewrites nothing), got {min_files}")
    if tier_ratio is not None and (
        isinstance(tier_ratio, bool) or not isinstance(tier_ratio, int) or tier_ratio < 2
    ):
        raise ValueError(f"tier_ratio must be None or an int >= 2, got {tier_ratio!r}")
    if target_file_size < 1 << 10 or max_input < 1:
        raise ValueError(
            f"target_file_size must be >= 1 KiB and max_input >= 1, got {target_file_size} and {max_input}"
        )
    storage = (
        open_storage(path_or_storage, storage_options)
        if isinstance(path_or_storage, str)
        else path_or_storage
    )
    metadata, vlog = open_v3(storage, "compaction")
    if not dry_run and check_store:
        probe_store(storage)  # a store that overwrites: refuse before writing anything
    token = new_op_token()
    snap = vlog.snapshot()
    report = CompactReport(storage.url, token, snap.version, "dry_run" if dry_run else "nothing_to_do", 0)
    if abandon_older_than is not None:
        state = settle_ops(
            storage, vlog, snap.state, older_than=abandon_older_than, dry_run=dry_run, report=report
        )
        if state.version != snap.version:
            snap = vlog.snapshot()
            report.base_version = snap.version
    if snap.version < 0:
        return report
    picked, report.live_files = pick_files(storage, vlog, snap, target_file_size // 2, max_input)
    report.bins = make_bins(picked, target_file_size, min_files, tier_ratio)
    if dry_run or not report.bins:
        return report

    # The outputs take the lake's schema at the base version; older inputs are read as it
    # (schema evolution: columns they lack as nulls, narrower types widened).
    schema = schema_at(metadata.schema, snap.state.schema_at(snap.version))
    data_schema = pa.schema([f for f in schema if f.name not in metadata.partition_columns])
    lease = _Lease(storage, token, snap.version, lease_refresh)
    lease.start()
    _call(hook, "lease")
    published: list[str] = []
    committed = unknown = False
    try:
        for seq, b in enumerate(report.bins):
            output = _rewrite(storage, data_schema, token, seq, b, write_options or WriteOptions(), published)
            report.outputs.append(output)
            _call(hook, "published")
            if progress is not None:
                progress(seq + 1, len(report.bins))
        pending = PendingCommit.compact(
            op_token=token,
            base_version=snap.version,
            removes=[RemoveFile(f.path, f.rows, f.size) for b in report.bins for f in b.inputs],
            adds=report.outputs,
            trigger=trigger,
        )
        _call(hook, "before_commit")
        try:
            result = vlog.commit(pending, state=snap.state)
        except CommitStateUnknownError:
            unknown = True  # maybe committed: keep the outputs and the lease; an abandon settles them
            raise
        committed = True
        report.version, report.status = result.version, "committed"
        _call(hook, "committed")
    except CommitConflictError:
        log.info(
            "compaction %s of %s conflicts: deleting its %d output(s)", token, storage.url, len(published)
        )
        raise
    finally:
        lease.stop()
        if not committed and not unknown:  # no create of ours can land any more: outputs are garbage
            for name in published:
                quietly(functools.partial(storage.delete, name), f"delete compaction output {name}")
        if not unknown:
            quietly(lambda: storage.delete(lease.name), f"delete the lease {lease.name}")
    log.info(
        "compacted %d file(s) (%d bytes) of %s into %d at version %s (op %s)",
        report.input_files,
        report.input_bytes,
        storage.url,
        len(report.outputs),
        report.version,
        token,
    )
    return report


def open_v3(storage: Storage, what: str) -> tuple[TableMetadata, VersionedLogWriter]:
    """The metadata and versioned log of a format-3 epoch-mode lake, for a maintenance command
    that commits (``open_epoch_log``'s checks), with the views' hook: compaction and vacuum
    update the views the lake has (bringing them up), never start one."""
    metadata, plain = open_epoch_log(storage, what)
    view = maintenance_views(storage, plain.table_id, metadata)
    return metadata, VersionedLogWriter(
        storage, plain.table_id, checkpoint_interval=plain.checkpoint_interval, after_commit=view
    )


# Picking ----------------------------------------------------------------------------------------


def stream_live_files(
    storage: Storage, vlog: VersionedLog, snap: Snapshot, emit: Callable[[pa.Table], None]
) -> int:
    """Stream the live files at the snapshot's version into ``emit`` (file-list tables sorted by
    path): one row group of the checkpoint's list plus the changes after it in memory. Returns
    the number of live files."""
    start = snap.checkpoint
    base, opened = None, None
    if start is not None:
        try:
            opened, base = open_file_list(storage, start), start
        except CorruptFileError as exc:
            log.warning("not reading from checkpoint %d: %s", start.version, exc)
            base, opened = usable_base(storage, vlog.table_id, start.version, vlog.checkpoint_interval)
    _, changes = derive_changes(storage, base, vlog.table_id, snap.version, vlog.read_commit)
    batches = iter_file_list(storage, base, opened=opened) if base is not None else iter(())
    files, _, _ = merge_file_list(batches, changes, emit, where=f"{storage.url} at version {snap.version}")
    return files


def pick_files(
    storage: Storage, vlog: VersionedLog, snap: Snapshot, under: int, max_input: int
) -> tuple[list[InputFile], int]:
    """The live files smaller than ``under`` bytes, oldest ``added_version`` first, at most
    ``max_input`` bytes and :data:`MAX_INPUT_FILES` files of them (a heap keeps only those: memory
    grows with the picked files);
    and the number of live files."""
    heap: list[tuple[int, int, InputFile]] = []  # (-added_version, -seq, file): the newest on top
    total = 0
    seq = 0

    def consider(table: pa.Table) -> None:
        nonlocal total, seq
        cols = table.select(["path", "bytes", "rows", "added_version"]).to_pydict()
        for path, size, rows, added in zip(
            cols["path"], cols["bytes"], cols["rows"], cols["added_version"], strict=True
        ):
            if size >= under:
                continue
            seq += 1
            heapq.heappush(heap, (-added, -seq, InputFile(path, rows, size, added)))
            total += size
            while (total > max_input or len(heap) > MAX_INPUT_FILES) and heap:
                total -= heapq.heappop(heap)[2].size

    live = stream_live_files(storage, vlog, snap, consider)
    # By folder first: a partitioned lake's bins never mix partition folders (make_bins).
    return sorted((f for _, _, f in heap), key=lambda f: (folder_of(f.path), f.added_version, f.path)), live


def folder_of(path: str) -> str:
    """The folder of a root-relative path ('' in the root): a partitioned lake's partition folder."""
    return path.rpartition("/")[0]


def size_tier(size: int, ratio: int) -> int:
    """The tier of a file of ``size`` bytes: files of one tier are within a factor ``ratio``."""
    tier = 0
    while size >= ratio:
        size //= ratio
        tier += 1
    return tier


def make_bins(
    files: list[InputFile], target: int, min_files: int, tier_ratio: int | None = None
) -> list[Bin]:
    """Consecutive runs of ``files`` of about ``target`` bytes, each within one folder (and with
    ``tier_ratio``, one size tier); those of ``min_files`` or more."""

    def group(f: InputFile) -> tuple[str, int]:  # what one bin never mixes
        return folder_of(f.path), size_tier(f.size, tier_ratio) if tier_ratio is not None else 0

    if tier_ratio is not None:
        # Stable: within a folder and tier, the files keep their order (oldest first).
        files = sorted(files, key=group)
    bins: list[Bin] = []
    current: list[InputFile] = []
    size = 0
    for f in files:
        if current and (size + f.size > target or group(f) != group(current[0])):
            bins.append(Bin(tuple(current)))
            current, size = [], 0
        current.append(f)
        size += f.size
    if current:
        bins.append(Bin(tuple(current)))
    return [b for b in bins if len(b.inputs) >= min_files]


# Rewriting ----------------------------------------------------------------------------------------


def _rewrite(
    storage: Storage,
    schema: pa.Schema,
    token: str,
    seq: int,
    b: Bin,
    options: WriteOptions,
    published: list[str],
) -> AddFile:
    """Stream the bin's inputs, in order, into one published output; returns its add."""
    # The output goes in its inputs' folder (a partitioned lake's files hold no partition column).
    folder = folder_of(b.inputs[0].path)
    name = f"{folder}/" * bool(folder) + compaction_file_name(token, seq, new_attempt_id())
    writer = FileWriter(storage, name, schema, options)
    try:
        for f in b.inputs:
            # Bounded as a reader's read is (lakesink_reader.datafiles): its footer, then what it
            # decodes to; a link is refused (pyarrow follows links: nothing copied from outside).
            with open_file(storage, f.path) as opened:
                rows = opened.metadata.num_rows
                if rows != f.rows:
                    raise CorruptFileError(
                        f"{storage.url}/{f.path} has {rows} rows, but the log says {f.rows}"
                    )
                for batch in opened.batches():
                    writer.write(read_as(batch, schema))
        if writer.rows != b.rows:
            raise CorruptFileError(
                f"compaction {token} read {writer.rows} rows from its inputs, the log says {b.rows}"
            )
        done = writer.publish()
    except BaseException:
        writer.discard()
        raise
    if done is None or not done.won:  # a fresh name never meets another file
        raise CorruptFileError(
            f"{storage.url}/{name}: the output could not be published under its fresh name"
        )
    published.append(name)
    stats = None if done.stats is None else jsondoc.canonical(done.stats)  # the log holds text
    return AddFile(name, done.rows, done.size, None, None, stats)


class _Lease:
    """``_lakesink/ops/<token>.json``, put now and every ``refresh`` seconds until stopped."""

    def __init__(self, storage: Storage, token: str, base_version: int, refresh: float) -> None:
        self.storage, self.token, self.base_version, self.refresh = storage, token, base_version, refresh
        self.name = f"{OPS_DIR}/{token}.json"
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{token}", daemon=True)

    def put(self) -> None:
        doc = {
            "token": self.token,
            "kind": "compact",
            "base_version": self.base_version,
            "started_at": self.started,
            "refreshed_at": time.time(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        self.storage.put(self.name, json.dumps(doc, sort_keys=True).encode())

    def start(self) -> None:
        self.put()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh):
            quietly(self.put, f"refresh the lease {self.name}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# Abandoning dead ops ----------------------------------------------------------------------------


def settle_ops(
    storage: Storage,
    vlog: VersionedLogWriter,
    state: TableState,
    *,
    older_than: float,
    dry_run: bool,
    report: CompactReport | None = None,
    now: float | None = None,
) -> TableState:
    """Abandon the ops the log does not know whose lease (or, without one, newest file) is
    older than ``older_than``, then delete the garbage of abandoned ops (their outputs, staged
    data and lease) and the staged data and leases of committed ones. Returns the state after
    the abandon commits. A committed op's published files are never touched (the log lists them)."""
    now = time.time() if now is None else now
    files: dict[str, list[str]] = {}
    staged: dict[str, list[StagedEntry]] = {}
    newest: dict[str, float] = {}
    for entry in storage.list(""):
        token = parse_compaction_file(entry.name)
        if token is not None:
            files.setdefault(token, []).append(entry.name)
            newest[token] = max(newest.get(token, 0.0), entry.modified or now)
    for part in storage.staged(""):
        token = parse_compaction_file(part.name)
        if token is not None:
            staged.setdefault(token, []).append(part)
            newest[token] = max(newest.get(token, 0.0), part.started or now)
    leases: dict[str, float] = {}
    for entry in storage.list(OPS_DIR):
        token = entry.name.rsplit("/", 1)[-1].removesuffix(".json")
        leases[token] = _lease_time(storage, entry.name, entry.modified or now)
    for token in sorted(set(files) | set(staged) | set(leases)):
        op = state.ops.get(token)
        version: int | None = None
        if op is None:
            idle = now - leases.get(token, newest.get(token, now))
            if idle < older_than:
                continue  # may be running: its commit may still come
            if dry_run:
                if report is not None:
                    report.abandoned.append(AbandonedOp(token, None, tuple(sorted(files.get(token, [])))))
                continue
            try:
                result = vlog.commit(
                    PendingCommit.abandon(op_token=new_op_token(), abandons=token), state=state
                )
            except CommitRefusedError:
                continue  # it committed meanwhile: its files are settled
            state, version = result.state, result.version
            log.info("abandoned op %s of %s (idle %.0f s) at version %s", token, storage.url, idle, version)
        if dry_run:
            continue
        garbage = [] if (op is not None and op.outcome == "committed") else files.get(token, [])
        for name in garbage:
            storage.delete(name)
        for part in staged.get(token, []):
            quietly(functools.partial(storage.drop_staged, part), f"drop staged {part.name}")
        if token in leases:
            storage.delete(f"{OPS_DIR}/{token}.json")
        if report is not None and (version is not None or garbage):
            report.abandoned.append(AbandonedOp(token, version, tuple(sorted(garbage))))
    return state


def _lease_time(storage: Storage, name: str, fallback: float) -> float:
    try:
        doc = jsondoc.loads(limits.read(storage, name, limits.OPS_LEASE))
        value = doc.get("refreshed_at") if isinstance(doc, dict) else None  # crafted: [] (session 22)
        return float(value) if isinstance(value, int | float) else fallback
    except (OSError, ValueError, LakeSinkError):
        return fallback


def _call(hook: Hook | None, step: str) -> None:
    if hook is not None:
        hook(step)


def parse_size(text: str) -> int:
    """``"128MB"``, ``"128MiB"``, ``"1g"``, ``"4096"`` -> bytes (K, M, G, T are powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if match is None:
        raise ValueError(
            f"bad size {text!r}: use a number with an optional unit KB, MB, GB or TB (e.g. 128MB)"
        )
    power = " kmgt".index(match.group(2).lower() or " ")
    return int(float(match.group(1)) * (1 << (10 * power)))
