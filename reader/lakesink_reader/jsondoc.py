"""JSON read from a lake, bounded: whoever can write the lake's folder chooses these bytes.

``json.loads`` of ``[`` x 100,000 raises RecursionError, and a document nested a few hundred
deep parses but then exhausts the stack of whatever walks it (encoding it again, comparing it,
pickling it to Spark). :func:`loads` refuses both, and documents larger than any lakesink
writes, with a ValueError -- the error every caller already turns into ``CorruptFileError``
naming the file (or, for a hint, into "ignore it"). It also bounds what the document builds:
elements (a 60 MiB ``[{},{},...]`` would otherwise take minutes and gigabytes), and numbers
(``NaN``/``Infinity``, a float that overflows to infinity such as ``1e999``, an integer of more
than :data:`MAX_INT_DIGITS` digits are refused, so no ``OverflowError`` comes later from
``int(inf)`` or a date). docs/FORMAT.md, "Trust", lists the limits.

:func:`canonical` is the other direction: the one JSON text lakesink writes of a value where
the text itself is compared or stored (the log's stats, the Delta view's lines).
"""

from __future__ import annotations

import json
import math
from typing import Any

#: The deepest nesting lakesink writes is a commit's statistics and a writer's source offsets
#: (under ten levels); Spark's offset JSON adds a few. 64 leaves room, and is far below the
#: interpreter's recursion limit.
MAX_DEPTH = 64
#: One JSON document (a commit line, a checkpoint's small part, table.json, a hint, an epoch
#: record or segment). The largest lakesink writes are a compaction commit's lines and a
#: format-2 segment: a few MB.
MAX_BYTES = 64 << 20
#: Values (objects, arrays, strings, numbers, literals) in one document, bounded by counting its
#: commas and opening brackets (:func:`count_elements`). The largest lakesink writes are a
#: checkpoint's small part (about 20 per writer and op) and a format-2 segment (about 10 per
#: epoch): a million is far above both, and builds ~100 MB at most.
MAX_ELEMENTS = 1_000_000
#: An integer literal's digits: a decimal(38) statistic has 38 (and a sign). Versions, counts and
#: sizes are further bounded to :data:`MAX_COUNT` where they are read.
MAX_INT_DIGITS = 40
#: The largest version, count, size or interval a lake may state: what a signed 64-bit integer
#: holds (what Delta, Spark and Parquet use for them).
MAX_COUNT = (1 << 63) - 1
#: The latest time a lake may state (seconds since 1970): the last second of year 9999, the
#: most ``datetime`` holds (``history`` and ``status`` print these times).
MAX_SECONDS = 253_402_300_799
#: What to read of a file that holds one document (``Storage.read_bytes(..., limit=LIMIT)``): one
#: byte more than a document may have, so that a larger file is refused without reading it all.
LIMIT = MAX_BYTES + 1


def loads(
    data: bytes | str,
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    max_elements: int = MAX_ELEMENTS,
) -> Any:
    """``json.loads(data)``, refusing a document over ``max_bytes``, nested deeper than
    ``max_depth``, of more than ``max_elements`` values, or with a number out of range:
    ValueError for every way ``data`` is not an acceptable document."""
    if len(data) > max_bytes:
        raise ValueError(f"a JSON document of {len(data)} bytes, more than the {max_bytes} allowed")
    if count_elements(data) > max_elements:
        raise ValueError(f"a JSON document of more than {max_elements} values (commas and brackets)")
    try:
        doc = json.loads(data, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except MemoryError:
        raise ValueError("JSON document too large to decode") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
    # Cheap first: fewer brackets than the limit cannot nest deeper than it. Only documents with
    # many brackets are walked (without recursion).
    brackets = (
        data.count(b"[") + data.count(b"{") if isinstance(data, bytes) else data.count("[") + data.count("{")
    )
    if brackets > max_depth and depth(doc, max_depth) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return doc


def count_elements(data: bytes | str) -> int:
    """An upper bound of the values in ``data``: every value but the first follows a ``,`` or
    opens right after a ``[``/``{`` or ``:`` (colons pair with commas), so commas and opening
    brackets bound the count. Counted in C, without a copy; those inside strings count too
    (lakesink writes no string with many), which keeps it one pass: stripping the strings first
    (a regex) built ~500 MB of pieces for 60 MB of short strings (fuzzer, case 725)."""
    if isinstance(data, bytes):
        return data.count(b",") + data.count(b"[") + data.count(b"{") + 1
    return data.count(",") + data.count("[") + data.count("{") + 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def count(value: Any, what: str, *, least: int = 0) -> int:
    """``value`` as a version, count, size or interval read from a lake: an int (not a bool)
    from ``least`` to :data:`MAX_COUNT`; ValueError naming ``what`` otherwise."""
    if type(value) is not int or not least <= value <= MAX_COUNT:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "a huge number"
        raise ValueError(f"{what} must be an int from {least} to 2**63-1, got {shown[:60]}")
    return value


def seconds(value: Any, what: str) -> float:
    """``value`` as a time read from a lake (seconds since 1970, int or float, not a bool) from 0
    to :data:`MAX_SECONDS`; ValueError naming ``what`` otherwise."""
    if type(value) not in (int, float) or not 0 <= value <= MAX_SECONDS:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else "a huge number"
        raise ValueError(f"{what} must be a time in seconds from 0 to {MAX_SECONDS}, got {shown[:60]}")
    return float(value)


def depth(doc: Any, limit: int) -> int:
    """How deep ``doc`` nests, counted up to ``limit + 1`` (then it stops looking).

    Level by level, each level's children gathered with ``list.extend`` (in C): one test per
    value, where a stack of (value, level) pairs took three (a commit of 50,000 lines of 100
    empty objects each spent ~4 s walking)."""
    deepest, level = 0, [doc]
    while level:
        below: list[Any] = []
        containers = False
        for value in level:
            if isinstance(value, dict):
                below.extend(value.values())
                containers = True
            elif isinstance(value, list):
                below.extend(value)
                containers = True
        if not containers:
            break
        deepest += 1
        if deepest > limit:
            return deepest
        level = below
    return deepest


def canonical(value: Any) -> str:
    """The one JSON text of ``value``: keys sorted, no spaces, UTF-8 as is, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
