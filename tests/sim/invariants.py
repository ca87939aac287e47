"""The invariants, checked with a god's-eye view of the store (fault-free, no scheduling point).

After every step that changed the store:

- ``acknowledged``: every batch a writer was told is committed (``commit`` returned) is in the
  log: the writer's ``last_batch`` there is at least its highest acknowledged batch;
- ``readable``: the latest version reads (``Lake(...).to_table()``, lakesink's reader);
- ``exactly_once``: the rows read are whole batches, each once, and exactly the batches the log
  holds (0..``last_batch`` of each writer) -- no committed row lost or duplicated.

At the end (``final``): every retained version reads as the batches committed at or before it;
after a fault-free pass of ``vacuum``, ``orphans --delete`` (the sweep) and, with views,
``sync-views``, each of them reports no failure and the store holds no leftover: no staged
file anywhere, no data file the latest version does not list, no lease; and ``verify`` is clean.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.sim.actors import batch_of, batch_rows
from tests.sim.world import START

if TYPE_CHECKING:
    from tests.sim.run import Env


class Violation(Exception):
    """An invariant does not hold: ``name`` says which."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name


def _stat(path: str) -> tuple[int, int, int] | None:
    """What identifies a file's content here: a published file is never rewritten in place
    (a replacement is a new inode), so an unchanged (inode, size, mtime) is unchanged rows."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _folder_stats(folder: str) -> tuple[tuple[str, tuple[int, int, int] | None], ...]:
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return ()
    return tuple((n, _stat(os.path.join(folder, n))) for n in names)


class Checker:
    def __init__(self, env: Env) -> None:
        self.env = env
        self.checks = 0
        self.full_reads = 0
        # The per-step check re-reads rows only when what it read last could have changed: the
        # latest version and the (inode, size, mtime) of each file it lists (the simulation's
        # speed is this check: issue 32's 100,000 seeds).
        self._state: tuple[object, Any] | None = None
        self._latest: tuple[object, tuple[tuple[str, Any], ...], set[tuple[int, int]]] | None = None
        self._delta: tuple[object, int] | None = None
        self._spark: tuple[object, int] | None = None
        self._iceberg: tuple[object, int] | None = None
        self._iceberg_hint = 0  # the highest version-hint.text seen: it never moves back
        #: A snapshot's manifest list -> the manifests it names (a list is never rewritten).
        self._iceberg_lists: dict[str, tuple[str, ...]] = {}
        self._ids: dict[str, tuple[Any, list[int]]] = {}
        self._versions: dict[int, set[tuple[int, int]]] = {}
        #: Every commit seen in the log: version -> (its committer's ``committed_at``, the store's
        #: time of its object), what vacuum's retention is judged by (``check_retention``).
        self.commit_times: dict[int, tuple[float | None, float | None]] = {}
        #: The batches each version held when it was the latest (the model a reader's read of a
        #: pinned version is held to, ``check_read``).
        self.model: dict[int, frozenset[tuple[int, int]]] = {}

    def _log(self):  # type: ignore[no-untyped-def]
        from lakesink_reader.format.v3.vlog import VersionedLog

        return VersionedLog(self.env.client(None), self.env.table_id, checkpoint_interval=self.env.interval)

    def check(self) -> None:
        """The per-step invariants."""

        self.checks += 1
        log_key = self._log_key()
        if self._state is not None and self._state[0] == log_key:
            state = self._state[1]
        else:
            try:
                state = self._log().open()
            except Exception as exc:
                raise Violation("readable", f"the log cannot be read: {type(exc).__name__}: {exc}") from exc
            self._state = (log_key, state)
            self._note_commit_times(log_key)
        for plan in self.env.writers:
            if not plan.acked:
                continue
            acked = max(plan.acked)
            known = state.writers.get(plan.id)
            if known is None or known.last_batch < acked:
                raise Violation(
                    "acknowledged",
                    f"writer {plan.index} was told batch {acked} committed, but the log at version "
                    f"{state.version} holds up to {None if known is None else known.last_batch}",
                )
        present = self._latest_batches(state.version, log_key)
        if any(plan.views for plan in self.env.writers):
            self.check_delta_view(state.retained_from)
            self.check_spark_view(state.retained_from)
        if any(plan.iceberg for plan in self.env.writers):
            self.check_iceberg_view(state.retained_from)
        expected = {
            (plan.stream, plan.base + b)
            for plan in self.env.writers
            if (known := state.writers.get(plan.id)) is not None
            for b in range(known.last_batch + 1)
        }
        self.model.setdefault(state.version, frozenset(expected))
        if present != expected:
            raise Violation(
                "exactly_once",
                f"the latest version {state.version} holds batches {sorted(present - expected)} the log does "
                f"not, and lacks {sorted(expected - present)} that it does",
            )

    def _note_commit_times(self, log_key: tuple | None = None) -> None:
        """Record the times of the commits that appeared (or were made again) since the last look,
        from the log folder's listing in ``log_key`` (``_log_key``'s; taken now when None)."""
        import json

        from lakesink_reader.format.v3.logfiles import parse_commit_name

        folder = os.path.join(self.env.root, "_lakesink", "log")
        times = self.env.shared.times  # the store's clock at each write (``SimStore``)
        for name, stat in (log_key or self._log_key())[1]:
            version = parse_commit_name(name)
            if version is None or stat is None:
                continue
            modified = times.get(f"_lakesink/log/{name}", stat[2] / 1e9)
            known = self.commit_times.get(version)
            if known is not None and known[1] == modified:
                continue
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    first = f.readline()
                committed_at = float(json.loads(first)["committed_at"])
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                committed_at = None
            self.commit_times[version] = (committed_at, modified)

    def check_retention(self, retained_from: int | None, previous: int, cutoff: float, retain: float) -> None:
        """``retention``: a vacuum whose clock read ``cutoff + retain`` when it returned kept every
        version committed after ``cutoff`` and the newest one at or before it (time travel to
        them works: ``check_versions`` reads each retained one), unless an earlier vacuum had
        given them up already (``previous``). A version is that old when both clocks that saw it
        say so: its committer's and the store's (docs/FORMAT.md, "Vacuum")."""
        self._note_commit_times()
        old = [
            v
            for v, times in self.commit_times.items()
            if (seen := [t for t in times if t is not None]) and max(seen) <= cutoff
        ]
        allowed = max(max(old, default=0), previous)
        if retained_from is not None and retained_from > allowed:
            raise Violation(
                "retention",
                f"a vacuum retaining {retain:g} s moved the oldest readable version to {retained_from}, "
                f"but version {allowed} was still inside the window (committed at or before "
                f"+{cutoff - START:.0f} s, and every later one after it)",
            )

    def _log_key(self) -> object:
        """What the log's state depends on: ``table.json`` and the log folder's files (names,
        inodes, sizes, times; hidden staged names left out)."""
        folder = os.path.join(self.env.root, "_lakesink", "log")
        return (
            _stat(os.path.join(self.env.root, "_lakesink", "table.json")),
            tuple(entry for entry in _folder_stats(folder) if not entry[0].startswith(".")),
        )

    def _latest_batches(self, version: int, log_key: object) -> set[tuple[int, int]]:
        """The (writer, batch) pairs the latest version holds, read with lakesink's reader
        (``Lake``) whenever the log or one of the files it lists changed since the last read."""
        from lakesink_reader.lake import Lake

        if self._latest is not None:
            last_key, files, present = self._latest
            if last_key == log_key and all(_stat(path) == st for path, st in files):
                return present
        try:
            lake = Lake(self.env.root)
            files = tuple((f.path, _stat(f.path)) for f in lake.files())
            self.full_reads += 1
            rows = lake.to_table(columns=["id"]).column("id").to_pylist()
        except Exception as exc:
            raise Violation(
                "readable", f"the latest version {version} cannot be read: {type(exc).__name__}: {exc}"
            ) from exc
        present = self.check_rows(rows, f"the latest version {version}")
        self._latest = (log_key, files, present)
        return present

    def _file_ids(self, path: str) -> list[int]:
        """The ids in a data file, read once per (inode, size, mtime)."""
        import pyarrow.parquet as pq

        st = _stat(path)
        cached = self._ids.get(path)
        if cached is not None and cached[0] == st:
            return cached[1]
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
        self._ids[path] = (st, ids)
        return ids

    def _lake_at(self, version: int) -> set[tuple[int, int]]:
        """The batches the lake holds at a retained version (fixed once read: a version's files
        never change; whether it stays readable is ``check_versions``' to say at the end)."""
        from lakesink_reader.lake import Lake

        if version not in self._versions:
            rows = Lake(self.env.root).at(version=version).to_table(columns=["id"]).column("id").to_pylist()
            self._versions[version] = self.check_rows(rows, f"the lake at version {version}")
        return self._versions[version]

    def check_delta_view(self, retained_from: int) -> None:
        """``views``: the Delta view, read as a Delta reader would (its newest checkpoint, then
        its JSON commits; not through lakesink's code): every file it lists exists, none twice,
        and it holds the same rows as the lake at that version (when the lake still retains it)."""
        # Unchanged when its folder and the files it listed are (the lake's retained floor only
        # decides whether the comparison below runs: a view checked against the lake stays so).
        folder = _folder_stats(os.path.join(self.env.root, "_delta_log"))
        if self._delta is not None:
            (last_folder, last_files), last_floor = self._delta
            if (
                last_folder == folder
                and last_floor <= retained_from
                and all(_stat(os.path.join(self.env.root, p)) == st for p, st in last_files)
            ):
                return
        version, paths = delta_view_files(self.env.root)
        if version is None:
            return
        where = f"the Delta view at version {version}"
        twice = sorted(p for p in set(paths) if paths.count(p) > 1)
        if twice:
            raise Violation("views", f"{where} lists {twice[:3]} more than once")
        gone = sorted(p for p in paths if not os.path.exists(os.path.join(self.env.root, p)))
        if gone:
            raise Violation("views", f"{where} lists {len(gone)} file(s) that are gone: {gone[:3]}")
        rows = [r for p in paths for r in self._file_ids(os.path.join(self.env.root, p))]
        present = self.check_rows(rows, where)
        if version >= retained_from and present != self._lake_at(version):
            raise Violation("views", f"{where} holds other batches than the lake at that version")
        files = tuple((p, _stat(os.path.join(self.env.root, p))) for p in paths)
        self._delta = ((folder, files), retained_from)

    def check_spark_view(self, retained_from: int) -> None:
        """``views``: the Spark view (``_spark_metadata/``), read as Spark's file source reads it
        (the newest compact batch at or below the newest batch, then every batch after it; not
        through lakesink's code): every file it lists exists, and it holds whole batches once,
        the same as the lake at the version its newest batch holds (when still retained)."""
        root = self.env.root
        folder = _folder_stats(os.path.join(root, "_spark_metadata"))
        anchors = _folder_stats(os.path.join(root, "_spark_metadata", "_lakesink"))
        if self._spark is not None:
            (last_folder, last_anchors, last_files), last_floor = self._spark
            if (
                (last_folder, last_anchors) == (folder, anchors)
                and last_floor <= retained_from
                and all(_stat(p) == st for p, st in last_files)
            ):
                return
        latest, version, paths = spark_view_files(root)
        if latest is None:
            return
        where = f"the Spark view at batch {latest} (lake version {version})"
        gone = sorted(p for p in set(paths) if not os.path.exists(p))
        if gone:
            raise Violation("views", f"{where} lists {len(gone)} file(s) that are gone: {gone[:3]}")
        # Spark's file index keys files by path: a path listed twice is read once.
        rows = [r for p in dict.fromkeys(paths) for r in self._file_ids(p)]
        present = self.check_rows(rows, where)
        if version is not None and version >= retained_from and present != self._lake_at(version):
            raise Violation("views", f"{where} holds other batches than the lake at that version")
        files = tuple((p, _stat(p)) for p in dict.fromkeys(paths))
        self._spark = ((folder, anchors, files), retained_from)

    def check_iceberg_view(self, retained_from: int) -> None:
        """``views``: the Iceberg view as pyiceberg's ``StaticTable`` reads it given the lake's
        path (the metadata file ``version-hint.text`` names, its current snapshot's manifests;
        not through lakesink's code): the hint never moves back, every file the snapshot lists
        exists, none twice, and it holds the same rows as the lake at the version its snapshot
        holds (when the lake still retains it)."""
        root = self.env.root
        folder = _folder_stats(os.path.join(root, "metadata"))
        if self._iceberg is not None:
            (last_folder, last_files), last_floor = self._iceberg
            if (
                last_folder == folder
                and last_floor <= retained_from
                and all(_stat(p) == st for p, st in last_files)
            ):
                return
        hint_path = os.path.join(root, "metadata", "version-hint.text")
        try:
            with open(hint_path, "rb") as f:
                hint = int(f.read().decode().strip())
        except FileNotFoundError:
            return
        if hint < self._iceberg_hint:
            moved = f"from {self._iceberg_hint} to {hint}"
            raise Violation("views", f"the Iceberg view's hint moved back {moved}")
        self._iceberg_hint = hint
        from pyiceberg.table import StaticTable

        try:
            table = StaticTable.from_metadata(root)
            snap = table.current_snapshot()
            paths = [t.file.file_path for t in table.scan().plan_files()]
        except Exception as exc:
            raise Violation(
                "views", f"the Iceberg view at hint {hint} cannot be read: {type(exc).__name__}: {exc!s:.300}"
            ) from exc
        if snap is None:
            raise Violation("views", f"the Iceberg view at hint {hint} has no current snapshot")
        version = int(snap.summary["lakesink.version"]) if snap.summary is not None else -1
        where = f"the Iceberg view at hint {hint} (snapshot {snap.snapshot_id}, lake version {version})"
        if snap.snapshot_id != hint or version != hint - 1:
            raise Violation("views", f"{where}: its snapshot is not the hint's")
        twice = sorted(p for p in set(paths) if paths.count(p) > 1)
        if twice:
            raise Violation("views", f"{where} lists {twice[:3]} more than once")
        gone = sorted(p for p in paths if not os.path.exists(p))
        if gone:
            raise Violation("views", f"{where} lists {len(gone)} file(s) that are gone: {gone[:3]}")
        # Time travel: every snapshot of a version the lake retains keeps its manifest list and
        # manifests (vacuum deletes only those of snapshots the view no longer holds).
        for older in table.metadata.snapshots:
            held = int(older.summary["lakesink.version"]) if older.summary is not None else -1
            if held < retained_from:
                continue
            named = self._iceberg_lists.get(older.manifest_list)
            if named is None and os.path.exists(older.manifest_list):
                if len(self._iceberg_lists) > 10_000:
                    self._iceberg_lists.clear()
                named = tuple(m.manifest_path for m in older.manifests(table.io))
                self._iceberg_lists[older.manifest_list] = named
            lost = [p for p in (older.manifest_list, *(named or ())) if not os.path.exists(p)]
            if lost:
                raise Violation(
                    "views", f"{where}: snapshot {older.snapshot_id} (lake version {held}) lost {lost[:2]}"
                )
        rows = [r for p in paths for r in self._file_ids(p)]
        present = self.check_rows(rows, where)
        if version >= retained_from and present != self._lake_at(version):
            raise Violation("views", f"{where} holds other batches than the lake at that version")
        files = tuple((p, _stat(p)) for p in paths)
        self._iceberg = ((folder, files), retained_from)

    def check_read(self, version: int, who: str, read: Callable[[], list[int]]) -> list[int]:
        """``reads``: a reader's read of ``version`` (pinned before ``read`` runs) holds exactly the
        batches the model says that version holds; it may fail under a store fault, or when the
        version is no longer retained (a vacuum gave it up meanwhile) -- never otherwise."""
        from tests.sim.store import SimIOError

        try:
            rows = read()
        except Violation:
            raise
        except Exception as exc:
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, SimIOError):
                cause = cause.__cause__ or cause.__context__
            retained_from = self._log().open().retained_from
            if cause is None and version >= retained_from:
                raise Violation(
                    "reads",
                    f"{who} could not read version {version}, which the lake still retains (from "
                    f"{retained_from}): {type(exc).__name__}: {self.env.world.redacted(str(exc)):.300}",
                ) from exc
            raise
        present = self.check_rows(rows, f"{who} ({version})")
        expected = self.model.get(version)
        if expected is not None and present != expected:
            raise Violation(
                "reads",
                f"{who} read version {version} as {sorted(present - expected)} beyond its batches and "
                f"without {sorted(expected - present)}",
            )
        return rows

    def forget_lake(self) -> None:
        """Start the model again: the lake was deleted and created anew (``tests.sim.recreate``),
        its versions counted from 0 again."""
        self._state = self._latest = None
        self._versions.clear()
        self.commit_times.clear()
        self.model.clear()
        self.forget_views()

    def forget_views(self) -> None:
        """Check the views again from scratch (a view removed and rebuilt)."""
        self._delta = self._spark = self._iceberg = None
        self._iceberg_hint = 0
        self._iceberg_lists.clear()

    def check_rows(self, rows: list[int], where: str) -> set[tuple[int, int]]:
        """Whole batches, each once; returns the (writer, batch) pairs present."""
        counts = Counter(rows)
        twice = sorted(r for r, n in counts.items() if n > 1)
        if twice:
            raise Violation(
                "exactly_once", f"{where} holds rows {twice[:5]} more than once ({len(twice)} in all)"
            )
        present = {batch_of(r) for r in counts}
        for w, b in sorted(present):
            want = {r for task in batch_rows(w, b) for r in task}
            have = {r for r in counts if batch_of(r) == (w, b)}
            if have != want:
                raise Violation(
                    "exactly_once",
                    f"{where} holds {len(have)} of the {len(want)} rows of writer {w}'s batch {b}",
                )
        return present

    def check_versions(self) -> None:
        """Every retained version reads as the batches appended at or before it."""
        from lakesink_reader.lake import Lake

        lake = Lake(self.env.root)
        versions = lake.versions()
        appended: dict[int, tuple[int, int]] = {}
        plans = {plan.id: plan for plan in self.env.writers}
        for info in versions:
            if info.writer is not None and info.batch is not None:
                plan = plans[info.writer]
                appended[info.version] = (plan.stream, plan.base + info.batch)
        if not versions:
            return
        # Batches appended before the oldest retained version: what that version holds already.
        base = self.check_rows(
            lake.at(version=versions[0].version).to_table(columns=["id"]).column("id").to_pylist(),
            f"version {versions[0].version}",
        )
        for info in versions[1:]:
            try:
                rows = lake.at(version=info.version).to_table(columns=["id"]).column("id").to_pylist()
            except Exception as exc:
                raise Violation(
                    "readable", f"retained version {info.version} cannot be read: {type(exc).__name__}: {exc}"
                ) from exc
            present = self.check_rows(rows, f"version {info.version}")
            expected = base | {wb for v, wb in appended.items() if versions[0].version < v <= info.version}
            if present != expected:
                raise Violation(
                    "exactly_once",
                    f"version {info.version} holds {sorted(present - expected)} beyond the batches "
                    f"appended up to it and lacks {sorted(expected - present)}",
                )

    def check_streams(self) -> None:
        """Once the writers are done: every batch of every input stream is in the latest version
        (a continued query's stream finished by the queries that continued it)."""
        from lakesink_reader.lake import Lake

        present = self.check_rows(
            Lake(self.env.root).to_table(columns=["id"]).column("id").to_pylist(), "the end"
        )
        for plan in self.env.writers:
            if plan.continues is None:
                want = {(plan.stream, b) for b in range(plan.batches)}
                if not want <= present:
                    raise Violation(
                        "exactly_once",
                        f"stream {plan.stream} lacks batches {sorted(b for _, b in want - present)} at the "
                        "end",
                    )

    def leftovers(self) -> list[str]:
        """What a converged lake must not hold: staged files, unlisted data files, leases, store
        probes' objects."""
        from lakesink_reader.lake import Lake

        root = self.env.root
        live = {f.name for f in Lake(root).files()}
        found = []
        for folder, _, names in os.walk(root):
            rel = os.path.relpath(folder, root)
            for name in names:
                path = name if rel == "." else f"{rel}/{name}"
                if name.endswith(".uncommitted"):
                    found.append(f"staged {path}")
                elif rel == "." and name.endswith(".parquet") and path not in live:
                    found.append(f"unlisted data file {path}")
                elif rel == os.path.join("_lakesink", "ops"):
                    found.append(f"lease {path}")
                elif rel == "_lakesink" and name.startswith("probe-"):
                    found.append(f"store probe {path}")
        return sorted(found)


