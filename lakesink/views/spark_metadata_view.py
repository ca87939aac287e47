"""The Spark view of a format-3 epoch lake: ``_spark_metadata/``, so that ``spark.read.parquet(lake)``
reads exactly the committed files.

When Spark's batch reader is given one folder that holds ``_spark_metadata/``
(``FileStreamSink.hasMetadata``), it does not list the folder: ``MetadataLogFileIndex`` reads
the files the log names (``FileStreamSinkLog.allFiles``), the log Spark's own file sink writes.
What Spark 4.x reads there (``CompactibleFileStreamLog``, ``FileStreamSinkLog``,
``SinkFileStatus``, read at apache/spark master, Spark 4.x):

- batch files named by a batch id, ``<id>`` or ``<id>.compact``: ``v1`` then one JSON line per
  file, ``{"path": <absolute, URI-encoded>, "size", "isDir", "modificationTime",
  "blockReplication", "blockSize", "action": "add"}``; other names (ours under ``_lakesink/``,
  staged copies) are skipped;
- a reader takes the newest id L and the interval K, and reads the compact batch at or below L
  (``floor((L + 1) / K) * K - 1``) and every id after it up to L -- all of which must exist.
  Compact batches are the ids with ``(id + 1) % K == 0``;
- K is ``latest - previous`` of the two newest ``.compact`` files; with fewer than two, the
  reader's own ``spark.sql.streaming.fileSink.log.compactInterval`` decides (10 unless set);
- **nothing removes a file but a compact batch**: since Spark 3.1 ``action`` is not read (a
  ``"delete"`` entry would *add* the file), and entries of the batches after a compact only add.

So the view (:class:`SparkView`, an ``after_commit`` hook):

- lake version ``v`` is one batch. A version that only adds files is the next id, listing its
  adds; a version that removes files (a compaction) -- or one the view cannot continue from
  (the view is new, behind, or the lake was written without it) -- jumps to the next compact id
  and lists every live file at ``v``. Every compact id reached is written as a compact (the
  live files). The ids skipped by a jump are never read: a reader starts at the newest compact.
- a lake whose schema evolved (a version recorded a schema): each compact batch also lists
  :data:`SUMMARY`, ``_common_metadata`` at the lake's root holding the lake's schema, so that
  ``spark.read.parquet(lake)`` reads the lake's columns, not the first file's; a version that
  changes the schema jumps to a compact batch for it.
- K is :data:`COMPACT_INTERVAL` and pinned from the start: the first batch is the compact
  ``2K - 1`` (ids ``K - 1`` is an empty pin ``.compact``), so every reader, whatever its
  configuration, computes the same K from the two newest compacts.
- which lake version a batch holds: ``_spark_metadata/_lakesink/<id:020d>.json``
  (``{"batch", "table_id", "version"}``), written before each compact batch; a batch after
  the newest such anchor at or below it holds ``anchor version + (id - anchor id)``. An anchor
  whose batch is not there (its writer died between the two) is finished by the next writer
  that reaches its id -- the compact of the version it names, whose files ``vacuum`` and the
  sweep keep until then (:func:`promised_files`) -- or, when the lake vacuumed that version
  from its log, replaced. Maintenance's update (compaction, vacuum) finishes it too, even when
  it is all the view holds (:meth:`SparkView._promised`).
- create-if-absent, like the Delta view: a batch that adds is a pure function of the lake
  commit (equal bytes = done); a compact is compared by its files (paths and sizes: the times
  of files added in versions the lake vacuumed may differ between two derivations). Other
  content means a foreign writer: the view stops (:data:`STOP_FILE`), ``lakesink status`` and
  ``verify`` say so, and ``lakesink sync-views`` resumes it once ``_spark_metadata/`` is
  removed. The lake's own log is never touched.
- paths are absolute URIs of the lake as Spark names it: ``file://`` for local lakes,
  ``s3a://`` for ``s3://`` lakes (Hadoop's S3 client), ``hdfs://`` as is. A lake moved or
  reached under another URI needs its view rebuilt (remove ``_spark_metadata/``, sync).
- after each compact ``c``, batches and anchors below ``c - K`` are deleted (a reader that
  started at the previous compact still finds its files; Spark's own sink deletes old batches
  the same way).
"""

from __future__ import annotations

import functools
import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from lakesink.views.delta_view import added_times, live_at, prior_table, table_interval
from lakesink.views.hook import ViewHook
from lakesink.views.memo import CommitTimes, StopFile, ViewMemo, ViewMemos
from lakesink_reader import jsondoc, limits
from lakesink_reader.arrays import array, scalar
from lakesink_reader.errors import CorruptFileError
from lakesink_reader.format.opening import open_epoch_log
from lakesink_reader.format.schemas import decode_schema, fit_problems
from lakesink_reader.format.table import probe_store, read_table_metadata
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.names import META_DIR, unsafe_name
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)

