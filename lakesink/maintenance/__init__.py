"""Maintenance of a lake beside (or after) its writers: the orphan sweep and the integrity check.

- ``sweep``: finds, and on request removes, what crashed or losing writers left behind. The
  writer's own recovery and the ``lakesink orphans`` command are this one sweep.
- ``verify``: checks that every committed file is there and readable (read-only).
- ``compact``: format 3: rewrites small committed files into larger ones, as one commit.
- ``status``: what a lake holds and who writes it (read-only, without reading a file list).
"""

from lakesink.maintenance.compact import CompactReport, compact
from lakesink.maintenance.status import LakeStatus, status
from lakesink.maintenance.sweep import Orphan, SweepReport, sweep
from lakesink.maintenance.verify import Problem, VerifyReport, verify

__all__ = [
    "CompactReport",
    "LakeStatus",
    "Orphan",
    "Problem",
    "SweepReport",
    "VerifyReport",
    "compact",
    "status",
    "sweep",
    "verify",
]
