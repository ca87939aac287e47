"""Where the Iceberg view's files are, and which metadata version readers find: the names and
numbers of ``metadata/`` (docs/design/iceberg-view.md, sections 1-2), without pyiceberg.

Kept apart from the view's derivation (``iceberg``) and keeping (``iceberg_view``) so that the
writers' and maintenance's common path -- asking whether a lake has an Iceberg view, and how far
it is -- loads no pyiceberg: only lakes that keep the view need it installed.
"""

from __future__ import annotations

import re

from lakesink_reader import limits
from lakesink_reader.names import META_DIR
from lakesink_reader.storage.base import Storage

METADATA_DIR = "metadata"
#: What file-system catalogs read first: the newest metadata version's number.
VERSION_HINT = f"{METADATA_DIR}/version-hint.text"
#: Written when the view was found holding what lakesink did not derive: writers stop updating it.
STOP_FILE = f"{META_DIR}/iceberg_view_stopped.json"
#: Metadata files probed above the hint before the folder is listed instead (a hint lost or
#: lagging: the version is found by probing ``v<h+1>``, as Iceberg's file-system catalog does).
MAX_PROBES = 16


def snapshot_id(version: int) -> int:
    """The snapshot id, sequence number and metadata version of lake version ``version``: one
    number for the three, ``version + 1`` (Iceberg reserves sequence number 0)."""
    if version < 0:
        raise ValueError(f"a lake version must be >= 0, got {version}")
    return version + 1


def metadata_name(number: int) -> str:
    """``metadata/v<number>.metadata.json`` (relative to the lake's root)."""
    if number < 1:
        raise ValueError(f"an Iceberg metadata version must be >= 1, got {number}")
    return f"{METADATA_DIR}/v{number}.metadata.json"


def metadata_number(name: str) -> int | None:
    """The version of ``v<N>.metadata.json`` (the last part of a name or URI); None for any other
    name."""
    base = name.rsplit("/", 1)[-1]
    digits = base[1 : -len(".metadata.json")]
    if base.startswith("v") and base.endswith(".metadata.json") and digits.isdigit() and len(digits) <= 18:
        return int(digits)
    return None


def file_stem(version: int, token: str, salt: str) -> str:
    """The start of the names of snapshot ``version + 1``'s Avro files: the lake commit's token
    and ``salt`` (one per write) in them, so two writers deriving the same snapshot at once
    write files of their own and only the one whose metadata file is created is referenced
    (Avro files begin with a random sync marker: equal content is not equal bytes)."""
    return f"{METADATA_DIR}/{snapshot_id(version):020d}-{token[:16]}-{salt}"


#: The last part of the name of an Avro file :func:`file_stem` begins: the snapshot id, the
#: commit token's first 16 hex digits, the salt, then ``-list`` or ``-m<i>``.
_AVRO_NAME = re.compile(r"(\d{20})-[0-9a-f]{16}-[0-9a-f]{1,32}-(?:list|m\d{1,6})\.avro")


def avro_snapshot(name: str) -> int | None:
    """The snapshot id in the name of an Avro file lakesink writes (a manifest list or
    manifest, :func:`file_stem`); None for any other name (never lakesink's to delete)."""
    found = _AVRO_NAME.fullmatch(name.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def read_hint(storage: Storage) -> int | None:
    """``version-hint.text`` as a number (None: absent, or not a number lakesink writes)."""
    try:
        text = limits.read(storage, VERSION_HINT, limits.HINT).decode("ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) <= 18 else None


def listed_numbers(storage: Storage) -> list[int]:
    """The metadata versions in ``metadata/``, sorted (a listing: for a hint lost or damaged)."""
    numbers = (metadata_number(f.name) for f in storage.list(METADATA_DIR))
    return sorted(n for n in numbers if n is not None)


def newest_number(storage: Storage) -> int:
    """The newest metadata version of the view (0: none): the hint, then probes above it."""
    hint = read_hint(storage)
    if hint is None:
        numbers = listed_numbers(storage)
        return numbers[-1] if numbers else 0
    number = hint
    for _ in range(MAX_PROBES):
        if not storage.exists(metadata_name(number + 1)):
            return number
        number += 1
    numbers = listed_numbers(storage)
    return max(number, numbers[-1] if numbers else 0)


def reader_number(storage: Storage) -> int:
    """The metadata version every reader reads at least (0: no view): the hint, which pyiceberg's
    ``StaticTable`` trusts as it is (Iceberg's Java catalog probes above it), else the newest
    listed (what readers without a hint take)."""
    hint = read_hint(storage)
    if hint is not None:
        return hint
    numbers = listed_numbers(storage)
    return numbers[-1] if numbers else 0


def has_view(storage: Storage) -> bool:
    """Whether the lake has an Iceberg view (a hint, or a metadata file)."""
    return storage.exists(VERSION_HINT) or bool(listed_numbers(storage))


def brief(storage: Storage, latest: int, stop_file: str) -> str | None:
    """``lakesink status``'s cheap word on the view (two or three small reads, no pyiceberg):
    None when the lake has none; ``ok`` when the hint names the lake's latest version;
    ``behind: ...``; ``foreign: ...`` when the view stopped (``stop_file`` there). What the
    snapshot lists is ``verify``'s to check."""
    hint = read_hint(storage)
    if hint is None and not storage.exists(metadata_name(1)) and not listed_numbers(storage):
        return None
    if storage.exists(stop_file):
        return f"foreign: the view stopped ({stop_file} says why): `lakesink verify` names it"
    if hint is not None and latest >= 0 and hint == snapshot_id(latest):
        return "ok"
    held = "no readable hint" if hint is None else f"the hint names lake version {hint - 1}"
    return f"behind: {held}, the lake is at {latest}: run `lakesink sync-views {storage.url}`"
