"""The lakes each case starts from, built once per run with lakesink's own writers (no Spark).

Beside every lake, ``victim/secret.parquet``: another tenant's file of the lake's schema whose
ids (:data:`VICTIM_IDS`) no read of the lake may ever return.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from tests.lakes import epoch_lake, v3_file, v3_name, v3_table

WRITER = "11111111-2222-3333-4444-555555555555"
VICTIM_IDS = range(9000, 9050)
#: name -> what it is (the names are the --template choices)
TEMPLATES = {
    "v3": "format 3, 6 appends of 2 files, a checkpoint at version 4",
    "v3views": "the same with its Delta and Spark views (sync-views)",
    "v3compacted": "format 3, 4 appends then one compaction (removes in the log)",
    "v2": "a format-2 epoch lake (3 epochs of 2 files, its records)",
}


def build_v3(path: str, *, batches: int = 6) -> None:
    from lakesink.commit.versions import VersionedLogWriter
    from lakesink_reader.format.v3.commits import PendingCommit

    storage, table_id = v3_table(path, checkpoint_interval=4)
    vlog = VersionedLogWriter(storage, table_id, checkpoint_interval=4)
    n = 0
    for batch in range(batches):
        adds = []
        for p in range(2):
            adds.append(v3_file(storage, v3_name(WRITER, batch, p), n, 50, batch=batch, partition=p))
            n += 50
        vlog.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="run00001", adds=adds))


def build(base: Path) -> dict[str, Path]:
    """Every template under ``base`` (``base/<name>/lake``, ``base/<name>/victim``)."""
    from lakesink.cli import main
    from lakesink.maintenance import compact
    from lakesink_reader.storage import open_storage

    built = {}
    for name in TEMPLATES:
        root = base / name / "lake"
        if root.parent.exists():
            shutil.rmtree(root.parent)
        root.parent.mkdir(parents=True)
        if name == "v2":
            epoch_lake(str(root))
        else:
            build_v3(str(root), batches=4 if name == "v3compacted" else 6)
        if name == "v3views":
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(["sync-views", str(root)]) == 0
        if name == "v3compacted":
            compact(str(root), min_files=2, target_file_size=1 << 20)
        v3_file(
            open_storage(str(root.parent / "victim")), "secret.parquet", VICTIM_IDS.start, len(VICTIM_IDS)
        )
        built[name] = root
    return built
