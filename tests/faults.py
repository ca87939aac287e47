"""Fault-injecting writers for tests. Spark's Python workers import this module by name
(conftest puts tests/ on their PYTHONPATH), so the classes pickle by reference."""

from __future__ import annotations

import os
import time
from typing import Any

from lakesink import LakeForeachWriter


class FailFirstAttempt(LakeForeachWriter):
    """Raises mid-partition on the first attempt of one partition of every epoch (or one epoch)."""

    def __init__(
        self, path: str, *, after_rows: int, partition: int = 0, epoch: int | None = None, **kw: Any
    ):
        super().__init__(path, **kw)
        self.after_rows, self.fail_partition, self.fail_epoch = after_rows, partition, epoch

    def open(self, partition_id: int, epoch_id: int) -> bool:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        self._armed = (
            ctx is not None
            and ctx.attemptNumber() == 0
            and partition_id == self.fail_partition
            and (self.fail_epoch is None or epoch_id == self.fail_epoch)
        )
        self._seen = 0
        return super().open(partition_id, epoch_id)

    def process(self, row: Any) -> None:
        self._seen += 1
        if self._armed and self._seen > self.after_rows:
            raise RuntimeError(f"injected failure after {self.after_rows} rows")
        super().process(row)


class HangAfterRows(LakeForeachWriter):
    """After ``after_rows`` rows: flush a row group, touch ``marker``, then hang (to be kill -9'd)."""

    def __init__(self, path: str, *, after_rows: int, marker: str, from_epoch: int = 0, **kw: Any):
        super().__init__(path, **kw)
        self.after_rows, self.marker, self.from_epoch = after_rows, marker, from_epoch

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._seen = 0
        self._hang = epoch_id >= self.from_epoch
        return super().open(partition_id, epoch_id)

    def process(self, row: Any) -> None:
        super().process(row)
        self._seen += 1
        if self._hang and self._seen == self.after_rows:
            self._flush_rows()
            if self._file is not None:
                self._file._flush_row_group()
            with open(self.marker, "a") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(3600)


def start_unchecked(writer: Any, path: str | None = None) -> Any:
    """``writer.start(path)`` without the driver-side checks ``lakesink.register`` installs.

    Those checks refuse most mistakes before a query starts; the writers' own checks, in tasks
    and at commit, stay the backstop (no ``register``, or a race between two starts). Tests of
    the backstop start their query through this, whatever other tests registered before.
    """
    start = type(writer).start
    return getattr(start, "__wrapped__", start)(writer, path)
