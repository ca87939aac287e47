"""One Spark call of a lakesink writer door, in a process of its own, as pyspark 4.3 makes it.

pyspark runs a data source's ``commit`` and ``abort`` in a driver worker that it ends after any
exception of the call (``worker_run``), so the ``abort`` that follows a failed ``commit`` runs
in a fresh interpreter: nothing the commit remembered survives. The tests of
``tests/test_process_boundaries.py`` run each call through this script, with the data source
instance pickled between them as Spark ships it.

    python tests/spark_calls.py CALL STATE_DIR [BATCH] [--hold-log-creates]

``CALL`` is ``write`` (two tasks of BATCH, their messages pickled to STATE_DIR), ``commit`` or
``abort`` (of BATCH, with those messages; ``abort`` with ``--lost-task`` drops the second
task's message, as Spark hands a failed task's slot), ``batch-write`` (the foreachBatch door's
run: tasks and commit of BATCH in this one process). ``--hold-log-creates`` makes the creates
of the lake's log entries go unanswered: each is queued in STATE_DIR (its first request only)
and never applied here; the test applies it later, as a request that lands after its client
gave up. The exit code is 0, or 3 with the exception's type and message on the last line.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

ROWS = 5  # per task


def rows(schema: Any, batch: int, partition: int) -> Any:
    import pyarrow as pa

    start = 1000 * batch + 100 * partition
    return pa.record_batch([pa.array(range(start, start + ROWS), pa.int64())], schema=schema)


def write_tasks(writer: Any, batch: int, query: str) -> list[Any]:
    """Two tasks of ``batch`` (partitions 0 and 1), their messages."""
    return [writer.write_partition(iter([rows(writer.schema, batch, p)]), p, batch, query) for p in (0, 1)]


def hold_log_creates(state: Path) -> None:
    """Creates of log entries are never answered in this process; the first request of each is
    queued in ``state/held`` for the test to apply later."""
    from lakesink_reader.format.v3.logfiles import LOG_DIR
    from lakesink_reader.storage.local import LocalStorage

    held = state / "held"
    held.mkdir(exist_ok=True)
    original = LocalStorage.put_if_absent

    def put_if_absent(self: LocalStorage, name: str, data: bytes) -> bool:
        if not name.startswith(f"{LOG_DIR}/") or not name.endswith(".json"):
            return original(self, name, data)
        queued = held / name.replace("/", "%")
        if not queued.exists():
            queued.write_bytes(data)
        raise TimeoutError(f"no answer to the create of {name}")

    LocalStorage.put_if_absent = put_if_absent  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    call, state = argv[0], Path(argv[1])
    batch = int(argv[2]) if len(argv) > 2 and not argv[2].startswith("--") else 0
    if "--hold-log-creates" in argv:
        hold_log_creates(state)
    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType())])
    source = pickle.loads((state / "source.pickle").read_bytes())
    query = (state / "query").read_text()
    messages_file = state / f"messages-{batch}.pickle"
    try:
        if call == "batch-write":
            from lakesink.spark.batches import LakeBatchWrite

            door = LakeBatchWrite(source.config)
            door.source = source  # the run's instance (its token), as the door makes it once
            writer = door.source.streamWriter(schema, False)
            tasks = [
                writer.write_partition(iter([rows(writer.schema, batch, p)]), p, batch, query) for p in (0, 1)
            ]
            messages_file.write_bytes(pickle.dumps(tasks))
            writer.commit_batch(tasks, batch)
            return 0
        writer = source.streamWriter(schema, False)  # Spark asks for the writer in every worker
        if call == "write":
            tasks = [
                writer.write_partition(iter([rows(writer.schema, batch, p)]), p, batch, query) for p in (0, 1)
            ]
            messages_file.write_bytes(pickle.dumps(tasks))
        elif call == "commit":
            writer.commit(pickle.loads(messages_file.read_bytes()), batch)
        elif call == "abort":
            messages = pickle.loads(messages_file.read_bytes())
            if "--lost-task" in argv:
                messages[1] = None
            writer.abort(messages, batch)
        else:
            raise SystemExit(f"unknown call {call!r}")
    except Exception as exc:  # noqa: BLE001 - the worker reports it to the JVM and exits
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
