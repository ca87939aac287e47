"""The lakes each case starts from, built once per run with lakesink's own writers (no Spark).

Beside every lake, ``victim/secret.parquet``: another tenant's file of the lake's schema whose
ids (:data:`VICTIM_IDS`) no read of the lake may ever return.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

from tests.lakes import SCHEMA, epoch_lake, rows, v3_file, v3_name, v3_table

WRITER = "11111111-2222-3333-4444-555555555555"
VICTIM_IDS = range(9000, 9050)
#: name -> what it is (the names are the --template choices)
TEMPLATES = {
    "v3": "format 3, 6 appends of 2 files, a checkpoint at version 4, a killed task's staged file",
    "v3views": "the same with its Delta and Spark views (sync-views)",
    "v3compacted": "format 3, 4 appends, one compaction (removes in the log), a killed one's lease",
    "v2": "a format-2 epoch lake (3 epochs of 2 files, its records)",
    "v3parts": "format 3 partitioned by bucket (7 folders), 6 appends, a checkpoint at 4, both views",
    "v3foreach": "format 3 in foreach mode (LakeForeachWriter's hooks): 3 epochs of 2 tasks, a staged file",
    "v3iceberg": "v3views with its Iceberg view too (metadata/: metadata file, manifest list, manifest)",
}
#: Templates built where their cases run (``<workdir>/<place>/lake``) rather than copied there:
#: the Iceberg view's manifests name the lake's absolute paths inside deflate blocks, which no
#: byte replace of a copy can point at the copy (the Spark view's plain lines can: run.py).
BUILT_IN_PLACE = {"v3iceberg": "case-iceberg"}


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


def build_partitioned(path: str, *, batches: int = 6) -> None:
    """A format-3 lake partitioned by ``bucket`` (ids % 7: a file per folder per append), its
    table.json written as a ``partition_by`` writer's first commit would."""
    import json
    import time
    import uuid

    from lakesink.commit.files import WriteOptions
    from lakesink.commit.partitioned import PartitionedWriter
    from lakesink.commit.versions import VersionedLogWriter
    from lakesink_reader.format.table import TableMetadata
    from lakesink_reader.format.v3.commits import AddFile, PendingCommit
    from lakesink_reader.names import TABLE_FILE
    from lakesink_reader.storage import open_storage

    storage = open_storage(path)
    meta = TableMetadata(3, "epoch", SCHEMA, time.time(), uuid.uuid4().hex, partition_columns=("bucket",))
    doc = json.loads(meta.to_json())
    doc["checkpoint_interval"] = 4
    assert storage.put_if_absent(TABLE_FILE, json.dumps(doc, indent=2).encode())
    assert meta.table_id is not None
    vlog = VersionedLogWriter(storage, meta.table_id, checkpoint_interval=4)
    for batch in range(batches):
        parts = iter(range(1000))
        writer = PartitionedWriter(
            storage, SCHEMA, ["bucket"], lambda b=batch, n=parts: v3_name(WRITER, b, next(n)), WriteOptions()
        )
        writer.write(rows(batch * 30, 30))
        adds = [
            AddFile(f.published.name, f.published.rows, f.published.size, 0, batch, f.published.stats)
            for f in writer.publish()
        ]
        vlog.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="run00001", adds=adds))


def build_foreach(path: str, *, epochs: int = 3, partitions: int = 2) -> None:
    """A format-3 foreach lake, written through ``LakeForeachWriter``'s hooks the way pyspark's
    foreach wrapper calls them (a pickled copy per task: open, process each row, close)."""
    import pickle

    from lakesink.spark.foreach import LakeForeachWriter

    writer = LakeForeachWriter(path, schema=SCHEMA, batch_rows=20)
    n = 0
    for epoch in range(epochs):
        for partition in range(partitions):
            task = pickle.loads(pickle.dumps(writer))
            assert task.open(partition, epoch)
            for row in rows(n, 40).to_pylist():
                task.process((row["id"], row["bucket"], row["label"]))
            task.close(None)
            n += 40


def build(base: Path) -> dict[str, Path]:
    """Every template under ``base`` (``base/<name>/lake``, ``base/<name>/victim``)."""
    from lakesink.cli import main
    from lakesink.maintenance import compact
    from lakesink_reader.storage import open_storage

    built = {}
    for name in TEMPLATES:
        root = (base.parent / BUILT_IN_PLACE[name] if name in BUILT_IN_PLACE else base / name) / "lake"
        for folder in (root.parent, base / name):
            if folder.exists():
                shutil.rmtree(folder)
        root.parent.mkdir(parents=True)
        if name == "v2":
            epoch_lake(str(root))
        elif name == "v3parts":
            build_partitioned(str(root))
        elif name == "v3foreach":
            build_foreach(str(root))
        else:  # v3, v3views, v3compacted, v3iceberg
            build_v3(str(root), batches=4 if name == "v3compacted" else 6)
        if name == "v3iceberg":  # as `lakesink config LAKE iceberg_view=true` says it
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["config", str(root), "iceberg_view=true"]) == 0
        if name in ("v3views", "v3parts", "v3iceberg"):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(["sync-views", str(root)]) == 0
        if name in ("v3", "v3foreach"):
            _leave_a_staged_file(root)
        if name == "v3compacted":
            compact(str(root), min_files=2, target_file_size=1 << 20)
            _leave_a_lease(root)
        v3_file(
            open_storage(str(root.parent / "victim")), "secret.parquet", VICTIM_IDS.start, len(VICTIM_IDS)
        )
        if name in BUILT_IN_PLACE:
            shutil.move(root.parent, base / name)
            root = base / name / "lake"
        built[name] = root
    return built


def _leave_a_lease(root: Path) -> None:
    """The lease of a compaction killed a day ago (``_lakesink/ops/<token>.json``, as
    ``compact``'s lease writes it): what the next ``compact`` reads, abandons and deletes."""
    import json
    import time

    token = "0123456789abcdef"
    day_ago = time.time() - 86_400
    doc = {"token": token, "kind": "compact", "base_version": 3, "started_at": day_ago,
           "refreshed_at": day_ago, "host": "fuzz", "pid": 1}  # fmt: skip
    (root / "_lakesink" / "ops" / f"{token}.json").write_text(json.dumps(doc, sort_keys=True))


def _leave_a_staged_file(root: Path) -> None:
    """A task killed before its publish: its staged copy of the next batch's (epoch's) first
    file, hidden and ``.uncommitted`` (``names.staged_name``), which ``read_all`` reads."""
    from lakesink_reader.names import staged_name

    first = min(p for p in root.iterdir() if p.suffix == ".parquet")
    final = re.sub(
        r"(-b|-epoch-)(\d+)",
        lambda m: f"{m.group(1)}{int(m.group(2)) + 100:0{len(m.group(2))}d}",
        first.name,
        count=1,
    )
    shutil.copyfile(first, root / staged_name(final, "0123abcd"))
