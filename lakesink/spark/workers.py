"""What lakesink does about the cost of Spark's Python workers (docs/guide/performance.md).

PySpark reuses a Python worker process for many tasks, and after every task its daemon runs a
full ``gc.collect()`` (pyspark/daemon.py). A full collection walks every object the process
holds -- with pyspark, pyarrow and lakesink imported, some hundreds of thousands of them, tens
of milliseconds each time, and all of it the same long-lived objects: module dictionaries,
functions, classes. ``freeze_heap_once`` moves what exists when a worker first runs lakesink
code into the collector's permanent generation (``gc.freeze``), so the per-task collection
only walks what tasks create. Frozen objects are still freed by reference counting; only a
reference cycle created before the freeze would stay until the worker exits.

And a worker Spark keeps sits idle between tasks holding what its last task's Parquet writer
freed: pyarrow's allocator (mimalloc) keeps freed pages for the next allocation.
``release_arrow_memory`` hands them back after each task (measured: ~4 MiB of each task worker's
PSS, issue 38's memory target), and after each commit (the views' and checkpoints' tables:
~6 MiB of the process that commits, after 300 commits); the next allocation takes them again.
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


def release_arrow_memory() -> None:
    """Return the pages pyarrow's allocator keeps after a task or a commit to the system (above)."""
    # Here, not at the top: this module loads without pyarrow (the data source's lookup imports it).
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
