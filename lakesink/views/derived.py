"""The derived views a format-3 epoch lake keeps after each commit, as one ``after_commit`` hook,
and what maintenance needs of them: bringing views that lag up, and the files they still list.

- ``_delta_log/`` (:mod:`lakesink.views.delta_view`): Delta readers (deltalake, polars, DuckDB);
- ``_spark_metadata/`` (:mod:`lakesink.views.spark_metadata_view`): ``spark.read.parquet``;
- ``metadata/`` (:mod:`lakesink.views.iceberg_view`): Iceberg readers (pyiceberg, polars), opt-in.

All are derived from the lake's own log, never the truth, and never fail a commit. A view can
lag behind the lake (a writer killed between its lake commit and its view update, a failed
write to the view): whoever updates it next brings it up to the lake's version, and until then
its readers read the version it holds -- whose files ``vacuum`` must therefore keep
(:func:`files_lagging_views_list`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink.commit.versions import AfterCommit
from lakesink.views import delta_view, iceberg_layout, spark_metadata_view
from lakesink.views.delta import delta_commit_name
from lakesink.views.delta_view import DeltaView
from lakesink.views.spark_metadata_view import SparkView
from lakesink_reader.errors import StorageError
from lakesink_reader.format.table import TableMetadata
from lakesink_reader.format.v3.commits import Commit
from lakesink_reader.format.v3.state import TableState
from lakesink_reader.format.v3.vlog import VersionedLog
from lakesink_reader.storage.base import Storage

if TYPE_CHECKING:
    from lakesink.views.iceberg_cleanup import ExpiredFile

log = logging.getLogger(__name__)

#: Runs the thunks it is given at once, returning when all have (:func:`in_threads`; the
#: simulation hands one that runs each as an actor of its own).
Together = Callable[[Sequence[Callable[[], None]]], None]

DELTA = "Delta view (_delta_log/)"
SPARK = "Spark view (_spark_metadata/)"
ICEBERG = "Iceberg view (metadata/)"


class DerivedViews:
    """Calls each view's hook (each logs its own failures and never raises): in turn, or all at
    once through ``together`` (a function that runs the thunks it is given concurrently and
    returns when all have; :func:`in_threads`)."""

    def __init__(self, hooks: Sequence[AfterCommit], together: Together | None = None) -> None:
        self.hooks = tuple(hooks)
        self.together = together

    def __call__(self, commit: Commit, state: TableState) -> None:
        if self.together is None or len(self.hooks) < 2:
            for hook in self.hooks:
                hook(commit, state)
            return
        self.together([functools.partial(hook, commit, state) for hook in self.hooks])


def in_threads(thunks: Sequence[Callable[[], None]]) -> None:
    """Run ``thunks`` at once, the first in this thread and each other in a thread of its own;
    return when all have, raising the first one's exception if any raised."""
    errors: list[BaseException] = []

    def run(thunk: Callable[[], None]) -> None:
        try:
            thunk()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,), name="lakesink-view", daemon=True) for t in thunks[1:]]
    for thread in threads:
        thread.start()
    run(thunks[0])
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def derived_views(
    storage: Storage,
    table_id: str,
    *,
    delta_log: bool = True,
    spark_metadata: bool = True,
    iceberg: bool = False,
    together: Together | None = None,
) -> AfterCommit | None:
    """A writer's hook: the views it keeps (``delta_log``, ``spark_metadata``, ``iceberg``),
    None for none; all at once through ``together`` (:func:`in_threads`; None: one after the
    other)."""
    hooks: list[AfterCommit] = []
    if delta_log:
        hooks.append(DeltaView(storage, table_id, create=True))
    if spark_metadata:
        hooks.append(SparkView(storage, table_id, create=True))
    if iceberg:
        hooks.append(_iceberg_view(storage, table_id, create=True))
    if not hooks:
        return None
    return hooks[0] if len(hooks) == 1 else DerivedViews(hooks, together)


