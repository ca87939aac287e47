"""Maintenance of a lake beside (or after) its writers: the orphan sweep and the integrity check.

- ``sweep``: finds, and on request removes, what crashed or losing writers left behind. The
  writer's own recovery and the ``lakesink orphans`` command are this one sweep.
- ``verify``: checks that every committed file is there and readable (read-only).
- ``compact``: format 3: rewrites small committed files into larger ones, as one commit.
- ``status``: what a lake holds and who writes it (read-only, without reading a file list unless
  asked to count the published leftovers).
- ``vacuum``: format 3: commits a retention floor, then removes what no retained version needs.
- ``upgrade``: converts a format-1/2 lake to format 3 in place.
"""

from lakesink.maintenance.compact import CompactReport, compact
from lakesink.maintenance.status import LakeStatus, status
from lakesink.maintenance.sweep import Orphan, SweepReport, sweep, sweep_after_commit
from lakesink.maintenance.upgrade import UpgradeReport, upgrade
from lakesink.maintenance.vacuum import VacuumReport, vacuum
from lakesink.maintenance.verify import Problem, VerifyReport, verify

__all__ = [
    "CompactReport",
    "LakeStatus",
    "Orphan",
    "Problem",
    "SweepReport",
    "UpgradeReport",
    "VacuumReport",
    "VerifyReport",
    "compact",
    "status",
    "sweep",
    "sweep_after_commit",
    "upgrade",
    "vacuum",
    "verify",
]
