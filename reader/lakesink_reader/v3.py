"""The reader's view of a format-3 (epoch-mode) lake: one pinned snapshot of its versioned log.

Opening reads table.json, the newest checkpoint's small part and the commit headers after it
(docs/design/format-v3.md, section 6) -- never a checkpoint's file list, which is read when
files are. Everything else (which files a version holds, which versions an epoch maps to) is
computed against the pinned snapshot, so one ``Lake`` object answers about one state of the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink_reader.errors import CorruptFileError, VersionNotRetainedError
from lakesink_reader.format.schemas import decode_schema
from lakesink_reader.format.table import TableMetadata
from lakesink_reader.format.v3.checkpoint import (
    live_files_table,
    oldest_listed_commit,
)
from lakesink_reader.format.v3.commits import Commit, CommitHeader, CommitKind
from lakesink_reader.format.v3.logfiles import READ_BATCH, commit_name, parallel, read_threads
from lakesink_reader.format.v3.state import TableState, WriterState
from lakesink_reader.format.v3.vlog import Snapshot, VersionedLog
from lakesink_reader.storage import Storage


def vacuumed_while_read(version: int, url: str, retained: str) -> VersionNotRetainedError:
    """The error for a read of ``version`` whose snapshot a vacuum gave up after the read pinned
    it (the read straddled the vacuum): not a damaged lake, and the way on is a fresh snapshot.
    ``retained`` says what the lake retains now."""
    return VersionNotRetainedError(
        f"version={version} of {url} was vacuumed while it was read: the lake's {retained}. Read a "
        "retained version with a fresh snapshot (lake.refresh(), or open the lake again)"
    )


@dataclass(frozen=True)
class VersionInfo:
    """One commit of a format-3 lake, as ``Lake.versions()`` and ``Lake.history()`` list it (from
    its header).

    ``writer``/``batch``: an append's; ``op``: the token of a maintenance op's commit;
    ``continues``: the writer a continuing writer's first append continues; ``schema_changed``:
    an append that changed the lake's schema (``merge_schema``); ``auto``: a compaction a
    writer's driver ran by itself (``auto_compact``). :attr:`operation` names it.
    """

    version: int
    kind: CommitKind
    committed_at: float
    writer: str | None
    batch: int | None
    op: str | None
    add_files: int
    add_rows: int
    add_bytes: int
    remove_files: int
    remove_rows: int
    remove_bytes: int
    source_offsets: Any = None
    continues: str | None = None
    schema_changed: bool = False
    auto: bool = False

    @property
    def operation(self) -> str:
        """What the commit did, as ``lakesink history`` says it: ``append``, ``continuation``
        (a continuing writer's first append), ``schema change`` (an append that changed the
        schema), ``compaction``, ``auto-compaction`` (run by a writer's driver), ``abandon`` (a
        dead compaction's files given up), ``vacuum`` or ``upgrade`` (the format-2 lake's
        epochs imported)."""
        if self.kind == "append":
            return "continuation" if self.continues else "schema change" if self.schema_changed else "append"
        if self.auto:
            return "auto-compaction"
        return _OPERATIONS.get(self.kind, self.kind)

    @classmethod
    def of(cls, header: CommitHeader) -> VersionInfo:
        c = header.counts
        return cls(
            header.version,
            header.kind,
            header.committed_at,
            header.writer.id if header.writer is not None else None,
            header.writer.batch if header.writer is not None else None,
            header.op.token if header.op is not None else None,
            c.add_files,
            c.add_rows,
            c.add_bytes,
            c.remove_files,
            c.remove_rows,
            c.remove_bytes,
            header.source_offsets,
            header.continues.writer if header.continues is not None else None,
            header.schema is not None,
            header.op is not None and header.op.trigger == "auto",
        )


_OPERATIONS = {"compact": "compaction"}


class LogView:
    """A pinned snapshot of a format-3 lake's log, and what readers ask of it."""

    def __init__(self, storage: Storage, metadata: TableMetadata, where: str) -> None:
        table_id = metadata.table_id
        if not table_id:
            raise CorruptFileError(f"{where}: a format-3 lake's table.json must carry a table_id")
        self._also = (metadata.upgrade_version,) if metadata.upgrade_version is not None else ()
        self.storage = storage
        self.log = VersionedLog(storage, table_id, checkpoint_interval=metadata.log_interval)
        self.snapshot: Snapshot = self.log.snapshot(also=self._also)
        self._headers: dict[int, CommitHeader] = {h.version: h for h in self.snapshot.headers}
        self._schema: tuple[str, pa.Schema] | None = None  # the last decoded, by its text

    @property
    def state(self) -> TableState:
        return self.snapshot.state

    def schema(self, table_schema: pa.Schema) -> pa.Schema:
        """The schema at the snapshot's version: the last one a commit recorded, else table.json's."""
        encoded = self.state.schema_at(self.version)
        if encoded is None:
            return table_schema
        if self._schema is None or self._schema[0] != encoded:
            self._schema = (encoded, decode_schema(encoded, self.where(self.version)))
        return self._schema[1]

    @property
    def version(self) -> int:
        return self.snapshot.version

    def refresh(self) -> None:
        self.snapshot = self.log.snapshot(also=self._also)
        self._headers = {h.version: h for h in self.snapshot.headers}

    # Versions ----------------------------------------------------------------------------------

    def oldest(self) -> int:
        """The oldest version still readable: the retention floor, or the oldest commit or
        checkpoint there is (one listing, only when the log starts after version 0)."""
        floor = self.state.retained_from
        if self.snapshot.checkpoint is None or self.log.read_header(floor) is not None:
            return floor
        listed = oldest_listed_commit(self.storage)
        return max(floor, listed if listed is not None else self.version)

    def headers(self, first: int, last: int) -> list[CommitHeader]:
        """Headers of versions ``first..last`` (within the snapshot), cached.

        Read :data:`READ_BATCH` versions at a time, oldest first, stopping at the first missing
        commit: ``last`` may be what a checkpoint claims (10**18, say), and only commits that
        exist are ever listed, so a claim with no commits under it fails at the first gap
        instead of building a range over it (docs/FORMAT.md, "Trust")."""
        for start in range(first, last + 1, READ_BATCH):
            stop = min(start + READ_BATCH, last + 1)
            wanted = [v for v in range(start, stop) if v not in self._headers]
            found = parallel(self.log.read_header, wanted, read_threads(self.log.storage))
            for v, header in zip(wanted, found, strict=True):
                if header is None:
                    raise CorruptFileError(
                        f"{self.where(v)} is missing: the log is not contiguous (the snapshot is at "
                        f"version {self.version})"
                    )
                self._headers[v] = header
        return [self._headers[v] for v in range(first, last + 1)]

    def commits(self, versions: Sequence[int]) -> list[Commit]:
        found = parallel(self.log.read_commit, list(versions), read_threads(self.log.storage))
        for v, commit in zip(versions, found, strict=True):
            if commit is None:
                raise CorruptFileError(f"{self.where(v)} is missing: the log is not contiguous")
        return [c for c in found if c is not None]

    def versions(self) -> list[VersionInfo]:
        """Every readable version of the snapshot, oldest first."""
        if self.version < 0:
            return []
        return [VersionInfo.of(h) for h in self.headers(self.oldest(), self.version)]

    def history(self, last: int, limit: int | None) -> list[VersionInfo]:
        """The retained versions up to ``last``, newest first, at most ``limit`` of them (None: all)."""
        if last < 0 or limit == 0:
            return []
        first = self.oldest() if limit is None else max(self.oldest(), last - limit + 1)
        return [VersionInfo.of(h) for h in reversed(self.headers(first, last))]

    def check_version(self, version: int, what: str) -> None:
        """ValueError naming the readable range when ``version`` is outside it."""
        if version > self.version:
            raise ValueError(
                f"{what} is beyond the newest version of {self.storage.url} ({self.version}"
                + (": nothing is committed yet)" if self.version < 0 else ")")
            )
        retained = self.state.retained_from
        if version < retained:
            raise VersionNotRetainedError(
                f"{what} is below the retained range of {self.storage.url}: versions {retained}.."
                f"{self.version} (vacuum retains versions from {retained}; the oldest retained commit "
                f"is {self.oldest()})"
            )

    # Files -------------------------------------------------------------------------------------

    def live_files(self, version: int) -> pa.Table:
        """The live files at ``version`` (checkpoint list columns), sorted by path."""
        self.check_version(version, f"version={version}")
        try:
            return live_files_table(
                self.storage,
                self.log.table_id,
                version,
                interval=self.log.checkpoint_interval,
                start=self.snapshot.checkpoint,
                read_commit=self.log.read_commit,
            )
        except CorruptFileError as exc:
            oldest = self.oldest()
            if version < oldest and oldest > self.version:
                # The whole snapshot this object pinned was vacuumed while it was read: the
                # range it knows is empty, so name the lake's own and the way on.
                now = f"oldest retained commit is now {oldest}"
                raise vacuumed_while_read(version, self.storage.url, now) from exc
            if version < oldest:
                raise VersionNotRetainedError(
                    f"version={version} is below the retained range of {self.storage.url}: versions "
                    f"{oldest}..{self.version} (retained_from {self.state.retained_from}, the oldest "
                    f"retained commit {oldest})"
                ) from exc
            raise

    def added_by_appends(self, first: int, last: int) -> list[Commit]:
        """The whole append commits among versions ``first..last`` (compactions change no rows)."""
        self.check_version(first, f"versions {first}..{last}")
        self.check_version(last, f"versions {first}..{last}")
        appends = [h.version for h in self.headers(first, last) if h.kind == "append" and h.counts.add_files]
        return self.commits(appends)

    # Writers and epochs ------------------------------------------------------------------------

    def writers(self) -> list[WriterState]:
        return sorted(self.state.writers.values(), key=lambda w: (w.first_version, w.id))

    def offsets(self, writer: str | None) -> Any:
        if writer is not None:
            try:
                found = self.state.writer(writer)
            except ValueError as exc:
                raise ValueError(f"{self.storage.url}: {exc}") from exc
            if found is None:
                raise ValueError(
                    f"{writer!r} is not a writer of {self.storage.url} (its writers: {self._named()})"
                )
            return found.offsets
        live = [w for w in self.writers() if not w.retired]
        if len(live) != 1:
            raise ValueError(
                f"{self.storage.url} has {len(live)} writers that are not retired"
                + (f" ({self._named()})" if live else "")
                + ": name one with writer=<id or tag>"
            )
        return live[0].offsets

    def lineage(self, what: str) -> list[WriterState]:
        """The lake's writers as one lineage, oldest first (each continues the one before);
        ValueError naming the writers otherwise. Epochs are counted along it (see epoch_of)."""
        writers = self.writers()
        if not writers:
            return []
        roots = [w for w in writers if w.continues is None]
        chain = [roots[0]] if len(roots) == 1 else []
        while chain and chain[-1].continued_by is not None:
            nxt = self.state.writers.get(chain[-1].continued_by)
            if nxt is None:
                break
            chain.append(nxt)
        if len(chain) != len(writers):
            raise ValueError(
                f"{what} selects epochs, which a format-3 lake has only when one writer lineage wrote it; "
                f"{self.storage.url} has the writers {self._named()}. Select versions instead "
                "(Lake.at(version=), Lake.since(version=); Lake.versions() lists them)"
            )
        return chain

    def epochs(self, what: str) -> list[tuple[int, CommitHeader]]:
        """(epoch, header) of every retained append of the lineage, in version order.

        A lineage's epochs are its first writer's batches, then each continuing writer's batches
        numbered on from the last epoch before it (one writer: epoch = batch).
        """
        chain = self.lineage(what)
        if not chain:
            return []
        offset: dict[str, int] = {}
        next_epoch = chain[0].first_batch
        for w in chain:
            offset[w.id] = next_epoch - w.first_batch
            next_epoch += w.last_batch - w.first_batch + 1
        found = []
        for h in self.headers(self.oldest(), self.version):
            if h.kind == "append" and h.writer is not None:
                found.append((h.writer.batch + offset[h.writer.id], h))
        return found

    def _named(self) -> str:
        return "; ".join(w.describe() for w in self.writers()) or "none"

    def where(self, version: int) -> str:
        return f"{self.storage.url.rstrip('/')}/{commit_name(version)}"
