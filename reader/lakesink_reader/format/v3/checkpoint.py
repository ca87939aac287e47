"""Checkpoints of the versioned log: the state at a version, so that nobody folds from version 0.

A checkpoint at version ``c`` is ``state(c)`` in two objects (docs/design/format-v3.md, section
5), next to the commits in ``_lakesink/log/``:

- ``<c>.checkpoint.<token>.files``: Parquet (named so that no ``*.parquet`` glob finds it), one
  row per live file, sorted by path, in row groups (a reader filters them; a merge holds one);
- ``<c>.checkpoint.json``: the small state (writers, ops, retention, counts) and the name, row
  count and size of its list. Created with ``put_if_absent``: **its commit point**.

Plus the hint ``_last_checkpoint`` (``{"version": c}``), only ever a hint.

Writing one is the writer's (``lakesink.commit.checkpoints.write_checkpoint``): this module
encodes and decodes them, finds and reads them, and derives the live files at a version
(:func:`derive_changes`, :func:`merge_file_list`), which both sides need.

Finding one (:func:`find_checkpoint`): the hint, then probes of multiples of N upward from it
(the hint may lag after a kill) or downward (time travel), the extra candidates a caller knows
(an upgrade's version), and a listing of the log folder only when a candidate was damaged or
the hint unreadable. A missing or damaged candidate is skipped for the next older one.
Opening reads the small part only; the list is read when files are, and checked then
(:func:`open_file_list`: its footer's row count must be the small part's).

Checkpoints are derived data: never required for correctness while the commits they fold are
retained, so every failure here is a reason to use an older one, or the commits themselves.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink_reader import jsondoc, limits
from lakesink_reader.arrays import array
from lakesink_reader.errors import CorruptFileError, FormatVersionError, one_line
from lakesink_reader.format.decoded import check_decoded, check_footer, plain, string_leaves
from lakesink_reader.format.v3.commits import (
    HISTOGRAM_BUCKETS,
    LOG_FORMAT_VERSION,
    Commit,
    CommitKind,
    decode_commit,
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
from lakesink_reader.format.v3.state import (
    LiveFile,
    OpState,
    StateCounts,
    TableState,
    WriterState,
)
from lakesink_reader.names import UNSAFE_DATA_NAME, check_name
from lakesink_reader.storage.base import Storage, StoredFile

if TYPE_CHECKING:
    import pyarrow.parquet as pq

log = logging.getLogger(__name__)

#: The hint naming the newest checkpoint. Safe to lose, to lag, or to find damaged.
LAST_CHECKPOINT = f"{LOG_DIR}/_last_checkpoint"
#: Downward probes of multiples of N before a finder lists the log folder instead.
MAX_PROBES = 8

#: The columns of a checkpoint's file list, in this order.
_LIST_FIELDS: list[pa.Field[Any]] = [
    pa.field("path", pa.string(), nullable=False),
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("rows", pa.int64(), nullable=False),
    pa.field("added_version", pa.int64(), nullable=False),
    pa.field("writer", pa.dictionary(pa.int32(), pa.string())),
    pa.field("batch", pa.int64()),
    pa.field("partition", pa.int32()),
    pa.field("stats", pa.string()),
]
LIST_SCHEMA = pa.schema(_LIST_FIELDS)

_CHECKPOINT = re.compile(r"^(?P<version>\d{20})\.checkpoint\.json$")
_FILE_LIST = re.compile(r"^(?P<version>\d{20})\.checkpoint\.(?P<token>[0-9a-f]{32})\.files$")


def checkpoint_name(version: int) -> str:
    """The small part of the checkpoint at ``version``: its commit point."""
    if version < 0:
        raise ValueError(f"a checkpoint version must be >= 0, got {version}")
    return f"{LOG_DIR}/{version:020d}.checkpoint.json"


def file_list_name(version: int, token: str) -> str:
    """The file list written by one writer of the checkpoint at ``version``."""
    return f"{LOG_DIR}/{version:020d}.checkpoint.{token}.files"


def parse_checkpoint_name(base_name: str) -> int | None:
    """The version of a checkpoint's small part from its base name; None for anything else."""
    match = _CHECKPOINT.match(base_name)
    return int(match.group("version")) if match else None


