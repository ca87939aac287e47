"""The Iceberg view's Avro files (manifest lists, manifests) checked before pyiceberg decodes
them (docs/FORMAT.md, "Trust"; docs/design/trust.md, "Session 22").

The view's files are the lake's input like any other, and an Avro container lets a few bytes
stand for many: a block is compressed (a 3 MB manifest list of one deflate block inflated to
3 GB, and ``lakesink verify`` to 6 GB), and an array or map states its count up front (a
billion nulls take five bytes). pyiceberg decompresses each block whole and builds an object
per value, so before it sees a file, :func:`check` walks it by the schema its header gives,
without building anything:

- the container: the magic, a header of at most :data:`MAX_HEADER_ENTRIES` entries whose schema
  is a JSON document of at most :data:`MAX_SCHEMA_BYTES` bytes (``jsondoc``), nested at most
  :data:`MAX_DEPTH` deep; the codec ``null`` or ``deflate`` (what pyiceberg writes); each block's
  sync marker; each block inflated to at most :data:`MAX_BLOCK` bytes;
- what pyiceberg would build: each value (a record's field, an array's or a map's item -- a
  count is checked before its items are walked) costs :data:`VALUE_COST` bytes and each byte
  of text one; their sum is at most :data:`FLOOR` plus :data:`EXPANSION` times the file's bytes.

lakesink's own files cost far less than that: a manifest entry of a 3-column lake holds ~160
bytes on storage (pyiceberg writes a deflate block per record) and ~45 values, which pyiceberg
decodes to 3-4 KB (measured: 50,000 entries, 134 MiB).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from lakesink_reader import jsondoc

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
#: Entries of a header's metadata map (pyiceberg writes ~8: the schema, the codec, Iceberg's).
MAX_HEADER_ENTRIES = 64
#: A header's schema (a manifest entry's is ~10 KB with a partition spec of a few columns).
MAX_SCHEMA_BYTES = 1 << 20
#: How deep types nest in a schema, and so how deep a value's walk goes (a manifest's: 5).
MAX_DEPTH = 32
#: The most bytes one block may inflate to: pyiceberg writes a block per record (~200 bytes),
#: Iceberg's Java writers a block per ~64 KB.
MAX_BLOCK = 16 << 20
#: What one decoded value costs pyiceberg at most in memory, in bytes: an object or a boxed
#: number and its slot in a list, a dict or a record (measured ~70 for a manifest entry's).
VALUE_COST = 96
#: What a view's Avro file may cost, beyond :data:`EXPANSION` times its bytes.
FLOOR = 64 << 20
#: What a view's Avro file may cost per byte it holds on storage: lakesink's decode to ~20 times.
EXPANSION = 64
#: The codecs pyiceberg reads; lakesink writes ``deflate``.
CODECS = frozenset({"null", "deflate"})

# The primitive types and the bytes each takes (None: variable).
_PRIMITIVES = {
    "null": 0,
    "boolean": 1,
    "int": None,
    "long": None,
    "float": 4,
    "double": 8,
    "bytes": None,
    "string": None,
}


class AvroRefused(ValueError):
    """The file is no Avro container lakesink's view could hold, or costs too much to decode."""


@dataclass(frozen=True)
class _Type:
    """A compiled schema node: ``kind`` one of the primitives, ``record``, ``enum``, ``array``,
    ``map``, ``fixed``, ``union``; ``items`` its children (fields, branches, the element or the
    map's value); ``size`` a fixed's bytes or an enum's symbols."""

    kind: str
    items: tuple[Any, ...] = ()  # _Type, or a named type's full name (resolved when walked)
    size: int = 0


def check(data: bytes, where: str) -> int:
    """``data``, a view's Avro file, checked as the module docstring says: the number of
    records it holds; AvroRefused naming ``where`` and what is wrong otherwise."""
    try:
        return _Walk(data, FLOOR + EXPANSION * len(data)).file()
    except AvroRefused as exc:
        raise AvroRefused(f"{where}: {exc}") from None
    except (IndexError, zlib.error) as exc:
        raise AvroRefused(f"{where}: not an Avro file lakesink's view could hold ({exc})") from None


