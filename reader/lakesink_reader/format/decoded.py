"""What the string columns of a Parquet file read from a lake decode to, counted before they are
decoded (docs/FORMAT.md, "Trust").

A dictionary-encoded column stores each distinct value once and every row as an index: one
large value referenced by every row passes a file's row and size checks, and decodes to rows x
its length (3.4 GB from a 0.73 MB checkpoint list; issue 51). Such columns are read with
pyarrow's ``read_dictionary`` (they stay dictionary arrays: indices and the values once), their
size is counted per use from the indices -- each value's length, summed over the rows that
use it -- and only then decoded. A column stored plain is dictionary-encoded by the read from
its decoded values, which the row group's footer size bounds already.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from lakesink_reader.errors import CorruptFileError, one_line

#: The most bytes the footer of a Parquet file of a lake's metadata (a checkpoint's file list, a
#: Delta-view checkpoint) may hold. pyarrow decodes the whole footer when the file is opened, to
#: ~10 times its size (a column chunk's metadata per column per row group): a 200 MB view
#: checkpoint of 38,000 one-row groups took 1.15 GB to open (fuzzer, template v3parts, case 105).
#: lakesink writes row groups of 65,536 rows or more: 10 million files' footers hold < 1 MB.
MAX_FOOTER = 8 << 20


def check_footer(tail: bytes, size: int, where: str, kind: str = "a lake's metadata file") -> None:
    """CorruptFileError naming ``where`` unless ``tail``, the last 8 bytes of a Parquet file of
    ``size`` bytes, end in ``PAR1`` after a footer length of at most :data:`MAX_FOOTER` that fits
    the file -- read before pyarrow decodes the footer. ``kind`` names the file's kind (a data
    file's footer is bounded alike: ``lakesink_reader.datafiles``)."""
    if len(tail) != 8 or tail[4:] != b"PAR1" or size < 12:
        raise CorruptFileError(f"{where}: not a Parquet file (no PAR1 at its end)")
    length = int.from_bytes(tail[:4], "little")
    if length > MAX_FOOTER or length > size - 12:
        raise CorruptFileError(
            f"{where}: its Parquet footer holds {length:,} bytes, more than the {MAX_FOOTER:,} {kind} "
            f"may have (or than the file's {size:,}): not a file lakesink wrote"
        )


def string_leaves(schema: pa.Schema, columns: list[str] | None = None) -> list[str]:
    """The dotted names (``add.stats``) of the string and binary leaves of ``schema`` reached
    through structs only, among ``columns`` (dotted names too; None: all): what a read passes
    as ``read_dictionary``."""
    found: list[str] = []

    def walk(name: str, type_: pa.DataType) -> None:
        if pa.types.is_struct(type_):
            for child in type_:
                walk(f"{name}.{child.name}", child.type)
        else:
            values = type_.value_type if pa.types.is_dictionary(type_) else type_
            if pa.types.is_string(values) or pa.types.is_binary(values) or pa.types.is_large_string(values):
                found.append(name)

    for field in schema:
        walk(field.name, field.type)
    if columns is None:
        return found
    return [n for n in found if any(n == c or n.startswith(f"{c}.") for c in columns)]


def decoded_bytes(data: pa.Table | pa.RecordBatch) -> int:
    """The bytes the dictionary arrays of ``data`` (top-level or in structs) decode to: each
    value's length once per row that uses it, from the indices; nothing is decoded."""
    import pyarrow.compute as pc  # here: only reads of a lake's Parquet metadata need it

    total = 0

    def count(array: Any) -> None:
        nonlocal total
        if isinstance(array, pa.ChunkedArray):
            for chunk in array.chunks:
                count(chunk)
        elif isinstance(array, pa.StructArray):
            for child in array.flatten():  # the parent's offset and nulls applied
                count(child)
        elif isinstance(array, pa.DictionaryArray):
            values: Any = array.dictionary  # string or binary: read_dictionary makes no other
            lengths = pc.binary_length(values)
            used = pc.sum(pc.take(lengths, array.indices)).as_py()
            total += int(used or 0)

    for column in data.columns:
        count(column)
    return total


def check_decoded(data: pa.Table | pa.RecordBatch, most: int, what: str) -> None:
    """CorruptFileError naming ``what`` when ``data``'s dictionary columns decode to more than
    ``most`` bytes (:func:`decoded_bytes`), or when an index of one is past its dictionary
    (pyarrow reads them unchecked: one changed byte of a list, fuzzer case 917)."""
    try:
        found = decoded_bytes(data)
    except pa.ArrowIndexError as exc:
        said = one_line(exc)
        raise CorruptFileError(f"{what}: a dictionary index past its dictionary ({said})") from exc
    if found > most:
        raise CorruptFileError(
            f"{what}: its text columns decode to {found} bytes (their dictionaries counted per use), "
            f"more than {most}: not a file lakesink wrote"
        )


def plain(data: pa.Table, schema: pa.Schema | None = None) -> pa.Table:
    """``data`` decoded, after :func:`check_decoded`: cast to ``schema``'s types (its columns a
    subset of ``schema``'s, in any order), or with every dictionary type replaced by its values'
    type (None)."""
    if schema is not None:
        return data.cast(pa.schema([schema.field(name) for name in data.column_names]))

    def undictionary(type_: pa.DataType) -> pa.DataType:
        if pa.types.is_dictionary(type_):
            values: pa.DataType = type_.value_type
            return values
        if pa.types.is_struct(type_):
            return pa.struct([f.with_type(undictionary(f.type)) for f in type_])
        return type_

    return data.cast(pa.schema([f.with_type(undictionary(f.type)) for f in data.schema]))
