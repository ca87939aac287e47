"""What lakesink reads from a streaming query's Spark checkpoint: its id, and its source offsets.

The Python Data Source API hands a sink neither its query's id at commit time nor any offset,
but Spark keeps both in the checkpoint folder, in formats stable since Spark 2:

- ``metadata``: ``{"id": "<query id>"}``, written before batch 0 (the id survives restarts);
- ``offsets/<batch>``: a version line, a metadata line, then one line per source with the
  JSON of the source's offset at the *end* of the batch (``-`` for a source without one);
- ``sources/<i>/0``: the *initial* offsets of source ``i``, for sources that record them
  (Kafka's: a NUL byte or not, a version line, then the JSON), written when the query first
  plans batch 0.

Spark's Kafka source (``KafkaMicroBatchStream``, checked against connector 4.2.0 and a real
broker in tests/test_kafka.py; the v1 ``KafkaSource`` uses the same writer) writes
``sources/<i>/0`` through its ``KafkaSourceInitialOffsetWriter``: a NUL byte, ``v1``, then
``{"ev":{"0":100,"1":100}}``, ``startingOffsets`` with -1/-2 resolved to the partitions'
latest/earliest offsets at that time (and every partition of the subscription named: the
source refuses specific offsets that leave one out). Its line in ``offsets/<batch>`` is the same
JSON, the next offset to read per partition at the batch's end: what ``lakesink offsets``
prints, and what ``startingOffsets`` takes back. Python data sources record no initial offsets
(their continuations declare them).

A continuation (``continue_writer``: a new query that takes over from a writer whose
checkpoint was lost, docs/design/format-v3.md section 9) starts where that writer ended: its
start offsets are the sources' initial offsets, or, for sources that do not record them, the
ones the user declares with ``continue_offsets`` (what ``lakesink offsets`` printed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from lakesink_reader.storage import Storage, open_storage

log = logging.getLogger(__name__)


def open_checkpoint(location: str, storage_options: Mapping[str, Any] | None) -> Storage:
    """The checkpoint folder as a storage; the lake's options apply to a checkpoint on S3."""
    remote = location.split("://", 1)[0].lower() in ("s3", "s3a")
    return open_storage(location, storage_options if remote else None)


def query_id(checkpoint: Storage) -> str | None:
    """The query id in ``metadata``; None when there is none (yet) or it cannot be read."""
    try:
        return str(json.loads(checkpoint.read_bytes("metadata").decode().splitlines()[0])["id"])
    except Exception:  # absent or unreadable: the caller falls back
        log.debug("no query id in %s/metadata", checkpoint.url, exc_info=True)
        return None


def last_committed_batch(checkpoint: Storage) -> int | None:
    """The newest batch Spark's commit log (``commits/``) holds; None when it holds none or
    cannot be listed."""
    try:
        names = [f.name.rsplit("/", 1)[-1] for f in checkpoint.list("commits")]
    except Exception:  # absent or unreadable: nothing to judge by
        log.debug("no commit log in %s", checkpoint.url, exc_info=True)
        return None
    return max((int(n) for n in names if n.isdigit()), default=None)


def batch_end_offsets(checkpoint: Storage, batch: int) -> list[Any] | None:
    """The sources' offsets at the end of ``batch`` (one entry per source), or None."""
    try:
        text = checkpoint.read_bytes(f"offsets/{batch}").decode()
    except Exception:  # informational: a lake without offsets is still right
        log.debug("no offset log for batch %d under %s", batch, checkpoint.url, exc_info=True)
        return None
    offsets: list[Any] = []
    for line in text.splitlines()[2:]:
        try:
            offsets.append(None if line.strip() == "-" else json.loads(line))
        except ValueError:
            offsets.append(line)
    return offsets


def initial_offsets(checkpoint: Storage, sources: int) -> list[Any] | None:
    """Each source's recorded initial offsets (``sources/<i>/0``); None unless all have them."""
    found = []
    for index in range(sources):
        try:
            raw = checkpoint.read_bytes(f"sources/{index}/0").decode().lstrip("\x00")
        except FileNotFoundError:
            return None
        lines = [line for line in raw.splitlines() if line.strip()]
        try:
            found.append(json.loads(lines[-1]))
        except (ValueError, IndexError):
            return None
    return found


def parse_declared_offsets(text: str | None, sources: int | None) -> list[Any] | None:
    """``continue_offsets`` as one entry per source: a JSON list, or one object for one source."""
    if text is None:
        return None
    try:
        declared = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"continue_offsets must be JSON (what `lakesink offsets` prints), got {text!r}: {exc}"
        ) from None
    if not isinstance(declared, list):
        declared = [declared]
    if sources is not None and len(declared) != sources:
        raise ValueError(f"continue_offsets names {len(declared)} source(s), and the query reads {sources}")
    return declared


def continuation_start(
    checkpoint: Storage, declared: str | None, sources: int | None
) -> tuple[list[Any] | None, str]:
    """A continuing query's start offsets, and where they came from (for messages).

    The sources' own record wins; a declaration that differs from it is refused (the user's
    ``startingOffsets`` and ``continue_offsets`` disagree).
    """
    recorded = initial_offsets(checkpoint, sources) if sources else None
    stated = parse_declared_offsets(declared, sources)
    if recorded is not None:
        if stated is not None and stated != recorded:
            raise ValueError(
                f"continue_offsets {json.dumps(stated)} differs from the offsets the source starts at, "
                f"{json.dumps(recorded)} (its startingOffsets): make them the same, or drop continue_offsets"
            )
        return recorded, "the sources' initial offsets in the checkpoint"
    return stated, "continue_offsets"


class SparkCheckpoint:
    """A streaming query's Spark checkpoint as the writer's run reads it
    (``lakesink.writer.run.QueryCheckpoint``): the query id in ``metadata``, a batch's end
    offsets in the offset log, and a continuing query's start offsets."""

    def __init__(
        self,
        location: str | None,
        storage_options: Mapping[str, Any] | None,
        continue_offsets: str | None = None,
    ) -> None:
        self.location = location
        self.storage_options = storage_options
        self.continue_offsets = continue_offsets

    def __repr__(self) -> str:
        return f"SparkCheckpoint({self.location!r})"

    def _open(self) -> Storage | None:
        return open_checkpoint(self.location, self.storage_options) if self.location else None

    def query_id(self) -> str | None:
        checkpoint = self._open()
        return None if checkpoint is None else query_id(checkpoint)

    def end_offsets(self, batch: int) -> list[Any] | None:
        """The Python Data Source API does not hand offsets to the sink; Spark writes them to its
        offset log before the batch runs. None when unavailable: they are needed only to
        continue a writer from the lake (``continue_writer``)."""
        checkpoint = self._open()
        return None if checkpoint is None else batch_end_offsets(checkpoint, batch)

    def start_offsets(self) -> list[Any] | None:
        """A continuing query's start offsets (``continue_offsets`` must agree with the source's)."""
        checkpoint = self._open()
        if checkpoint is None:
            raise ValueError("continue_writer needs the query's checkpointLocation option")
        sources = batch_end_offsets(checkpoint, 0)
        start, _ = continuation_start(
            checkpoint, self.continue_offsets, len(sources) if sources is not None else None
        )
        return start