def maintenance_views(storage: Storage, table_id: str, metadata: TableMetadata | None = None) -> DerivedViews:
    """The hook of compaction and vacuum: every view, updated (and brought up) when the lake has
    it, never started (a lake whose writers keep no view gets none from maintenance)."""
    hooks: list[AfterCommit] = [
        DeltaView(storage, table_id, create=False, metadata=metadata),
        SparkView(storage, table_id, create=False),
    ]
    # The Iceberg view only on a lake that keeps one (pyiceberg need not be installed otherwise).
    if (metadata is not None and metadata.iceberg_view) or storage.exists(iceberg_layout.VERSION_HINT):
        hooks.append(_iceberg_view(storage, table_id, create=False, metadata=metadata))
    return DerivedViews(hooks)


def _iceberg_view(
    storage: Storage, table_id: str, *, create: bool, metadata: TableMetadata | None = None
) -> AfterCommit:
    # Here, not at the top: pyiceberg loads only in processes that keep an Iceberg view.
    from lakesink.views.iceberg_view import IcebergView

    return IcebergView(storage, table_id, create=create, metadata=metadata)


def _iceberg_listed(
    storage: Storage, keep: Callable[[str], bool] | None = None
) -> tuple[int, dict[str, int]] | None:
    if iceberg_layout.reader_number(storage) == 0:
        return None  # no view: nothing to load pyiceberg for
    # Here, not at the top: pyiceberg loads only for lakes that have an Iceberg view.
    from lakesink.views.iceberg_view import listed_files

    return listed_files(storage, keep)


def expired_view_files(storage: Storage) -> list[ExpiredFile]:
    """The views' files ``vacuum`` may delete: the Iceberg view's of snapshots it no longer
    holds (``lakesink.views.iceberg_cleanup``; the Delta and Spark views keep their history, as a
    vacuumed Delta table does). Empty when there are none, or when they cannot be known (logged:
    the view is derived, and what is not known to be unneeded stays)."""
    if iceberg_layout.reader_number(storage) == 0:
        return []  # no view: nothing to load pyiceberg for
    try:
        # Here, not at the top: pyiceberg loads only for lakes that have an Iceberg view.
        from lakesink.views.iceberg_cleanup import expired_files

        return expired_files(storage)
    except Exception:
        log.warning("the Iceberg view of %s: its expired files stay this time", storage.url, exc_info=True)
        return []


def bring_up(storage: Storage, vlog: VersionedLog, metadata: TableMetadata) -> int | None:
    """Bring the lake's views (those it has) up to its latest version, as its last commit's hook
    would have; returns that version (None: the log could not be read). Failures are logged,
    not raised (the views are derived):
    see :func:`files_lagging_views_list` for what a view left behind still needs."""
    try:
        state = vlog.open()
        commit = vlog.read_commit(state.version) if state.version >= 0 else None
    except Exception:  # derived work: what a view still lags by is measured after, not assumed
        log.warning("could not bring the views of %s up", storage.url, exc_info=True)
        return None
    if commit is not None:
        maintenance_views(storage, vlog.table_id, metadata)(commit, state)
    return state.version


@dataclass(frozen=True)
class LaggingView:
    """A view whose readers read an older lake version than ``floor``, and the files they read."""

    view: str  # DELTA, SPARK or ICEBERG
    version: int
    files: dict[str, int]
    #: The Spark view's compact batch whose anchor names ``version`` and that is not written yet:
    #: its readers do not read these files yet, its next update writes them (None: they read them).
    anchor: int | None = None


def lagging_views(
    storage: Storage, floor: int, keep: Callable[[str], bool] | None = None
) -> list[LaggingView]:
    """The views of the lake whose readers read a version below ``floor``, with what they list
    (only the files ``keep`` says, when given). Cheap when the views are at or above it (a
    listing of each view's folder; a view's file list is read only when it lags)."""
    out: list[LaggingView] = []
    for view, at_least, listed in (
        (DELTA, _delta_at_least, delta_view.listed_files),
        (SPARK, _spark_at_least, spark_metadata_view.listed_files),
        (ICEBERG, _iceberg_at_least, _iceberg_listed),
    ):
        if at_least(storage, floor):
            continue
        try:
            found = listed(storage, keep)
        except (OSError, StorageError):
            raise  # a failed read (EIO, a 503) says nothing of what the view lists: delete nothing
        except Exception:  # not lakesink's content: `verify` names it as foreign
            log.warning(
                "the %s of %s cannot be read; nothing is kept for it", view, storage.url, exc_info=True
            )
            continue
        if found is not None and found[0] < floor:
            out.append(LaggingView(view, found[0], found[1]))
    # A compact anchor without its batch is kept as a promise: whoever reaches its id fills it
    # with the version it names, even below the floor (taking it over instead races its writer:
    # seed 2770). Its files must therefore outlive the anchor, or that fill lists deleted files
    # (seed 30060). A failed read here raises: the maintenance then deletes nothing.
    for anchor, version, files in spark_metadata_view.promised_files(storage, floor):
        out.append(LaggingView(SPARK, version, files, anchor))
    return out


