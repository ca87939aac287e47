"""The epoch log (``_lakesink/epochs/``): which files each committed epoch holds.

An epoch is committed exactly when its record ``<epoch:020d>.json`` exists. The record is
created once, create-if-absent (no-clobber link locally, ``If-None-Match`` on S3), after every
file it lists was published; a replayed epoch that finds its record is skipped whole.

So that opening a table stays cheap however many epochs it has, every ``checkpoint_interval``
epochs the driver also writes ``<epoch:020d>.checkpoint.json``: the records of all epochs up
to that one, in one file, and then points the hint ``_last_checkpoint.json`` at it. A reader of
the current table loads the hinted checkpoint and reads the records after it one by one until
the first missing epoch -- no listing of the log, whose records are contiguous because Spark
commits epochs in order and the epoch writer refuses to leave a gap. Time travel below the
hint, or a log without one, lists the folder instead. A checkpoint is derived data; a record
is the truth.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakesink.errors import CorruptFileError
from lakesink.layout import (
    EPOCH_LAST_CHECKPOINT,
    EPOCHS_DIR,
    FORMAT_VERSION,
    epoch_checkpoint_name,
    epoch_record_name,
    parse_epoch_log_entry,
)
from lakesink.storage import Storage

DEFAULT_CHECKPOINT_INTERVAL = 100


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


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    committed_at: float
    files: tuple[CommittedFile, ...]
    source_offsets: Any = None
    #: The streaming query that wrote the record (Spark's query id survives restarts from one
    #: checkpoint); a different query replaying "its" epoch N must not be skipped silently.
    query_id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

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
            "source_offsets": self.source_offsets,
            "query_id": self.query_id,
            "files": [
                {"path": f.name, "partition": f.partition, "rows": f.rows, "bytes": f.size}
                for f in self.files
            ],
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> EpochRecord:
        epoch = int(doc["epoch"])
        files = tuple(
            CommittedFile(str(f["path"]), int(f["partition"]), epoch, int(f["rows"]), int(f["bytes"]))
            for f in doc["files"]
        )
        query_id = doc.get("query_id")
        return cls(
            epoch,
            float(doc["committed_at"]),
            files,
            doc.get("source_offsets"),
            str(query_id) if query_id is not None else None,
        )


class EpochLog:
    """Read and append the epoch log of one table."""

    def __init__(self, storage: Storage, *, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> None:
        if checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {checkpoint_interval}")
        self.storage = storage
        self.checkpoint_interval = checkpoint_interval

    # Writing ------------------------------------------------------------------------------

    def commit(
        self,
        epoch: int,
        files: Iterable[CommittedFile],
        *,
        source_offsets: Any = None,
        query_id: str | None = None,
    ) -> bool:
        """Write the record of ``epoch``; False if it already existed (a replay: nothing changes).

        Every file listed must already be published. On a checkpoint epoch the checkpoint is
        written next -- also when the record already existed, because a crash between the
        record and its checkpoint must not leave the log without its checkpoint for good.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        record = EpochRecord(epoch, time.time(), tuple(files), source_offsets, query_id)
        doc = {"format_version": FORMAT_VERSION, **record.to_doc()}
        created = self.storage.put_if_absent(epoch_record_name(epoch), json.dumps(doc).encode())
        checkpoint_due = epoch > 0 and epoch % self.checkpoint_interval == 0
        if checkpoint_due and (created or not self.storage.exists(epoch_checkpoint_name(epoch))):
            self.write_checkpoint(epoch)
        return created

    def write_checkpoint(self, epoch: int) -> None:
        """Fold every record up to ``epoch`` into one checkpoint file (idempotent)."""
        records = self.records(as_of_epoch=epoch)
        doc = {
            "format_version": FORMAT_VERSION,
            "epoch": epoch,
            "epochs": [r.to_doc() for r in records],
        }
        self.storage.put_if_absent(epoch_checkpoint_name(epoch), json.dumps(doc).encode())
        hinted = self._last_checkpoint()
        if hinted is None or hinted < epoch:
            self.storage.put(EPOCH_LAST_CHECKPOINT, json.dumps({"epoch": epoch}).encode())

    # Reading ------------------------------------------------------------------------------

    def has(self, epoch: int) -> bool:
        return self.storage.exists(epoch_record_name(epoch))

    def record(self, epoch: int) -> EpochRecord | None:
        """The record of ``epoch``, or None when the epoch is not committed."""
        name = epoch_record_name(epoch)
        try:
            data = self.storage.read_bytes(name)
        except FileNotFoundError:
            return None
        return self._parse(self._decode(data, name), name)

    def epochs(self, *, as_of_epoch: int | None = None) -> list[EpochInfo]:
        return [r.info() for r in self.records(as_of_epoch=as_of_epoch)]

    def latest_epoch(self) -> int | None:
        tail = self._tail()
        if tail is not None:
            return tail[-1].epoch if tail else None
        entries = self._entries()
        records = [epoch for epoch, kind in entries if kind == "record"]
        return max(records) if records else None

    def committed_files(
        self, *, as_of_epoch: int | None = None, epochs: tuple[int, int] | None = None
    ) -> list[CommittedFile]:
        """Every file of the committed epochs (all, up to ``as_of_epoch``, or in ``epochs``)."""
        upto = as_of_epoch
        if epochs is not None:
            upto = epochs[1] if upto is None else min(upto, epochs[1])
        records = self.records(as_of_epoch=upto)
        first = epochs[0] if epochs is not None else None
        return [f for r in records if first is None or r.epoch >= first for f in r.files]

    def _entries(self) -> list[tuple[int, str]]:
        found: list[tuple[int, str]] = []
        for stored in self.storage.list(EPOCHS_DIR):
            parsed = parse_epoch_log_entry(stored.name.rsplit("/", 1)[-1])
            if parsed is not None:
                found.append(parsed)
        return found

    def _last_checkpoint(self) -> int | None:
        try:
            return int(json.loads(self.storage.read_bytes(EPOCH_LAST_CHECKPOINT))["epoch"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None  # a hint: missing or damaged means "list the log"

    def _tail(self, as_of_epoch: int | None = None) -> list[EpochRecord] | None:
        """Every record via the hinted checkpoint plus the records after it; None: list instead."""
        base = self._last_checkpoint()
        if base is None or (as_of_epoch is not None and as_of_epoch < base):
            return None
        name = epoch_checkpoint_name(base)
        try:
            doc = self._decode(self.storage.read_bytes(name), name)
        except FileNotFoundError:
            return None
        records = [self._parse(r, name) for r in doc["epochs"]]
        epoch = base + 1
        while as_of_epoch is None or epoch <= as_of_epoch:
            record = self.record(epoch)
            if record is None:
                break
            records.append(record)
            epoch += 1
        return [r for r in records if as_of_epoch is None or r.epoch <= as_of_epoch]

    def records(self, *, as_of_epoch: int | None = None) -> list[EpochRecord]:
        """The committed epochs' records (all, or up to ``as_of_epoch``), oldest first."""
        tail = self._tail(as_of_epoch)
        if tail is not None:
            return tail
        entries = self._entries()
        in_range = [(e, k) for e, k in entries if as_of_epoch is None or e <= as_of_epoch]
        checkpoints = [e for e, k in in_range if k == "checkpoint"]
        by_epoch: dict[int, EpochRecord] = {}
        base = max(checkpoints) if checkpoints else -1
        if checkpoints:
            doc = self._load(epoch_checkpoint_name(base))
            for r in doc["epochs"]:
                record = self._parse(r, epoch_checkpoint_name(base))
                by_epoch[record.epoch] = record
        for epoch, kind in in_range:
            # Records at or below the checkpoint are normally folded into it; one that is not
            # (written after the checkpoint by some other writer) is still the truth.
            if kind == "record" and (epoch > base or epoch not in by_epoch):
                name = epoch_record_name(epoch)
                by_epoch[epoch] = self._parse(self._load(name), name)
        return [by_epoch[e] for e in sorted(by_epoch)]

    def _load(self, name: str) -> dict[str, Any]:
        try:
            data = self.storage.read_bytes(name)
        except FileNotFoundError:
            where = f"{self.storage.url.rstrip('/')}/{name}"
            raise CorruptFileError(f"epoch log entry {where} vanished while the log was read") from None
        return self._decode(data, name)

    def _decode(self, data: bytes, name: str) -> dict[str, Any]:
        where = f"{self.storage.url.rstrip('/')}/{name}"
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise CorruptFileError(f"epoch log entry {where} is not valid JSON: {exc}") from exc
        if int(doc.get("format_version", 0)) > FORMAT_VERSION:
            from lakesink.errors import FormatVersionError

            raise FormatVersionError(f"{where}: written by a newer lake format; upgrade lakesink")
        return dict(doc)

    def _parse(self, doc: Mapping[str, Any], name: str) -> EpochRecord:
        try:
            return EpochRecord.from_doc(doc)
        except (KeyError, TypeError, ValueError) as exc:
            where = f"{self.storage.url.rstrip('/')}/{name}"
            raise CorruptFileError(f"epoch log entry {where} is malformed: {exc!r}") from exc