SPARK_DIR = "_spark_metadata"
ANCHOR_DIR = f"{SPARK_DIR}/_lakesink"
#: Written when the view holds content lakesink did not derive: writers stop updating it.
STOP_FILE = f"{META_DIR}/spark_view_stopped.json"
_STOP = StopFile(STOP_FILE, "says the view holds content lakesink did not derive", log)
#: Parquet's summary file at the lake's root, listed in the compact batches of a lake whose
#: schema evolved: Spark's reader without ``mergeSchema`` takes the schema of the summary when
#: the listing has one, else of the first data file by path -- an older file of fewer or
#: narrower columns, so it dropped the lake's new columns or failed on a widened one (measured
#: with Spark 4.3: with the summary it reads the lake's schema, widening older files'
#: ints itself, and reads no rows of it). Only a root-level file named so counts. It is the
#: one file of the view that is replaced (when the schema changes), never by a narrower one.
SUMMARY = "_common_metadata"
#: K: batches between two compacts (Spark's own default). A compact lists every live file.
COMPACT_INTERVAL = 10
#: The empty compact that pins K, and the first real batch (lake version of the first anchor).
PIN_BATCH = COMPACT_INTERVAL - 1
FIRST_BATCH = 2 * COMPACT_INTERVAL - 1
#: A view this many versions behind, or less, is filled in order; further behind, it jumps.
GAP_FILL = 16
#: Races lost to other lakesink processes (other writers of the lake) before a commit gives up.
RACE_RETRIES = 4
#: ``SinkFileStatus.blockSize``: informational for Parquet reads (splits follow
#: ``spark.sql.files.maxPartitionBytes``); Hadoop's local and S3A default.
BLOCK_SIZE = 32 * 1024 * 1024
_BATCH = re.compile(r"^(\d+)(\.compact)?$")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def is_compact(batch: int) -> bool:
    return (batch + 1) % COMPACT_INTERVAL == 0


def batch_name(batch: int) -> str:
    return f"{SPARK_DIR}/{batch}" + (".compact" if is_compact(batch) else "")


def anchor_name(batch: int) -> str:
    return f"{ANCHOR_DIR}/{batch:020d}.json"


