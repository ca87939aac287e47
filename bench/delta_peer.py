"""The peer: the Delta table a PySpark 4.3 user would build instead of lakesink, written and counted.

delta-spark supports pyspark <= 4.2 only, so a PySpark 4.3 user who wants an exactly-once
table writes it with deltalake (delta-rs) inside ``foreachBatch``: each micro-batch is
collected to the driver as Arrow and appended, and the commit records the batch id as a Delta
app transaction; a batch whose id the table already holds (a replay after a crash) is skipped.
That is the whole sink, and the run ``delta-peer`` measures it on the bench's stream.

deltalake is imported only where this module runs it -- in the child's driver Python, where
``foreachBatch``'s function runs, and in the counting subprocess -- never at import: delta-rs
panics in forked processes (Spark's Python workers fork from a daemon), and a process that has
read through it may abort at exit (FACTS, "Delta readers").

    .venv/bin/python bench/delta_peer.py count PATH    # prints the table's rows, from file_uris()
"""

from __future__ import annotations

import os
import sys
from typing import Any


def start(df: Any, path: str, checkpoint: str) -> Any:
    """Start ``df`` into a Delta table at ``path``: deltalake's append in ``foreachBatch``, availableNow.

    The app id is the checkpoint: a query restarted from it replays its last batch, which the
    table then already holds.
    """
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    app_id = checkpoint

    def append_once(batch_df: Any, batch_id: int) -> None:
        try:
            done = DeltaTable(path).transaction_version(app_id)
        except TableNotFoundError:  # the first batch creates the table
            done = None
        if done is not None and batch_id <= done:
            return
        write_deltalake(
            path,
            batch_df.toArrow(),
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]),
        )

    return (
        df.writeStream.foreachBatch(append_once)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def count_rows(path: str) -> int:
    """The table's rows, from the files ``DeltaTable.file_uris()`` lists, counted by pyarrow.

    Run in a process of its own (``launch.count_rows`` runs this script), which leaves with
    ``os._exit``: no bench process imports deltalake, and an abort at exit cannot fail the count.

    Not ``to_pyarrow_table``/``to_pandas``: after those the interpreter aborts at exit in 1/3 to
    2/3 of runs; after ``file_uris`` and a pyarrow read it did not (FACTS, "Delta readers").
    """
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    uris = DeltaTable(path).file_uris()
    return int(ds.dataset(uris, format="parquet").count_rows()) if uris else 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["count"] or len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.stdout.write(f"{count_rows(sys.argv[2])}\n")
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown, where delta-rs may abort (see count_rows)
