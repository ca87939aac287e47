"""Small statistics of the bench: the median run, the spread of repetitions, percentiles, ratios."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def median_run(runs: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    """The run with the median ``key`` (the lower middle one for an even count) and the number of runs.

    A real run rather than the median of each figure on its own: its figures belong together.
    """
    ordered = sorted(runs, key=lambda run: run[key])
    figures = dict(ordered[(len(ordered) - 1) // 2])
    figures["runs"] = len(runs)
    return figures


def middle(values: Sequence[float]) -> float:
    """The median, taken as the lower middle value for an even count, as :func:`median_run` does."""
    return sorted(values)[(len(values) - 1) // 2]


def spread(values: Sequence[float]) -> dict[str, float]:
    """min, max, median and the relative spread ``(max - min) / median`` of repeated measurements."""
    median = middle(values)
    return {
        "min": min(values),
        "max": max(values),
        "median": median,
        "relative": (max(values) - min(values)) / median if median else 0.0,
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linearly interpolated between ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(value: float | None, base: float | None) -> float | None:
    """``value / base``, or None when either is missing or the base is zero."""
    if value is None or not base:
        return None
    return value / base


def p50_p95(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "count": len(values)}