def delta_view_files(root: str) -> tuple[int | None, list[str]]:
    """The newest version of the Delta view under ``root`` and the paths it lists (relative,
    unquoted; a path listed twice appears twice), from its newest checkpoint and the commits
    after it; (None, []) without a view."""
    import json
    from urllib.parse import unquote

    import pyarrow.parquet as pq

    folder = os.path.join(root, "_delta_log")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None, []
    commits = sorted(int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit())
    checkpoints = [int(n[:20]) for n in names if n.endswith(".checkpoint.parquet") and n[:20].isdigit()]
    if not commits and not checkpoints:
        return None, []
    # A Delta reader starts at the newest checkpoint, also one whose own commit is not written
    # (yet): a view rebuilt at v writes its checkpoint at v first (deltalake reads v from it).
    start = max(checkpoints, default=None)
    latest = max([*commits, *([] if start is None else [start])])
    listed: list[str] = []
    if start is not None:
        adds = pq.read_table(os.path.join(folder, f"{start:020d}.checkpoint.parquet"), columns=["add"])
        listed = [a["path"] for a in adds.column("add").to_pylist() if a is not None]
    for v in range((start + 1) if start is not None else 0, latest + 1):
        try:
            with open(os.path.join(folder, f"{v:020d}.json"), "rb") as f:
                actions = [json.loads(line) for line in f.read().splitlines() if line.strip()]
        except FileNotFoundError:
            raise Violation("views", f"the Delta view has version {latest} but not {v}") from None
        for action in actions:
            if "remove" in action:
                path = action["remove"]["path"]
                if path in listed:
                    listed.remove(path)
            if "add" in action:
                listed.append(action["add"]["path"])
    return latest, [unquote(p) for p in listed]