class _Walk:
    """One pass over a container: position ``at`` in ``data`` (or in an inflated block)."""

    def __init__(self, data: bytes, budget: int) -> None:
        self.data = data
        self.at = 0
        self.left = budget  # what decoding may still cost
        self.named: dict[str, _Type] = {}
        # Names declared, compiled or not yet: a record's fields may refer to the record itself
        # (such a recursion is bounded by MAX_DEPTH when its values are walked).
        self._declared: set[str] = set()

    # The container ----------------------------------------------------------------------------

    def file(self) -> int:
        data = self.data
        if data[:4] != MAGIC:
            raise AvroRefused("no Avro magic")
        self.at = 4
        meta = self._header()
        codec = meta.get("avro.codec", b"null").decode("ascii", "replace")
        if codec not in CODECS:
            raise AvroRefused(f"codec {codec!r}: lakesink's view holds {sorted(CODECS)}")
        if "avro.schema" not in meta:
            raise AvroRefused("no schema in its header")
        try:
            schema = jsondoc.loads(meta["avro.schema"], max_bytes=MAX_SCHEMA_BYTES, max_depth=MAX_DEPTH)
        except ValueError as exc:
            raise AvroRefused(f"its schema: {exc}") from None
        root = self._compile(schema, "", 0)
        sync = data[self.at : self.at + SYNC_SIZE]
        if len(sync) != SYNC_SIZE:
            raise AvroRefused("cut short in its header")
        self.at += SYNC_SIZE
        records = 0
        while self.at < len(data):
            count = self._long()
            size = self._long()
            if count < 0 or size < 0 or self.at + size + SYNC_SIZE > len(data):
                raise AvroRefused(f"a block of {count} record(s) and {size} bytes past its end")
            block = data[self.at : self.at + size]
            self.at += size
            if data[self.at : self.at + SYNC_SIZE] != sync:
                raise AvroRefused("a block without its sync marker")
            self.at += SYNC_SIZE
            records += count
            self._block(block if codec == "null" else self._inflated(block), root, count)
        return records

    def _header(self) -> dict[str, bytes]:
        meta: dict[str, bytes] = {}
        while True:
            count = self._long()
            if count == 0:
                return meta
            if count < 0:
                count = -count
                self._long()  # the block's size in bytes
            if len(meta) + count > MAX_HEADER_ENTRIES:
                raise AvroRefused(f"more than {MAX_HEADER_ENTRIES} header entries")
            for _ in range(count):
                key = self._bytes().decode("utf-8", "replace")
                meta[key] = self._bytes()

    def _inflated(self, block: bytes) -> bytes:
        """``block`` inflated, never to more than :data:`MAX_BLOCK` bytes (which then count)."""
        inflater = zlib.decompressobj(-15)
        out = inflater.decompress(block, MAX_BLOCK + 1)
        if len(out) > MAX_BLOCK or inflater.unconsumed_tail:
            raise AvroRefused(f"a block inflates to more than {MAX_BLOCK >> 20} MiB")
        self._spend(0, len(out))  # pyiceberg holds the block inflated while it decodes it
        return out

    def _block(self, block: bytes, root: _Type, count: int) -> None:
        outer, outer_at = self.data, self.at
        self.data, self.at = block, 0
        self._spend(count, 0)
        for _ in range(count):
            self._value(root, 0)
        if self.at != len(block):
            raise AvroRefused(f"a block of {count} record(s) holds {len(block) - self.at} bytes more")
        self.data, self.at = outer, outer_at

    # Values -----------------------------------------------------------------------------------

    def _value(self, t: Any, depth: int) -> None:
        if isinstance(t, str):
            t = self.named[t]
        if depth > MAX_DEPTH:
            raise AvroRefused(f"values nested deeper than {MAX_DEPTH}")
        kind = t.kind
        if kind in ("int", "long", "enum"):
            self._long()
        elif kind in ("bytes", "string"):
            n = self._long()
            if n < 0 or self.at + n > len(self.data):
                raise AvroRefused(f"a text of {n} bytes past its block")
            self._spend(0, n)
            self.at += n
        elif kind == "fixed":
            self._spend(0, t.size)
            self.at += t.size
        elif kind in _PRIMITIVES:
            self.at += _PRIMITIVES[kind] or 0
        elif kind == "record":
            self._spend(len(t.items), 0)
            for field in t.items:
                self._value(field, depth + 1)
        elif kind == "union":
            branch = self._long()
            if not 0 <= branch < len(t.items):
                raise AvroRefused(f"union branch {branch} of {len(t.items)}")
            self._value(t.items[branch], depth + 1)
        else:  # array, map: blocks of items until a zero count
            while True:
                count = self._long()
                if count == 0:
                    break
                if count < 0:
                    count = -count
                    self._long()
                self._spend(count * (2 if kind == "map" else 1), 0)
                for _ in range(count):
                    if kind == "map":
                        n = self._long()
                        if n < 0 or self.at + n > len(self.data):
                            raise AvroRefused(f"a map key of {n} bytes past its block")
                        self._spend(0, n)
                        self.at += n
                    self._value(t.items[0], depth + 1)
        if self.at > len(self.data):
            raise AvroRefused("a value past its block")

    def _spend(self, values: int, text: int) -> None:
        self.left -= values * VALUE_COST + text
        if self.left < 0:
            raise AvroRefused(f"decodes past what the file may cost ({self._budget_text()})")

    def _budget_text(self) -> str:
        return f"{FLOOR >> 20} MiB plus {EXPANSION} times its bytes, a value counted {VALUE_COST} bytes"

    def _long(self) -> int:
        data, at = self.data, self.at
        n = shift = 0
        while True:
            byte = data[at]
            at += 1
            n |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise AvroRefused("a number longer than 10 bytes")
        self.at = at
        return (n >> 1) ^ -(n & 1)

    def _bytes(self) -> bytes:
        n = self._long()
        if n < 0 or self.at + n > len(self.data):
            raise AvroRefused(f"a text of {n} bytes past the end")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    # The schema -------------------------------------------------------------------------------

    def _compile(self, schema: Any, namespace: str, depth: int) -> Any:
        """``schema`` as a :class:`_Type` (a named type's reference as its full name)."""
        if depth > MAX_DEPTH:
            raise AvroRefused(f"a schema nested deeper than {MAX_DEPTH}")
        if isinstance(schema, list):
            return _Type("union", tuple(self._compile(b, namespace, depth + 1) for b in schema))
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _Type(schema)
            for name in (f"{namespace}.{schema}" if namespace and "." not in schema else schema, schema):
                if name in self.named or name in self._declared:
                    return name
            raise AvroRefused(f"its schema names the unknown type {schema!r}")
        if not isinstance(schema, dict):
            raise AvroRefused(f"its schema holds {type(schema).__name__}")
        kind = schema.get("type")
        if kind in _PRIMITIVES or isinstance(kind, list | dict):
            return self._compile(kind, namespace, depth + 1)
        if kind in ("array", "map"):
            key = "items" if kind == "array" else "values"
            return _Type(kind, (self._compile(schema.get(key), namespace, depth + 1),))
        if kind not in ("record", "error", "enum", "fixed"):
            raise AvroRefused(f"its schema holds the type {kind!r}")
        name = str(schema.get("name", ""))
        space = str(schema.get("namespace", namespace)) if "." not in name else name.rsplit(".", 1)[0]
        full = name if "." in name or not space else f"{space}.{name}"
        self._declared.add(full)
        if kind == "fixed":
            size = schema.get("size")
            if not isinstance(size, int) or not 0 <= size <= MAX_SCHEMA_BYTES:
                raise AvroRefused(f"a fixed type of size {size!r}")
            compiled = _Type("fixed", size=size)
        elif kind == "enum":
            compiled = _Type("enum")
        else:
            fields = schema.get("fields")
            if not isinstance(fields, list):
                raise AvroRefused(f"the record {full!r} has no fields list")
            compiled = _Type(
                "record",
                tuple(
                    self._compile(f.get("type") if isinstance(f, dict) else None, space, depth + 1)
                    for f in fields
                ),
            )
        self.named[full] = compiled
        if full != name:
            self.named.setdefault(name, compiled)
        return compiled
