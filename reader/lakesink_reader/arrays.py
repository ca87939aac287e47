"""Arrow arrays of Python values, built from their buffers: the log's and the views' columns
without pandas (issue 38's memory target).

pyarrow's converters of Python objects ask its pandas shim first whether the object is a
pandas one (``_is_array_like`` in pyarrow 26's ``array.pxi`` and ``scalar.pxi``), and the
shim's first question imports pandas: ``pa.array`` and ``pa.scalar`` of anything that is not
an Arrow array, ``pa.table``/``pa.record_batch``/``Table.from_arrays`` of lists,
``from_pylist``/``from_pydict``, and a compute function handed a Python value
(``pc.fill_null(x, False)`` makes a ``pa.scalar``). That is ~27 MiB in the user's process of a
streaming query, which commits every batch, and in each Spark worker. ``Array.from_buffers``
asks nothing: :func:`array` lays the values out as Arrow's columnar format says and hands the
buffers over. It takes the types the lake's own documents use (strings, binary, integers,
booleans, and lists, maps and structs of them); anything else is a TypeError naming the type.
"""

from __future__ import annotations

import array as _array
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

#: array.array's type codes by (bytes, signed): the integer types' data buffers.
_INT_CODES = {
    (1, True): "b", (1, False): "B", (2, True): "h", (2, False): "H",
    (4, True): "i", (4, False): "I", (8, True): "q", (8, False): "Q",
}  # fmt: skip
#: The most bytes a string or binary column (32-bit offsets) holds.
_MAX_OFFSET = 2**31 - 1


def array(values: Sequence[Any], type: pa.DataType) -> pa.Array[Any]:
    """``pa.array(values, type)``, without pyarrow's pandas check (the module docstring).

    ``None`` is null at any level. A map's value is a mapping or a sequence of (key, value)
    pairs; a struct's is a mapping of its fields (a field left out is null).
    """
    n = len(values)
    validity, null_count = _validity(values)
    buffers: list[pa.Buffer | None]
    children: list[pa.Array[Any]] = []
    if pa.types.is_string(type) or pa.types.is_binary(type):
        encoded = [b"" if v is None else v.encode() if isinstance(v, str) else bytes(v) for v in values]
        offsets = _offsets(map(len, encoded), type)
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    elif pa.types.is_integer(type):
        code = _INT_CODES[(type.bit_width // 8, pa.types.is_signed_integer(type))]
        data = _array.array(code, (0 if v is None else v for v in values))
        buffers = [validity, pa.py_buffer(data)]
    elif pa.types.is_boolean(type):
        buffers = [validity, pa.py_buffer(_bitmap([bool(v) for v in values]))]
    elif pa.types.is_list(type) or pa.types.is_map(type):
        items = [() if v is None else _entries(v) if pa.types.is_map(type) else v for v in values]
        buffers = [validity, pa.py_buffer(_offsets(map(len, items), type))]
        flat = list(itertools.chain.from_iterable(items))
        if pa.types.is_map(type):
            entries = pa.struct([type.key_field, type.item_field])
            flat = [{type.key_field.name: k, type.item_field.name: i} for k, i in flat]
            children = [array(flat, entries)]
        else:
            children = [array(flat, type.value_type)]
    elif pa.types.is_struct(type):
        buffers = [validity]
        rows = [{} if v is None else v for v in values]
        children = [array([row.get(f.name) for row in rows], f.type) for f in type]
    else:
        raise TypeError(f"lakesink_reader.arrays.array builds no {type} column (pa.array would, with pandas)")
    built: pa.Array[Any] = pa.Array.from_buffers(type, n, buffers, null_count=null_count, children=children)
    return built


def scalar(value: Any, type: pa.DataType) -> pa.Scalar[Any]:
    """``pa.scalar(value, type)``, without the pandas check: the one value of a one-row array."""
    one: pa.Scalar[Any] = array([value], type)[0]
    return one


def _validity(values: Sequence[Any]) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of ``values`` (None when none is null) and their null count."""
    present = [v is not None for v in values]
    null_count = len(present) - sum(present)
    return (pa.py_buffer(_bitmap(present)) if null_count else None), null_count


def _bitmap(flags: Sequence[bool]) -> bytes:
    """Arrow's bit-packed booleans: bit i of byte i // 8, least significant first."""
    n = len(flags)
    ones = sum(flags)
    # Set the fewer of the two kinds one by one (itertools.compress walks the rest in C).
    out = bytearray(b"\xff" if ones * 2 > n else b"\x00") * ((n + 7) // 8)
    if ones * 2 > n:
        for i in itertools.compress(range(n), [not f for f in flags]):
            out[i >> 3] &= ~(1 << (i & 7)) & 0xFF
        if n % 8:
            out[-1] &= (1 << (n % 8)) - 1  # no bits set past the end
    else:
        for i in itertools.compress(range(n), flags):
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _offsets(lengths: Any, type: pa.DataType) -> _array.array[int]:
    """32-bit offsets of consecutive values of these ``lengths``; ValueError past 2**31 - 1."""
    try:
        return _array.array("i", itertools.accumulate(lengths, initial=0))
    except OverflowError:
        raise ValueError(f"a {type} column of more than {_MAX_OFFSET} bytes or values") from None


def _entries(value: Mapping[Any, Any] | Sequence[tuple[Any, Any]]) -> Sequence[tuple[Any, Any]]:
    return list(value.items()) if isinstance(value, Mapping) else value
