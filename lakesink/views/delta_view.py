"""Writing and checking the Delta view of a format-3 epoch lake (``lakesink.views.delta``).

After each lake commit, :class:`DeltaView` (a ``VersionedLogWriter`` ``after_commit`` hook) creates
``_delta_log/<v:020d>.json`` create-if-absent: one PUT per commit. The same bytes already there
mean done; other bytes mean a foreign writer touched the view: the view is then left alone
(a marker, :data:`STOP_FILE`, tells every process so) until ``lakesink sync-views`` finds it
whole again, and ``lakesink status``/``verify`` report it. Nothing here ever raises into a
commit, nor touches the lake's own log.

A view commit ``v`` is written on top of ``v - 1`` (or at 0), or on top of a view checkpoint at
``v``: whoever updates a view brings it up to the lake's version, however far behind it is (a
writer killed between its lake commit and its view update leaves it behind). A gap of up to
:data:`GAP_FILL` versions whose lake commits are still there is filled in order; a longer one,
or one whose lake commits were vacuumed, is bridged by a rebuild: the view checkpoint at ``v``
(built from the lake's checkpoint and the commits after it), then the commit ``v``. Readers
start at the newest view checkpoint, so they read ``v`` whole; only time travel to the versions
skipped fails until ``sync-views`` writes them (when the lake still has them). A writer
(``create=True``) may start a view; a maintenance op only updates one that is there. What a
process learned (the last view version it wrote, a stop, a schema Delta cannot take) is kept
per lake for the life of the process, so the steady state costs the one PUT.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakesink.views.delta import (
    DELTA_LOG_DIR,
    LAST_CHECKPOINT,
    DeltaViewUnsupported,
    checkpoint_schema,
    delta_checkpoint,
    delta_checkpoint_name,
    delta_commit,
    delta_commit_name,
    delta_schema,
    last_checkpoint_doc,
)
from lakesink.views.hook import ViewHook
from lakesink.views.memo import CommitTimes, StopFile, ViewMemo, ViewMemos
from lakesink_reader import jsondoc, limits
from lakesink_reader.arrays import array, scalar
from lakesink_reader.errors import CorruptFileError, one_line
from lakesink_reader.format.decoded import check_footer, decoded_bytes, plain, string_leaves
from lakesink_reader.format.opening import oldest_commit, open_epoch_log
from lakesink_reader.format.schemas import schema_at
from lakesink_reader.format.table import TableMetadata, probe_store, read_table_metadata
from lakesink_reader.format.v3.checkpoint import MAX_LIST_EXPANSION, live_files_table
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.logfiles import parallel, read_threads
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.names import META_DIR
from lakesink_reader.redact import redacted
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)

#: Written when a view commit holds bytes lakesink did not derive: writers stop updating the view.
STOP_FILE = f"{META_DIR}/delta_view_stopped.json"
_STOP = StopFile(STOP_FILE, "says the view was touched by a foreign writer", log)
#: A view this many versions behind, or less, is filled in order; further behind, it is rebuilt
#: at the lake's version (a view checkpoint: bounded cost per update, whatever the gap).
GAP_FILL = 16


@dataclass
class _Known(ViewMemo):
    """What this process knows of one lake's view."""

    version: int = -1  # the newest view version known to be this lake's bytes
    unsupported: str | None = None


_MEMOS = ViewMemos(_Known)


forget = _MEMOS.forget  # what this process knows of a lake's view goes: after a sync, in tests


