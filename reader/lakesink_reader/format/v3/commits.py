"""One commit of the versioned log: a header and file actions, as canonical JSON lines.

Version ``v`` of a v3 lake is committed exactly when ``_lakesink/log/<v:020d>.json`` exists
(``vlog``). Its bytes are one JSON object per line, UTF-8, keys sorted, no spaces, every line
ending in ``\\n``: the header ``{"commit": {...}}`` first, then one ``{"remove": {...}}`` line
per removed file, then one ``{"add": {...}}`` line per added file (docs/design/format-v3.md,
section 3).

Why canonical bytes: a create-if-absent whose answer was lost reads the object back and
compares bytes (``Storage.put_if_absent``), and an upgrade re-derives commits that must come
out identical; so one commit always encodes to the same bytes. Why the header first: opening a
lake and a writer's checks need only writers and counts, and stop after the first line
(:func:`decode_header`).

A commit is built without a version (:class:`PendingCommit`). The log gives it one when it
tries to create it, and a call that loses a version to another commit tries the *same*
pending commit -- the same token -- at the next version (:meth:`PendingCommit.at`).

Only the standard library: the driver's commit worker imports this without pyarrow.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast, get_args

from lakesink_reader import jsondoc, limits
from lakesink_reader.errors import CorruptFileError, FormatVersionError
from lakesink_reader.names import NAME_RULE, unsafe_name

#: The format version every v3 commit carries. A newer one is refused (FormatVersionError).
LOG_FORMAT_VERSION = 3

CommitKind = Literal["append", "compact", "abandon", "vacuum", "upgrade"]
COMMIT_KINDS: tuple[CommitKind, ...] = get_args(CommitKind)
#: How a continuation's start offsets were checked against the writer it continues (section 9).
OffsetsCheck = Literal["kafka", "equal"]
OFFSETS_CHECKS: tuple[OffsetsCheck, ...] = get_args(OffsetsCheck)

MIB = 1 << 20
#: Live-file size histogram buckets: [0, 1 MiB), [1, 2) MiB, [2, 4) MiB, ... [512, 1024) MiB,
#: [1 GiB, ...). Headers carry each commit's added and removed files per bucket, so that the
#: state's histogram folds from headers alone, as its other counts do.
HISTOGRAM_BUCKETS = 12

_COMMIT_TOKEN = re.compile(r"[0-9a-z][0-9a-z-]{7,63}")
_OP_TOKEN = re.compile(r"[0-9a-f]{16}")
_TAG = re.compile(r"[0-9a-f]{16}")


def size_bucket(size: int) -> int:
    """The histogram bucket of a file of ``size`` bytes (see :data:`HISTOGRAM_BUCKETS`)."""
    if size < MIB:
        return 0
    return min(HISTOGRAM_BUCKETS - 1, (size // MIB).bit_length())


def writer_tag(writer_id: str) -> str:
    """The 16-hex tag of a writer: what its data file names start with (``w<tag>-b...``).

    For a Spark query id (a UUID) it is its first 16 hex digits, as the foreach writer names
    files today. Writer ids of another shape (``v2-unknown`` of an upgraded lake, tests) get
    the first 16 hex digits of their SHA-256, so that every writer has a tag of one shape.
    """
    if not writer_id:
        raise ValueError("a writer id must not be empty")
    digits = writer_id.replace("-", "")[:16]
    if _TAG.fullmatch(digits):
        return digits
    return hashlib.sha256(writer_id.encode()).hexdigest()[:16]


def new_commit_token() -> str:
    """A fresh commit token (32 hex digits): unique per commit call, kept across its versions."""
    return uuid.uuid4().hex


def new_op_token() -> str:
    """A fresh token for one maintenance op (16 hex digits, as compaction output names use)."""
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class AddFile:
    """A file a commit adds. ``path`` is relative to the table root, '/'-separated.

    ``partition`` and ``batch``: the Spark task partition and the writer's batch (None for
    compaction output). ``stats``: Delta's stats object (``numRecords``, ``minValues``,
    ``maxValues``, ``nullCount``), exact or None, held as its canonical JSON text
    (``jsondoc.canonical``): a plain-JSON value given here is encoded once (ValueError when it
    is not plain JSON), text is taken as that text. Text, not objects, because a commit's
    writer chooses its stats: decoded, a line of 100 empty objects cost ~19 times its bytes
    (issue 51), and the log, the checkpoint list and the Delta view only copy the text;
    :attr:`stats_object` decodes it where values are needed.
    """

    path: str
    rows: int
    size: int
    partition: int | None = None
    batch: int | None = None
    stats: str | None = None

    def __post_init__(self) -> None:
        if self.stats is not None and not isinstance(self.stats, str):
            try:
                text = jsondoc.canonical(self.stats)
            except (TypeError, ValueError) as exc:
                what = f"stats of {self.path!r}"
                raise ValueError(f"{what} must be plain JSON (no NaN or infinity): {exc}") from exc
            object.__setattr__(self, "stats", text)  # frozen: set once, while it is being made

    @property
    def stats_object(self) -> Any:
        """The stats decoded (None when there are none); ValueError when the text is not JSON."""
        return None if self.stats is None else jsondoc.loads(self.stats)


@dataclass(frozen=True)
class RemoveFile:
    """A file a commit removes from the live set (it stays in storage until vacuum)."""

    path: str
    rows: int
    size: int


@dataclass(frozen=True)
class WriterRef:
    """The writer of an append: Spark's query id, its tag, the batch, and the run's token."""

    id: str
    tag: str
    batch: int
    run: str


@dataclass(frozen=True)
class Continuation:
    """A writer's first commit that continues another writer (section 9).

    ``after_batch``/``after_version``: the continued writer's last batch and its version, as
    the continuation saw them (if that writer committed since, the continuation is refused);
    ``offsets``: the new writer's start offsets, one entry per source.
    """

    writer: str
    after_batch: int
    after_version: int
    offsets: Any
    check: OffsetsCheck


@dataclass(frozen=True)
class OpRef:
    """The maintenance op of a commit that is not an append; the field of its kind is set:
    compact ``base_version``, abandon ``abandons``, vacuum ``retained_from``, upgrade
    ``from_format`` and ``fence_epoch``. ``trigger``: ``"auto"`` on a compaction a writer's
    driver ran by itself (``auto_compact``); None on any other (absent from the header)."""

    token: str
    base_version: int | None = None
    abandons: str | None = None
    retained_from: int | None = None
    from_format: int | None = None
    fence_epoch: int | None = None
    trigger: str | None = None


_OP_FIELDS: dict[CommitKind, tuple[str, ...]] = {
    "compact": ("base_version",),
    "abandon": ("abandons",),
    "vacuum": ("retained_from",),
    "upgrade": ("from_format", "fence_epoch"),
}
#: The op fields a kind may carry, written only when set: a manual compaction's bytes are the
#: ones format 3 had before ``trigger`` existed.
_OP_OPTIONAL_FIELDS: dict[CommitKind, tuple[str, ...]] = {"compact": ("trigger",)}
#: What ran a compaction, when it was not a person or a schedule (``lakesink compact``).
COMPACT_TRIGGERS = ("auto",)


@dataclass(frozen=True)
class CommitCounts:
    """Totals of a commit's actions, in its header: the state's counts fold from headers."""

    add_files: int = 0
    add_rows: int = 0
    add_bytes: int = 0
    remove_files: int = 0
    remove_rows: int = 0
    remove_bytes: int = 0
    add_histogram: tuple[int, ...] = (0,) * HISTOGRAM_BUCKETS
    remove_histogram: tuple[int, ...] = (0,) * HISTOGRAM_BUCKETS

    @classmethod
    def of(cls, removes: Sequence[RemoveFile], adds: Sequence[AddFile]) -> CommitCounts:
        return cls(
            len(adds),
            sum(a.rows for a in adds),
            sum(a.size for a in adds),
            len(removes),
            sum(r.rows for r in removes),
            sum(r.size for r in removes),
            _histogram(a.size for a in adds),
            _histogram(r.size for r in removes),
        )


def _histogram(sizes: Iterable[int]) -> tuple[int, ...]:
    buckets = [0] * HISTOGRAM_BUCKETS
    for size in sizes:
        buckets[size_bucket(size)] += 1
    return tuple(buckets)


@dataclass(frozen=True)
class CommitHeader:
    """The first line of a commit: everything but the file actions.

    ``read_version`` (the version whose state the checks ran against) is always
    ``version - 1``, None at version 0; the bytes carry it for readers of the raw log.
    ``schema``: an append that changes the lake's schema carries the new one (base64 Arrow IPC,
    as table.json's ``arrow_schema``; ``lakesink_reader.format.schemas``); None otherwise.
    """

    version: int
    table_id: str
    kind: CommitKind
    token: str
    committed_at: float
    writer: WriterRef | None
    continues: Continuation | None
    allow_other_queries: bool | None
    source_offsets: Any
    op: OpRef | None
    counts: CommitCounts
    schema: str | None = None

    @property
    def read_version(self) -> int | None:
        return self.version - 1 if self.version > 0 else None


@dataclass(frozen=True)
class Commit:
    """One version of the log: its header, the files it removes, the files it adds."""

    header: CommitHeader
    removes: tuple[RemoveFile, ...] = ()
    adds: tuple[AddFile, ...] = ()

    @property
    def version(self) -> int:
        return self.header.version


@dataclass(frozen=True)
class PendingCommit:
    """A commit before it has a version: what one commit call tries to create.

    Build one with :meth:`append`, :meth:`compact`, :meth:`abandon`, :meth:`vacuum` or
    :meth:`upgrade`; the constructor checks that its fields fit its kind (ValueError naming
    the field otherwise).
    """

    kind: CommitKind
    token: str
    committed_at: float
    writer: WriterRef | None = None
    continues: Continuation | None = None
    allow_other_queries: bool | None = None
    source_offsets: Any = None
    op: OpRef | None = None
    removes: tuple[RemoveFile, ...] = field(default=())
    adds: tuple[AddFile, ...] = field(default=())
    schema: str | None = None

    def __post_init__(self) -> None:
        _check_header_fields(
            self.kind, self.token, self.writer, self.continues, self.allow_other_queries, self.op
        )
        _check_actions(self.kind, self.writer, self.removes, self.adds)
        if self.schema is not None and self.kind != "append":
            raise ValueError(f"only an append changes the schema, not a {self.kind} commit")

    # Builders -----------------------------------------------------------------------------

    @classmethod
    def append(
        cls,
        *,
        writer_id: str,
        batch: int,
        run: str,
        adds: Iterable[AddFile] = (),
        source_offsets: Any = None,
        allow_other_queries: bool = False,
        continues: Continuation | None = None,
        token: str | None = None,
        committed_at: float | None = None,
        schema: str | None = None,
    ) -> PendingCommit:
        """A writer's batch ``batch``: its files (sorted by path; ``batch`` filled in where
        None) and the source offsets of the batch's end (Spark's offset JSON, per source).
        ``schema``: the lake's new schema, encoded (``schemas.encode_schema``), when the batch
        changes it."""
        files = tuple(
            sorted(
                (
                    a if a.batch is not None else replace(a, batch=batch)
                    for a in adds  # stats: canonical text already (AddFile)
                ),
                key=_path,
            )
        )
        if continues is not None:
            continues = replace(continues, offsets=_json_value(continues.offsets, "continues.offsets"))
        return cls(
            "append",
            token or new_commit_token(),
            time.time() if committed_at is None else committed_at,
            writer=WriterRef(writer_id, writer_tag(writer_id), batch, run),
            continues=continues,
            allow_other_queries=allow_other_queries,
            source_offsets=_json_value(source_offsets, "source_offsets"),
            adds=files,
            schema=schema,
        )

    @classmethod
    def compact(
        cls,
        *,
        op_token: str,
        base_version: int,
        removes: Iterable[RemoveFile],
        adds: Iterable[AddFile],
        token: str | None = None,
        committed_at: float | None = None,
        trigger: str | None = None,
    ) -> PendingCommit:
        """A compaction: ``removes`` (live at ``base_version``) rewritten as ``adds``;
        ``trigger="auto"`` when a writer's driver ran it by itself."""
        return cls(
            "compact",
            token or new_commit_token(),
            time.time() if committed_at is None else committed_at,
            op=OpRef(op_token, base_version=base_version, trigger=trigger),
            removes=tuple(sorted(removes, key=_path)),
            adds=tuple(sorted(adds, key=_path)),
        )

    @classmethod
    def abandon(
        cls, *, op_token: str, abandons: str, token: str | None = None, committed_at: float | None = None
    ) -> PendingCommit:
        """End op ``abandons``, which never committed: its commit becomes impossible."""
        return cls(
            "abandon",
            token or new_commit_token(),
            time.time() if committed_at is None else committed_at,
            op=OpRef(op_token, abandons=abandons),
        )

    @classmethod
    def vacuum(
        cls, *, op_token: str, retained_from: int, token: str | None = None, committed_at: float | None = None
    ) -> PendingCommit:
        """From this commit on, versions below ``retained_from`` are no longer readable."""
        return cls(
            "vacuum",
            token or new_commit_token(),
            time.time() if committed_at is None else committed_at,
            op=OpRef(op_token, retained_from=retained_from),
        )

    @classmethod
    def upgrade(cls, *, op_token: str, fence_epoch: int, token: str, committed_at: float) -> PendingCommit:
        """The upgrade from a v2 log fenced at ``fence_epoch``. Token and time are derived
        from the fence by the caller, so that a rerun writes identical bytes."""
        return cls("upgrade", token, committed_at, op=OpRef(op_token, from_format=2, fence_epoch=fence_epoch))

    # ------------------------------------------------------------------------------------------

    def at(self, version: int, table_id: str) -> Commit:
        """This commit as version ``version`` of the table ``table_id``."""
        if version < 0:
            raise ValueError(f"a log version must be >= 0, got {version}")
        if not table_id:
            raise ValueError("a commit needs the table id of table.json, got an empty one")
        header = CommitHeader(
            version,
            table_id,
            self.kind,
            self.token,
            self.committed_at,
            self.writer,
            self.continues,
            self.allow_other_queries,
            self.source_offsets,
            self.op,
            CommitCounts.of(self.removes, self.adds),
            self.schema,
        )
        return Commit(header, self.removes, self.adds)