def spark_view_files(root: str) -> tuple[int | None, int | None, list[str]]:
    """The newest batch of the Spark view under ``root``, the lake version it holds (from its
    anchors; None when none is at or below it) and the data files it lists (absolute local
    paths, a path listed twice twice), as Spark 4.x's ``FileStreamSinkLog`` reads them; (None,
    None, []) without a view."""
    import json
    from urllib.parse import unquote, urlparse

    folder = os.path.join(root, "_spark_metadata")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None, None, []
    ids = sorted(
        int(n.split(".")[0]) for n in names if n.isdigit() or (n.endswith(".compact") and n[:-8].isdigit())
    )
    if not ids:
        return None, None, []
    latest = ids[-1]
    compacts = sorted(int(n[:-8]) for n in names if n.endswith(".compact") and n[:-8].isdigit())
    interval = compacts[-1] - compacts[-2] if len(compacts) >= 2 else 10
    start = (latest + 1) // interval * interval - 1
    paths: list[str] = []
    for batch in range(max(start, 0), latest + 1):
        name = f"{batch}.compact" if (batch + 1) % interval == 0 else str(batch)
        try:
            with open(os.path.join(folder, name), "rb") as f:
                lines = f.read().decode().splitlines()
        except FileNotFoundError:
            raise Violation("views", f"the Spark view has batch {latest} but not {name}") from None
        if not lines or lines[0] != "v1":
            raise Violation("views", f"the Spark view's batch {name} does not start with v1")
        for line in lines[1:]:
            entry = json.loads(line)
            path = unquote(urlparse(entry["path"]).path)
            if not path.endswith("/_common_metadata"):
                paths.append(path)
    anchored = []
    for n in (
        os.listdir(os.path.join(folder, "_lakesink"))
        if os.path.isdir(os.path.join(folder, "_lakesink"))
        else []
    ):
        if n.endswith(".json") and n[:-5].isdigit() and int(n[:-5]) <= latest:
            anchored.append(int(n[:-5]))
    version = None
    if anchored:
        with open(os.path.join(folder, "_lakesink", f"{max(anchored):020d}.json"), "rb") as f:
            anchor = json.loads(f.read())
        version = int(anchor["version"]) + (latest - int(anchor["batch"]))
    return latest, version, paths