class DeltaView(ViewHook[_Known]):
    """The ``after_commit`` hook that keeps a lake's Delta view up to date.

    ``create``: a writer with ``delta_log`` on may start the view; else (compaction, vacuum,
    through ``lakesink.views.derived.maintenance_views``) only a view that is there is updated.
    Either way a view that is behind is brought up to the commit's version.
    """

    view = "Delta view"
    memos = _MEMOS
    log = log
    keeps_times = True

    def _after(self, commit: Commit, state: TableState) -> None:
        k, v = self.known, commit.version
        if k.unsupported is not None or _STOP.stops(self.storage, k, "Delta view"):
            return
        if v > 0 and k.version != v - 1 and not self.storage.exists(delta_commit_name(v - 1)):
            if not self.create and not self._exists():
                return  # no view to continue (the writers of this lake keep none)
            vlog = VersionedLog(self.storage, self.table_id, checkpoint_interval=None)
            # Never at a version the lake no longer retains, whose files a sweep or vacuum may
            # have removed already (a slow writer's hook filling the gap from below the floor:
            # simulation seed 211).
            floor = max(state.retained_from, vlog.open().retained_from)
            if v < floor:
                return  # this version is vacuumed: a later commit or `sync-views` brings the view up
            start = self._gap_start(v)
            if start is None or start < floor:
                # Far behind (bounded cost, whatever the gap), or the gap reaches below the
                # retained versions, whose files vacuum may have deleted though their commits
                # are still in the log (a view started on an upgraded lake): a view version
                # there would list them (simulation: the upgrade world, seed 211).
                self._rebuild(commit, state)
                return
            for u in range(start, v):
                older = vlog.read_commit(u)
                if older is None:  # vacuumed from the lake's log: the view cannot hold it
                    self._rebuild(commit, state)
                    return
                if not self._write(older):
                    return
                if self._due(u):
                    self._checkpoint(u, None, vlog)
        if self._write(commit) and self._due(v):
            self._checkpoint(v, state, None)

    def _exists(self) -> bool:
        """Whether the lake has a Delta view (its first commit, or a checkpoint hint: a view
        rebuilt on a vacuumed lake starts at a checkpoint)."""
        return self.known.version >= 0 or any(
            self.storage.exists(name) for name in (delta_commit_name(0), LAST_CHECKPOINT)
        )

    def _rebuild(self, commit: Commit, state: TableState) -> None:
        """Bring a view that is far behind (or whose missing versions the lake vacuumed) to
        ``commit``'s version: the view checkpoint there first -- the lake's live files, from its
        checkpoint and the commits after it -- then the commit. A Delta reader starts at the
        newest checkpoint, so at no point does it meet the gap below ``v``; time travel into the
        gap fails until ``sync-views`` writes what the lake still has of it."""
        v = commit.version
        try:
            delta_commit(self._table(), commit)  # a schema Delta cannot take: no view, as in _write
        except DeltaViewUnsupported:
            self._write(commit)
            return
        log.info("the Delta view of %s is behind version %d: rebuilding it there", self.storage.url, v)
        try:
            write_view_checkpoint(
                self.storage,
                self._table(),
                VersionedLog(self.storage, self.table_id, checkpoint_interval=self._interval()),
                v,
                state=state,
                interval=self._interval(),
                times=self.known.times,
                ahead_of_commit=True,
            )
        except Exception:
            log.warning(
                "rebuilding the Delta view of %s at version %d failed; the lake commit stands, and the "
                "next commit or `lakesink sync-views` brings the view up",
                self.storage.url,
                v,
                exc_info=True,
            )
            return
        self._write(commit)

    def _due(self, version: int) -> bool:
        return version > 0 and version % self._interval() == 0

    def _interval(self) -> int:
        if self.known.interval is None:
            self.known.interval = table_interval(self.storage)
        return self.known.interval

    def _checkpoint(self, version: int, state: TableState | None, vlog: VersionedLog | None) -> None:
        """The view checkpoint at ``version``, after its commit (derived work: a failure is logged)."""
        try:
            write_view_checkpoint(
                self.storage,
                self._table(),
                vlog or VersionedLog(self.storage, self.table_id, checkpoint_interval=self._interval()),
                version,
                state=state,
                interval=self._interval(),
                times=self.known.times,
            )
        except Exception:
            log.warning(
                "writing the Delta view checkpoint of %s at version %d failed; Delta readers read the "
                "commits instead, and `lakesink sync-views` writes it",
                self.storage.url,
                version,
                exc_info=True,
            )

    def _gap_start(self, v: int) -> int | None:
        """The first missing version of a view that lacks ``v - 1``, when the gap is at most
        :data:`GAP_FILL` versions; None when it is longer (or the view is new on a lake with more
        versions than that): the view is then rebuilt at ``v``."""
        for u in range(v - 2, max(-1, v - 1 - GAP_FILL), -1):
            if self.storage.exists(delta_commit_name(u)):
                return u + 1
        return 0 if v <= GAP_FILL else None

    def _write(self, commit: Commit) -> bool:
        k = self.known
        try:
            data = delta_commit(self._table(), commit)
        except DeltaViewUnsupported as exc:
            k.unsupported = str(exc)
            self.known.warn_once(log, "unsupported", "%s has no Delta view: %s", self.storage.url, exc)
            return False
        if self.storage.put_if_absent(delta_commit_name(commit.version), data):
            k.version = max(k.version, commit.version)
            return True
        k.stopped = (
            f"version {commit.version} of the view holds bytes lakesink did not derive (a foreign writer)"
        )
        log.warning(
            "%s/%s: %s; the view is no longer updated (the lake is unaffected). `lakesink sync-views` "
            "resumes it once the view is removed or repaired",
            self.storage.url,
            delta_commit_name(commit.version),
            k.stopped,
        )
        _STOP.mark(self.storage, commit.version, k.stopped)
        return False