def _path(file: AddFile | RemoveFile) -> str:
    return file.path


# Shape checks: shared by the builders and the decoder (a check failing there is a corrupt commit).


def _check_header_fields(
    kind: str,
    token: str,
    writer: WriterRef | None,
    continues: Continuation | None,
    allow_other_queries: bool | None,
    op: OpRef | None,
) -> None:
    if kind not in COMMIT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(COMMIT_KINDS)}, got {kind!r}")
    if not _COMMIT_TOKEN.fullmatch(token):
        raise ValueError(f"token must be 8-64 characters of [0-9a-z-], got {token!r}")
    if kind == "append":
        if writer is None or op is not None:
            raise ValueError("an append has a writer and no op")
        if writer.batch < 0:
            raise ValueError(f"writer.batch must be >= 0, got {writer.batch}")
        if writer.tag != writer_tag(writer.id):
            raise ValueError(f"writer.tag {writer.tag!r} is not the tag of writer {writer.id!r}")
        if not _COMMIT_TOKEN.fullmatch(writer.run):
            raise ValueError(f"writer.run must be 8-64 characters of [0-9a-z-], got {writer.run!r}")
        if not isinstance(allow_other_queries, bool):
            raise ValueError(f"allow_other_queries of an append must be a bool, got {allow_other_queries!r}")
        if continues is not None:
            if continues.check not in OFFSETS_CHECKS:
                raise ValueError(f"continues.check must be kafka or equal, got {continues.check!r}")
            if continues.writer == writer.id:
                raise ValueError(f"writer {writer.id!r} cannot continue itself")
            if writer.batch != 0:
                # Only a writer's first commit continues another; a query keeps the option across
                # restarts, so its committer passes it with batch 0 alone.
                raise ValueError(f"only batch 0 continues a writer, got batch {writer.batch}")
        return
    if writer is not None or continues is not None or op is None:
        raise ValueError(f"a {kind} commit has an op and no writer")
    if allow_other_queries is not None:
        raise ValueError(f"allow_other_queries is for appends, not a {kind} commit")
    if not _OP_TOKEN.fullmatch(op.token):
        raise ValueError(f"op.token must be 16 hex digits, got {op.token!r}")
    wanted = _OP_FIELDS[cast(CommitKind, kind)]
    for name in ("base_version", "abandons", "retained_from", "from_format", "fence_epoch"):
        value = getattr(op, name)
        if (value is None) == (name in wanted):
            needed = "required" if value is None else "not allowed"
            raise ValueError(f"op.{name} is {needed} in a {kind} commit")
    if op.trigger is not None and (kind != "compact" or op.trigger not in COMPACT_TRIGGERS):
        raise ValueError(f"op.trigger must be one of {list(COMPACT_TRIGGERS)} in a compact commit, "
                         f"got {op.trigger!r} in a {kind} commit")  # fmt: skip
    if op.abandons is not None and not _OP_TOKEN.fullmatch(op.abandons):
        raise ValueError(f"op.abandons must be an op token (16 hex digits), got {op.abandons!r}")
    for name in ("base_version", "retained_from", "fence_epoch"):
        value = getattr(op, name)
        if value is not None and value < 0:
            raise ValueError(f"op.{name} must be >= 0, got {value}")


