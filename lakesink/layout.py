"""The lake's names: how data files, staged files and metadata are called and parsed.

This module is the on-disk contract of docs/FORMAT.md in code. The writer and the reader
both use it, so it must stay free of pyspark (and of anything heavier than the stdlib).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Literal

#: Version of the lake contract in docs/FORMAT.md. Bump it with every change to the contract.
FORMAT_VERSION = 1

#: Hidden folder at the table root holding table metadata and the epoch log. Spark, pyarrow
#: and DuckDB skip names starting with "_" or "." -- and no file in it ends in ".parquet".
META_DIR = "_lakesink"
TABLE_FILE = f"{META_DIR}/table.json"
EPOCHS_DIR = f"{META_DIR}/epochs"

STAGED_SUFFIX = ".uncommitted"
DATA_SUFFIX = ".parquet"

FileState = Literal["committed", "staged"]

_COMMITTED = re.compile(
    r"^part-(?P<partition>\d{5,})-epoch-(?P<epoch>\d{12,})(?:-(?P<writer>[0-9a-f]{8,}))?\.parquet$"
)
_STAGED = re.compile(r"^\.(?P<final>part-.+\.parquet)\.(?P<attempt>[0-9a-f]{8,})\.uncommitted$")


@dataclass(frozen=True)
class DataFileName:
    """A parsed data-file name: which (partition, epoch) it holds and whether it is published."""

    name: str
    partition: int
    epoch: int
    state: FileState
    committed_name: str


def new_attempt_id() -> str:
    """A fresh id for one task attempt: two attempts never share a staged file."""
    return uuid.uuid4().hex[:16]


def committed_name(partition: int, epoch: int, writer_id: str | None = None) -> str:
    """The published name of a (partition, epoch) file.

    Foreach mode passes the streaming query's id: the name is deterministic per (query,
    partition, epoch), so a no-clobber publish is what fences two attempts of the same
    (partition, epoch), and two queries writing one lake never collide. Epoch mode passes the
    attempt's id, because there the epoch record (not the name) decides what is committed.
    """
    if partition < 0 or epoch < 0:
        raise ValueError(f"partition and epoch must be >= 0, got ({partition}, {epoch})")
    suffix = f"-{writer_id}" if writer_id else ""
    return f"part-{partition:05d}-epoch-{epoch:012d}{suffix}{DATA_SUFFIX}"


def staged_name(final_name: str, attempt_id: str) -> str:
    """Name under which an attempt stages ``final_name``: hidden ('.' first) and '.uncommitted'."""
    return f".{final_name}.{attempt_id}{STAGED_SUFFIX}"


def parse_data_file(name: str) -> DataFileName | None:
    """Parse a file name at the table root; None for anything that is not a lake data file."""
    staged = _STAGED.match(name)
    final = staged.group("final") if staged else name
    match = _COMMITTED.match(final)
    if match is None:
        return None
    return DataFileName(
        name=name,
        partition=int(match.group("partition")),
        epoch=int(match.group("epoch")),
        state="staged" if staged else "committed",
        committed_name=final,
    )


def epoch_record_name(epoch: int) -> str:
    """The epoch-mode commit record of ``epoch`` (zero-padded so names sort by epoch)."""
    return f"{EPOCHS_DIR}/{epoch:020d}.json"


def epoch_checkpoint_name(epoch: int) -> str:
    """A checkpoint of the epoch log: every committed file of epochs <= ``epoch``."""
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
