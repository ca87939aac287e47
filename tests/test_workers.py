"""``freeze_heap_once``: a worker's long-lived heap leaves the per-task full collection."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
import pyarrow  # what a worker holds when lakesink first runs there (with pyspark)
from lakesink.spark.workers import freeze_heap_once
assert gc.get_freeze_count() == 0
freeze_heap_once()
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen  # pyarrow alone: tens of thousands of objects
kept = [object() for _ in range(1000)]  # objects made by a task are not frozen later on
gc.collect()
freeze_heap_once()
assert gc.get_freeze_count() == frozen, (gc.get_freeze_count(), frozen)
print(frozen)
"""


def test_the_heap_is_frozen_once_per_process() -> None:
    # In a fresh interpreter: freezing pytest's own heap would outlive this test.
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10_000