def _check_actions(
    kind: str, writer: WriterRef | None, removes: Sequence[RemoveFile], adds: Sequence[AddFile]
) -> None:
    if len(removes) + len(adds) > limits.COMMIT_ACTIONS:
        raise ValueError(
            f"a commit holds at most {limits.COMMIT_ACTIONS:,} file actions (docs/FORMAT.md, Trust), "
            f"this one {len(removes) + len(adds):,}: write fewer files per batch (fewer tasks or "
            "partition folders)"
        )
    seen: set[str] = set()
    actions: list[AddFile | RemoveFile] = [*removes, *adds]
    for action in actions:
        _check_path(action.path)
        if action.path in seen:
            raise ValueError(f"path {action.path!r} appears twice in one commit")
        seen.add(action.path)
        if action.rows < 0 or action.size < 0:
            raise ValueError(f"rows and bytes of {action.path!r} must be >= 0: {action.rows}, {action.size}")
    if kind == "append":
        if removes:
            raise ValueError("an append removes no files (appends never conflict)")
        assert writer is not None
        for add in adds:
            if add.batch != writer.batch:
                raise ValueError(f"add {add.path!r} of batch {add.batch} in a commit of batch {writer.batch}")
            if add.partition is not None and add.partition < 0:
                raise ValueError(f"partition of {add.path!r} must be >= 0, got {add.partition}")
    elif kind == "compact":
        if not removes:
            raise ValueError("a compaction removes at least one file")
        for add in adds:
            if add.batch is not None or add.partition is not None:
                raise ValueError(f"compaction output {add.path!r} has no batch and no partition")
    elif removes or adds:
        raise ValueError(f"a {kind} commit has no file actions")


