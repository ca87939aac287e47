"""What of the Iceberg view ``vacuum`` deletes: the metadata files and Avro files (manifest
lists, manifests) of snapshots the view no longer holds (docs/design/iceberg-view.md, section 6).

A snapshot leaves the view when the lake's retention floor passes its version or when it falls
beyond the newest ``SNAPSHOT_MAX`` (``iceberg_view.write_snapshot``). Its files then serve no
reader given the lake's path: those read the metadata file the hint names (pyiceberg, polars)
or the newest one (Iceberg's Java catalog probes above the hint), and reach older snapshots only
through that file's snapshot list. What goes:

- **metadata files** ``v<N>.metadata.json`` numbered below ``low``, the oldest snapshot that
  the hint's or the newest metadata file holds (both are read, and ``low`` is never above
  either's own number): every metadata file from ``low`` on is kept, so a retained snapshot's
  own commit point stays;
- **Avro files** lakesink named (``iceberg_layout.avro_snapshot``: others are never touched) of
  snapshots below ``low`` that no snapshot a kept metadata file holds names (its manifest
  list, and the manifests that list names: an append keeps its parent's manifests). Three
  metadata files are read for it: the hint's, the newest and the oldest kept. Together they
  hold every snapshot a kept metadata file holds: the retention floor and the cap only rise,
  and each metadata file holds the previous one's snapshots from its floor on, plus its own
  (copied as they are: a snapshot names the same list in every file). An Avro file of a
  snapshot from ``low`` on -- a hook writing the next snapshot now, whose metadata file does
  not exist yet -- is never a candidate.

A metadata file kept names in its snapshot list those its floor then retained: their Avro files
go one vacuum later, once that metadata file has gone too. Iceberg's metadata log (history, not
read by readers) of an older kept metadata file may name a deleted metadata file, as Iceberg's
own ``write.metadata.delete-after-commit`` leaves it.

Everything read here is the lake's input, read through bounded reads of its Storage. A hint's
or newest metadata file lakesink did not write, or a stopped view: nothing of the view is
deleted. A manifest list outside ``<root>/metadata/``, or one that cannot be read: no Avro file
is (the metadata files below ``low`` still go: they need nothing read from a list). What is
deleted comes from the listing of ``metadata/``, never from a name read in a file, so no
content can point a delete anywhere; content only keeps files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyiceberg.manifest import read_manifest_list
from pyiceberg.table.metadata import TableMetadataV2

from lakesink.views.iceberg import SNAPSHOT_MAX
from lakesink.views.iceberg_layout import (
    METADATA_DIR,
    STOP_FILE,
    avro_snapshot,
    metadata_name,
    metadata_number,
    newest_number,
    reader_number,
)
from lakesink.views.iceberg_view import ForeignView, bounded_input, read_metadata, root_uri
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.format.v3.logfiles import parallel
from lakesink_reader.storage.base import Storage

log = logging.getLogger(__name__)

#: Manifest lists read at most to find what the kept snapshots name: the three metadata files
#: read hold at most SNAPSHOT_MAX each when lakesink wrote them (a view written before the cap
#: may hold more: its Avro files then wait for a later vacuum; its metadata files still go).
MAX_LISTS = 3 * SNAPSHOT_MAX


@dataclass(frozen=True)
class ExpiredFile:
    """A file of the view no kept snapshot needs: its name (relative to the lake), size when the
    listing gave it, and why it may go."""

    name: str
    size: int | None
    reason: str


def expired_files(storage: Storage) -> list[ExpiredFile]:
    """The view's files that ``vacuum`` may delete (module docstring), metadata files first
    (oldest first), then Avro files: deleted in this order, a run killed half-way never leaves
    a metadata file naming an Avro file that is gone. Empty when the lake has no view, the view
    stopped, or its metadata is not lakesink's."""
    hint = reader_number(storage)
    if hint == 0 or storage.exists(STOP_FILE):
        return []
    table_id = read_table_metadata(storage).table_id or ""
    newest = max(hint, newest_number(storage))
    try:
        held = {n: read_metadata(storage, table_id, n) for n in {hint, newest}}
    except ForeignView as exc:
        log.info("%s: the Iceberg view %s: nothing of it is deleted", storage.url, exc)
        return []
    low = min(min((s.snapshot_id for s in m.snapshots), default=n) for n, m in held.items())
    listing = storage.list(METADATA_DIR)
    numbers = sorted((n, entry.size) for entry in listing if (n := metadata_number(entry.name)) is not None)
    out = [
        ExpiredFile(
            metadata_name(n),
            size,
            f"Iceberg metadata file of snapshot {n}, which the view no longer holds (its oldest: {low})",
        )
        for n, size in numbers
        if n < low
    ]
    kept = [n for n, _ in numbers if n >= low]
    try:
        if kept and kept[0] not in held:
            held[kept[0]] = read_metadata(storage, table_id, kept[0])
        named = _named(storage, list(held.values()))
    except Exception as exc:  # noqa: BLE001 -- unknown is not unnamed: every Avro file stays
        log.warning(
            "%s: what the Iceberg view's kept snapshots name could not be read (%s): its Avro files "
            "are kept this time",
            storage.url,
            exc,
        )
        return out
    if named is None:
        return out
    for entry in listing:
        sid = avro_snapshot(entry.name)
        if sid is not None and sid < low and entry.name not in named:
            out.append(
                ExpiredFile(
                    entry.name,
                    entry.size,
                    f"Iceberg Avro file of snapshot {sid}, which the view no longer holds (its oldest: "
                    f"{low}) and no kept metadata file names",
                )
            )
    return out


def _named(storage: Storage, metadata: list[TableMetadataV2]) -> set[str] | None:
    """The Avro files (relative to the lake) the snapshots of ``metadata`` name: their manifest
    lists and the manifests those list. None when there are more lists than :data:`MAX_LISTS`
    (nothing is then known to be unnamed). ForeignView for a list outside the lake's
    ``metadata/``."""
    root = root_uri(storage) + "/"
    lists = sorted({s.manifest_list for m in metadata for s in m.snapshots})
    if len(lists) > MAX_LISTS:
        log.info(
            "%s: the Iceberg view's kept metadata holds %d snapshots (more than %d): its Avro files "
            "are kept this time",
            storage.url,
            len(lists),
            MAX_LISTS,
        )
        return None
    prefix = f"{root}{METADATA_DIR}/"
    for location in lists:
        if not location.startswith(prefix):
            raise ForeignView(f"names the manifest list {location}, outside {prefix}")

    def manifests(location: str) -> list[str]:
        return [m.manifest_path for m in read_manifest_list(bounded_input(storage, root, location))]

    named = {location[len(root) :] for location in lists}
    for paths in parallel(manifests, lists):
        named.update(p[len(root) :] for p in paths if p.startswith(root))
    return named
