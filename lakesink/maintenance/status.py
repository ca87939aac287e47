"""``lakesink status``: what a lake holds and who writes it, read-only and cheap.

It reads table.json, the log's small state (format 3: the newest checkpoint's small part and
the commit headers after it; format 2: the epoch log), and the staged data storage lists --
never the file list of a format-3 lake: the live files' counts and sizes are folded into the
state (docs/design/format-v3.md, section 4).

What it does not see by default: *published* leftovers -- data files a killed or losing attempt
published that no version lists (``lakesink orphans`` finds them). Telling them apart from the
committed files takes what a sweep reads: every data folder listed, and the live file list of a
format-3 lake. ``leftovers=True`` (``lakesink status --leftovers``) runs the sweep's plan,
read-only, and counts what it finds; without it the report says they were not counted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lakesink.commit.files import DEFAULT_STAGED_AGE
from lakesink.maintenance.sweep import sweep
from lakesink.views.delta_view import check_view
from lakesink.views.iceberg_layout import STOP_FILE as ICEBERG_STOP_FILE
from lakesink.views.iceberg_layout import brief
from lakesink.views.spark_metadata_view import check_spark_view
from lakesink_reader.format.table import has_versioned_log, read_table_metadata
from lakesink_reader.format.v3.commits import size_bucket
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.lake import Lake
from lakesink_reader.names import OPS_DIR
from lakesink_reader.storage import Storage, open_storage

#: Files below this size count as small in the report (``lakesink compact`` makes them fewer).
SMALL_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class WriterStatus:
    """One writer (streaming query) of a format-3 lake."""

    id: str
    tag: str
    first_batch: int
    last_batch: int
    last_version: int
    committed_at: float
    offsets: Any
    continues: str | None
    continued_by: str | None
    allow_other_queries: bool


@dataclass(frozen=True)
class Leftovers:
    """What the sweep's plan (``lakesink orphans`` without ``--delete``) finds: ``removable``,
    per kind of orphan, ``[count, bytes]`` (what ``lakesink orphans --delete`` would remove,
    staged data only when older than ``older_than`` seconds); ``kept``: published files of
    batches not committed yet (a commit in flight, or a killed one: its replay settles them)."""

    older_than: float
    removable: dict[str, list[int]]
    kept: int
    kept_bytes: int


@dataclass(frozen=True)
class LakeStatus:
    """What :func:`status` found; ``version`` is the latest lake version (format 3) or epoch (format 2)."""

    path: str
    format_version: int
    mode: str
    table_id: str | None
    version: int | None
    committed_at: float | None
    files: int | None
    rows: int | None
    bytes: int | None
    small_files: int | None
    writers: list[WriterStatus] = field(default_factory=list)
    staged: int = 0
    staged_bytes: int = 0
    oldest_staged_age: float | None = None
    running_ops: int = 0
    #: Format-3 epoch lakes: the Delta view's state (``ok``, ``absent``, ``behind: ...``,
    #: ``foreign: ...``, ``unsupported: ...``); None for lakes that have no view.
    delta_view: str | None = None
    #: Format-3 epoch lakes: the Spark view's state (``ok``, ``absent``, ``behind: ...``,
    #: ``foreign: ...``); None for lakes that have no view.
    spark_view: str | None = None
    #: Format-3 epoch lakes: the Iceberg view's state (``ok``, ``behind: ...``, ``foreign: ...``);
    #: None for lakes that have none.
    iceberg_view: str | None = None
    #: With ``leftovers=True``: what the sweep's plan finds; None when not counted (the default).
    leftovers: Leftovers | None = None

    @property
    def has_log(self) -> bool:
        """A versioned log (format 3, epoch mode): ``version`` counts lake versions, not epochs."""
        return has_versioned_log(self.format_version, self.mode)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def status(
    path: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    now: float | None = None,
    leftovers: bool = False,
) -> LakeStatus:
    """The status of the lake at ``path``; TableNotFoundError / NotALakeError when there is none.

    ``leftovers``: also run the sweep's plan, read-only, and count what it finds (it lists every
    data folder and reads the live file list: as costly as ``lakesink orphans``)."""
    storage = open_storage(path, storage_options)
    metadata = read_table_metadata(storage)
    now = time.time() if now is None else now
    staged = [s for folder in ("", OPS_DIR) for s in storage.staged(folder)]
    ages = [now - s.started for s in staged if s.started is not None]
    common = {
        "path": storage.url,
        "format_version": metadata.format_version,
        "mode": metadata.mode,
        "table_id": metadata.table_id,
        "staged": len(staged),
        "staged_bytes": sum(s.size or 0 for s in staged),
        "oldest_staged_age": max(ages) if ages else None,
    }
    if leftovers:
        common["leftovers"] = _leftovers(storage, now)
    if metadata.has_log:
        return _format3(storage, metadata.table_id or "", common)
    return _format2(path, storage_options, metadata.mode, common)


def _leftovers(storage: Storage, now: float) -> Leftovers:
    report = sweep(storage, older_than=DEFAULT_STAGED_AGE, delete=False, now=now, views=True)
    removable: dict[str, list[int]] = {}
    for o in report.findings:
        counted = removable.setdefault(o.kind, [0, 0])
        counted[0] += 1
        counted[1] += o.size or 0
    return Leftovers(DEFAULT_STAGED_AGE, removable, len(report.kept), sum(o.size or 0 for o in report.kept))


def _format3(storage: Storage, table_id: str, common: dict[str, Any]) -> LakeStatus:
    vlog = VersionedLog(storage, table_id)
    state = vlog.open()
    try:
        view: str | None = check_view(storage, read_table_metadata(storage), vlog, state.version).summary()
    except Exception as exc:  # noqa: BLE001 -- the view is derived: its check never fails the status
        view = f"unknown: {exc!r}"
    try:
        spark_view: str | None = check_spark_view(storage).summary()
    except Exception as exc:  # noqa: BLE001 -- the view is derived: its check never fails the status
        spark_view = f"unknown: {exc!r}"
    try:
        iceberg_view = brief(storage, state.version, ICEBERG_STOP_FILE)
    except Exception as exc:  # noqa: BLE001 -- the view is derived: its check never fails the status
        iceberg_view = f"unknown: {exc!r}"
    small = sum(state.counts.histogram[: size_bucket(SMALL_FILE_BYTES)])
    writers = [
        WriterStatus(
            w.id,
            w.tag,
            w.first_batch,
            w.last_batch,
            w.last_version,
            w.committed_at,
            w.offsets,
            w.continues,
            w.continued_by,
            w.allow_other_queries,
        )
        for w in sorted(state.writers.values(), key=lambda w: w.first_version)
    ]
    leases = [f for f in storage.list(OPS_DIR) if f.name.endswith(".json")]
    return LakeStatus(
        **common,
        version=state.version if state.version >= 0 else None,
        committed_at=state.committed_at,
        files=state.counts.files,
        rows=state.counts.rows,
        bytes=state.counts.bytes,
        small_files=small,
        writers=writers,
        running_ops=len(leases),
        delta_view=view,
        spark_view=spark_view,
        iceberg_view=iceberg_view,
    )


def _format2(
    path: str, storage_options: Mapping[str, Any] | None, mode: str, common: dict[str, Any]
) -> LakeStatus:
    """Formats 1 and 2, and foreach lakes: the epoch log, or the listing (foreach mode)."""
    lake = Lake(path, storage_options)
    epochs = lake.epochs() if mode == "epoch" else []
    files = lake.files()  # read_committed's files
    return LakeStatus(
        **common,
        version=epochs[-1].epoch if epochs else None,
        committed_at=epochs[-1].committed_at if epochs else None,
        files=len(files),
        rows=sum(e.rows for e in epochs) if mode == "epoch" else None,
        bytes=sum(f.size or 0 for f in files),
        small_files=sum(1 for f in files if (f.size or 0) < SMALL_FILE_BYTES),
    )