# View checkpoints -----------------------------------------------------------------------------

#: View checkpoints kept: writing one deletes the one this many intervals older (the view is
#: derived, and its commits are all kept: time travel to older versions reads those).
KEEP_CHECKPOINTS = 2


def table_interval(storage: Storage) -> int:
    """table.json's ``checkpoint_interval`` N (the lake's checkpoints, and the views' too)."""
    return read_table_metadata(storage).log_interval


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def live_at(storage: Storage, vlog: VersionedLog, version: int, interval: int, files: int | None) -> pa.Table:
    """The lake's live files at ``version`` (the list of its checkpoint there, or the nearest one
    below and the commits since), checked against the state's file count ``files``."""
    live = live_files_table(storage, vlog.table_id, version, interval=interval, read_commit=vlog.read_commit)
    if files is not None and live.num_rows != files:
        raise CorruptFileError(
            f"{storage.url}: {live.num_rows} live file(s) derived at version {version}, the log's state "
            f"says {files}"
        )
    return live


def added_times(
    storage: Storage,
    vlog: VersionedLog,
    live: pa.Table,
    *,
    times: CommitTimes | None,
    prior: Callable[[], pa.Table | None] | None = None,
) -> pa.Array[Any]:
    """Per live file, the time (ms) of the lake commit that added it: what that commit's view
    entry says (``modificationTime``). From ``times`` (version -> ms, filled here: a writer's
    process knows the versions it committed), then ``prior`` (a table of ``path`` -> ``ms`` from
    an older snapshot of the view, see :func:`prior_table`, read only when needed), the commits'
    headers, and for versions the lake's log no longer holds the Delta view's commit of that
    version; else the time of the oldest retained lake commit (a rebuilt view of a vacuumed
    lake: the only time left). In Arrow: a view of a million files is a million lookups."""
    # Arrays and scalars from lakesink_reader.arrays: pa.array and pa.scalar of Python values
    # (pc.fill_null's fill value too) import pandas, in the process that commits every batch.
    fill: Any = pc.fill_null  # pyarrow's stubs type its arguments too narrowly
    added: Any = live.column("added_version").combine_chunks().cast(pa.int64())
    versions: Any = fill(added, scalar(0, pa.int64()))
    # The lake's times are shared by its views, which run in threads: one fills at a time, and
    # the next finds them there (CommitTimes). None: a caller with no memo (a sync, a test).
    times = CommitTimes() if times is None else times
    with times.filling():
        return _added_times(storage, vlog, live, versions, times, prior)


def _added_times(
    storage: Storage,
    vlog: VersionedLog,
    live: pa.Table,
    versions: Any,
    times: dict[int, int],
    prior: Callable[[], pa.Table | None] | None,
) -> pa.Array[Any]:
    missing = [v for v in (int(v) for v in pc.unique(versions).to_pylist()) if v not in times]
    known: Any = None  # per live file: its time in the prior view, or null
    if prior is not None and missing:
        found = prior()
        if found is not None:
            where = pc.index_in(live.column("path").combine_chunks(), value_set=found.column("path"))
            known = pc.take(found.column("ms"), where)
    need = missing
    if need and known is not None:
        unknown = pc.and_(pc.is_in(versions, value_set=array(need, pa.int64())), pc.is_null(known))
        need = sorted(int(v) for v in pc.unique(pc.filter(versions, unknown)).to_pylist())
    if need:
        for v, header in zip(need, parallel(vlog.read_header, need, read_threads(storage)), strict=True):
            if header is not None:
                times[v] = _ms(header.committed_at)
        fallback: int | None = None
        for v in (v for v in need if v not in times):
            ms = _view_commit_ms(storage, v)
            if ms is None:
                if fallback is None:
                    fallback = _oldest_commit_ms(storage, vlog)
                ms = fallback
            times[v] = ms
    known_times = list(times.items())  # one look: a commit may add a time meanwhile
    by_version = pc.take(
        array([ms for _, ms in known_times], pa.int64()),
        pc.index_in(versions, value_set=array([v for v, _ in known_times], pa.int64())),
    )
    out: Any = by_version if known is None else pc.coalesce(by_version, known)
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out  # type: ignore[no-any-return]


