"""The most lakesink reads of each kind of lake file, in one place (docs/FORMAT.md, "Trust").

Whoever can write a lake's folder chooses its files' sizes: a sparse 6 GiB file costs them
nothing and, read whole, costs a reader 6 GiB. Every read of a lake's metadata passes through
:func:`read` with the limit of its kind: the file's first ``most + 1`` bytes are read (one
``read``, one ranged GET), and a file longer than ``most`` is ``CorruptFileError`` naming it.
Each limit is far above the largest file of its kind lakesink writes (said beside it). What the
decoders build from the bytes is bounded separately (``jsondoc``: values, depth, numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink_reader.errors import CorruptFileError
from lakesink_reader.redact import redacted

if TYPE_CHECKING:
    from lakesink_reader.storage.base import Storage

KiB = 1 << 10
MiB = 1 << 20


@dataclass(frozen=True)
class Kind:
    """A kind of lake file and the most bytes a reader reads of one."""

    name: str
    most: int


#: ``_lakesink/table.json``: fields and the Arrow schema in base64 (~300 bytes per column).
TABLE = Kind("table.json", 16 * MiB)
#: A format-3 commit: a header line and one line per file action (~0.3-3 KB each: a compaction
#: of 100,000 files with statistics of 32 columns stays under 256 MiB). Each line is a JSON
#: document bounded by ``jsondoc`` too.
COMMIT = Kind("commit", 256 * MiB)
#: A format-3 checkpoint's small part: the state (writers, ops, counts), ~1 KB per writer.
CHECKPOINT = Kind("checkpoint", 64 * MiB)
#: ``_last_checkpoint``, a format-2 ``_last_checkpoint``, a view's hint: ``{"version": n}``.
HINT = Kind("hint", 4 * KiB)
#: A format-1/2 epoch record (~200 bytes per file of the epoch) or checkpoint segment.
EPOCH_RECORD = Kind("format-2 epoch record", 64 * MiB)
#: A running compaction's lease (``_lakesink/ops/<token>.json``): a few fields.
OPS_LEASE = Kind("ops lease", 64 * KiB)
#: A Delta-view commit (the lakesink commit's actions again) or a Spark-view batch or compact
#: file (one line per live file: ~300 bytes, so ~900,000 files); a view's stop note, a Spark-view anchor.
VIEW_FILE = Kind("view file", 256 * MiB)
VIEW_NOTE = Kind("view note", 64 * KiB)

#: The most file actions (adds and removes) one format-3 commit may hold: its header's count is
#: checked against it before a line is decoded, and lakesink's writers never commit more. A
#: decoded action costs ~1 KB (an ``AddFile``, its path and its stats' text): the commit's
#: 256 MiB of short lines would be ~1.6 million of them, ~2 GB; 200,000 cost ~200 MB. What
#: lakesink writes: an append, one file per task and partition folder (a batch of more fails,
#: naming this bound); a compaction, at most ``compact.MAX_INPUT_FILES`` (100,000) inputs and
#: fewer outputs; an upgrade, one commit per format-2 epoch record (a file per task).
COMMIT_ACTIONS = 200_000
#: The most values one action line of a format-3 commit may hold (``jsondoc.count_elements``:
#: its commas and opening brackets, those inside strings too), against ``jsondoc``'s million for
#: any document: decoding a line of a million costs up to ~120 MB, of this bound ~40 MB, and
#: only while that one line is decoded (its stats are then kept as text). What lakesink writes:
#: ~110 outside strings (an add's fields, stats of at most 32 columns); inside them, the string
#: bounds (64 of at most 4096 bytes: 262,144 commas at worst) and the columns' names.
ACTION_VALUES = 300_000

KINDS = (TABLE, COMMIT, CHECKPOINT, HINT, EPOCH_RECORD, OPS_LEASE, VIEW_FILE, VIEW_NOTE)


def read(storage: Storage, name: str, kind: Kind, *, first_contact: bool = False) -> bytes:
    """The whole of ``name``, a file of ``kind``: ``CorruptFileError`` naming it when it holds
    more than ``kind.most`` bytes (only ``kind.most + 1`` of them are read); FileNotFoundError
    when it does not exist."""
    data = storage.read_bytes(name, first_contact=first_contact, limit=kind.most + 1)
    if len(data) > kind.most:
        raise CorruptFileError(
            f"{redacted(storage.url.rstrip('/'))}/{name}: more than {kind.most:,} bytes, "
            f"the most a {kind.name} may hold"
        )
    return data
