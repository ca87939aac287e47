"""The lake's names: data files, staged files and metadata, and how a listing is parsed.

Every name here is part of the on-disk contract (docs/FORMAT.md). Only the standard library
(and ``lakesink_reader.errors``, which the package imports anyway).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Literal

from lakesink_reader.errors import CorruptFileError

#: Version of the lake contract in docs/FORMAT.md, and the format of every new lake. Bump it
#: with every change to the contract.
#: 2: epoch records carry a commit id; log checkpoints hold one segment of epochs each;
#: table.json carries a table id (and, in foreach mode, the owning query).
#: 3: the versioned log (``_lakesink/log/``) that several writers share, with source offsets,
#: compaction and vacuum; writers refuse format-1/2 lakes until ``lakesink upgrade`` converts them.
FORMAT_VERSION = 3
#: The newest lake format this code reads.
READABLE_FORMAT_VERSION = 3
#: The features a lake may list in table.json's ``reader_features`` that this code reads: a
#: reader refuses a lake that needs one it does not know (docs/FORMAT.md, "Reader features").
#: ``partitions``: files under Hive-style partition folders (``lakesink_reader.format.partitions``).
READER_FEATURES = ("partitions",)
#: The format of the format-2 epoch log's records and checkpoints (``_lakesink/epochs/``): what
#: format-2 lakes hold and what ``lakesink upgrade`` fences (no writer writes it any more).
EPOCH_LOG_FORMAT_VERSION = 2

#: Hidden folder at the table root holding table metadata and the epoch log. Spark, pyarrow
#: and DuckDB skip names starting with "_" or "." -- and no file in it ends in ".parquet".
META_DIR = "_lakesink"
TABLE_FILE = f"{META_DIR}/table.json"
EPOCHS_DIR = f"{META_DIR}/epochs"
#: Object stores only: one small marker object per staged upload (see ``storage.s3``), so
#: that staged data can be listed on stores that cannot list uploads by prefix (MinIO).
STAGING_DIR = f"{META_DIR}/staging"

#: The store probe's temporary objects (``Storage.check_conditional_writes``): a writer's start,
#: or a maintenance command's, writes one and removes it within seconds. Sweeps leave one
#: alone until it is :data:`PROBE_ABANDONED_AGE` old: removing a live probe's staged upload
#: would fail the run that is probing.
PROBE_PREFIX = f"{META_DIR}/probe-"
PROBE_ABANDONED_AGE = 3600.0


def probe_name() -> str:
    """A fresh name for a store probe's object."""
    return f"{PROBE_PREFIX}{uuid.uuid4().hex}"


#: What no name read from a lake may be (docs/FORMAT.md, "Trust"): empty, absolute, with a scheme
#: (``s3:``, ``file:``, ``C:``), a backslash, a NUL or a line break, an empty, ``.`` or ``..``
#: segment. Such a name could reach outside the table root once joined onto it (or parsed as a
#: URI by a view's reader). Kept to RE2's syntax: the checkpoint file list is checked with it
#: by ``pyarrow.compute`` (no lookaround).
UNSAFE_NAME = r"^$|^/|^[A-Za-z][A-Za-z0-9+.-]*:|[\\\x00\n\r]|//|/$|(^|/)\.\.?(/|$)"
#: ... and what a data file's name may not be besides: inside the lake's metadata folder.
UNSAFE_DATA_NAME = UNSAFE_NAME + r"|^_lakesink(/|$)"
_UNSAFE_NAME = re.compile(UNSAFE_NAME)
_UNSAFE_DATA_NAME = re.compile(UNSAFE_DATA_NAME)
#: How a refused name is described: the rule, so that the message says what is wrong with it.
NAME_RULE = (
    "a name in a lake is relative to the table root and '/'-separated, without '.', '..' or empty "
    "segments, a scheme, a backslash or control characters"
)


def unsafe_name(name: str, *, data: bool = True) -> bool:
    """Whether ``name``, read from the lake, breaks :data:`NAME_RULE` (``data``: or names a file
    under ``_lakesink/``, where no data file is). The one test every logged name passes before
    it becomes a storage path."""
    return (_UNSAFE_DATA_NAME if data else _UNSAFE_NAME).search(name) is not None


