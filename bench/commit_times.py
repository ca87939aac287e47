"""When lakesink's commit protocol reached each of its steps, per epoch: an observer that writes it down.

``CommitTimes(path)`` goes to ``lakesink.write_stream(..., observer=...)``. lakesink pickles it
to Spark's Python workers -- the executors (``in_write``, ``before_publish``,
``after_publish``, once per file) and the driver's commit worker (``before_record``,
``after_record``, once per epoch) -- so it cannot keep the times in memory: each call appends
one JSON line to a file, and the bench reads the file after the query. Workers must be able
to import this module: the bench puts bench/ on their PYTHONPATH (``launch.bench_env``).

Times are ``time.time()``: one clock for every process of the machine, and the clock of the
``timestamp`` in Spark's progress events.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CommitTimes:
    """An observer (``lakesink.commit.observer``) appending ``{point, epoch, partition, t}`` to ``path``."""

    path: str

    def __call__(self, point: str, epoch: int, partition: int | None) -> None:
        line = json.dumps({"point": point, "epoch": epoch, "partition": partition, "t": time.time()})
        # One write(2) with O_APPEND per line: lines of concurrent workers do not interleave.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


@dataclass(frozen=True)
class EpochSteps:
    """The protocol steps of one epoch, as wall-clock times (None: the step was not seen)."""

    epoch: int
    files: int  # files published by tasks (after_publish calls)
    last_publish: float | None  # the last task published its file
    before_record: float | None  # the driver is about to write the record
    after_record: float | None  # the record exists: the epoch is committed

    @property
    def record_seconds(self) -> float | None:
        """The commit point itself: writing the epoch's record (one create-if-absent)."""
        if self.before_record is None or self.after_record is None:
            return None
        return self.after_record - self.before_record

    @property
    def driver_commit_seconds(self) -> float | None:
        """From the last task's file being published to the epoch committed: the driver's share.

        It holds Spark handing the tasks' results to the driver's commit worker, lakesink's
        checks (replay, order) and the record; for an epoch without files it is None.
        """
        if self.last_publish is None or self.after_record is None:
            return None
        return self.after_record - self.last_publish


def read_commit_times(path: Path) -> dict[int, EpochSteps]:
    """The steps of every epoch in the observer's file, by epoch (empty when there is no file)."""
    if not path.exists():
        return {}
    points: dict[int, dict[str, list[float]]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            points.setdefault(int(entry["epoch"]), {}).setdefault(entry["point"], []).append(
                float(entry["t"])
            )
    steps = {}
    for epoch, seen in sorted(points.items()):
        steps[epoch] = EpochSteps(
            epoch=epoch,
            files=len(seen.get("after_publish", [])),
            last_publish=max(seen.get("after_publish", []), default=None),
            # A retried commit of the same epoch reports twice: the last attempt is the one that counted.
            before_record=max(seen.get("before_record", []), default=None),
            after_record=max(seen.get("after_record", []), default=None),
        )
    return steps
