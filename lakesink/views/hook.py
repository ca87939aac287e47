"""The shape of a derived view's ``after_commit`` hook: what the Delta view's, the Spark view's
and the Iceberg view's hooks share (``lakesink.views.delta_view.DeltaView``,
``lakesink.views.spark_metadata_view.SparkView``, ``lakesink.views.iceberg_view.IcebergView``).

Each is made for one lake (its storage and table id), with ``create`` (whether it may start a
view the lake does not have: a writer's hook may, maintenance's may not) and, optionally, the
table.json its caller has read already. Its memo -- what this process knows of that lake's
view -- is looked up at each use, never held: a sync's ``forget`` or the memo's bound then
counts at once. And a view is derived: its update never fails the lake commit it follows, so
``__call__`` logs a failure and returns (the next commit or ``lakesink sync-views`` writes it).

Its own module rather than ``lakesink.views.derived``: that module imports the three views to
combine them, and the views import this (no import circle among a package's modules:
``.importlinter``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Generic

from lakesink.views.memo import Memo, ViewMemos
from lakesink_reader.format.table import TableMetadata, read_table_metadata

if TYPE_CHECKING:
    from lakesink_reader.format.v3.commits import Commit
    from lakesink_reader.format.v3.state import TableState
    from lakesink_reader.storage.base import Storage


class ViewHook(Generic[Memo]):
    """An ``after_commit`` hook that keeps one derived view of a lake; subclasses set
    :attr:`view`, :attr:`memos`, :attr:`log` and write the view in :meth:`_after`.

    ``create``: the hook may start the view (a writer with the view's option on); else
    (compaction, vacuum, through ``lakesink.views.derived.maintenance_views``) only a view that
    is there is updated. ``metadata``: the lake's table.json when the caller has it (else read
    on first need, :meth:`_table`).
    """

    #: The view's name in the log ("the <view> of <lake>").
    view: str
    #: This kind of view's memos (one per lake, per process).
    memos: ViewMemos[Memo]
    #: The module's logger, so a failure is logged under the view's module.
    log: logging.Logger
    #: Whether each commit's time is kept in the memo before the update (the views whose files
    #: name the times of the commits that added a file: Delta's ``modificationTime``, Spark's).
    keeps_times: bool = False

    def __init__(
        self, storage: Storage, table_id: str, *, create: bool, metadata: TableMetadata | None = None
    ) -> None:
        self.storage = storage
        self.table_id = table_id
        self.create = create
        self._given = metadata

    @property
    def known(self) -> Memo:
        """What this process knows of the view (looked up each time: a sync's ``forget`` counts)."""
        known = self.memos.get(self.storage, self.table_id)
        if known.table is None and self._given is not None:
            known.table = self._given
        return known

    def __call__(self, commit: Commit, state: TableState) -> None:
        if self.keeps_times:
            self.known.remember_time(commit)
        try:
            self._after(commit, state)
        except Exception:
            self.log.warning(
                "updating the %s of %s at version %d failed; the lake commit stands, and the next "
                "commit or `lakesink sync-views` writes it",
                self.view,
                self.storage.url,
                commit.version,
                exc_info=True,
            )

    def _after(self, commit: Commit, state: TableState) -> None:
        """Bring the view to ``commit``'s version (its own failures may raise: logged above)."""
        raise NotImplementedError

    def _table(self) -> TableMetadata:
        """The lake's table.json, as given or read once per memo (a sync's ``forget`` rereads it)."""
        known = self.known
        if known.table is None:
            known.table = read_table_metadata(self.storage)
        return known.table
