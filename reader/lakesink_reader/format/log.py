"""The epoch log (``_lakesink/epochs/``): which files each committed epoch holds.

An epoch is committed exactly when its record ``<epoch:020d>.json`` exists. The record is
created once, create-if-absent, after every file it lists was published, and never changes;
a replayed epoch that finds its record is skipped whole. Each record carries a ``commit_id``
unique to the commit that wrote it, so a writer whose create-if-absent answer was lost can
tell its own record from another writer's (``Storage.put_if_absent`` compares the bytes).

So that opening a table stays cheap however many epochs it has, every ``checkpoint_interval``
epochs the writer also folds the records of the epochs since the previous checkpoint into one
*segment* ``<epoch:020d>.checkpoint.json``, which names the earlier segments (``previous``),
and then points the hint ``_last_checkpoint.json`` at it. A reader of the current table loads
the hinted segment, the earlier segments it needs, and the records after it until the first
missing epoch (records are contiguous: the epoch committer refuses gaps). Without a usable
hint it lists the folder and reads the records themselves. Checkpoints and the hint are
derived data; a record is the truth. Format version 1 wrote cumulative checkpoints (every
record since epoch 0): they read as a segment starting at epoch 0.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from lakesink_reader import jsondoc, limits
from lakesink_reader.errors import CorruptFileError, FormatVersionError
from lakesink_reader.names import (
    EPOCH_LAST_CHECKPOINT,
    EPOCH_LOG_FORMAT_VERSION,
    EPOCHS_DIR,
    NAME_RULE,
    epoch_checkpoint_name,
    epoch_record_name,
    parse_epoch_log_entry,
    unsafe_name,
)
from lakesink_reader.storage.base import Storage

DEFAULT_CHECKPOINT_INTERVAL = 100
#: The query id of the record ``lakesink upgrade`` appends to fence a format-2 log before it
#: converts the lake to format 3: no format-2 writer may commit at or after it.
UPGRADE_FENCE_PREFIX = "lakesink-upgrade-"
#: Log entries read at once: on an object store each read is a request of tens of ms.
READ_THREADS = 16

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class CommittedFile:
    """A file of a committed epoch; ``name`` is relative to the table root."""

    name: str
    partition: int
    epoch: int
    rows: int
    size: int


@dataclass(frozen=True)
class EpochInfo:
    """One committed epoch, as listed by ``Lake.epochs()``."""

    epoch: int
    committed_at: float
    files: int
    rows: int
    bytes: int
    source_offsets: Any = None


def _data_name(path: Any) -> str:
    """A record's file name, when it passes the lake's name rule (ValueError, which the log
    turns into CorruptFileError naming the record, otherwise)."""
    if not isinstance(path, str) or unsafe_name(path):
        raise ValueError(f"refusing the path {path!r}: {NAME_RULE} and outside _lakesink/")
    return path


@dataclass(frozen=True)
class EpochRecord:
    """The record of one committed epoch.

    ``query_id``: the streaming query that wrote it (Spark's query id survives restarts from
    one checkpoint), so that another query reaching "its" epoch N is refused, not skipped.
    ``commit_id``: unique per commit attempt, so that the record's bytes are unique.
    """

    epoch: int
    committed_at: float
    files: tuple[CommittedFile, ...]
    source_offsets: Any = None
    query_id: str | None = None
    commit_id: str | None = None

    @classmethod
    def new(
        cls,
        epoch: int,
        files: Iterable[CommittedFile],
        *,
        source_offsets: Any = None,
        query_id: str | None = None,
    ) -> EpochRecord:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        return cls(epoch, time.time(), tuple(files), source_offsets, query_id, uuid.uuid4().hex)

    def info(self) -> EpochInfo:
        return EpochInfo(
            self.epoch,
            self.committed_at,
            len(self.files),
            sum(f.rows for f in self.files),
            sum(f.size for f in self.files),
            self.source_offsets,
        )

    def to_doc(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "committed_at": self.committed_at,
            "commit_id": self.commit_id,
            "source_offsets": self.source_offsets,
            "query_id": self.query_id,
            "files": [
                {"path": f.name, "partition": f.partition, "rows": f.rows, "bytes": f.size}
                for f in self.files
            ],
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> EpochRecord:
        epoch = jsondoc.count(doc["epoch"], "epoch")
        files = tuple(
            CommittedFile(
                _data_name(f["path"]),
                jsondoc.count(f["partition"], "partition"),
                epoch,
                jsondoc.count(f["rows"], "rows"),
                jsondoc.count(f["bytes"], "bytes"),
            )
            for f in doc["files"]
        )
        if len({f.name for f in files}) != len(files):
            # Each listing of a file is a read of it: one file listed 100,000 times took its
            # reader past 1.3 GB (fuzzer, case 1199). Lakesink lists each file of an epoch once.
            raise ValueError("a file is listed more than once")
        query_id, commit_id = doc.get("query_id"), doc.get("commit_id")
        return cls(
            epoch,
            jsondoc.seconds(doc["committed_at"], "committed_at"),
            files,
            doc.get("source_offsets"),
            str(query_id) if query_id is not None else None,
            str(commit_id) if commit_id is not None else None,
        )


@dataclass(frozen=True)
class _Segment:
    """A loaded checkpoint: the records of epochs ``first..last``, and the segments before it."""

    first: int
    last: int
    previous: tuple[int, ...]
    records: tuple[EpochRecord, ...]


class EpochLog:
    """Read and append the epoch log of one table."""

    def __init__(self, storage: Storage, *, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> None:
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int):
            raise TypeError(f"checkpoint_interval must be an int, got {checkpoint_interval!r}")
        if checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {checkpoint_interval}")
        self.storage = storage
        self.checkpoint_interval = checkpoint_interval

    # Writing ------------------------------------------------------------------------------

    def append(self, record: EpochRecord) -> tuple[bool, EpochRecord]:
        """Create the record of ``record.epoch`` unless the epoch already has one.

        Returns ``(True, record)`` when this call's record is in the log -- also when an
        earlier try of this very call created it and its answer was lost -- and ``(False,
        the record found)`` when another commit recorded the epoch first. Every file listed
        must already be published.
        """
        doc = {"format_version": EPOCH_LOG_FORMAT_VERSION, **record.to_doc()}
        name = epoch_record_name(record.epoch)
        if self.storage.put_if_absent(name, json.dumps(doc).encode()):
            return True, record
        found = self.record(record.epoch)
        if found is None:  # records are never deleted: a missing one means a damaged log
            raise CorruptFileError(f"{self._where(name)} was reported to exist, then could not be read")
        return False, found

    def checkpoint_due(self, epoch: int) -> bool:
        return epoch > 0 and epoch % self.checkpoint_interval == 0

    def ensure_checkpoint(self, epoch: int) -> bool:
        """Write the checkpoint segment ending at ``epoch`` if it is due and missing.

        Idempotent, and safe beside a concurrent writer of the same segment (create-if-absent
        of identical content). Called after every commit and every replayed commit, so a
        checkpoint lost to a crash is written by the replay. Returns whether one was written.
        """
        if not self.checkpoint_due(epoch):
            return False
        name = epoch_checkpoint_name(epoch)
        if self.storage.exists(name):
            self._advance_hint(epoch)
            return False
        chain = self._chain_below(epoch)
        first = chain[-1] + 1 if chain else 0
        records = [r for r in self._read_records(range(first, epoch + 1)) if r is not None]
        doc = {
            "format_version": EPOCH_LOG_FORMAT_VERSION,
            "epoch": epoch,
            "first_epoch": first,
            "previous": chain,
            "epochs": [r.to_doc() for r in records],
        }
        self.storage.put_if_absent(name, json.dumps(doc).encode())
        self._advance_hint(epoch)
        return True

    def _advance_hint(self, epoch: int) -> None:
        hinted = self._hint()
        if hinted is None or hinted < epoch:
            self.storage.put(EPOCH_LAST_CHECKPOINT, json.dumps({"epoch": epoch}).encode())

    def _chain_below(self, epoch: int) -> list[int]:
        """The checkpoint epochs whose segments cover every epoch below the newest one < ``epoch``."""
        hinted = self._hint()
        if hinted is not None:
            segment = self._segment(hinted)
            if segment is not None:
                chain = [*segment.previous, hinted]
                return [c for c in chain if c < epoch]
        below = [e for e, kind in self._entries() if kind == "checkpoint" and e < epoch]
        for candidate in sorted(below, reverse=True):
            segment = self._segment(candidate)
            if segment is not None:
                return [*segment.previous, candidate]
        return []

    # Reading ------------------------------------------------------------------------------

    def has(self, epoch: int) -> bool:
        return self.storage.exists(epoch_record_name(epoch))

    def record(self, epoch: int) -> EpochRecord | None:
        """The record of ``epoch``, or None when the epoch is not committed."""
        name = epoch_record_name(epoch)
        try:
            data = limits.read(self.storage, name, limits.EPOCH_RECORD)
        except FileNotFoundError:
            return None
        return self._parse(self._decode(data, name), name)

    def epochs(self, *, as_of_epoch: int | None = None) -> list[EpochInfo]:
        return [r.info() for r in self.records(as_of_epoch=as_of_epoch)]

    def latest_epoch(self) -> int | None:
        """The newest committed epoch, or None for an empty log."""
        via_hint = self._via_hint(None, None)
        if via_hint is not None:
            return via_hint[-1].epoch if via_hint else None
        records = [epoch for epoch, kind in self._entries() if kind == "record"]
        return max(records) if records else None

    def committed_files(
        self, *, as_of_epoch: int | None = None, epochs: tuple[int, int] | None = None
    ) -> list[CommittedFile]:
        """Every file of the committed epochs (all, up to ``as_of_epoch``, or in ``epochs``)."""
        return [f for r in self.records(as_of_epoch=as_of_epoch, epochs=epochs) for f in r.files]

    def records(
        self, *, as_of_epoch: int | None = None, epochs: tuple[int, int] | None = None
    ) -> list[EpochRecord]:
        """The committed epochs' records (all, up to ``as_of_epoch``, or in ``epochs``), oldest first."""
        low = epochs[0] if epochs is not None else 0
        high = as_of_epoch
        if epochs is not None:
            high = epochs[1] if high is None else min(high, epochs[1])
        via_hint = self._via_hint(low, high)
        if via_hint is not None:
            return via_hint
        wanted = sorted(
            e for e, kind in self._entries() if kind == "record" and low <= e and (high is None or e <= high)
        )
        found = self._read_records(wanted)
        missing = [e for e, r in zip(wanted, found, strict=True) if r is None]
        if missing:
            where = self._where(epoch_record_name(missing[0]))
            raise CorruptFileError(f"epoch log entry {where} vanished while the log was read")
        return [r for r in found if r is not None]

    def _via_hint(self, low: int | None, high: int | None) -> list[EpochRecord] | None:
        """Records in ``[low, high]`` from the hinted checkpoint's segments and the records
        after it; None when there is no usable hint (the caller lists the folder instead)."""
        hinted = self._hint()
        if hinted is None:
            return None
        top = self._segment(hinted)
        if top is None:
            return None
        low = 0 if low is None else low
        bounds, first = [], 0
        for last in [*top.previous, hinted]:
            bounds.append((first, last))
            first = last + 1
        needed = [last for first, last in bounds if last >= low and (high is None or first <= high)]
        others = [e for e in needed if e != hinted]
        # READ_THREADS at a time, stopping at the first gone: ``previous`` is the segment's own
        # claim (a crafted one listed a million predecessors: 89 s and 2 GB read at once).
        segments: list[_Segment | None] = []
        for at in range(0, len(others), READ_THREADS):
            segments += self._parallel(self._segment, others[at : at + READ_THREADS])
            if any(s is None for s in segments):
                return None  # a segment of the chain is gone: read the records themselves
        records = [r for s in [*segments, top if hinted in needed else None] if s for r in s.records]
        if high is None or high > hinted:
            records += self._walk(hinted + 1, high)
        by_epoch = {r.epoch: r for r in records if r.epoch >= low and (high is None or r.epoch <= high)}
        return [by_epoch[e] for e in sorted(by_epoch)]

    def _walk(self, start: int, high: int | None) -> list[EpochRecord]:
        """Records ``start, start+1, ...`` up to the first missing one (or ``high``)."""
        found: list[EpochRecord] = []
        epoch = start
        while high is None or epoch <= high:
            batch = range(
                epoch, epoch + READ_THREADS if high is None else min(epoch + READ_THREADS, high + 1)
            )
            for record in self._read_records(batch):
                if record is None:
                    return found
                found.append(record)
            epoch = batch.stop
        return found

    def _read_records(self, epochs: Iterable[int]) -> list[EpochRecord | None]:
        return self._parallel(self.record, list(epochs))

    def _segment(self, epoch: int) -> _Segment | None:
        name = epoch_checkpoint_name(epoch)
        try:
            doc = self._decode(limits.read(self.storage, name, limits.EPOCH_RECORD), name)
        except FileNotFoundError:
            return None
        try:
            records = tuple(self._parse(r, name) for r in doc["epochs"])
            # Format 1 checkpoints were cumulative: every record since epoch 0.
            first = jsondoc.count(doc.get("first_epoch", 0), "first_epoch")
            previous = tuple(jsondoc.count(e, "a previous segment") for e in doc.get("previous", ()))
            if any(b <= a for a, b in itertools.pairwise(previous)) or (previous and previous[-1] >= first):
                raise ValueError("previous segments must be increasing and end below first_epoch")
            return _Segment(first, jsondoc.count(doc["epoch"], "epoch"), previous, records)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(f"epoch log checkpoint {self._where(name)} is malformed: {exc!r}") from exc

    def _hint(self) -> int | None:
        try:
            return jsondoc.count(
                jsondoc.loads(limits.read(self.storage, EPOCH_LAST_CHECKPOINT, limits.HINT))["epoch"], "epoch"
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError, CorruptFileError):
            return None  # a hint: missing or damaged means "list the log"

    def _entries(self) -> list[tuple[int, str]]:
        found: list[tuple[int, str]] = []
        for stored in self.storage.list(EPOCHS_DIR):
            parsed = parse_epoch_log_entry(stored.name.rsplit("/", 1)[-1])
            if parsed is not None:
                found.append(parsed)
        return found

    def _parallel(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(min(READ_THREADS, len(items))) as pool:
            return list(pool.map(fn, items))

    def _where(self, name: str) -> str:
        return f"{self.storage.url.rstrip('/')}/{name}"

    def _decode(self, data: bytes, name: str) -> dict[str, Any]:
        where = self._where(name)
        try:
            doc = jsondoc.loads(data)
            version = int(doc.get("format_version", 0))
        except (ValueError, AttributeError, TypeError) as exc:
            raise CorruptFileError(f"epoch log entry {where} is not valid JSON: {exc}") from exc
        if version > EPOCH_LOG_FORMAT_VERSION:
            raise FormatVersionError(
                f"{where}: written by lake format version {version}, newer than this lakesink "
                f"understands ({EPOCH_LOG_FORMAT_VERSION}); upgrade lakesink"
            )
        return dict(doc)

    def _parse(self, doc: Mapping[str, Any], name: str) -> EpochRecord:
        try:
            return EpochRecord.from_doc(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(f"epoch log entry {self._where(name)} is malformed: {exc!r}") from exc
