"""Deprecated home of the orphan sweep: use ``lakesink.maintenance.sweep`` (same arguments)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from lakesink.maintenance.sweep import Orphan, SweepReport, sweep

__all__ = ["Orphan", "SweepReport", "sweep_orphans"]


def sweep_orphans(
    path: str, *, older_than: float, delete: bool = False, storage_options: Mapping[str, Any] | None = None
) -> SweepReport:
    """Deprecated alias of :func:`lakesink.maintenance.sweep`."""
    warnings.warn(
        "lakesink.orphans.sweep_orphans is deprecated: use lakesink.maintenance.sweep",
        DeprecationWarning,
        stacklevel=2,
    )
    return sweep(path, older_than=older_than, delete=delete, storage_options=storage_options)
