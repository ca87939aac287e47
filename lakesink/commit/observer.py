"""Observers: callables told when the commit protocol reaches each of its steps.

For metrics and tracing, and for the chaos tests, which kill a writer exactly at a step. An
observer travels with the writer to Spark's executors and to the driver's commit worker, so
it must be picklable and importable there. It must not raise: what it raises is logged.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger(__name__)

#: The steps, in protocol order. Executors (both modes): in_write (a row group of the file is
#: in storage), before_publish (sealed, not published), after_publish. Driver (epoch mode):
#: before_record (every file published, no record yet), after_record (the epoch is committed;
#: Spark's own commit log is written after this returns).
POINTS = ("in_write", "before_publish", "after_publish", "before_record", "after_record")


class Observer(Protocol):
    def __call__(self, point: str, epoch: int, partition: int | None) -> None: ...


def notify(observer: Observer | None, point: str, epoch: int, partition: int | None = None) -> None:
    """Tell ``observer`` (if any) that ``point`` was reached; its failures never stop a commit."""
    if observer is None:
        return
    try:
        observer(point, epoch, partition)
    except Exception:
        log.warning("observer %r failed at %s of epoch %d", observer, point, epoch, exc_info=True)