def prior_table(paths: Any, ms: Any) -> pa.Table | None:
    """The ``prior`` of :func:`added_times`: view paths (percent-encoded, relative) -> ms, the
    rows with a null in either dropped; None when none is left."""
    table = pa.table({"path": paths, "ms": ms}).filter(
        pc.and_(pc.is_valid(paths), pc.is_valid(ms))
    )  # fmt: skip
    if table.num_rows == 0:
        return None
    path: Any = table.column("path").combine_chunks().cast(pa.string())
    if pc.any(pc.match_substring(path, "%")).as_py():
        path = array([unquote(p) for p in path.to_pylist()], pa.string())
    return pa.table({"path": path, "ms": table.column("ms").cast(pa.int64())})


def _view_commit_ms(storage: Storage, version: int) -> int | None:
    try:
        first = limits.read(storage, delta_commit_name(version), limits.VIEW_FILE).split(b"\n", 1)[0]
        return int(jsondoc.loads(first)["commitInfo"]["timestamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _oldest_commit_ms(storage: Storage, vlog: VersionedLog) -> int:
    oldest = oldest_commit(storage, vlog)
    header = vlog.read_header(oldest) if oldest is not None else None
    if header is None:
        raise CorruptFileError(f"{storage.url}: the lake's log has no commit to date its files by")
    return _ms(header.committed_at)


def view_checkpoints(storage: Storage) -> list[int]:
    """The versions of the view checkpoints there (a listing of ``_delta_log/``)."""
    found = []
    for f in storage.list(DELTA_LOG_DIR):
        name = f.name.rsplit("/", 1)[-1]
        if name.endswith(".checkpoint.parquet") and name[:20].isdigit() and len(name) == 39:
            found.append(int(name[:20]))
    return sorted(found)


#: A view checkpoint holds at least this many bytes on disk per row: each row is an action, and
#: each add names a distinct file by a name with 8+ random hex digits (lakesink writes ~10 bytes
#: a row). One of null rows (10M in 0.8 MB decoded to 3.8 GB; issue 51) is refused unread.
MIN_VIEW_BYTES_PER_ROW = 2
#: A view checkpoint is decoded this many rows at a time (lakesink writes row groups of 65,536).
VIEW_BATCH_ROWS = 65_536


def view_checkpoint_batches(
    storage: Storage, version: int, columns: Sequence[str], *, most_rows: int | None = None
) -> Iterator[pa.Table]:
    """The view checkpoint at ``version``, its ``columns`` only (dotted leaves: ``add.path``),
    decoded :data:`VIEW_BATCH_ROWS` rows at a time.

    Its bytes are read through the lake's storage -- no link followed, at most the view-file
    limit (``limits.VIEW_FILE``) -- and handed to pyarrow as a buffer: pyarrow's own file system
    follows links (issue 51). Before a row is decoded: at most ``most_rows`` rows (the lake's
    live files and writers there, when the caller knows them) and :data:`MIN_VIEW_BYTES_PER_ROW`
    bytes a row, row groups that unpack to at most ``MAX_LIST_EXPANSION`` times its size; its
    text columns are read dictionary-encoded and what they decode to, counted per use, is held
    to that bound too. FileNotFoundError when missing; CorruptFileError naming it otherwise.
    """
    name = delta_checkpoint_name(version)
    where = f"view checkpoint {redacted(storage.url.rstrip('/'))}/{name}"
    data = limits.read(storage, name, limits.VIEW_FILE)
    most = MAX_LIST_EXPANSION * max(len(data), 1)
    check_footer(data[-8:], len(data), where)
    try:
        opened = pq.ParquetFile(
            pa.BufferReader(data), read_dictionary=string_leaves(checkpoint_schema(), list(columns))
        )
        rows = opened.metadata.num_rows
        if rows * MIN_VIEW_BYTES_PER_ROW > len(data) or (most_rows is not None and rows > most_rows):
            raise CorruptFileError(
                f"{where}: {rows} rows in {len(data)} bytes"
                + (f", where the lake has {most_rows} actions to list" if most_rows is not None else "")
                + ": not a checkpoint lakesink wrote"
            )
        for group in range(opened.metadata.num_row_groups):
            unpacked = opened.metadata.row_group(group).total_byte_size
            if unpacked > most:
                raise CorruptFileError(
                    f"{where}: row group {group} unpacks to {unpacked} bytes: not lakesink's"
                )
        decoded = 0
        for batch in opened.iter_batches(batch_size=VIEW_BATCH_ROWS, columns=list(columns)):
            decoded += decoded_bytes(batch)
            if decoded > most:
                raise CorruptFileError(
                    f"{where}: its text columns decode to more than {most} bytes (their dictionaries "
                    "counted per use): not a checkpoint lakesink wrote"
                )
            yield plain(pa.Table.from_batches([batch]))
    except (OSError, pa.ArrowException, ValueError, KeyError) as exc:  # a damaged or foreign file
        said = one_line(exc)
        raise CorruptFileError(f"{where} cannot be read: {said}") from exc


def _prior_times(storage: Storage, version: int, live: pa.Table) -> pa.Table | None:
    """path -> modificationTime of the adds of the view checkpoint at ``version`` (None: none)
    that are among the ``live`` files: what is kept is bounded by them."""
    paths = live.column("path").combine_chunks()
    kept = []
    try:
        for batch in view_checkpoint_batches(storage, version, ["add.path", "add.modificationTime"]):
            adds: Any = batch.column("add").combine_chunks()
            found = prior_table(pc.struct_field(adds, "path"), pc.struct_field(adds, "modificationTime"))
            if found is not None:
                kept.append(found.filter(pc.is_in(found.column("path"), value_set=paths)))
    except (OSError, CorruptFileError) as exc:  # only a shortcut: the commits say the same
        log.info("not using the view checkpoint at version %d for file times: %s", version, exc)
        return None
    return pa.concat_tables(kept) if kept else None


#: The actions of a Delta-view commit beside the lake commit's file actions: commitInfo,
#: protocol, metaData, txn, and a margin.
_VIEW_COMMIT_OWN_ACTIONS = 16


def listed_files(
    storage: Storage, keep: Callable[[str], bool] | None = None
) -> tuple[int, dict[str, int]] | None:
    """What a Delta reader reads of the view at its newest version: that version and the files
    it lists (path relative to the lake -> size; only those ``keep`` says, when given: what is
    held is then bounded by the caller's files, not by the view); None when the lake has no
    view.

    The newest view checkpoint, then the view commits after it up to the first one missing
    (where a reader stops). For ``verify`` and ``vacuum``'s protection of a view that is behind:
    a view at the lake's version lists the lake's own files."""
    commits, checkpoints = set(), set()
    for f in storage.list(DELTA_LOG_DIR):
        name = f.name.rsplit("/", 1)[-1]
        if not name[:20].isdigit():
            continue
        if name.endswith(".json") and len(name) == 25:
            commits.add(int(name[:20]))
        elif name.endswith(".checkpoint.parquet") and len(name) == 39:
            checkpoints.add(int(name[:20]))
    if not commits and not checkpoints:
        return None
    files: dict[str, int] = {}
    version = -1
    if checkpoints:
        version = max(checkpoints)
        for batch in view_checkpoint_batches(storage, version, ["add.path", "add.size"]):
            for add in batch.column("add").to_pylist():
                if add is not None and (keep is None or keep(unquote(add["path"]))):
                    files[unquote(add["path"])] = int(add["size"])
    while version + 1 in commits:
        version += 1
        data = limits.read(storage, delta_commit_name(version), limits.VIEW_FILE)
        # A view commit holds one lake commit's actions and four of its own (commitInfo,
        # protocol, metaData, txn): more lines are a crafted file, refused before they are split
        # (fuzzer case 50,136: 735,420 lines in 256 MiB took verify 620 MiB).
        lines = data.count(b"\n") + 1
        if lines > limits.COMMIT_ACTIONS + _VIEW_COMMIT_OWN_ACTIONS:
            where = f"{redacted(storage.url.rstrip('/'))}/{delta_commit_name(version)}"
            raise CorruptFileError(
                f"{where}: {lines:,} lines, more than a Delta-view commit may hold (a lake commit's "
                f"{limits.COMMIT_ACTIONS:,} file actions and the view's own)"
            )
        for line in data.splitlines():
            action = jsondoc.loads(line)
            if "add" in action and (keep is None or keep(unquote(action["add"]["path"]))):
                files[unquote(action["add"]["path"])] = int(action["add"]["size"])
            elif "remove" in action:
                files.pop(unquote(action["remove"]["path"]), None)
    return (version, files) if version >= 0 else None


def _hint_version(storage: Storage) -> int | None:
    try:
        return jsondoc.count(
            jsondoc.loads(limits.read(storage, LAST_CHECKPOINT, limits.HINT))["version"], "version"
        )
    except (OSError, ValueError, KeyError, TypeError, CorruptFileError):
        return None


def write_view_checkpoint(
    storage: Storage,
    metadata: TableMetadata,
    vlog: VersionedLog,
    version: int,
    *,
    state: TableState | None = None,
    interval: int | None = None,
    times: CommitTimes | None = None,
    ahead_of_commit: bool = False,
) -> bool:
    """Make sure the view checkpoint at ``version`` exists, then advance ``_last_checkpoint``.

    Only ever after the view's commit ``version`` exists (a checkpoint of a version Delta
    readers cannot see would be a lie), except for a rebuild (``ahead_of_commit``): a view far
    behind gets its checkpoint first, then the commit, so that readers never meet the gap.
    Built from the lake -- its live files at ``version``
    (path, size, exact stats), the writers' last batches (``txn``), table.json (``protocol``,
    ``metaData``) -- never from the view. Written create-if-absent: a checkpoint already there
    (this process's, another writer's, or a Delta tool's) stands. Then the hint, when it names
    an older one, and the checkpoint ``KEEP_CHECKPOINTS`` intervals older is deleted.
    Returns whether this call created it.
    """
    interval = interval or table_interval(storage)
    if not ahead_of_commit and not storage.exists(delta_commit_name(version)):
        raise FileNotFoundError(f"{storage.url}/{delta_commit_name(version)}: no view commit to checkpoint")
    name = delta_checkpoint_name(version)
    created = False
    if not storage.exists(name):
        state = state if state is not None else vlog.snapshot(at_most=version).state
        if state.version != version:
            raise CorruptFileError(
                f"{storage.url}: the lake's state at version {version} is at {state.version}"
            )
        live = live_at(storage, vlog, version, interval, state.counts.files)
        hint = _hint_version(storage)
        prior = (
            functools.partial(_prior_times, storage, hint, live)
            if hint is not None and hint < version
            else None
        )
        stamps = added_times(storage, vlog, live, times=times, prior=prior)
        txns = [(w.id, w.last_batch, _ms(w.committed_at)) for w in state.writers.values()]
        # The schema the lake has at that version (schema evolution), as the commits' metaData say.
        schema = schema_at(metadata.schema, state.schema_at(version))
        table = delta_checkpoint(dataclasses.replace(metadata, schema=schema), live, stamps, txns)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=65_536, compression="zstd")
        data = sink.getvalue().to_pybytes()
        created = storage.put_if_absent(name, data)
        if not created:
            log.info("%s/%s exists with other bytes (another writer's): kept", storage.url, name)
        hint_doc = last_checkpoint_doc(version, table.num_rows, live.num_rows, len(data))
    else:  # there already: the hint needs its row count (``size`` is required), from the footer
        try:  # read through the lake's storage (no link followed), as every view checkpoint is
            there = limits.read(storage, name, limits.VIEW_FILE)
            check_footer(there[-8:], len(there), f"view checkpoint {storage.url}/{name}")
            rows = pq.ParquetFile(pa.BufferReader(there)).metadata.num_rows
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            said = one_line(exc)
            raise CorruptFileError(f"view checkpoint {storage.url}/{name} cannot be read: {said}") from exc
        hint_doc = json.dumps({"size": rows, "version": version}, separators=(",", ":")).encode()
    hint = _hint_version(storage)
    if hint is None or hint < version:
        storage.put(LAST_CHECKPOINT, hint_doc)
    older = version - KEEP_CHECKPOINTS * interval
    if older > 0 and (version % interval == 0):
        storage.delete(delta_checkpoint_name(older))
    if created:
        log.info("wrote the Delta view checkpoint of %s at version %d", storage.url, version)
    return created


def check_view_checkpoint(
    storage: Storage, vlog: VersionedLog, version: int, interval: int, writers: int
) -> str | None:
    """None when the view checkpoint at ``version`` holds exactly the lake's live files there
    (paths and sizes) and the table's protocol; else what differs. ``writers``: how many the
    lake has (a txn row each, at most). CorruptFileError when the lake cannot derive that
    version; a checkpoint that cannot be read, or holds more rows than the lake's actions
    there, differs."""
    live = live_at(storage, vlog, version, interval, None)
    expected = dict(zip(live.column("path").to_pylist(), live.column("bytes").to_pylist(), strict=True))
    seen: dict[str, int] = {}
    protocols = []
    columns = ["add.path", "add.size", "protocol.minWriterVersion"]
    try:
        # its rows: one add per live file, a txn per writer, protocol and metaData
        for batch in view_checkpoint_batches(
            storage, version, columns, most_rows=live.num_rows + writers + 2
        ):
            for row in batch.to_pylist():
                if row.get("add") is not None:
                    seen[unquote(row["add"]["path"])] = int(row["add"]["size"])
                if row.get("protocol") is not None:
                    protocols.append(row["protocol"])
    except CorruptFileError as exc:
        return str(exc)
    if seen != expected:
        extra, lost = len(set(seen) - set(expected)), len(set(expected) - set(seen))
        return (
            f"the view checkpoint at version {version} lists other files than the lake ({extra} more, "
            f"{lost} fewer)"
        )
    if len(protocols) != 1 or protocols[0].get("minWriterVersion") != 7:
        return f"the view checkpoint at version {version} has another protocol: {protocols}"
    return None


# Checking and syncing -------------------------------------------------------------------------


@dataclass
class DeltaViewReport:
    """The Delta view of a lake, as :func:`delta_sync` or :func:`check_view` found it.

    ``state``: ``ok`` (the view has every retained lake version, each with lakesink's bytes),
    ``absent`` (no view), ``behind`` (versions missing: ``missing``), ``foreign`` (``foreign``
    versions hold other bytes; writers stopped updating it), ``unsupported`` (the schema has
    types Delta cannot take). A view of a lake whose oldest versions are vacuumed starts at a
    view checkpoint at the oldest retained version.
    """

    path: str
    state: str = "ok"
    detail: str = ""
    lake_version: int | None = None
    view_version: int | None = None
    written: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    foreign: list[int] = field(default_factory=list)
    #: View checkpoints written by this sync.
    checkpoints: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in ("ok", "absent")

    def summary(self) -> str:
        return self.state + (f": {self.detail}" if self.detail else "")


def delta_sync(
    storage: Storage, *, write: bool = True, progress: Callable[[int, int], None] | None = None
) -> DeltaViewReport:
    """Write every Delta commit missing from the view of the lake at ``storage``, from the oldest
    retained lake version, and check the ones there (``write=False``: check only, as ``verify``).
    ``progress(done, total)`` after each lake version (``lakesink sync-views`` shows it).

    Resumes a stopped view when every version holds lakesink's bytes. Views of format-2 and
    foreach lakes do not exist (FormatVersionError / ValueError, from ``open_v3``).
    """
    metadata, vlog = open_epoch_log(storage, "the Delta view")
    report = DeltaViewReport(storage.url)
    try:
        delta_schema(metadata.schema)
    except DeltaViewUnsupported as exc:
        report.state, report.detail = "unsupported", str(exc)
        return report
    state = vlog.open()
    latest = state.version
    report.lake_version = latest if latest >= 0 else None
    present = {
        int(name[:-5])
        for f in storage.list("_delta_log")
        if (name := f.name.rsplit("/", 1)[-1]).endswith(".json") and name[:-5].isdigit() and len(name) == 25
    }
    report.view_version = max(present) if present else None
    if latest < 0:
        report.state = "absent" if not present else "ok"
        return report
    # From the oldest version the lake retains: a vacuum that committed its floor deletes the
    # files below it before it truncates their commits, so a commit still in the log may name
    # files that are gone, and a view version made of it would too (simulation seed 62934: a
    # sync stopped by a lost answer left the view at such a version, which no Delta reader
    # could open). The hook has the same floor (``_after``).
    oldest = max(oldest_commit(storage, vlog) or 0, state.retained_from)
    interval = table_interval(storage)
    checkpoints = view_checkpoints(storage)
    # A lake whose oldest versions are vacuumed: the view cannot hold them, and starts (again)
    # at a checkpoint at or above the oldest retained version.
    start_checkpoint: int | None = None
    vacuumed = oldest > 0 and not all(u in present for u in range(oldest))
    if vacuumed and not any(c >= oldest for c in checkpoints):
        start_checkpoint = oldest
    if not present and not write:
        report.state = "absent"
        return report
    if write:
        probe_store(storage)  # a writing command: refuse on a store that overwrites
    for v in range(oldest, latest + 1):
        if progress is not None and v > oldest:
            progress(v - oldest, latest + 1 - oldest)
        commit = vlog.read_commit(v)
        if commit is None:
            raise FileNotFoundError(f"{storage.url}: lake version {v} vanished while the view was synced")
        data = delta_commit(metadata, commit)
        name = delta_commit_name(v)
        if v in present:
            try:
                same = limits.read(storage, name, limits.VIEW_FILE) == data
            except FileNotFoundError:
                same = None
            if same is False:
                report.foreign.append(v)
            if same is not None:
                continue
        if not write or report.foreign:
            report.missing.append(v)
            continue
        if start_checkpoint is not None and start_checkpoint not in checkpoints:
            # A view starting again on a vacuumed lake gets its checkpoint before its first
            # commit, as a hook's rebuild does: a sync that dies halfway then never leaves
            # commits that no Delta reader can start from (simulation seed 7083: view commits 3
            # and 4 without 0..2 or a checkpoint).
            write_view_checkpoint(
                storage, metadata, vlog, start_checkpoint, interval=interval, ahead_of_commit=True
            )
            report.checkpoints.append(start_checkpoint)
            checkpoints = [*checkpoints, start_checkpoint]
        if storage.put_if_absent(name, data):
            report.written.append(v)
        else:
            report.foreign.append(v)
    if progress is not None:
        progress(latest + 1 - oldest, latest + 1 - oldest)
    if report.foreign:
        report.state = "foreign"
        report.detail = (
            f"version(s) {report.foreign[:10]} of the view hold bytes lakesink did not derive: a foreign "
            "writer touched it; writers no longer update it (remove `_delta_log/` and run "
            "`lakesink sync-views` to rebuild it; the lake is unaffected)"
        )
        if write:
            _STOP.mark(storage, report.foreign[0], report.detail)
    elif report.missing:
        report.state = "behind"
        report.detail = (
            f"{len(report.missing)} version(s) missing from {report.missing[0]}: run `lakesink sync-views`"
        )
    else:
        # Writers are never dropped from the state: the latest's bound every older version's.
        _sync_checkpoints(
            storage, metadata, vlog, report, latest, interval, start_checkpoint, checkpoints, write,
            len(state.writers),
        )  # fmt: skip
        if write and report.state == "ok":
            storage.delete(STOP_FILE)
    forget(storage, metadata.table_id or "")
    report.view_version = max(present | set(report.written)) if present or report.written else None
    return report


def _sync_checkpoints(
    storage: Storage,
    metadata: TableMetadata,
    vlog: VersionedLog,
    report: DeltaViewReport,
    latest: int,
    interval: int,
    start_checkpoint: int | None,
    checkpoints: list[int],
    write: bool,
    writers: int,
) -> None:
    """The view checkpoints: the one a view restarted on a vacuumed lake needs (at its oldest
    version), the newest due one, and the newest there checked against the lake (``writers``:
    how many the lake has)."""
    due = latest // interval * interval
    wanted = sorted({c for c in (start_checkpoint, due) if c is not None and c > 0})
    wanted = [c for c in wanted if storage.exists(delta_commit_name(c))]  # never without its commit
    for c in wanted:
        if c in checkpoints:
            continue
        if write:
            write_view_checkpoint(storage, metadata, vlog, c, interval=interval)
            report.checkpoints.append(c)
        elif c == start_checkpoint:
            report.state = "behind"
            report.detail = f"the lake's versions below {c} are vacuumed: the view needs a checkpoint at {c}"
    newest = max([c for c in checkpoints if c <= latest] + report.checkpoints, default=None)
    if newest is not None and report.state == "ok":
        try:
            problem = check_view_checkpoint(storage, vlog, newest, interval, writers)
        except CorruptFileError as exc:
            # The lake cannot derive that version any more (vacuumed below it): a view whose
            # newest checkpoint is that old is behind, which sync-views repairs (it writes the
            # checkpoint due at the latest version), not a reason for verify to crash.
            report.state = "behind"
            report.detail = (
                f"the view's newest checkpoint is at version {newest}, which the lake can no longer "
                f"derive ({exc}): run `lakesink sync-views {storage.url}`"
            )
            return
        if problem is not None:
            report.state, report.foreign, report.detail = "foreign", [newest], problem


def check_view(storage: Storage, metadata: TableMetadata, vlog: VersionedLog, latest: int) -> DeltaViewReport:
    """The cheap check of ``lakesink status``: the stop marker, and the view commit of the latest
    lake version compared with what lakesink derives (two or three reads)."""
    report = DeltaViewReport(storage.url, lake_version=latest if latest >= 0 else None)
    try:
        delta_schema(metadata.schema)
    except DeltaViewUnsupported as exc:
        report.state, report.detail = "unsupported", str(exc)
        return report
    if storage.exists(STOP_FILE):
        report.state, report.detail = "foreign", _STOP.reason(storage)
        return report
    if latest < 0:
        report.state = "absent"
        return report
    try:
        existing = limits.read(storage, delta_commit_name(latest), limits.VIEW_FILE)
    except FileNotFoundError:
        existing = None
    if existing is None:
        report.state = "behind" if storage.exists(delta_commit_name(0)) else "absent"
        if report.state == "behind":
            report.detail = f"the view lacks lake version {latest}: run `lakesink sync-views`"
        return report
    commit = vlog.read_commit(latest)
    if commit is not None and delta_commit(metadata, commit) != existing:
        report.state = "foreign"
        report.foreign = [latest]
        report.detail = f"version {latest} of the view holds bytes lakesink did not derive (a foreign writer)"
        return report
    report.view_version = latest
    return report
