"""A lake's defaults for its writers, kept in its table.json (``lakesink config``; issue 36).

Delta keeps such settings as table properties (``delta.autoOptimize.autoCompact``); a lakesink
lake keeps them as optional fields of ``_lakesink/table.json`` that writers read when a query
does not say, and readers never need (docs/FORMAT.md, "table.json"): ``auto_compact``, and
``iceberg_view`` (whether the lake keeps its Iceberg view; a writer with the option on sets it).

Changing one replaces table.json, the one file of the lake that is otherwise written once.
The replace is a compare-and-swap (``Storage.supersede`` against the version read): a lake
deleted and created again meanwhile, or another ``lakesink config`` run, makes it fail with a
message to run it again, never overwrite a table.json it did not read. Only the defaults'
fields change: the document is edited as read, so fields this lakesink does not know survive.
A running query reads the defaults when it starts; it keeps what it found until its next start.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lakesink_reader import jsondoc, limits
from lakesink_reader.errors import FormatVersionError, LakeSinkError
from lakesink_reader.format.table import TableMetadata, read_table_metadata
from lakesink_reader.names import TABLE_FILE
from lakesink_reader.storage import Storage, open_storage
from lakesink_reader.storage.base import sealed_copy

#: The defaults a lake can keep, and what each accepts (None removes it).
LAKE_DEFAULTS: dict[str, type] = {"auto_compact": bool, "iceberg_view": bool}


class DefaultsChangedError(LakeSinkError):
    """table.json changed between its read and its replace (another ``lakesink config``, or the
    lake deleted and created again): nothing was written; run the command again."""


def lake_defaults(metadata: TableMetadata) -> dict[str, Any]:
    """The defaults ``metadata`` sets (unset ones left out)."""
    return {name: getattr(metadata, name) for name in LAKE_DEFAULTS if getattr(metadata, name) is not None}


def set_lake_defaults(
    path_or_storage: str | Storage,
    changes: Mapping[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> TableMetadata:
    """Set (or, with None, remove) the lake's writer defaults named in ``changes``; returns the
    table metadata as it now stands. Format-3 epoch lakes (the defaults are the log's writers').

    Raises ValueError for a name that is no default or a value of the wrong type, and
    DefaultsChangedError when table.json changed while this ran."""
    for name, value in changes.items():
        if name not in LAKE_DEFAULTS:
            raise ValueError(f"{name!r} is not a lake default; the lake keeps {sorted(LAKE_DEFAULTS)}")
        if value is not None and not isinstance(value, LAKE_DEFAULTS[name]):
            raise ValueError(
                f"{name} must be {LAKE_DEFAULTS[name].__name__} or None (to remove it), got {value!r}"
            )
    storage = (
        path_or_storage
        if not isinstance(path_or_storage, str)
        else open_storage(path_or_storage, storage_options)
    )
    # The version first, then the bytes: if the file changes between the two reads, the bytes
    # may be newer than the version, and the swap against that version fails as it should.
    seen = storage.version(TABLE_FILE)
    if seen is None:
        read_table_metadata(storage)  # raises, naming what is there instead of a lake
        raise DefaultsChangedError(f"{storage.url}/{TABLE_FILE} appeared while it was read: run it again")
    data = limits.read(storage, TABLE_FILE, limits.TABLE)
    metadata = TableMetadata.from_json(data, f"{storage.url}/{TABLE_FILE}")
    if not metadata.has_log:
        raise FormatVersionError(
            f"{storage.url}: writer defaults are for format-3 epoch lakes (this one is format "
            f"{metadata.format_version}, {metadata.mode} mode); `lakesink upgrade {storage.url}` "
            "first for a format-2 epoch lake"
        )
    doc = jsondoc.loads(data)
    for name, value in changes.items():
        if value is None:
            doc.pop(name, None)
        else:
            doc[name] = value
    written = json.dumps(doc, indent=2).encode()
    sealed = sealed_copy(storage, TABLE_FILE, written)
    if not storage.supersede(sealed, seen):
        storage.discard(sealed)
        raise DefaultsChangedError(
            f"{storage.url}/{TABLE_FILE} changed while its defaults were set (another `lakesink config`, "
            "or the lake deleted and created again): nothing was written; run it again"
        )
    return TableMetadata.from_json(written, f"{storage.url}/{TABLE_FILE}")