def check_name(name: object, where: str, *, data: bool = True) -> str:
    """``name`` when it is a safe name (:func:`unsafe_name`); CorruptFileError naming ``where``
    (the file it was read from) and the entry otherwise."""
    if not isinstance(name, str) or unsafe_name(name, data=data):
        raise CorruptFileError(
            f"{where}: refusing the entry {name!r}: {NAME_RULE}" + (" and outside _lakesink/" if data else "")
        )
    return name


STAGED_SUFFIX = ".uncommitted"
DATA_SUFFIX = ".parquet"

#: The states of a data file (docs/FORMAT.md, "States"). A listing tells staged from
#: published; only the log (epoch mode) or the name (foreach mode) makes a file committed.
FileState = Literal["staged", "published", "committed"]

_DATA_FILE = re.compile(
    r"^part-(?P<partition>\d{5,})-epoch-(?P<epoch>\d{12,})(?:-(?P<writer>[0-9a-f]{8,}))?\.parquet$"
)
#: Format 3's epoch writer: ``w<tag>-b<batch:012d>-p<partition:05d>-<attempt>.parquet``. The tag
#: (``lakesink_reader.format.v3.commits.writer_tag``) says whose file it is, so a sweep can settle it
#: by that writer's last batch, and a writer can find its own files of one batch by prefix.
_WRITER_FILE = re.compile(
    r"^w(?P<writer>[0-9a-f]{16})-b(?P<epoch>\d{12,})-p(?P<partition>\d{5,})-(?P<attempt>[0-9a-f]{8,})\.parquet$"
)
_STAGED = re.compile(r"^\.(?P<final>(?:part|w)[-0-9a-f].+\.parquet)\.(?P<attempt>[0-9a-f]{8,})\.uncommitted$")


@dataclass(frozen=True)
class DataFileName:
    """A parsed data-file name: which (partition, epoch) it holds, and whether it is staged."""

    name: str
    partition: int
    epoch: int  # format 3's writer files: the writer's batch
    state: Literal["staged", "published"]
    final_name: str  # the published name (the name itself, for a published file)
    # foreach: the query tag; epoch mode, format 2: the task attempt's id; format 3: the writer's tag
    writer: str | None


def new_attempt_id() -> str:
    """A fresh id for one task attempt: two attempts never share a staged file."""
    return uuid.uuid4().hex[:16]


def data_file_name(partition: int, epoch: int, writer_id: str | None = None) -> str:
    """The published name of a (partition, epoch) file.

    Foreach mode passes the streaming query's tag: the name is deterministic per (query,
    partition, epoch), so a no-clobber publish is what fences two attempts of the same
    (partition, epoch), and a replay finds the file. Epoch mode passes the attempt's id:
    names never collide there, and the epoch record (not the name) decides what is committed.
    """
    if partition < 0 or epoch < 0:
        raise ValueError(f"partition and epoch must be >= 0, got ({partition}, {epoch})")
    if writer_id is not None and not re.fullmatch(r"[0-9a-f]{8,}", writer_id):
        raise ValueError(f"writer id must be 8 or more lowercase hex digits, got {writer_id!r}")
    suffix = f"-{writer_id}" if writer_id else ""
    return f"part-{partition:05d}-epoch-{epoch:012d}{suffix}{DATA_SUFFIX}"


def writer_file_name(tag: str, batch: int, partition: int, attempt_id: str) -> str:
    """Format 3: the published name of a task attempt's file of batch ``batch`` of the writer
    tagged ``tag``. Unique to the attempt, so a publish never meets another file; the log, not
    the name, makes it committed."""
    if not re.fullmatch(r"[0-9a-f]{16}", tag) or not re.fullmatch(r"[0-9a-f]{8,}", attempt_id):
        raise ValueError(f"bad writer file name parts: tag {tag!r}, attempt {attempt_id!r}")
    if partition < 0 or batch < 0:
        raise ValueError(f"partition and batch must be >= 0, got ({partition}, {batch})")
    return f"w{tag}-b{batch:012d}-p{partition:05d}-{attempt_id}{DATA_SUFFIX}"