def next_batch(previous: int | None, *, jump: bool) -> int:
    """The batch after ``previous`` (None: the view is empty); ``jump``: the next compact id."""
    if previous is None:
        return FIRST_BATCH
    batch = previous + 1
    if jump and not is_compact(batch):
        batch = (batch // COMPACT_INTERVAL + 1) * COMPACT_INTERVAL - 1
    return batch


def base_uri(storage: Storage) -> str:
    """The lake's root as Spark's Hadoop file systems name it (``s3://`` is read as ``s3a://``)."""
    url = storage.url.rstrip("/")
    if url.startswith("s3://"):
        return "s3a://" + quote(url[len("s3://") :], safe="/")
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{quote(rest, safe='/:@')}"
    return "file://" + quote(url, safe="/")


def _entry(uri: str, size: int, ms: int) -> str:
    """One ``SinkFileStatus`` line (``uri`` is percent-encoded: nothing in it needs JSON escapes)."""
    return (
        f'{{"path":"{uri}","size":{int(size)},"isDir":false,"modificationTime":{int(ms)},'
        f'"blockReplication":1,"blockSize":{BLOCK_SIZE},"action":"add"}}'
    )


def _batch_bytes(entries: list[str]) -> bytes:
    return ("v1" + "".join("\n" + e for e in entries)).encode("utf-8")


def adds_batch(base: str, commit: Commit) -> bytes:
    """The batch of a lake version that only adds files: its adds, at the commit's time."""
    ms = _ms(commit.header.committed_at)
    return _batch_bytes(
        [
            _entry(f"{base}/{quote(a.path, safe='/')}", a.size, ms)
            for a in sorted(commit.adds, key=lambda a: a.path)
        ]
    )


#: Path characters ``quote(p, safe="/")`` leaves as they are: a path of only these needs no quoting.
_UNQUOTED_PATH = r"^[A-Za-z0-9_.~/-]*$"


def compact_batch(base: str, live: pa.Table, stamps: pa.Array[Any]) -> bytes:
    """A compact batch: every live file (the lake's list at one version, sorted by path).

    Built in Arrow, not as a Python string per file: at a million live files the batch is
    ~200 MB, and building it from Python strings took 0.75 GiB and 1.5 s (Arrow: 0.35 GiB,
    0.8 s). The bytes are exactly those of :func:`_entry` per file (two writers must derive
    the same view; tests/test_spark_view.py compares them).
    """
    if live.num_rows == 0:
        return _batch_bytes([])
    paths = live.column("path").combine_chunks().cast(pa.string())
    if not pc.all(pc.match_substring_regex(paths, _UNQUOTED_PATH)).as_py():
        paths = array([quote(str(p), safe="/") for p in paths.to_pylist()], pa.string())
    # Python values handed to pyarrow.compute become pa.scalar, which imports pandas in the
    # process that commits every batch: scalars from lakesink_reader.arrays instead.
    fill: Any = pc.fill_null  # pyarrow's stubs type its arguments too narrowly
    sizes: Any = fill(live.column("bytes").combine_chunks().cast(pa.int64()), scalar(0, pa.int64()))
    times: Any = fill(stamps.cast(pa.int64()), scalar(0, pa.int64()))
    sizes, times = (a.cast(pa.int64()).cast(pa.string()) for a in (sizes, times))
    # Each line starts with its newline: the batch is then the header and the lines' bytes back
    # to back, copied out of Arrow once.
    text = functools.partial(scalar, type=pa.string())
    lines = pc.binary_join_element_wise(
        text("\n"),
        text(f'{{"path":"{base}/'),
        paths,
        text('","size":'),
        sizes,
        text(',"isDir":false,"modificationTime":'),
        times,
        text(f',"blockReplication":1,"blockSize":{BLOCK_SIZE},"action":"add"}}'),
        text(""),
    )
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    bounds = pa.Array.from_buffers(
        pa.int32(), len(lines) + 1, [None, lines.buffers()[1]], offset=lines.offset
    )
    first, end = bounds[0].as_py(), bounds[len(lines)].as_py()
    return b"v1" + bytes(lines.buffers()[2][first:end].to_pybytes())


def iter_batch(data: bytes) -> Iterator[dict[str, object]]:
    """The entries of a batch file, decoded one line at a time; ValueError when it is not
    Spark's ``v1`` format (UnicodeDecodeError, a ValueError, for bytes that are not UTF-8).

    One at a time: a batch's writer chooses its length, and its 256 MiB limit holds ~1 million
    short entries, each ~1.5 KB decoded -- a crafted batch of 400,000 (76 MB) took `verify`
    to 656 MiB and 18 s holding them all (fuzzer, session 18, v3views case 7)."""
    end = data.find(b"\n")
    header = data if end < 0 else data[:end]
    if header != b"v1":
        raise ValueError(f"not a v1 batch: {header[:20].decode('utf-8', 'replace')!r}")
    start = len(data) if end < 0 else end + 1
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end > start:
            yield jsondoc.loads(data[start:end].decode("utf-8"))
        start = end + 1


def parse_batch(data: bytes) -> list[dict[str, object]]:
    """The entries of a batch file (see :func:`iter_batch`: for a batch from a lake, iterate)."""
    return list(iter_batch(data))


def _files_of(data: bytes, base: str) -> dict[str, int] | None:
    """path (relative to the lake) -> size of a batch's entries; None when unreadable or when an
    entry is outside the lake, not an ``add``, a directory, or of no size lakesink writes."""
    out: dict[str, int] = {}
    try:
        for e in iter_batch(data):
            path = e.get("path")
            if path == f"{base}/{SUMMARY}":
                continue  # the schema summary: not a data file of the lake
            if (
                not isinstance(path, str)
                or not path.startswith(base + "/")
                or e.get("action") != "add"
                or e.get("isDir")
            ):
                return None
            name = unquote(path[len(base) + 1 :])
            if unsafe_name(name):  # never a name lakesink writes: not the view it derives
                return None
            out[name] = jsondoc.count(e.get("size"), "size")
    except (ValueError, UnicodeDecodeError):  # jsondoc.count: ValueError for a size out of range
        return None
    return out


# The view's layout as found in storage -----------------------------------------------------------


@dataclass
class Layout:
    """The batch ids and anchors under ``_spark_metadata/`` (one listing each)."""

    batches: dict[int, str]  # id -> name
    anchors: dict[int, int]  # id -> lake version

    @property
    def latest(self) -> int | None:
        real = [b for b in self.batches if b != PIN_BATCH or self.anchors.get(b) is not None]
        return max(real) if real else None

    def version_of(self, batch: int) -> int | None:
        """The lake version batch ``batch`` holds (None: no anchor explains it)."""
        below = [a for a in self.anchors if a <= batch]
        if not below:
            return None
        a = max(below)
        return self.anchors[a] + (batch - a)

    def batch_of(self, version: int) -> int | None:
        """The batch holding lake version ``version``, when the view has it."""
        latest = self.latest
        if latest is None:
            return None
        at = [(v, a) for a, v in self.anchors.items() if v <= version]
        if not at:
            return None
        v, a = max(at)
        batch = a + (version - v)
        return batch if batch <= latest and batch in self.batches else None


def read_layout(storage: Storage) -> Layout:
    """The view's layout, from listings that agree with each other.

    The batches and the anchors are two listings, not one snapshot: a writer that compacts the
    view between them (writes a newer anchor and compact batch, then deletes the older ones)
    leaves the first listing's newest batch without the anchor that explained it in the
    second, which looks like a foreign batch -- and a foreign view is stopped for good
    (simulation seed 103819: a maintenance hook's listings straddled another writer's two
    compact batches). So a newest batch no anchor explains is looked at again, until two
    layouts in a row are the same: writers only add newer names and delete older ones, so two
    equal layouts mean nothing moved between them, and what they show is the view's own.
    """
    layout = _read_layout_once(storage)
    for _ in range(RACE_RETRIES):
        top = layout.latest
        if top is None or layout.version_of(top) is not None:
            break
        again = _read_layout_once(storage)
        if again == layout:
            break  # the same twice: unexplained for real
        layout = again
    return layout


def _read_layout_once(storage: Storage) -> Layout:
    batches: dict[int, str] = {}
    for f in storage.list(SPARK_DIR):
        name = f.name.rsplit("/", 1)[-1]
        if f.name != f"{SPARK_DIR}/{name}":
            continue
        m = _BATCH.match(name)
        if m is not None and bool(m.group(2)) == is_compact(int(m.group(1))):
            batches[int(m.group(1))] = f.name
    anchors: dict[int, int] = {}
    for f in storage.list(ANCHOR_DIR):
        name = f.name.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:-5].isdigit():
            try:
                doc = jsondoc.loads(limits.read(storage, f.name, limits.VIEW_NOTE))
                anchors[int(doc["batch"])] = int(doc["version"])
            except (FileNotFoundError, ValueError, KeyError, TypeError, CorruptFileError):
                # Gone since the listing, or not an anchor of ours. Any other failed read raises:
                # skipped, it would leave a batch no anchor explains -- and the view stopped as
                # foreign for good (simulation seed 3041).
                continue
    return Layout(batches, anchors)