def _check_path(path: str) -> None:
    """A root-relative, '/'-separated path that cannot leave the root or enter ``_lakesink``:
    the lake's one name rule (``names.unsafe_name``), also for checkpoint lists and epoch records."""
    if unsafe_name(path):
        raise ValueError(f"refusing the path {path!r}: {NAME_RULE} and outside _lakesink/")


# Encoding -----------------------------------------------------------------------------------------


def _json_value(value: Any, what: str) -> Any:
    """``value`` as it will read back from JSON (tuples become lists); ValueError naming ``what``."""
    try:
        return json.loads(jsondoc.canonical(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be plain JSON (no NaN or infinity): {exc}") from exc


def _counts_doc(counts: CommitCounts) -> dict[str, Any]:
    return {
        "add_files": counts.add_files,
        "add_rows": counts.add_rows,
        "add_bytes": counts.add_bytes,
        "remove_files": counts.remove_files,
        "remove_rows": counts.remove_rows,
        "remove_bytes": counts.remove_bytes,
        "add_histogram": list(counts.add_histogram),
        "remove_histogram": list(counts.remove_histogram),
    }


def _header_doc(header: CommitHeader) -> dict[str, Any]:
    writer, continues, op = header.writer, header.continues, header.op
    return {
        "format_version": LOG_FORMAT_VERSION,
        "version": header.version,
        "read_version": header.read_version,
        "table_id": header.table_id,
        "kind": header.kind,
        "token": header.token,
        "committed_at": header.committed_at,
        "writer": None
        if writer is None
        else {"id": writer.id, "tag": writer.tag, "batch": writer.batch, "run": writer.run},
        "continues": None
        if continues is None
        else {
            "writer": continues.writer,
            "after_batch": continues.after_batch,
            "after_version": continues.after_version,
            "offsets": continues.offsets,
            "check": continues.check,
        },
        "allow_other_queries": header.allow_other_queries,
        "source_offsets": header.source_offsets,
        # Only the fields of the op's kind: the header says what the op is, nothing more.
        "op": None
        if op is None
        else {
            "token": op.token,
            **{name: getattr(op, name) for name in _OP_FIELDS[header.kind]},
            **{
                name: getattr(op, name)
                for name in _OP_OPTIONAL_FIELDS.get(header.kind, ())
                if getattr(op, name) is not None
            },
        },
        "counts": _counts_doc(header.counts),
        # Only in the commits that change the schema: the others' bytes stay as they were.
        **({"schema": header.schema} if header.schema is not None else {}),
    }


def encode_commit(commit: Commit) -> bytes:
    """The canonical bytes of ``commit``: equal commits give equal bytes."""
    lines: list[dict[str, Any]] = [{"commit": _header_doc(commit.header)}]
    lines += [{"remove": {"path": r.path, "rows": r.rows, "bytes": r.size}} for r in commit.removes]
    text = [jsondoc.canonical(line) + "\n" for line in lines]
    for a in commit.adds:
        # The stats are canonical text already; "stats" sorts last of an add's keys, so it goes
        # just before the line's closing braces, as if the line had been encoded whole.
        add = {"path": a.path, "partition": a.partition, "rows": a.rows, "bytes": a.size, "batch": a.batch}
        text.append(f'{jsondoc.canonical({"add": add})[:-2]},"stats":{a.stats or "null"}}}}}\n')
    return "".join(text).encode("utf-8")


# Decoding -----------------------------------------------------------------------------------------


def header_line(prefix: bytes) -> bytes | None:
    """The first line of a commit (its header) from a prefix of its bytes; None when the prefix
    ends before the line does (read more)."""
    end = prefix.find(b"\n")
    return None if end < 0 else prefix[:end]


def decode_header(data: bytes, *, where: str) -> CommitHeader:
    """The header of a commit, from its bytes or any prefix holding the whole first line.

    The action lines are not parsed (nor need they be present). CorruptFileError naming
    ``where`` when the header is malformed; FormatVersionError when it is newer than v3.
    """
    line = header_line(data)
    if line is None:
        raise CorruptFileError(f"{where}: the commit's header line is incomplete (no newline)")
    return _parse_header(_json_line(line, where, 1), where)


def decode_commit(data: bytes, *, where: str) -> Commit:
    """A whole commit from its bytes; CorruptFileError naming ``where`` and the line otherwise.

    Besides each line's shape, checks that the actions fit the kind and match the header's
    counts.
    """
    if not data.endswith(b"\n"):
        raise CorruptFileError(f"{where}: the commit is truncated (its last line has no newline)")
    header = _parse_header(_json_line(data[: data.index(b"\n")], where, 1), where)
    declared = header.counts.add_files + header.counts.remove_files
    if declared > limits.COMMIT_ACTIONS:
        # The header's count is the lake writer's too: 256 MiB of short distinct action lines
        # that it counts would be ~1.6 million actions decoded (~2 GB). Refused before a line is.
        raise CorruptFileError(
            f"{where}: its header counts {declared:,} file actions, more than the {limits.COMMIT_ACTIONS:,} "
            "a commit may hold: not a commit lakesink wrote"
        )
    actions = data.count(b"\n") - 1
    if actions != declared:
        # Before the lines are split or decoded: each costs ~2 KB built (its stats), and a commit
        # of one add line repeated 400,000 times took its reader ~1 GB (fuzzer, case 1213).
        raise CorruptFileError(f"{where}: {actions} action lines, but its header counts {declared}")
    removes: list[RemoveFile] = []
    adds: list[AddFile] = []
    # Line by line, not split: one line's bytes at a time beside the commit's, not a copy of all.
    start = data.index(b"\n") + 1
    for number in range(2, actions + 2):
        end = data.index(b"\n", start)
        raw, start = data[start:end], end + 1
        # An action holds a few hundred values; a line of the default million costs ~120 MB while
        # it is decoded (issue 51).
        doc = _json_line(raw, where, number, max_elements=limits.ACTION_VALUES)
        try:
            (key, body), *others = doc.items()
            if others or key not in ("add", "remove"):
                raise ValueError(f"an action line holds one 'add' or 'remove', got keys {sorted(doc)}")
            if not isinstance(body, dict):
                raise ValueError(f"{key} must be a JSON object, got {body!r}")
            if key == "remove":
                removes.append(RemoveFile(_str(body, "path"), _int(body, "rows"), _int(body, "bytes")))
            else:
                adds.append(
                    AddFile(
                        _str(body, "path"),
                        _int(body, "rows"),
                        _int(body, "bytes"),
                        _opt_partition(body),
                        _opt_int(body, "batch"),
                        _stats_text(body.get("stats"), len(raw)),
                    )
                )
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # KeyError: a field missing
            raise CorruptFileError(f"{where}: line {number}: {exc}") from exc
        if adds and key == "remove":
            raise CorruptFileError(f"{where}: line {number}: removes come before adds")
    try:
        _check_actions(header.kind, header.writer, removes, adds)
    except ValueError as exc:
        raise CorruptFileError(f"{where}: {exc}") from exc
    counted = CommitCounts.of(removes, adds)
    if counted != header.counts:
        raise CorruptFileError(f"{where}: header counts {header.counts} differ from the actions' {counted}")
    return Commit(header, tuple(removes), tuple(adds))


def _stats_text(stats: Any, line_bytes: int) -> str | None:
    """An add's decoded stats as the canonical text the commit holds (the objects are dropped
    with the line). Never longer than the line it came from: in a line lakesink wrote it is a
    part of that line, while a crafted one could otherwise grow (``1e15`` is ``1000000000000000.0``
    re-encoded)."""
    if stats is None:
        return None
    text = jsondoc.canonical(stats)
    if len(text) > line_bytes:  # characters against bytes: a line's text has at most as many
        raise ValueError(
            f"its stats encode to {len(text)} characters, more than the {line_bytes} bytes of its line"
        )
    return text


def _json_line(
    raw: bytes, where: str, number: int, *, max_elements: int = jsondoc.MAX_ELEMENTS
) -> dict[str, Any]:
    try:
        doc = jsondoc.loads(raw, max_elements=max_elements)
    except ValueError as exc:
        raise CorruptFileError(f"{where}: line {number} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptFileError(f"{where}: line {number} is not a JSON object")
    return doc


#: Every field a commit header may have (``schema`` only where the commit changes the schema).
_HEADER_KEYS = frozenset(
    {
        "format_version", "version", "read_version", "table_id", "kind", "token", "committed_at", "writer",
        "continues", "allow_other_queries", "source_offsets", "op", "counts", "schema",
    }
)  # fmt: skip


def _parse_header(doc: Mapping[str, Any], where: str) -> CommitHeader:
    body = doc.get("commit")
    if not isinstance(body, dict):
        raise CorruptFileError(f'{where}: line 1 is not a commit header ({{"commit": {{...}}}})')
    version = body.get("format_version")
    if type(version) is not int or version < LOG_FORMAT_VERSION:
        raise CorruptFileError(f"{where}: not a format-v3 commit (format_version {version!r})")
    if version > LOG_FORMAT_VERSION:
        raise FormatVersionError(
            f"{where}: written by lake format version {version}, newer than this lakesink "
            f"understands ({LOG_FORMAT_VERSION}); upgrade lakesink"
        )
    unknown = sorted(set(body) - _HEADER_KEYS)
    if unknown:
        # A field this reader does not know may change what the commit means (as "schema" did):
        # refuse rather than misread it.
        raise FormatVersionError(
            f"{where}: the commit header has field(s) {unknown} that this lakesink does not know: "
            "written by a newer lakesink; upgrade lakesink"
        )
    try:
        kind = _str(body, "kind")
        if kind not in COMMIT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(COMMIT_KINDS)}, got {kind!r}")
        writer_doc, continues_doc, op_doc = body["writer"], body["continues"], body["op"]
        writer = (
            None
            if writer_doc is None
            else WriterRef(
                _str(writer_doc, "id"),
                _str(writer_doc, "tag"),
                _int(writer_doc, "batch"),
                _str(writer_doc, "run"),
            )
        )
        continues = (
            None
            if continues_doc is None
            else Continuation(
                _str(continues_doc, "writer"),
                _int(continues_doc, "after_batch"),
                _int(continues_doc, "after_version"),
                continues_doc["offsets"],
                cast(OffsetsCheck, _str(continues_doc, "check")),
            )
        )
        op = None
        if op_doc is not None:
            extra = set(op_doc) - {"token", *_OP_FIELDS.get(kind, ()), *_OP_OPTIONAL_FIELDS.get(kind, ())}
            if extra:
                raise ValueError(f"op fields {sorted(extra)} do not belong to a {kind} commit")
            op = OpRef(
                _str(op_doc, "token"),
                _opt_int(op_doc, "base_version"),
                _opt_str(op_doc, "abandons"),
                _opt_int(op_doc, "retained_from"),
                _opt_int(op_doc, "from_format"),
                _opt_int(op_doc, "fence_epoch"),
                _opt_str(op_doc, "trigger"),
            )
        allow = body["allow_other_queries"]
        if allow is not None and not isinstance(allow, bool):
            raise ValueError(f"allow_other_queries must be a bool or null, got {allow!r}")
        committed_at = jsondoc.seconds(body["committed_at"], "committed_at")
        header = CommitHeader(
            _int(body, "version"),
            _str(body, "table_id"),
            kind,
            _str(body, "token"),
            committed_at,
            writer,
            continues,
            allow,
            body["source_offsets"],
            op,
            _parse_counts(body["counts"]),
            _opt_str(body, "schema"),
        )
        _check_header_fields(kind, header.token, writer, continues, allow, op)
        if header.schema is not None and kind != "append":
            raise ValueError(f"a {kind} commit carries a schema")
        if body.get("read_version") != header.read_version:
            raise ValueError(f"read_version must be {header.read_version}, got {body.get('read_version')!r}")
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise CorruptFileError(f"{where}: line 1 is not a valid commit header: {exc!r}") from exc
    return header


def _parse_counts(doc: Mapping[str, Any]) -> CommitCounts:
    def histogram(key: str) -> tuple[int, ...]:
        values = doc[key]
        if not isinstance(values, list) or len(values) != HISTOGRAM_BUCKETS:
            raise ValueError(f"counts.{key} must be a list of {HISTOGRAM_BUCKETS} ints, got {values!r}")
        return tuple(_int({key: v}, key) for v in values)

    return CommitCounts(
        add_files=_int(doc, "add_files"),
        add_rows=_int(doc, "add_rows"),
        add_bytes=_int(doc, "add_bytes"),
        remove_files=_int(doc, "remove_files"),
        remove_rows=_int(doc, "remove_rows"),
        remove_bytes=_int(doc, "remove_bytes"),
        add_histogram=histogram("add_histogram"),
        remove_histogram=histogram("remove_histogram"),
    )


def _int(doc: Mapping[str, Any], key: str) -> int:
    return jsondoc.count(doc[key], key)


def _opt_int(doc: Mapping[str, Any], key: str) -> int | None:
    return None if doc.get(key) is None else _int(doc, key)


#: A Spark task's partition id is a Java int, and the checkpoint list holds it as int32: a
#: larger one raised OverflowError where the list is built (fuzzer, session 19, case 305 of
#: ``--mutation number_text``: 2**63-1).
MAX_PARTITION = (1 << 31) - 1


def _opt_partition(doc: Mapping[str, Any]) -> int | None:
    value = _opt_int(doc, "partition")
    if value is not None and value > MAX_PARTITION:
        raise ValueError(f"partition must be at most {MAX_PARTITION}, got {value}")
    return value


def _str(doc: Mapping[str, Any], key: str) -> str:
    value = doc[key]
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _opt_str(doc: Mapping[str, Any], key: str) -> str | None:
    return None if doc.get(key) is None else _str(doc, key)