def _delta_at_least(storage: Storage, version: int) -> bool:
    return version >= 0 and storage.exists(delta_commit_name(version))


def _iceberg_at_least(storage: Storage, version: int) -> bool:
    # The version readers that trust the hint read (pyiceberg's StaticTable does), not the newest.
    number = iceberg_layout.reader_number(storage)
    return number == 0 or version < 0 or number >= iceberg_layout.snapshot_id(version)


def _spark_at_least(storage: Storage, version: int) -> bool:
    layout = spark_metadata_view.read_layout(storage)
    at = layout.version_of(layout.latest) if layout.latest is not None else None
    return at is None or at >= version  # (no view, or one lakesink did not write: nothing to keep)


def files_lagging_views_list(
    storage: Storage, floor: int, among: Collection[str] | None = None
) -> dict[str, str]:
    """The files that views still behind ``floor`` list, each with why it is kept (for
    ``vacuum`` and ``orphans``, which delete only what no version from ``floor`` on lists).
    ``among``: the files the caller would delete; only those are looked for, so that what a
    view lists -- its writer's choice -- is never held whole (docs/design/trust.md)."""
    kept: dict[str, str] = {}
    for lag in lagging_views(storage, floor, among.__contains__ if among is not None else None):
        where, lists = (
            (f"is at lake version {lag.version}", "still lists it")
            if lag.anchor is None
            else (
                f"has an anchor of compact batch {lag.anchor} naming lake version {lag.version}",
                "that batch will list it",
            )
        )
        for name in lag.files:
            kept.setdefault(
                name,
                f"the {lag.view} {where}, below the retained versions (from {floor}), and {lists}: "
                f"kept until the view is brought up (`lakesink sync-views {storage.url}`, or the next "
                "commit)",
            )
    return kept


#: The most files a lagging view lists that ``verify`` looks for one by one once they are not in
#: its listing of the lake, before it says "that many or more are gone".
MOST_GONE = 1000


def view_problems(storage: Storage, retained_from: int, present: Callable[[str], bool]) -> dict[str, str]:
    """For ``verify``, per view (:data:`DELTA`, :data:`SPARK`, :data:`ICEBERG`): what makes its
    readers fail or read what the lake no longer keeps -- files it lists that are not there
    (``present`` says), or a version below ``retained_from`` (vacuumed: its files may go at the
    next vacuum, and the lake commits that would bring it up in order are gone). Views in order
    have no entry."""
    out: dict[str, str] = {}
    fix = f"run `lakesink sync-views {storage.url}` to bring it to the lake's version"
    for view, listed in (
        (DELTA, delta_view.listed_files),
        (SPARK, spark_metadata_view.listed_files),
        (ICEBERG, _iceberg_listed),
    ):
        try:
            found = listed(storage)
        except Exception as exc:  # noqa: BLE001 -- a view lakesink cannot parse: the sync's check says why
            log.info("%s of %s could not be read: %r", view, storage.url, exc)
            continue
        if found is None:
            continue
        version, files = found
        # ``present`` may ask the store about each name (a HEAD on S3), and the view's writer
        # chooses how many it lists: a crafted Spark-view batch of 400,000 names made `verify`
        # stat each (fuzzer, session 18). The first MOST_GONE found are enough to say so.
        gone: list[str] = []
        for name in files:
            if not present(name):
                gone.append(name)
                if len(gone) == MOST_GONE:
                    break
        if gone:
            many = f"{MOST_GONE} or more" if len(gone) == MOST_GONE else str(len(gone))
            out[view] = (
                f"at lake version {version} it lists {many} file(s) that are gone (the first: "
                f"{min(gone)}): its readers fail; {fix}"
            )
        elif version < retained_from:
            out[view] = (
                f"it holds lake version {version}, below the versions the lake retains (from "
                f"{retained_from}; older ones were vacuumed); {fix}"
            )
    return out
