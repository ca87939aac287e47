"""The chaos harness's observer: a marker file at each protocol step, then a short pause.

It travels pickled with the writer (``write_stream(observer=...)``, ``LakeForeachWriter(observer=...)``)
to Spark's Python workers, which import this module by name (conftest puts tests/ on their
PYTHONPATH). The harness watches the markers and kills the job with -9 while it pauses there.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class KillPoints:
    """Touch ``<folder>/<point>-<epoch>-<partition>-<pid>`` at each step, then sleep ``pause`` s."""

    folder: str
    pause: float

    def __call__(self, point: str, epoch: int, partition: int | None) -> None:
        marker = os.path.join(
            self.folder, f"{point}-{epoch}-{'' if partition is None else partition}-{os.getpid()}"
        )
        with open(marker, "w"):
            pass
        if self.pause:
            time.sleep(self.pause)


def parse_marker(name: str) -> tuple[str, int, int | None]:
    """(point, epoch, partition) of a marker file name."""
    point, epoch, partition, _pid = name.rsplit("-", 3)
    return point, int(epoch), int(partition) if partition else None
