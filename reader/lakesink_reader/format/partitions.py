"""Hive-style partition folders: which columns may partition a lake, and values <-> paths.

A partitioned lake keeps each file under ``<col>=<value>/<col2>=<value2>/`` (docs/FORMAT.md,
"Partitioned lakes"), the layout Spark's ``partitionBy``, Hive, DuckDB's ``hive_partitioning``
and pyarrow's ``partitioning="hive"`` all read. The path is the record of a file's partition
values: the escaping below is invertible, so a reader gets the exact values back from the path
the log lists, and nothing else has to carry them.

Values are written as Spark writes them: the value's text (integers in decimal, booleans
``true``/``false``, dates ``YYYY-MM-DD``), with the characters Spark's
``ExternalCatalogUtils.escapePathName`` escapes written ``%XX``, and null written
``__HIVE_DEFAULT_PARTITION__``. Spark also writes an empty string as that null; lakesink refuses
an empty string (and the literal text of the null) rather than change the value.
"""

from __future__ import annotations

import re
import reprlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakesink_reader.arrays import scalar
from lakesink_reader.names import STAGING_DIR

if TYPE_CHECKING:
    from lakesink_reader.storage.base import Storage

#: The folder name's text of a null value (Hive's, Spark's, DuckDB's and pyarrow's default).
NULL_TEXT = "__HIVE_DEFAULT_PARTITION__"

#: Characters written as ``%XX`` in folder names: Spark's ``escapePathName`` set (control
#: characters, and ``"#%'*/:=?\\{[]^`` and DEL).
_ESCAPED = frozenset([chr(c) for c in range(0x01, 0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))
_ESCAPE = re.compile("[" + re.escape("".join(sorted(_ESCAPED))) + "]")
_UNESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")

#: Most partition folders one task keeps open at a time, unless told otherwise.
DEFAULT_MAX_OPEN_FILES = 32


def is_partitionable(dtype: pa.DataType) -> bool:
    """Types whose values are folder names every reader types back the same way."""
    return (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or (pa.types.is_integer(dtype))
        or pa.types.is_boolean(dtype)
        or pa.types.is_date32(dtype)
    )


def check_partition_columns(schema: pa.Schema, columns: Sequence[str], where: str) -> tuple[str, ...]:
    """``columns`` as the lake's partition columns, or ValueError naming what is wrong."""
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"partition_by must be a list of column names, got {shown(columns)}")
    cols = tuple(columns)
    # Linear in the list, and its messages cut: a lake's table.json holds this list, and its
    # writer may make it 400,000 names long (the fuzzer's case: `cols.count` per name hung).
    dupes = sorted(c for c, n in Counter(cols).items() if n > 1)
    if dupes:
        raise ValueError(f"partition_by names {shown(dupes)} more than once")
    names = schema.names
    known = set(names)
    unknown = [c for c in cols if c not in known]
    if unknown:
        raise ValueError(
            f"partition_by names {shown(unknown)}, which {where} does not have; its columns: {shown(names)}"
        )
    if cols and len(cols) == len(names):
        raise ValueError(
            f"partition_by {list(cols)} takes every column of {where}: a file needs at least one column "
            "that is not a partition column"
        )
    for c in cols:
        dtype = schema.field(c).type
        if not is_partitionable(dtype):
            raise ValueError(
                f"partition_by column {c!r} is {dtype}: folders can hold strings, integers, booleans and "
                "dates (their text reads back as the same value in every reader). Partition by a "
                f"derived column instead, e.g. to_date({c}) or date_format({c}, 'yyyy-MM-dd-HH')"
            )
    return cols


#: A value from a lake in a message: a few of its items, each cut (the lake's writer chooses its size).
_SHOWN = reprlib.Repr()  # (keyword arguments from Python 3.12 only)
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 20
_SHOWN.maxstring = _SHOWN.maxother = 200


def shown(value: Any) -> str:
    """``value`` for a message: its first 20 items, each cut to 200 characters."""
    return _SHOWN.repr(value)


def escape(text: str) -> str:
    """Spark's ``escapePathName``: ``%XX`` (upper-case hex) for each character it escapes."""
    return _ESCAPE.sub(lambda m: f"%{ord(m.group()):02X}", text)


def unescape(text: str) -> str:
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def check_value_text(column: str, text: str | None) -> None:
    """ValueError for a value whose folder name would read back as another value."""
    if text == "":
        raise ValueError(
            f"partition column {column!r} holds an empty string, which partition folders cannot keep "
            "apart from null (Spark writes both as null); map it first, e.g. "
            f"when(col({column!r}) == '', None).otherwise(col({column!r})), or partition by another column"
        )
    if text == NULL_TEXT:
        raise ValueError(
            f"partition column {column!r} holds the text {NULL_TEXT!r}, which partition folders use for "
            "null: it would read back as null"
        )


def partition_dir(columns: Sequence[str], texts: Sequence[str | None]) -> str:
    """The folder (no trailing '/') of a file whose partition values' texts are ``texts``."""
    parts = []
    for column, text in zip(columns, texts, strict=True):
        check_value_text(column, text)
        parts.append(f"{escape(column)}={NULL_TEXT if text is None else escape(text)}")
    return "/".join(parts)


def partition_texts(path: str, columns: Sequence[str]) -> dict[str, str | None]:
    """The partition values' texts of the file at ``path`` (root-relative), read from its folders;
    ValueError when the folders do not name ``columns`` in order."""
    parts = path.split("/")
    if len(parts) != len(columns) + 1:
        raise ValueError(f"{path!r} is not under one folder per partition column {list(columns)}")
    found: dict[str, str | None] = {}
    for column, part in zip(columns, parts, strict=False):
        name, eq, value = part.partition("=")
        if not eq or unescape(name) != column:
            raise ValueError(f"{path!r}: folder {part!r} is not '{column}=<value>'")
        found[column] = None if value == NULL_TEXT else unescape(value)
    return found


def typed_values(texts: Mapping[str, str | None], schema: pa.Schema) -> dict[str, Any]:
    """The partition values as Arrow scalars of their columns' types."""
    found: dict[str, Any] = {}
    for column, text in texts.items():
        dtype = schema.field(column).type
        # Not pa.scalar: it imports pandas (lakesink_reader.arrays), in each worker of a read.
        found[column] = pa.nulls(1, dtype)[0] if text is None else scalar(text, pa.string()).cast(dtype)
    return found


def texts_of(column: Any) -> Any:
    """A partition column's values as their folder texts (before escaping); nulls stay null."""
    # Here, not at the top: pyarrow.compute (40 ms) only for a partitioned write; readers need none.
    import pyarrow.compute as pc

    if pa.types.is_string(column.type):
        return column
    return pc.cast(column, pa.string())


def partition_folders(storage: Storage, columns: Sequence[str]) -> list[str]:
    """Every partition folder in storage (``day=1/label=a``), one listing per folder on the way:
    what sweeps and ``read_all`` look in, as a crashed task's files may be in a folder that no
    commit names. Folders of other names are not partition folders, and are not entered.

    A folder that holds only staged data is found too: on an object store an upload in flight
    is no object, but its staging marker is, in the same folder under ``STAGING_DIR``."""
    if not columns:
        return []
    found: set[str] = set()
    for base in ("", STAGING_DIR):
        level = [base]
        for column in columns:
            prefix = f"{escape(column)}="
            level = [
                f
                for parent in level
                for f in storage.folders(parent)
                if f.rpartition("/")[2].startswith(prefix)
            ]
        found.update(f[len(base) + 1 :] if base else f for f in level)
    return sorted(found)