def staged_name(final_name: str, attempt_id: str) -> str:
    """Name under which an attempt stages ``final_name``: hidden ('.' first) and '.uncommitted'."""
    return f".{final_name}.{attempt_id}{STAGED_SUFFIX}"


def parse_data_file(name: str) -> DataFileName | None:
    """Parse a base name at the table root; None for anything that is not a lake data file."""
    staged = _STAGED.match(name)
    final = staged.group("final") if staged else name
    match = _DATA_FILE.match(final) or _WRITER_FILE.match(final)
    if match is None:
        return None
    return DataFileName(
        name=name,
        partition=int(match.group("partition")),
        epoch=int(match.group("epoch")),
        state="staged" if staged else "published",
        final_name=final,
        writer=match.group("writer"),
    )


def parse_writer_file(name: str) -> tuple[str, int] | None:
    """Format 3: (writer tag, batch) of a writer file's published base name (or the final name a
    storage reports for a staged one); None for any other name."""
    match = _WRITER_FILE.match(name)
    return (match.group("writer"), int(match.group("epoch"))) if match else None


#: Format 3: leases of running maintenance ops (``<op token>.json``), hints for sweeps, never locks.
OPS_DIR = f"{META_DIR}/ops"

_COMPACTION_FILE = re.compile(
    r"^c(?P<token>[0-9a-f]{16})-(?P<seq>\d{5,})-(?P<attempt>[0-9a-f]{8,})\.parquet$"
)


def compaction_file_name(op_token: str, seq: int, attempt_id: str) -> str:
    """Format 3: the published name of output ``seq`` of compaction ``op_token``
    (``c<op token>-<seq:05d>-<attempt>.parquet``). Unique to the op and the attempt, so a
    publish never meets another file; the log, not the name, makes it committed."""
    if (
        not re.fullmatch(r"[0-9a-f]{16}", op_token)
        or not re.fullmatch(r"[0-9a-f]{8,}", attempt_id)
        or seq < 0
    ):
        raise ValueError(f"bad compaction file name parts: {op_token!r}, {seq!r}, {attempt_id!r}")
    return f"c{op_token}-{seq:05d}-{attempt_id}{DATA_SUFFIX}"


def parse_compaction_file(name: str) -> str | None:
    """The op token of a compaction output's base name (published name, or the final name a
    storage reports for a staged one); None for any other name. ``parse_data_file`` does not
    parse these: sweeps and ``read_all`` see them as data files of no epoch."""
    match = _COMPACTION_FILE.match(name)
    return match.group("token") if match else None


def epoch_record_name(epoch: int) -> str:
    """The epoch-mode commit record of ``epoch`` (zero-padded so names sort by epoch)."""
    return f"{EPOCHS_DIR}/{epoch:020d}.json"


def epoch_checkpoint_name(epoch: int) -> str:
    """A checkpoint of the epoch log: the records of one segment of epochs ending at ``epoch``."""
    return f"{EPOCHS_DIR}/{epoch:020d}.checkpoint.json"


#: Hint naming the newest checkpoint of the epoch log, so readers need not list the log.
#: Safe to lose or to lag (readers then start from an older checkpoint or list the folder).
EPOCH_LAST_CHECKPOINT = f"{EPOCHS_DIR}/_last_checkpoint.json"

_EPOCH_LOG_ENTRY = re.compile(r"^(?P<epoch>\d{20})\.(?P<kind>json|checkpoint\.json)$")


def parse_epoch_log_entry(name: str) -> tuple[int, Literal["record", "checkpoint"]] | None:
    """Parse a base name in the epoch log folder: (epoch, "record" | "checkpoint") or None."""
    match = _EPOCH_LOG_ENTRY.match(name)
    if match is None:
        return None
    kind: Literal["record", "checkpoint"] = "record" if match.group("kind") == "json" else "checkpoint"
    return int(match.group("epoch")), kind
