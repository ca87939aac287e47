"""JSON read from a lake, bounded: whoever can write the lake's folder chooses these bytes.

``json.loads`` of ``[`` x 100,000 raises RecursionError, and a document nested a few hundred
deep parses but then exhausts the stack of whatever walks it (encoding it again, comparing it,
pickling it to Spark). :func:`loads` refuses both, and documents larger than any lakesink
writes, with a ValueError -- the error every caller already turns into ``CorruptFileError``
naming the file (or, for a hint, into "ignore it"). docs/FORMAT.md, "Trust".

:func:`canonical` is the other direction: the one JSON text lakesink writes of a value where
the text itself is compared or stored (the log's stats, the Delta view's lines).
"""

from __future__ import annotations

import json
from typing import Any

#: The deepest nesting lakesink writes is a commit's statistics and a writer's source offsets
#: (under ten levels); Spark's offset JSON adds a few. 64 leaves room, and is far below the
#: interpreter's recursion limit.
MAX_DEPTH = 64
#: One JSON document (a commit line, a checkpoint's small part, table.json, a hint, an epoch
#: record or segment). The largest lakesink writes are a compaction commit's lines and a
#: format-2 segment: a few MB.
MAX_BYTES = 64 << 20
#: What to read of a file that holds one document (``Storage.read_bytes(..., limit=LIMIT)``): one
#: byte more than a document may have, so that a larger file is refused without reading it all.
LIMIT = MAX_BYTES + 1


def loads(data: bytes | str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, refusing a document over ``max_bytes`` or nested deeper than
    ``max_depth``: ValueError for every way ``data`` is not an acceptable document."""
    if len(data) > max_bytes:
        raise ValueError(f"a JSON document of {len(data)} bytes, more than the {max_bytes} allowed")
    try:
        doc = json.loads(data)
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


def depth(doc: Any, limit: int) -> int:
    """How deep ``doc`` nests, counted up to ``limit + 1`` (then it stops looking)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    deepest = 0
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def canonical(value: Any) -> str:
    """The one JSON text of ``value``: keys sorted, no spaces, UTF-8 as is, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
