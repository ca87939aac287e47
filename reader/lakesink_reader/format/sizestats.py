"""What a Parquet footer's ``SizeStatistics`` say each column chunk's text decodes to
(docs/FORMAT.md, "Trust"; docs/design/trust.md, "From issue 37", item 6).

A text column chunk can decode to far more than its pages hold: a dictionary stores a value once
and every row as an index; ``DELTA_BYTE_ARRAY`` stores a value as a prefix of the one before. So
what a chunk decodes to is not in the sizes pyarrow shows (its uncompressed bytes count the
dictionary once). Parquet 2.10's ``SizeStatistics.unencoded_byte_array_data_bytes`` is exactly
that number, per column chunk, and pyarrow (Arrow C++ since its ``SizeStatisticsLevel``
defaults to page and column chunk) writes it in every file, lakesink's included -- but does not
show it to Python. This module reads it from the footer's Thrift (compact protocol), the bytes
pyarrow decodes when it opens the file.

The footer is untrusted bytes: the walk is bounded by them (every element consumes a byte or
more, nesting is at most :data:`MAX_DEPTH`), stops at the row groups (the schema's key-value
metadata after them is never walked), and any footer it cannot follow gives ``None``: the
caller then bounds the chunks another way. A footer that lies about these sizes lies as one
that understates its uncompressed sizes does: the reader counts what it decoded, batch by batch.
"""

from __future__ import annotations

from collections.abc import Iterator

#: How deep Thrift structs and lists may nest in a footer walked here: a footer's row groups are
#: at depth 4 (file, row group, column chunk, column metadata, size statistics).
MAX_DEPTH = 16

# Thrift compact protocol type ids.
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT, _UUID = 9, 10, 11, 12, 13

# The fields walked (parquet.thrift): FileMetaData.row_groups, RowGroup.columns,
# ColumnChunk.meta_data, ColumnMetaData.size_statistics, SizeStatistics.unencoded_byte_array_data_bytes.
_ROW_GROUPS, _COLUMNS, _META_DATA, _SIZE_STATISTICS, _UNENCODED = 4, 1, 3, 16, 1


class _Unreadable(Exception):
    """The footer cannot be followed: its sizes are not known here."""


class _Walk:
    """One walk of a footer's bytes, position by position."""

    def __init__(self, footer: bytes) -> None:
        self.buf = footer
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _Unreadable
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise _Unreadable

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def advance(self, count: int) -> None:
        if count < 0 or self.pos + count > len(self.buf):
            raise _Unreadable
        self.pos += count

    def collection(self) -> tuple[int, int]:
        """A list's or set's header: its size (at most the bytes left: each element takes one
        or more) and its elements' type."""
        head = self.byte()
        size = head >> 4
        if size == 15:
            size = self.varint()
        if size > len(self.buf) - self.pos:
            raise _Unreadable
        return size, head & 15

    def skip(self, kind: int, depth: int, element: bool = False) -> None:
        if depth > MAX_DEPTH:
            raise _Unreadable
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            if element:  # a bool in a list or map is a byte; as a field, in the field's header
                self.advance(1)
        elif kind == _BYTE:
            self.advance(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.advance(8)
        elif kind == _BINARY:
            self.advance(self.varint())
        elif kind in (_LIST, _SET):
            size, of = self.collection()
            for _ in range(size):
                self.skip(of, depth + 1, element=True)
        elif kind == _MAP:
            size = self.varint()
            if size > len(self.buf) - self.pos:
                raise _Unreadable
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1, element=True)
                    self.skip(types & 15, depth + 1, element=True)
        elif kind == _STRUCT:
            for _field, field_kind in self.fields(depth + 1):
                self.skip(field_kind, depth + 1)
        elif kind == _UUID:
            self.advance(16)
        else:
            raise _Unreadable

    def fields(self, depth: int) -> Iterator[tuple[int, int]]:
        """The fields of the struct at the position: yields (field id, type) with the position at
        the field's value, which the caller reads or skips before the next."""
        if depth > MAX_DEPTH:
            raise _Unreadable
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta = head >> 4
            field = field + delta if delta else self.zigzag()
            yield field, head & 15

    def struct_list(self, kind: int, depth: int) -> int:
        """The size of the list of structs at the position (its elements then follow)."""
        if kind != _LIST:
            raise _Unreadable
        size, of = self.collection()
        if of != _STRUCT:
            raise _Unreadable
        return size


def unencoded_text_bytes(footer: bytes) -> list[list[int | None]] | None:
    """Per row group, per column chunk (in the footer's order, as pyarrow's
    ``metadata.row_group(g).column(j)``), the bytes its text values decode to by the chunk's
    ``SizeStatistics`` (None where the chunk has none: a column not of text, or a writer that
    does not write them); None when the footer (the Thrift ``FileMetaData``, without the file's
    last 8 bytes) cannot be followed."""
    walk = _Walk(footer)
    try:
        for field, kind in walk.fields(0):
            if field != _ROW_GROUPS:
                walk.skip(kind, 1)
                continue
            groups = []
            for _ in range(walk.struct_list(kind, 1)):
                groups.append(_row_group(walk, 2))
            return groups  # what follows the row groups is not needed
    except _Unreadable:
        return None
    return None  # no row groups: a footer pyarrow would refuse too


def _row_group(walk: _Walk, depth: int) -> list[int | None]:
    chunks: list[int | None] = []
    for field, kind in walk.fields(depth):
        if field != _COLUMNS:
            walk.skip(kind, depth)
            continue
        for _ in range(walk.struct_list(kind, depth)):
            chunks.append(_column_chunk(walk, depth + 1))
    return chunks


def _column_chunk(walk: _Walk, depth: int) -> int | None:
    found = None
    for field, kind in walk.fields(depth):
        if field == _META_DATA and kind == _STRUCT:
            found = _column_metadata(walk, depth + 1)
        else:
            walk.skip(kind, depth)
    return found


def _column_metadata(walk: _Walk, depth: int) -> int | None:
    found = None
    for field, kind in walk.fields(depth):
        if field == _SIZE_STATISTICS and kind == _STRUCT:
            for inner, inner_kind in walk.fields(depth + 1):
                if inner == _UNENCODED and inner_kind == _I64:
                    found = walk.zigzag()
                else:
                    walk.skip(inner_kind, depth + 1)
        else:
            walk.skip(kind, depth)
    return found if found is not None and found >= 0 else None