def parse_file_list_name(base_name: str) -> tuple[int, str] | None:
    """(version, token) of a checkpoint file list's base name; None for anything else."""
    match = _FILE_LIST.match(base_name)
    return (int(match.group("version")), match.group("token")) if match else None


def due_checkpoint(version: int, interval: int) -> int | None:
    """The newest checkpoint version ``<= version`` (a multiple of ``interval`` above 0), or None.

    Not at version 0: a checkpoint there would hold what commit 0 holds.
    """
    if interval < 1:
        raise ValueError(f"checkpoint_interval must be >= 1, got {interval}")
    c = version // interval * interval
    return c if c > 0 else None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's small part: the state at ``state.version`` and the list that goes with it."""

    state: TableState
    token: str
    created_at: float
    files_name: str  # relative to the table root
    files_rows: int
    files_bytes: int

    @property
    def version(self) -> int:
        return self.state.version


# The small part ---------------------------------------------------------------------------------


def _writer_doc(w: WriterState) -> dict[str, Any]:
    return {
        "tag": w.tag,
        "run": w.run,
        "first_batch": w.first_batch,
        "first_version": w.first_version,
        "last_batch": w.last_batch,
        "last_version": w.last_version,
        "committed_at": w.committed_at,
        "offsets": w.offsets,
        "allow_other_queries": w.allow_other_queries,
        "continues": w.continues,
        "continued_by": w.continued_by,
        "retired_version": w.retired_version,
    }


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The small part's bytes (canonical JSON: keys sorted, no spaces, one line)."""
    state = checkpoint.state
    doc = {
        "format_version": LOG_FORMAT_VERSION,
        "version": state.version,
        "table_id": state.table_id,
        "token": checkpoint.token,
        "created_at": checkpoint.created_at,
        "commit_token": state.token,
        "committed_at": state.committed_at,
        "writers": {id_: _writer_doc(w) for id_, w in state.writers.items()},
        "ops": {
            t: {"kind": o.kind, "version": o.version, "outcome": o.outcome} for t, o in state.ops.items()
        },
        "retained_from": state.retained_from,
        "counts": {
            "files": state.counts.files,
            "rows": state.counts.rows,
            "bytes": state.counts.bytes,
            "histogram": list(state.counts.histogram),
        },
        "files": {
            "name": checkpoint.files_name.rsplit("/", 1)[-1],
            "rows": checkpoint.files_rows,
            "bytes": checkpoint.files_bytes,
        },
        # Only when the schema ever changed: older small parts' bytes stay as they were.
        **({"schemas": [[v, encoded] for v, encoded in state.schemas]} if state.schemas else {}),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


def decode_checkpoint(data: bytes, *, version: int, table_id: str, where: str) -> Checkpoint:
    """A small part read from ``where``: CorruptFileError when it is not the checkpoint at
    ``version`` of table ``table_id``; FormatVersionError when it is newer than v3."""
    try:
        doc = jsondoc.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        fmt = doc["format_version"]
        if type(fmt) is int and fmt > LOG_FORMAT_VERSION:
            raise FormatVersionError(
                f"{where}: written by lake format version {fmt}, newer than this lakesink understands "
                f"({LOG_FORMAT_VERSION}); upgrade lakesink"
            )
        if fmt != LOG_FORMAT_VERSION:
            raise ValueError(f"format_version must be {LOG_FORMAT_VERSION}, got {fmt!r}")
        if doc["version"] != version:
            raise ValueError(f"it says it is the checkpoint at version {doc['version']!r}")
        if doc["table_id"] != table_id:
            raise ValueError(f"it belongs to table {doc['table_id']!r}, not {table_id}")
        token = _text(doc, "token")
        files = doc["files"]
        name = _text(files, "name")
        if parse_file_list_name(name) != (version, token):
            raise ValueError(f"its file list {name!r} is not named for version {version} and token {token}")
        counts = doc["counts"]
        histogram = tuple(_count(h) for h in counts["histogram"])
        if len(histogram) != HISTOGRAM_BUCKETS:
            raise ValueError(f"counts.histogram must hold {HISTOGRAM_BUCKETS} ints")
        writers = {
            str(id_): WriterState(
                id=str(id_),
                tag=_text(w, "tag"),
                run=_text(w, "run"),
                first_batch=_count(w["first_batch"]),
                first_version=_count(w["first_version"]),
                last_batch=_count(w["last_batch"]),
                last_version=_count(w["last_version"]),
                committed_at=jsondoc.seconds(w["committed_at"], "committed_at"),
                offsets=w["offsets"],
                allow_other_queries=bool(w["allow_other_queries"]),
                continues=w["continues"],
                continued_by=w["continued_by"],
                retired_version=w["retired_version"],
            )
            for id_, w in doc["writers"].items()
        }
        ops = {
            str(t): OpState(_op_kind(o["kind"]), _count(o["version"]), _outcome(o["outcome"]))
            for t, o in doc["ops"].items()
        }
        committed_at = doc["committed_at"]
        state = TableState(
            table_id,
            version,
            _text(doc, "commit_token"),
            jsondoc.seconds(committed_at, "committed_at") if committed_at is not None else None,
            writers,
            ops,
            _count(doc["retained_from"]),
            StateCounts(_count(counts["files"]), _count(counts["rows"]), _count(counts["bytes"]), histogram),
            tuple((_count(v), _text({"s": text}, "s")) for v, text in doc.get("schemas", [])),
        )
        rows = _count(files["rows"])
        if rows != state.counts.files:
            raise ValueError(f"its list has {rows} rows for {state.counts.files} live files")
        created_at = jsondoc.seconds(doc["created_at"], "created_at")
        return Checkpoint(state, token, created_at, f"{LOG_DIR}/{name}", rows, _count(files["bytes"]))
    except FormatVersionError:
        raise
    except (KeyError, ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise CorruptFileError(f"{where}: not a valid checkpoint: {exc!r}") from exc


def _text(doc: Mapping[str, Any], key: str) -> str:
    value = doc[key]
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _count(value: Any) -> int:
    return jsondoc.count(value, "a version or count")


def _op_kind(value: Any) -> CommitKind | None:
    if value not in (None, "append", "compact", "abandon", "vacuum", "upgrade"):
        raise ValueError(f"unknown op kind {value!r}")
    return value  # type: ignore[no-any-return]


def _outcome(value: Any) -> Any:
    if value not in ("committed", "abandoned"):
        raise ValueError(f"unknown op outcome {value!r}")
    return value


# Reading checkpoints ----------------------------------------------------------------------------


def read_checkpoint(storage: Storage, table_id: str, version: int) -> Checkpoint | None:
    """The small part of the checkpoint at ``version``; None when it is missing or damaged (a
    damaged one is logged: finders skip it for an older one)."""
    name = checkpoint_name(version)
    where = _url(storage, name)
    try:
        data = limits.read(storage, name, limits.CHECKPOINT)
        return decode_checkpoint(data, version=version, table_id=table_id, where=where)
    except FileNotFoundError:
        return None
    except CorruptFileError as exc:
        log.warning("skipping a damaged checkpoint: %s", exc)
        return None


def read_hint(storage: Storage) -> int | None:
    """The version ``_last_checkpoint`` names; None when it is missing or damaged."""
    try:
        doc = jsondoc.loads(limits.read(storage, LAST_CHECKPOINT, limits.HINT))
        return jsondoc.count(doc["version"], "the version")
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, CorruptFileError) as exc:
        log.warning("ignoring the damaged hint %s: %r", _url(storage, LAST_CHECKPOINT), exc)
        return None


def find_checkpoint(
    storage: Storage,
    table_id: str,
    *,
    interval: int | None,
    at_most: int | None = None,
    also: Iterable[int] = (),
    listing: bool = False,
) -> Checkpoint | None:
    """The newest usable checkpoint at a version ``<= at_most`` (None: any); None when there is
    none, and the caller folds commits from the oldest one.

    Candidates, newest first: the hint and the multiples of ``interval`` above it that exist
    (the hint may lag after a kill); when the hint is missing or newer than ``at_most``, the
    multiples of ``interval`` downward from ``at_most`` (at most :data:`MAX_PROBES`), or, for
    the current table without a hint, upward from ``interval`` while they exist; the versions
    in ``also`` (an upgrade's). A missing or damaged candidate is skipped. When every
    candidate failed and one of them was damaged, or the hint was unreadable, or ``listing``
    asks for it (the log lacks version 0), the log folder is listed once and every
    checkpoint there is a candidate. ``interval`` None: only the hint and the listing.
    """

    def fits(c: int) -> bool:
        return c > 0 and (at_most is None or c <= at_most)

    tried: set[int] = set()
    damaged = False

    def attempt(c: int) -> Checkpoint | None:
        nonlocal damaged
        if c in tried or not fits(c):
            return None
        tried.add(c)
        found = read_checkpoint(storage, table_id, c)
        if found is None and storage.exists(checkpoint_name(c)):
            damaged = True
        return found

    hint = read_hint(storage)
    if hint is None and storage.exists(LAST_CHECKPOINT):
        damaged = True  # a hint that cannot be read: find the checkpoints some other way
    top: int | None = None
    if hint is not None and fits(hint):
        top = _probe_upward(storage, hint, interval, at_most)
    elif interval is not None and at_most is not None:
        top = due_checkpoint(at_most, interval)
    elif interval is not None and hint is None and storage.exists(checkpoint_name(interval)):
        top = _probe_upward(storage, interval, interval, at_most)
    if top is not None:
        found = attempt(top)
        if found is not None:
            return found
        if interval is not None:
            below = (top - 1) // interval * interval
            for c in range(below, max(0, below - MAX_PROBES * interval), -interval):
                if storage.exists(checkpoint_name(c)):
                    found = attempt(c)
                    if found is not None:
                        return found
    for c in sorted(set(also), reverse=True):
        found = attempt(c)
        if found is not None:
            return found
    if not (damaged or listing or (hint is not None and not fits(hint) and interval is None)):
        return None
    for c in sorted((c for c, _ in listed_checkpoints(storage) if fits(c)), reverse=True):
        found = attempt(c)
        if found is not None:
            return found
    return None


def newest_listed_checkpoint(
    storage: Storage, table_id: str, at_most: int | None = None
) -> Checkpoint | None:
    """The newest checkpoint ``<= at_most`` a listing of the log shows whose small part reads and
    whose commit is there (one below the log's truncation has lost its commit); None: none."""
    for c, _ in reversed(listed_checkpoints(storage)):
        if at_most is not None and c > at_most:
            continue
        found = read_checkpoint(storage, table_id, c)
        if found is not None and storage.exists(commit_name(c)):
            return found
    return None


def _probe_upward(storage: Storage, start: int, interval: int | None, at_most: int | None) -> int:
    """``start``, or the newest of ``start + k*interval`` that exist one after the other."""
    top = start
    while interval is not None:
        c = (top // interval + 1) * interval
        if (at_most is not None and c > at_most) or not storage.exists(checkpoint_name(c)):
            break
        top = c
    return top


def listed_log(storage: Storage) -> list[StoredFile]:
    """The entries of the log folder, sorted by name (a listing sorts by version).

    One ``list`` of the whole folder (S3: one ``ListObjectsV2`` page per 1,000 keys), sorted
    here as ``LocalStorage.list`` does not sort. Every caller wants the whole folder, so a
    listing that starts after a name would save nothing.
    """
    return sorted(storage.list(LOG_DIR), key=lambda f: f.name)


def listed_checkpoints(storage: Storage) -> list[tuple[int, str]]:
    """(version, name) of every checkpoint small part a listing of the log shows."""
    found = []
    for entry in listed_log(storage):
        c = parse_checkpoint_name(entry.name.rsplit("/", 1)[-1])
        if c is not None:
            found.append((c, entry.name))
    return found


def oldest_listed_commit(storage: Storage) -> int | None:
    """The oldest commit a listing of the log shows (None: no commit)."""
    for entry in listed_log(storage):
        v = parse_commit_name(entry.name.rsplit("/", 1)[-1])
        if v is not None:
            return v
    return None


# The file list ----------------------------------------------------------------------------------


#: A file list holds at least this many bytes on disk per row: its paths are distinct, and each
#: row carries sizes and counts. Lists lakesink writes hold about 15 (zstd); a list claiming
#: more rows than its size allows is refused before a row is read (docs/FORMAT.md, "Trust").
MIN_LIST_BYTES_PER_ROW = 1
#: A row group of a file list unpacks to at most this many times the list's size on disk (lists
#: lakesink writes: about 6). With distinct paths (checked on the dictionary, before decoding:
#: one entry repeated for every row would decode to rows x its length), that bounds the memory
#: a list of a given size can take.
MAX_LIST_EXPANSION = 64


def open_file_list(storage: Storage, checkpoint: Checkpoint) -> pq.ParquetFile:
    """The checkpoint's file list, opened (its footer read); CorruptFileError when it is missing,
    unreadable, holds another number of rows than its small part says, or more rows than its
    size on disk can hold. Its paths are read dictionary-encoded (:func:`iter_file_list`
    checks them before they are decoded)."""
    # Here, not at the top: opening a lake reads no file list, and needs no pyarrow.parquet.
    import pyarrow.parquet as pq

    storage.refuse_link(checkpoint.files_name)
    fs, base = storage.arrow_filesystem()
    where = _url(storage, checkpoint.files_name)
    try:
        handle = fs.open_input_file(f"{base.rstrip('/')}/{checkpoint.files_name}")
        size = handle.size()
        if size >= 8:
            handle.seek(size - 8)
        check_footer(handle.read(8) if size >= 8 else b"", size, f"checkpoint file list {where}")
        handle.seek(0)
        listed = pq.ParquetFile(handle, read_dictionary=_DICTIONARY_COLUMNS)
    # KeyError: a footer without "path"; UnicodeDecodeError: names in it that are not UTF-8
    except (OSError, pa.ArrowException, UnicodeDecodeError, KeyError) as exc:
        said = one_line(exc)
        raise CorruptFileError(f"checkpoint file list {where} cannot be read: {said}") from exc
    rows = listed.metadata.num_rows
    if rows != checkpoint.files_rows:
        raise CorruptFileError(
            f"checkpoint file list {where} has {rows} rows, but its checkpoint at "
            f"version {checkpoint.version} says {checkpoint.files_rows}"
        )
    if size != checkpoint.files_bytes or rows * MIN_LIST_BYTES_PER_ROW > size:
        raise CorruptFileError(
            f"checkpoint file list {where} claims {rows} rows in {size} bytes (its checkpoint at version "
            f"{checkpoint.version} says {checkpoint.files_bytes} bytes): not a list lakesink wrote"
        )
    if not listed.schema_arrow.equals(_READ_SCHEMA):
        raise CorruptFileError(f"checkpoint file list {where} has the schema {listed.schema_arrow}")
    return listed


#: The text columns, read dictionary-encoded so that what they decode to is counted first
#: (``format.decoded``): one large value used by every row passes the row and size checks.
_DICTIONARY_COLUMNS = string_leaves(LIST_SCHEMA)
#: :data:`LIST_SCHEMA` as :func:`open_file_list` reads it: the text columns dictionary-encoded.
_READ_SCHEMA = pa.schema(
    [f.with_type(pa.dictionary(pa.int32(), f.type)) if f.type == pa.string() else f for f in LIST_SCHEMA]
)


def iter_file_list(
    storage: Storage,
    checkpoint: Checkpoint,
    columns: Sequence[str] | None = None,
    *,
    min_added_version: int | None = None,
    opened: pq.ParquetFile | None = None,
) -> Iterator[pa.RecordBatch]:
    """The checkpoint's live files, one row group at a time, sorted by path; ``columns``
    projects, ``min_added_version`` skips row groups whose files were all added before it.
    ``opened``: the list as :func:`open_file_list` returned it (its footer is not read again).

    A row group that unpacks to more than :data:`MAX_LIST_EXPANSION` times the list's size is
    not read, nor decoded when its text columns' dictionaries, counted per use, decode to more;
    every path passes the lake's name rule (``names.UNSAFE_DATA_NAME``) and is distinct, checked
    before the paths are decoded: CorruptFileError naming the list (and the entry) otherwise."""
    listed = opened if opened is not None else open_file_list(storage, checkpoint)
    column = LIST_SCHEMA.get_field_index("added_version")
    where = _url(storage, checkpoint.files_name)
    for group in range(listed.metadata.num_row_groups):
        if min_added_version is not None:
            stats = listed.metadata.row_group(group).column(column).statistics
            newest = stats.max if stats is not None and stats.has_min_max else None
            if newest is not None and newest < min_added_version:
                continue
        # Pages a row group's footer says decompress to far more than the list's size are not
        # decompressed (a compression bomb whose footer tells the truth; lists lakesink writes
        # decompress to ~6x).
        unpacked = listed.metadata.row_group(group).total_byte_size
        if unpacked > MAX_LIST_EXPANSION * max(checkpoint.files_bytes, 1):
            raise CorruptFileError(
                f"checkpoint file list {where}: row group {group} unpacks to {unpacked} bytes from a "
                f"{checkpoint.files_bytes}-byte list: not a list lakesink wrote"
            )
        try:
            table = listed.read_row_group(group, columns=list(columns) if columns is not None else None)
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:
            said = one_line(exc)  # fuzzer case 3994
            raise CorruptFileError(f"checkpoint file list {where}: row group {group}: {said}") from exc
        if "path" in table.column_names:
            _check_paths(table.column("path"), where)
        # Dictionaries counted per use (issue 51: a `stats` value used by every row of a 0.73 MB
        # list decoded to 3.4 GB), against the bound of the footer's sizes.
        most = MAX_LIST_EXPANSION * max(checkpoint.files_bytes, 1)
        check_decoded(table, most, f"checkpoint file list {where}: row group {group}")
        yield from plain(table, LIST_SCHEMA).to_batches()


def _check_paths(paths: pa.ChunkedArray[Any], where: str) -> None:
    """A row group's dictionary-encoded paths, checked before they are decoded: distinct (a
    list names a file once), and each passing the lake's name rule."""
    # Here, not at the top: pyarrow.compute (40 ms) only when a file list is read.
    import pyarrow.compute as pc

    for chunk in paths.chunks:
        encoded: pa.DictionaryArray[Any, Any] = chunk  # type: ignore[assignment]  # read_dictionary=["path"]
        names = encoded.dictionary
        if len(names) < len(encoded) or encoded.null_count:
            raise CorruptFileError(f"checkpoint file list {where}: a path is listed twice (or is null)")
        bad = pc.match_substring_regex(names, UNSAFE_DATA_NAME)
        if pc.any(bad).as_py():
            first = bad.to_pylist().index(True)
            check_name(names[first].as_py(), f"checkpoint file list {where}")


def live_files_of(batch: pa.RecordBatch) -> Iterator[LiveFile]:
    """The rows of a file-list batch (all columns) as :class:`LiveFile`."""
    cols: dict[str, list[Any]] = {name: batch.column(name).to_pylist() for name in LIST_SCHEMA.names}
    for i in range(batch.num_rows):
        yield LiveFile(
            str(cols["path"][i]),
            int(cols["rows"][i]),
            int(cols["bytes"][i]),
            int(cols["added_version"][i]),
            cols["writer"][i],
            cols["batch"][i],
            cols["partition"][i],
            cols["stats"][i],  # the text, as listed: decoded only where values are needed
        )


def _list_table(files: Sequence[LiveFile]) -> pa.Table:
    # From buffers (lakesink_reader.arrays): pa.array of a list imports pandas, in the process
    # that commits every micro-batch.
    columns = {
        "path": array([f.path for f in files], pa.string()),
        "bytes": array([f.size for f in files], pa.int64()),
        "rows": array([f.rows for f in files], pa.int64()),
        "added_version": array([f.added_version for f in files], pa.int64()),
        "writer": array([f.writer for f in files], pa.string()).dictionary_encode(),
        "batch": array([f.batch for f in files], pa.int64()),
        "partition": array([f.partition for f in files], pa.int32()),
        "stats": array([f.stats for f in files], pa.string()),
    }
    return pa.Table.from_arrays([columns[name] for name in LIST_SCHEMA.names], schema=LIST_SCHEMA)


@dataclass
class Changes:
    """What the commits after a base checkpoint did to its live files: the base paths they
    removed, and the files they added that are still live (a file added and removed again in
    between is in neither)."""

    removed: set[str]
    added: dict[str, LiveFile]

    @classmethod
    def empty(cls) -> Changes:
        return cls(set(), {})

    def apply(self, commit: Commit) -> None:
        """Fold one whole commit in; CorruptFileError for what can be told without the base
        (adding a path added since, removing a base path twice)."""
        version = commit.version
        for removed in commit.removes:
            if removed.path in self.added:
                del self.added[removed.path]
            elif removed.path in self.removed:
                raise CorruptFileError(f"log version {version} removes {removed.path}, which is not live")
            else:
                self.removed.add(removed.path)
        writer = commit.header.writer
        for added in commit.adds:
            if added.path in self.added:
                raise CorruptFileError(
                    f"log version {version} adds {added.path}, which is live since version "
                    f"{self.added[added.path].added_version}"
                )
            self.added[added.path] = LiveFile.added(added, version, writer)


def merge_file_list(
    base: Iterable[pa.RecordBatch], changes: Changes, emit: Callable[[pa.Table], None], *, where: str
) -> tuple[int, int, int]:
    """Stream ``base`` (file-list batches sorted by path) minus ``changes.removed``, merged with
    ``changes.added``, into ``emit`` as path-sorted tables; returns (files, rows, bytes).

    Memory: one base batch plus the changes. CorruptFileError when a removed path is not in the
    base, or an added one is there already.
    """
    # Here, not at the top: pyarrow.compute (40 ms) only when a file list is merged.
    import pyarrow.compute as pc

    added = sorted(changes.added)
    removed = array(sorted(changes.removed), pa.string())
    taken = 0  # adds emitted so far (a prefix of ``added``)
    matched = 0
    files = rows = size = 0

    def out(table: pa.Table) -> None:
        nonlocal files, rows, size
        if table.num_rows:
            files += table.num_rows
            rows += pc.sum(table.column("rows")).as_py() or 0
            size += pc.sum(table.column("bytes")).as_py() or 0
            emit(table)

    for batch in base:
        if batch.num_rows == 0:
            continue
        table = pa.Table.from_batches([batch]).cast(LIST_SCHEMA)
        paths = table.column("path")
        if len(removed):
            gone = pc.is_in(paths, value_set=removed)
            before = table.num_rows
            table = table.filter(pc.invert(gone))
            matched += before - table.num_rows
        last = paths[-1].as_py()
        upto = bisect.bisect_right(added, last, lo=taken)
        if upto > taken:
            chunk = added[taken:upto]
            present = set(table.column("path").to_pylist())
            clash = [p for p in chunk if p in present]
            if clash:
                raise CorruptFileError(
                    f"{where}: version {changes.added[clash[0]].added_version} adds {clash[0]}, which is "
                    "live already"
                )
            merged = pa.concat_tables([table, _list_table([changes.added[p] for p in chunk])])
            table = merged.take(pc.sort_indices(merged, sort_keys=[("path", "ascending")]))
            taken = upto
        out(table)
    if taken < len(added):
        out(_list_table([changes.added[p] for p in added[taken:]]))
    if matched != len(removed):
        raise CorruptFileError(
            f"{where}: the commits since it remove {len(removed) - matched} path(s) that were not live"
        )
    return files, rows, size


# Deriving the live files ---------------------------------------------------------------------------


def derive_changes(
    storage: Storage,
    base: Checkpoint | None,
    table_id: str,
    version: int,
    reader: Callable[[int], Commit | None],
) -> tuple[TableState, Changes]:
    """The state at ``version`` and the changes to ``base``'s list, from the whole commits after
    ``base`` (version 0 on without one); CorruptFileError when one of them is missing."""
    state = base.state if base is not None else TableState.empty(table_id)
    changes = Changes.empty()
    for start in range(state.version + 1, version + 1, READ_BATCH):
        stop = min(start + READ_BATCH, version + 1)
        found = parallel(reader, range(start, stop), read_threads(storage))
        for v, commit in zip(range(start, stop), found, strict=True):
            if commit is None:
                raise CorruptFileError(
                    f"{_url(storage, commit_name(v))} is missing: the live files at version {version} "
                    "cannot be derived"
                    + ("" if base is None else f" from the checkpoint at version {base.version}")
                )
            state = state.fold(commit.header)
            changes.apply(commit)
    return state, changes


def live_files_table(
    storage: Storage,
    table_id: str,
    version: int,
    *,
    interval: int | None = DEFAULT_CHECKPOINT_INTERVAL,
    start: Checkpoint | None = None,
    read_commit: Callable[[int], Commit | None] | None = None,
) -> pa.Table:
    """The live files at ``version`` (:data:`LIST_SCHEMA`, sorted by path): a checkpoint's list
    at or below it, minus the removes and plus the adds of the whole commits after it.

    ``start``: the checkpoint to use (a snapshot's, already found); when its list is damaged, or
    it is above ``version``, the newest usable one at or below ``version`` is found instead
    (or the commits from version 0 are folded).
    """
    reader = read_commit or plain_commit_reader(storage, table_id)
    base: Checkpoint | None = None
    opened: pq.ParquetFile | None = None
    if start is not None and start.version <= version:
        try:
            opened = open_file_list(storage, start)
            base = start
        except CorruptFileError as exc:
            log.warning("not reading from checkpoint %d: %s", start.version, exc)
            # Any usable checkpoint at or below ``version``, also one newer than ``start``: a
            # vacuum that truncated the log below its own checkpoint removed ``start`` with the
            # commits after it, and only the newer one still leads to ``version`` (simulation
            # seed 205 of session 16: a reader pinned at the latest version, then vacuumed).
            base, opened = usable_base(storage, table_id, version + 1, interval)
    else:
        base, opened = usable_base(storage, table_id, version + 1, interval)
    if base is not None and base.version == version:
        batches = list(iter_file_list(storage, base, opened=opened))
        return pa.Table.from_batches(batches, schema=LIST_SCHEMA) if batches else LIST_SCHEMA.empty_table()
    _, changes = derive_changes(storage, base, table_id, version, reader)
    tables: list[pa.Table] = []
    merge_file_list(
        iter_file_list(storage, base, opened=opened) if base is not None else (),
        changes,
        tables.append,
        where=_url(storage, LOG_DIR) + f" at version {version}",
    )
    return pa.concat_tables(tables) if tables else LIST_SCHEMA.empty_table()


def usable_base(
    storage: Storage, table_id: str, version: int, interval: int | None
) -> tuple[Checkpoint | None, pq.ParquetFile | None]:
    """The newest checkpoint below ``version`` whose list opens, and that list opened; or
    (None, None): fold from version 0."""
    at_most = version - 1
    skipped: set[int] = set()
    while at_most > 0:
        base = find_checkpoint(storage, table_id, interval=interval, at_most=at_most)
        if base is not None and not storage.exists(commit_name(base.version)):
            # A checkpoint left below the log's truncation (a hint moved back by a late put
            # named it): the commits after it are gone. Start from the newest one listed.
            log.warning("checkpoint %d is below the log's truncation: using the newest listed", base.version)
            base = newest_listed_checkpoint(storage, table_id, at_most)
        if base is None or base.version in skipped:
            break
        try:
            return base, open_file_list(storage, base)
        except CorruptFileError as exc:
            log.warning("not building on checkpoint %d: %s", base.version, exc)
            skipped.add(base.version)
            at_most = base.version - 1
    return None, None


def plain_commit_reader(storage: Storage, table_id: str) -> Callable[[int], Commit | None]:
    def read(version: int) -> Commit | None:
        name = commit_name(version)
        try:
            data = limits.read(storage, name, limits.COMMIT)
        except FileNotFoundError:
            return None
        commit = decode_commit(data, where=_url(storage, name))
        if commit.version != version or commit.header.table_id != table_id:
            raise CorruptFileError(
                f"{_url(storage, name)} is version {commit.version} of table {commit.header.table_id}, "
                f"not version {version} of table {table_id}"
            )
        return commit

    return read


def _url(storage: Storage, name: str) -> str:
    return f"{storage.url.rstrip('/')}/{name}"
