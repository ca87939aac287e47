"""What lakesink does about the cost of Spark's Python workers (docs/guide/performance.md).

PySpark reuses a Python worker process for many tasks, and after every task its daemon runs a
full ``gc.collect()`` (pyspark/daemon.py). A full collection walks every object the process
holds -- with pyspark, pyarrow and lakesink imported, some hundreds of thousands of them, tens
of milliseconds each time, and all of it the same long-lived objects: module dictionaries,
functions, classes. ``freeze_heap_once`` moves what exists when a worker first runs lakesink
code into the collector's permanent generation (``gc.freeze``), so the per-task collection
only walks what tasks create. Frozen objects are still freed by reference counting; only a
reference cycle created before the freeze would stay until the worker exits.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_heap_once() -> None:
    """``gc.freeze()`` this process's heap the first time it is called (cheap afterwards)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.freeze()