def listed_files(
    storage: Storage, keep: Callable[[str], bool] | None = None
) -> tuple[int, dict[str, int]] | None:
    """What ``spark.read.parquet(lake)`` reads of the view: the lake version its newest batch
    holds and the files listed by the newest compact batch and the batches after it (path
    relative to the lake -> size; only those ``keep`` says, when given); None when there is no
    view lakesink wrote. Entries outside
    the lake are left out (a foreign view: ``verify`` says so on its own)."""
    layout = read_layout(storage)
    top = layout.latest
    version = layout.version_of(top) if top is not None else None
    if top is None or version is None:
        return None
    base = base_uri(storage) + "/"
    files: dict[str, int] = {}
    for b in range(max((top + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1, 0), top + 1):
        if b not in layout.batches:
            continue
        for entry in iter_batch(limits.read(storage, layout.batches[b], limits.VIEW_FILE)):
            path = entry.get("path")
            if isinstance(path, str) and path.startswith(base) and path != base + SUMMARY:
                name = unquote(path[len(base) :])
                if keep is None or keep(name):
                    size = entry.get("size")  # the view writer's: a size lakesink writes, or -1
                    files[name] = size if isinstance(size, int) and not isinstance(size, bool) else -1
    return version, files


def promised_files(storage: Storage, floor: int) -> list[tuple[int, int, dict[str, int]]]:
    """The compact anchors above the view's newest batch whose batch is not written yet and
    that name a lake version below ``floor``: (batch id, version, that version's live files,
    path -> size) each. Readers do not read these files yet, but the next writer to reach the
    id writes that version's compact (what the anchor's writer, perhaps alive but slow, would
    write; :func:`write_version`), so maintenance must keep them until then: the simulation's
    seed 30060 swept them, and the fill that followed listed deleted files. A version the
    lake's log no longer holds promises nothing: its anchor is taken over, not filled."""
    layout = read_layout(storage)
    top = layout.latest
    pending = {
        b: v
        for b, v in layout.anchors.items()
        if v < floor and b not in layout.batches and (top is None or b > top)
    }
    if not pending:
        return []
    _, vlog = open_epoch_log(storage, "the Spark view")
    interval = table_interval(storage)
    out: list[tuple[int, int, dict[str, int]]] = []
    for b, v in sorted(pending.items()):
        if vlog.read_commit(v) is None:
            continue  # as in _fill: nobody can write it
        try:
            live = live_at(storage, vlog, v, interval, None)
        except CorruptFileError:
            continue
        paths, sizes = live.column("path").to_pylist(), live.column("bytes").to_pylist()
        out.append((b, v, {str(p): int(n or 0) for p, n in zip(paths, sizes, strict=True)}))
    return out


# The hook ----------------------------------------------------------------------------------------


@dataclass
class _Known(ViewMemo):
    position: tuple[int, int] | None = None  # (lake version, batch) last known written


_MEMOS = ViewMemos(_Known)


forget = _MEMOS.forget  # what this process knows of a lake's view goes: after a sync, in tests


class Foreign(Exception):
    """The view holds content lakesink did not derive."""


class LostRace(Exception):
    """Another lakesink process placed another version where this one meant to write."""


class SparkView(ViewHook[_Known]):
    """The ``after_commit`` hook that keeps a lake's ``_spark_metadata/`` up to date.

    ``create``: a writer with ``spark_metadata`` on may start the view; else (compaction,
    vacuum) only a view that is there is updated (a fillable anchor of its first batch counts).
    Either way a view that is behind is brought up to the commit's version (in order when it is
    a few versions behind, else a jump to a compact).
    """

    view = "Spark view (_spark_metadata/)"
    memos = _MEMOS
    log = log
    keeps_times = True

    def _after(self, commit: Commit, state: TableState) -> None:
        k, v = self.known, commit.version
        if _STOP.stops(self.storage, k, "Spark view"):
            return
        vlog = VersionedLog(self.storage, self.table_id, checkpoint_interval=self._interval())
        for _ in range(RACE_RETRIES):
            try:
                self._advance(vlog, commit, state)
                return
            except LostRace:
                k.position = None  # another lakesink process wrote there first: look again
            except Foreign as exc:
                k.stopped = str(exc)
                log.warning(
                    "%s: %s; the Spark view is no longer updated (the lake is unaffected)",
                    self.storage.url,
                    exc,
                )
                _STOP.mark(self.storage, v, k.stopped)
                return
        log.info("the Spark view of %s: lost %d races at version %d; the next commit catches up",
                 self.storage.url, RACE_RETRIES, v)  # fmt: skip

    def _advance(self, vlog: VersionedLog, commit: Commit, state: TableState) -> None:
        """Write version ``v`` on top of ``v - 1``'s batch: after filling a small gap in order (so
        that every process places each version alike), or as a jump when the view is far behind
        (or absent, for a lake with more than :data:`GAP_FILL` versions)."""
        k, v = self.known, commit.version
        if k.position is not None and k.position[0] == v - 1:
            write = functools.partial(
                write_version, self.storage, vlog, interval=self._interval(), times=k.times
            )
            k.position = (v, write(commit, k.position[1], jump=bool(commit.removes), state=state))
            return
        # Behind, or placing the view anew: never at a version the lake no longer retains, whose
        # files a sweep or vacuum may have removed already (a slow writer's hook bringing the
        # view up from version 0 of a vacuumed lake would list them: simulation seed 211).
        floor = max(state.retained_from, vlog.open().retained_from)
        if v < floor:
            return  # this version is vacuumed: a later commit or `sync-views` places the view
        write = functools.partial(write_version, self.storage, vlog, interval=self._interval(), times=k.times)
        layout = read_layout(self.storage)
        top = layout.latest
        top_version = layout.version_of(top) if top is not None else None
        if top is not None and top_version is None:
            raise Foreign(
                f"batch {top} of _spark_metadata/ is not one lakesink wrote (no anchor explains it)"
            )
        if top_version is not None and top_version >= v:
            at = layout.batch_of(v)
            k.position = (v, at) if at is not None else None
            return  # written already (by another process)
        first = 0 if top_version is None else top_version + 1
        if top is None and not self.create and not self._promised(vlog, layout):
            return  # no view to continue (the writers of this lake keep none)
        if v - first > GAP_FILL or first < floor or (top is None and vlog.read_header(0) is None):
            k.position = (v, write(commit, top, jump=True, state=state))  # far behind: jump
            return
        previous = top
        for u in range(first, v):
            older = vlog.read_commit(u)
            if older is None:  # vacuumed meanwhile: jump instead
                k.position = (v, write(commit, top, jump=True, state=state))
                return
            previous = write(older, previous, jump=bool(older.removes))
        k.position = (v, write(commit, previous, jump=bool(commit.removes), state=state))

    def _promised(self, vlog: VersionedLog, layout: Layout) -> bool:
        """Whether a view without a batch is one the lake has all the same: a writer keeping it
        put the anchor of its first batch and stopped (died, or stalls) before the batch, and the
        lake's log still holds the version that anchor names. Maintenance (``create`` off) then
        brings that view up like any other: its update fills the anchor with what its writer
        would write (:func:`write_version`) and puts the lake's version after it. Else nothing
        but a writer's next commit or ``sync-views`` would, while ``vacuum`` and the sweep keep
        that version's files for the anchor (:func:`promised_files`, seed 30060): below the
        floor, for good -- the simulation's seed 36381, whose maintenance never converged. A
        version the log no longer holds is not filled but taken over (as a writer does); that
        is left to the view's writers, as is an anchor of another table (foreign)."""
        if FIRST_BATCH not in layout.anchors:
            return False  # (the common case, a lake without views: no read beyond the listing)
        version = _unfilled(self.storage, vlog, FIRST_BATCH)
        return version is not None and vlog.read_commit(version) is not None

    def _interval(self) -> int:
        if self.known.interval is None:
            self.known.interval = table_interval(self.storage)
        return self.known.interval


def write_version(
    storage: Storage,
    vlog: VersionedLog,
    commit: Commit,
    previous: int | None,
    *,
    jump: bool,
    state: TableState | None = None,
    interval: int | None = None,
    times: CommitTimes | None = None,
) -> int:
    """Write lake version ``commit.version`` as the batch after ``previous`` (None: the view's
    first batch); returns its id. Foreign when the view holds other content there."""
    base = base_uri(storage)
    v = commit.version
    # A version that changes the lake's schema is a compact batch too: it lists the summary.
    jump = jump or commit.header.schema is not None
    batch = next_batch(previous, jump=jump or previous is None)
    if not is_compact(batch):
        data = adds_batch(base, commit)
        if not storage.put_if_absent(batch_name(batch), data):
            _lost_or_foreign(storage, vlog, batch, v)
        return batch
    if batch == FIRST_BATCH:
        _put_same(storage, batch_name(PIN_BATCH), _batch_bytes([]))
    for _ in range(RACE_RETRIES):  # bounded: a delete that has not taken effect yet, say
        anchor = json.dumps(
            {"batch": batch, "table_id": vlog.table_id, "version": v}, sort_keys=True
        ).encode()
        if storage.put_if_absent(anchor_name(batch), anchor):
            break
        there = _unfilled(storage, vlog, batch)
        if there == v:
            break  # this version's own anchor (equal bytes, on a store that refuses them anyway)
        if there is None:
            _lost_or_foreign(storage, vlog, batch, v)
        # Another version's anchor and no batch: a writer died between the two (or is writing
        # it). Waiting would wait forever on a dead writer, and skipping the id would leave the
        # two newest compacts 2K apart (Spark reads K from them): write what the anchor says --
        # what that writer would write, if it is alive but slow -- even below ``floor`` (its
        # files are there: maintenance keeps what such an anchor names, seed 30060): taking
        # the id over instead races it (its compact would land under our anchor: simulation
        # seed 2770). The caller's version goes in the next compact id right after.
        if not _fill(storage, vlog, batch, there, interval, times):
            storage.delete(anchor_name(batch))  # its version is vacuumed: nobody can write it
            continue
        if there > v:
            raise LostRace(f"compact batch {batch} holds version {there}")
        batch += COMPACT_INTERVAL  # on top of it, as a jump: a compact of every live file
    else:
        raise LostRace(f"compact batch {batch} of _spark_metadata/ stayed taken: the next commit looks again")
    interval = interval or table_interval(storage)
    if state is None or state.version != v:
        state = vlog.snapshot(at_most=v).state
    live = live_at(storage, vlog, v, interval, state.counts.files)
    prior = functools.partial(_prior, storage, base, batch - COMPACT_INTERVAL)
    stamps = added_times(storage, vlog, live, times=times, prior=prior)
    data = compact_batch(base, live, stamps)
    evolved = state.schema_at(v)
    if evolved is not None:
        data += b"\n" + summary_entry(storage, base, evolved, _ms(commit.header.committed_at)).encode()
    name = batch_name(batch)
    if not storage.put_if_absent(name, data):
        expected = dict(zip(live.column("path").to_pylist(), live.column("bytes").to_pylist(), strict=True))
        if _files_of(limits.read(storage, name, limits.VIEW_FILE), base) != expected:
            raise Foreign(
                f"compact batch {batch} of _spark_metadata/ lists other files than the lake at version {v}"
            )
    _clean(storage, batch)
    log.info(
        "wrote the Spark view of %s at version %d: compact batch %d, %d file(s)",
        storage.url,
        v,
        batch,
        live.num_rows,
    )
    return batch


def summary_bytes(storage: Storage, encoded: str) -> bytes:
    """The bytes of :data:`SUMMARY` for the lake's schema ``encoded`` (a recorded one): a Parquet
    footer without row groups, of the data columns (a partitioned lake's files hold none of its
    partition columns)."""
    schema = decode_schema(encoded, f"{storage.url}: the lake's schema")
    partition_columns = read_table_metadata(storage).partition_columns
    schema = pa.schema([f for f in schema if f.name not in partition_columns])
    sink = pa.BufferOutputStream()
    pq.write_metadata(schema.remove_metadata(), sink)
    return bytes(sink.getvalue().to_pybytes())


def summary_entry(storage: Storage, base: str, encoded: str, ms: int) -> str:
    """Make :data:`SUMMARY` hold the lake's schema ``encoded`` -- unless it holds a wider one
    already (a newer version's: the lake's schema only grows) -- and return its entry for a
    compact batch, with the size it has now (Spark reads its footer by that size)."""
    data = summary_bytes(storage, encoded)
    try:
        existing: bytes | None = limits.read(storage, SUMMARY, limits.VIEW_FILE)
    except FileNotFoundError:
        existing = None
    if existing != data:
        keep = False
        if existing is not None:
            try:
                there = pq.read_schema(io.BytesIO(existing))
                ours = pq.read_schema(io.BytesIO(data))
                keep = not fit_problems(ours, there)  # as wide or wider: ours is older
            except Exception:  # noqa: BLE001 -- unreadable: replaced by ours
                keep = False
        if keep and existing is not None:
            data = existing
        else:
            storage.put(SUMMARY, data)
    return _entry(f"{base}/{SUMMARY}", len(data), ms)


def _lost_or_foreign(storage: Storage, vlog: VersionedLog, batch: int, version: int) -> NoReturn:
    """Batch ``batch`` (or its anchor) was taken: LostRace when another lakesink process placed
    another lake version there (its content is what lakesink derives for that version), else
    Foreign."""
    try:
        doc = (
            jsondoc.loads(limits.read(storage, anchor_name(batch), limits.VIEW_NOTE))
            if is_compact(batch)
            else None
        )
    except (FileNotFoundError, ValueError, CorruptFileError):
        doc = None
    if doc is not None:
        if doc.get("table_id") == vlog.table_id and doc.get("version") != version:
            raise LostRace(f"compact batch {batch} holds version {doc.get('version')}")
        raise Foreign(f"the anchor of batch {batch} of _spark_metadata/ is not this lake's version {version}")
    layout = read_layout(storage)
    other = layout.version_of(batch)
    if other is not None and other != version and batch in layout.batches:
        commit = vlog.read_commit(other)
        if commit is not None and limits.read(storage, layout.batches[batch], limits.VIEW_FILE) == adds_batch(
            base_uri(storage), commit
        ):
            raise LostRace(f"batch {batch} holds version {other}")
    raise Foreign(f"batch {batch} of _spark_metadata/ holds content lakesink did not derive")


def _unfilled(storage: Storage, vlog: VersionedLog, batch: int) -> int | None:
    """The lake version that this lake's anchor of compact batch ``batch`` names, when the batch
    file is not there (None: another table's anchor, an unreadable one, or a batch written)."""
    try:
        doc = jsondoc.loads(limits.read(storage, anchor_name(batch), limits.VIEW_NOTE))
    except (FileNotFoundError, ValueError, CorruptFileError):
        return None
    version = doc.get("version")
    if doc.get("table_id") != vlog.table_id or not isinstance(version, int):
        return None
    return None if storage.exists(batch_name(batch)) else version


def _fill(
    storage: Storage,
    vlog: VersionedLog,
    batch: int,
    version: int,
    interval: int | None,
    times: CommitTimes | None,
) -> bool:
    """Write compact batch ``batch`` for lake version ``version``, as its anchor says; False when
    the lake no longer holds that version (vacuumed)."""
    commit = vlog.read_commit(version)
    if commit is None:
        return False
    try:
        write_version(storage, vlog, commit, batch - 1, jump=True, interval=interval, times=times)
    except CorruptFileError:
        return False
    return True


def _put_same(storage: Storage, name: str, data: bytes) -> None:
    if not storage.put_if_absent(name, data):
        raise Foreign(f"{name} holds content lakesink did not derive")


def _prior(storage: Storage, base: str, batch: int) -> pa.Table | None:
    """path -> modificationTime of the compact ``batch`` and the batches after it (the times a
    new compact keeps for files it carries over), read with Arrow's JSON reader: a compact batch
    of a million files is a million lines."""
    if batch < FIRST_BATCH:
        return None
    fields: list[tuple[str, pa.DataType]] = [("path", pa.string()), ("modificationTime", pa.int64())]
    schema = pa.schema(fields)
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    tables = []
    for b in reversed(range(batch, batch + COMPACT_INTERVAL)):  # a later batch's entry wins
        try:
            data = limits.read(storage, batch_name(b), limits.VIEW_FILE)
        except FileNotFoundError:
            continue
        header, _, body = data.partition(b"\n")
        if header != b"v1" or not body.strip():
            continue
        try:
            tables.append(pj.read_json(io.BytesIO(body), parse_options=options))
        except (pa.ArrowInvalid, ValueError):
            continue
    if not tables:
        return None
    entries = pa.concat_tables(tables)
    prefix = base + "/"
    paths: Any = entries.column("path").combine_chunks()
    ours = pc.fill_null(pc.starts_with(paths, prefix), scalar(False, pa.bool_()))  # not pa.scalar: pandas
    entries = entries.filter(ours)
    relative = pc.utf8_slice_codeunits(entries.column("path"), len(prefix))
    return prior_table(relative, entries.column("modificationTime"))


def _clean(storage: Storage, compact: int) -> None:
    """Delete batches and anchors below the previous compact (``compact - K``)."""
    floor = compact - COMPACT_INTERVAL
    layout = read_layout(storage)
    for b, name in layout.batches.items():
        if b < floor:
            storage.delete(name)
    for a in layout.anchors:
        if a < floor:
            storage.delete(anchor_name(a))


# Checking and syncing ------------------------------------------------------------------------------


@dataclass
class SparkViewReport:
    """The Spark view of a lake as :func:`spark_sync` found it.

    ``state``: ``ok`` (the newest batch holds the lake's latest version, and what Spark reads --
    the newest compact and the batches after it -- is what lakesink derives), ``absent`` (no
    ``_spark_metadata/``), ``behind`` (the view holds an older version: Spark reads that
    version's files), ``foreign`` (other content: writers stopped updating it).
    """

    path: str
    state: str = "ok"
    detail: str = ""
    lake_version: int | None = None
    view_version: int | None = None
    batch: int | None = None
    written: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in ("ok", "absent")

    def summary(self) -> str:
        return self.state + (f": {self.detail}" if self.detail else "")


def spark_sync(storage: Storage, *, write: bool = True, deep: bool = True) -> SparkViewReport:
    """Check the Spark view of the lake at ``storage`` and, with ``write``, bring it to the lake's
    latest version (a compact batch of the live files when it is absent or behind). Resumes a
    stopped view once what Spark reads holds lakesink's content again."""
    metadata, vlog = open_epoch_log(storage, "the Spark view")
    report = SparkViewReport(storage.url)
    latest = vlog.open().version
    report.lake_version = latest if latest >= 0 else None
    layout = read_layout(storage)
    if layout.latest is not None:
        report.batch = layout.latest
        report.view_version = layout.version_of(layout.latest)
    problem = _check(storage, vlog, layout, latest, deep=deep)
    if problem is not None:
        report.state, report.detail = "foreign", problem
        if write:
            _STOP.mark(storage, report.view_version or 0, problem)
        return report
    if latest < 0:
        report.state = "absent" if layout.latest is None else "ok"
        return report
    if report.view_version == latest:
        if write:
            storage.delete(STOP_FILE)
            forget(storage, metadata.table_id or "")
        return report
    if not write:
        report.state = "absent" if layout.latest is None else "behind"
        if report.state == "behind":
            report.detail = (
                f"the view holds lake version {report.view_version}, the lake is at {latest}: Spark "
                "reads the files of that version (run `lakesink sync-views`)"
            )
        return report
    probe_store(storage)
    commit = vlog.read_commit(latest)
    if commit is None:
        raise FileNotFoundError(
            f"{storage.url}: lake version {latest} vanished while the Spark view was synced"
        )
    table_id = metadata.table_id or ""
    forget(storage, table_id)
    view = SparkView(storage, table_id, create=True)
    state = vlog.open()
    for _ in range(RACE_RETRIES):
        try:
            view._advance(vlog, commit, state)
            break
        except LostRace:
            forget(storage, table_id)  # a writer placed it meanwhile: look again
        except Foreign as exc:
            report.state, report.detail = "foreign", str(exc)
            _STOP.mark(storage, latest, str(exc))
            return report
    layout = read_layout(storage)
    report.batch = layout.latest
    report.view_version = layout.version_of(layout.latest) if layout.latest is not None else None
    if report.view_version is None or report.view_version < latest:
        report.state, report.detail = "behind", "other writers kept moving the view: run it again"
        return report
    report.written.append(latest)
    storage.delete(STOP_FILE)
    forget(storage, table_id)
    return report


def _check(storage: Storage, vlog: VersionedLog, layout: Layout, latest: int, *, deep: bool) -> str | None:
    """What Spark reads -- the newest compact and the batches after it -- against the lake
    (``deep=False``: the compact's anchor only, not its files: status never reads file lists)."""
    top = layout.latest
    if top is None:
        return None
    version = layout.version_of(top)
    if version is None:
        return f"batch {top} of _spark_metadata/ is not one lakesink wrote (no anchor explains it)"
    if version > latest:
        return (
            f"batch {top} of _spark_metadata/ would hold lake version {version}, beyond the lake's {latest}"
        )
    start = (top + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1
    base = base_uri(storage)
    for b in range(max(start, 0), top + 1):
        if b not in layout.batches:
            return f"batch {b} of _spark_metadata/ is missing (Spark cannot read the view)"
        v = layout.version_of(b)
        if v is None:
            return f"batch {b} of _spark_metadata/ is not one lakesink wrote"
        if is_compact(b):
            if b not in layout.anchors:
                return f"compact batch {b} of _spark_metadata/ has no anchor: lakesink did not write it"
            if not deep:
                continue
            data = limits.read(storage, layout.batches[b], limits.VIEW_FILE)
            try:
                live = live_at(storage, vlog, v, table_interval(storage), None)
            except CorruptFileError:
                continue  # a version the lake vacuumed: a view behind it (verify says so), not a foreign one
            expected = dict(
                zip(live.column("path").to_pylist(), live.column("bytes").to_pylist(), strict=True)
            )
            if _files_of(data, base) != expected:
                return f"compact batch {b} of _spark_metadata/ lists other files than the lake at version {v}"
        else:
            commit = vlog.read_commit(v)
            if commit is None:
                continue  # vacuumed away; its batch is older than what a compact replaces soon
            data = limits.read(storage, layout.batches[b], limits.VIEW_FILE)
            if commit.removes or data != adds_batch(base, commit):
                return f"batch {b} of _spark_metadata/ holds content lakesink did not derive from version {v}"
    return None


def check_spark_view(storage: Storage) -> SparkViewReport:
    """The check of ``lakesink status``: the stop marker, then :func:`spark_sync` without writing
    and without reading file lists (``verify`` compares the compact's files too)."""
    if storage.exists(STOP_FILE):
        return SparkViewReport(storage.url, state="foreign", detail=_STOP.reason(storage))
    return spark_sync(storage, write=False, deep=False)
