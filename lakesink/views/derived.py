"""The derived views a format-3 epoch lake keeps after each commit, as one ``after_commit`` hook.

- ``_delta_log/`` (:mod:`lakesink.views.delta_view`): Delta readers (deltalake, polars, DuckDB);
- ``_spark_metadata/`` (:mod:`lakesink.views.spark_metadata_view`): ``spark.read.parquet``.

Both are derived from the lake's own log, never the truth, and never fail a commit.
"""

from __future__ import annotations

from collections.abc import Sequence

from lakesink.views.delta_view import DeltaView
from lakesink.views.spark_metadata_view import SparkView
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import AfterCommit
from lakesink_reader.storage.base import Storage


class DerivedViews:
    """Calls each view's hook in turn (each logs its own failures and never raises)."""

    def __init__(self, hooks: Sequence[AfterCommit]) -> None:
        self.hooks = tuple(hooks)

    def __call__(self, commit: Commit, state: TableState) -> None:
        for hook in self.hooks:
            hook(commit, state)


def derived_views(
    storage: Storage, table_id: str, *, delta_log: bool = True, spark_metadata: bool = True
) -> AfterCommit | None:
    """A writer's hook: the views it keeps (``delta_log``, ``spark_metadata``), None for none."""
    hooks: list[AfterCommit] = []
    if delta_log:
        hooks.append(DeltaView(storage, table_id, create=True))
    if spark_metadata:
        hooks.append(SparkView(storage, table_id, create=True))
    if not hooks:
        return None
    return hooks[0] if len(hooks) == 1 else DerivedViews(hooks)
