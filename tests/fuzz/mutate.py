"""One structure-aware change to one file of a lake, chosen by a seeded ``random.Random``.

Each mutation returns a one-line description (the case's ledger entry says what was done).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPARSE_BYTES = 6 << 30
#: How many empty objects ``lengthen``'s bomb holds (3 bytes each).
BOMB = 20_000_000
#: Texts an attacker puts where a JSON value was (raw JSON, not all of it valid).
VALUES = [
    "1e999",
    "-1e999",
    "1" + "0" * 400,
    "9" * 5000,
    "NaN",
    "Infinity",
    "-1",
    "0",
    "1.5",
    str(1 << 63),
    str((1 << 63) - 1),
    str(1 << 64),
    "9000000000000000000",
    "true",
    "null",
    '""',
    '"../victim/secret.parquet"',
    '"/etc/passwd"',
    '"s3://bucket/x"',
    '"a/../../x"',
    '"C:\\\\x"',
    '"\\u0000"',
    '"_lakesink/table.json"',
    "[]",
    "{}",
    '"' + "x" * (1 << 20) + '"',
    "[" * 200 + "]" * 200,
    "[" + ",".join(["{}"] * 50_000) + "]",
    '{"a": 1}',
    '"zzz"',
]
NUMBER = re.compile(rb"(?<![\w.\"])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w\"])")


def stable_key(path: Path, root: Path) -> str:
    """A file's place in the lake without its random parts (attempt ids, tokens), so that a
    case chooses the same file in every run of the same seed."""
    rel = path.relative_to(root).as_posix()
    return re.sub(r"[0-9a-f]{16,32}", "#", rel) + "\0" + rel


def files_of(root: Path) -> list[Path]:
    found = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return sorted(found, key=lambda p: stable_key(p, root))


def is_json(path: Path) -> bool:
    return path.suffix == ".json" or path.name in ("_last_checkpoint", "_ids") or "_lakesink/ops" in str(path)


# Mutations of JSON ---------------------------------------------------------------------------------


def _slots(doc: Any, trail: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in ``doc``."""
    found = [trail]
    if isinstance(doc, dict):
        for key in sorted(doc):
            found.extend(_slots(doc[key], (*trail, key)))
    elif isinstance(doc, list):
        for i, item in enumerate(doc[:50]):
            found.extend(_slots(item, (*trail, i)))
    return found


PLACEHOLDER = "\x00FUZZ\x00"


def _replace_at(doc: Any, trail: tuple[Any, ...], value: Any) -> Any:
    if not trail:
        return value
    node = doc
    for step in trail[:-1]:
        node = node[step]
    node[trail[-1]] = value
    return doc


def json_lines(path: Path) -> tuple[list[Any], str]:
    """The documents of ``path`` (one, or one per line) and how they were joined."""
    text = path.read_text()
    if path.suffix == ".json" and text.count("\n") > 1 and text.lstrip().startswith("{") and "\n{" in text:
        return [json.loads(line) for line in text.splitlines() if line], "lines"
    return [json.loads(text)], "one"


def write_json(path: Path, docs: list[Any], how: str, raw: str | None = None) -> None:
    text = (
        "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs)
        if how == "lines"
        else json.dumps(docs[0])
    )
    if raw is not None:
        text = text.replace(json.dumps(PLACEHOLDER), raw)
    path.write_text(text)


def json_value(rng: random.Random, path: Path) -> str:
    docs, how = json_lines(path)
    line = rng.randrange(len(docs))
    slots = _slots(docs[line])
    trail = rng.choice(slots)
    raw = rng.choice(VALUES)
    docs[line] = _replace_at(docs[line], trail, PLACEHOLDER)
    write_json(path, docs, how, raw)
    return f"line {line} {list(trail)} := {raw[:40]}"


def json_key(rng: random.Random, path: Path) -> str:
    docs, how = json_lines(path)
    line = rng.randrange(len(docs))
    objects = [t for t in _slots(docs[line]) if isinstance(_get(docs[line], t), dict) and _get(docs[line], t)]
    if not objects:
        return json_value(rng, path)
    trail = rng.choice(objects)
    node = _get(docs[line], trail)
    key = rng.choice(sorted(node))
    if rng.random() < 0.5:
        del node[key]
        what = f"deleted {key}"
    else:
        node["z" + key] = node[key]
        what = f"added z{key}"
    write_json(path, docs, how)
    return f"line {line} {list(trail)}: {what}"


def _get(doc: Any, trail: tuple[Any, ...]) -> Any:
    for step in trail:
        doc = doc[step]
    return doc


def number_text(rng: random.Random, path: Path) -> str:
    data = path.read_bytes()
    numbers = list(NUMBER.finditer(data))
    if not numbers:
        return truncate(rng, path)
    m = rng.choice(numbers)
    raw = rng.choice(VALUES[:13]).encode()
    path.write_bytes(data[: m.start()] + raw + data[m.end() :])
    return f"number at {m.start()} := {raw[:40].decode()}"


#: A commit file's byte limit (docs/FORMAT.md, "Trust").
COMMIT_BYTES = 256 << 20


def lengthen(rng: random.Random, path: Path) -> str:
    """A list in the document repeated many times (a header of many actions, a long previous)."""
    docs, how = json_lines(path)
    line = rng.randrange(len(docs))
    times = rng.choice([1000, 100_000, 400_000])
    if rng.random() < 0.1:
        # Issue 51's bomb: 20 million empty objects (60 MiB, under the byte and depth limits)
        # where a value was; decoded, 217 s and 4.5 GB. Written as text, never built here.
        slots = _slots(docs[line])
        trail = rng.choice(slots[1:] or slots)
        docs[line] = _replace_at(docs[line], trail, PLACEHOLDER)
        write_json(path, docs, how, "[" + "{}," * (BOMB - 1) + "{}]")
        return f"line {line} {list(trail)} := [{{}}] * {BOMB:,}"
    if how == "lines" and rng.random() < 0.3:  # many lines (a commit of many actions)
        if rng.random() < 0.3:
            # As many as a commit's byte limit lets in (docs/FORMAT.md: 256 MiB): what only the
            # bound on a commit's actions refuses (~700,000 adds: ~1 KB of memory each)
            line_bytes = len(json.dumps(docs[-1], separators=(",", ":"))) + 1
            times = max(1000, (COMMIT_BYTES - path.stat().st_size) // line_bytes - 16)
        docs.extend(docs[-1:] * times)
        # Half the time the header counts them, as the lake's writer could: then only the
        # bound on a commit's actions stands between the lines and their decoding.
        counts = docs[0].get("commit", {}).get("counts") if isinstance(docs[0], dict) else None
        action = next(iter(docs[-1]), None) if isinstance(docs[-1], dict) and len(docs) > 1 else None
        key = f"{action}_files"
        agreed = ""
        if isinstance(counts, dict) and isinstance(counts.get(key), int) and rng.random() < 0.5:
            counts[key] += times
            agreed = f" (the header counts them: {key} {counts[key]})"
        write_json(path, docs, how)
        return f"last line repeated {times} times{agreed}"
    lists = [t for t in _slots(docs[line]) if isinstance(_get(docs[line], t), list | dict)]
    trail = rng.choice(lists)
    node = _get(docs[line], trail)
    if isinstance(node, list) and node:
        node.extend(node[:1] * times)
    elif isinstance(node, dict):
        for i in range(min(times, 200_000)):
            node[f"k{i}"] = i
    else:
        _replace_at(docs[line], trail, [0] * times)
    write_json(path, docs, how)
    return f"line {line} {list(trail)} lengthened by {times}"


# Mutations of any file -------------------------------------------------------------------------------


def truncate(rng: random.Random, path: Path) -> str:
    size = path.stat().st_size
    keep = rng.randrange(size) if size else 0
    os.truncate(path, keep)
    return f"truncated to {keep} of {size} bytes"


def flip(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    if not data:
        return truncate(rng, path)
    spots = [rng.randrange(len(data)) for _ in range(rng.choice([1, 4, 32]))]
    for spot in spots:
        data[spot] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return f"{len(spots)} byte(s) changed"


def sparse(rng: random.Random, path: Path) -> str:
    with open(path, "r+b") as f:
        f.truncate(SPARSE_BYTES)
    return "made a sparse 6 GiB file (its first bytes kept)"


def parquet_footer(rng: random.Random, path: Path) -> str:
    """The footer of a Parquet file: its length word, or bytes of its Thrift metadata."""
    data = bytearray(path.read_bytes())
    if len(data) < 12 or data[-4:] != b"PAR1":
        return flip(rng, path)
    length = int.from_bytes(data[-8:-4], "little")
    choice = rng.randrange(3)
    if choice == 0:
        new = rng.choice([0, 1, length + 1, len(data), 1 << 31, (1 << 32) - 1])
        data[-8:-4] = new.to_bytes(4, "little")
        what = f"footer length {length} := {new}"
    else:
        start = max(0, len(data) - 8 - length)
        for _ in range(rng.choice([1, 3, 10])):
            spot = rng.randrange(start, len(data) - 8)
            data[spot] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        what = "footer bytes changed"
    path.write_bytes(bytes(data))
    return what


def link_out(rng: random.Random, path: Path, root: Path) -> str:
    """The file -- or a folder above it, inside the lake -- replaced by a link out of the lake."""
    victim = root.parent / "victim"
    folders = [p for p in path.relative_to(root).parents if p != Path(".")]
    if folders and rng.random() < 0.4:
        folder = root / rng.choice(folders)
        shutil.rmtree(folder)
        folder.symlink_to(victim, target_is_directory=True)
        return f"folder {folder.relative_to(root)} := link to ../victim"
    target = victim / "secret.parquet" if rng.random() < 0.7 else Path("/etc/hostname")
    path.unlink()
    path.symlink_to(target)
    return f"link to {target}"


def rename(rng: random.Random, path: Path, root: Path) -> str:
    """The file moved to a name a lake reader parses: versions far ahead, odd names."""
    name = path.name
    m = re.match(r"(\d{20})(.*)", name)
    if m:
        new = rng.choice(
            [f"{9 * 10**18:020d}", f"{(1 << 63) - 1:020d}", "99999999999999999999", f"{10**6:020d}"]
        )
        target = path.with_name(new + m.group(2))
        if m.group(2) == ".checkpoint.json" and path.parent.name == "log" and rng.random() < 0.5:
            claimed = _claim(path, int(new))
            if claimed:
                return claimed
        if rng.random() < 0.5:
            shutil.copy(path, target)
            return f"copied to {target.name}"
        path.rename(target)
        return f"renamed to {target.name}"
    target = path.with_name(rng.choice([".." + name, name + ".uncommitted", "_" + name, name.upper()]))
    path.rename(target)
    return f"renamed to {target.name}"


def _claim(checkpoint: Path, version: int) -> str:
    """The format-3 checkpoint ``checkpoint``, its list, the commit at its version and the hint
    all moved to ``version``, agreeing (tests/test_trust.py's recipe): the lake's snapshot then
    starts at that version, and a reader asked for its versions meets a claimed number that no
    commits below stand behind. "" when the files are not as lakesink writes them."""
    log = checkpoint.parent
    try:
        doc = json.loads(checkpoint.read_text())
        listed = log / doc["files"]["name"]
        commit = log / f"{doc['version']:020d}.json"
        header, rest = commit.read_text().split("\n", 1)
        head = json.loads(header)
        head["commit"].update(version=version, read_version=version - 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    doc["version"], doc["files"]["name"] = version, f"{version:020d}{listed.name[20:]}"
    listed.rename(log / doc["files"]["name"])
    checkpoint.unlink()
    (log / f"{version:020d}.checkpoint.json").write_text(json.dumps(doc))
    (log / f"{version:020d}.json").write_text(json.dumps(head, separators=(",", ":")) + "\n" + rest)
    (log / "_last_checkpoint").write_text(json.dumps({"version": version}))
    return f"checkpoint, list, commit and hint moved to claim version {version}"


def delete(rng: random.Random, path: Path) -> str:
    path.unlink()
    return "deleted"


# Parquet rewritten with pyarrow: a valid footer, other contents --------------------------------------

#: Values a rewrite puts in a Parquet cell, by the cell's Python type.
STRINGS = ["", "../victim/secret.parquet", "/etc/passwd", "file:///etc/passwd", "a/../../victim/x.parquet",
           "%2E%2E/victim/secret.parquet", "s3://bucket/x", "x" * (1 << 20), "_lakesink/table.json", "\x00",
           "{}", '{"numRecords": 1e999}', "[" * 100]  # fmt: skip
INTS = [0, -1, 1, (1 << 31) - 1, 1 << 31, (1 << 63) - 1, -(1 << 63), 10**15]


def _write_options(rng: random.Random, table: Any) -> tuple[dict[str, Any], str]:
    """Encodings, dictionaries, compression, page and row-group sizes pyarrow can write."""
    import pyarrow as pa

    options: dict[str, Any] = {
        "compression": rng.choice([None, "snappy", "zstd", "gzip", "lz4"]),
        "data_page_version": rng.choice(["1.0", "2.0"]),
        "write_statistics": rng.random() < 0.7,
        "store_schema": rng.random() < 0.8,
    }
    if rng.random() < 0.3:
        options["row_group_size"] = rng.choice([1, 3, 1000])
    if rng.random() < 0.2:
        options["data_page_size"] = rng.choice([1, 64, 4096])
    if rng.random() < 0.5:
        options["use_dictionary"] = True
    else:
        # Without dictionaries, other encodings for the top-level columns that take them.
        options["use_dictionary"] = False
        encodings = {}
        for field in table.schema:
            if pa.types.is_integer(field.type) and rng.random() < 0.6:
                encodings[field.name] = rng.choice(["DELTA_BINARY_PACKED", "PLAIN"])
            elif pa.types.is_string(field.type) and rng.random() < 0.6:
                encodings[field.name] = rng.choice(["DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY", "PLAIN"])
        if encodings:
            options["column_encoding"] = encodings
    shown = ",".join(f"{k}={v}" for k, v in sorted(options.items()) if k != "column_encoding")
    if "column_encoding" in options:
        shown += "," + ",".join(f"{k}:{v}" for k, v in sorted(options["column_encoding"].items()))
    return options, shown


def _edit_table(rng: random.Random, table: Any) -> tuple[Any, str]:
    """One change of a Parquet file's contents: its row count, a cell, a column, one large
    value every row uses (its dictionary then decodes to rows x value), or many null rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    kind = rng.choice(["repeat", "repeat", "slice", "cell", "cell", "cell", "one_value", "nulls", "column"])
    if kind == "repeat" and n:
        times = rng.choice([2, 1000, 50_000])
        # at most 200,000 rows: a Delta-view checkpoint's nested rows take ~5 KB each here
        indices = pa.array([i % n for i in range(min(n * times, 200_000))], pa.int64())
        return table.take(indices), f"rows repeated to {len(indices)}"
    if kind == "slice" and n:
        keep = rng.randrange(n)
        return table.slice(0, keep), f"rows cut to {keep} of {n}"
    loose = pa.schema([f.with_nullable(True) for f in table.schema], metadata=table.schema.metadata)
    if kind == "nulls":
        count = rng.choice([1, 100_000, 1_000_000])
        return pa.table([pa.nulls(count, f.type) for f in loose], schema=loose), f"{count} rows of nulls"
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    if kind == "one_value" and strings and n:
        name = rng.choice(strings)
        value = rng.choice(["x" * 300_000, "../victim/secret.parquet", table.column(name)[0].as_py() or "x"])
        times = rng.choice([1, 3000])
        indices = pa.array([i % n for i in range(n * times)], pa.int64())
        grown = table.take(indices)
        # Dictionary-encoded, in memory and on disk (parquet_rewrite keeps dictionaries on): the
        # value once and an index a row. Built plain, 150,000 rows of a 300 KB value took this
        # driver to 23 GB and the machine's OOM killer (session 18).
        column = pa.DictionaryArray.from_arrays(pa.array([0] * len(grown), pa.int32()), pa.array([value]))
        at = grown.schema.get_field_index(name)
        return (grown.set_column(at, pa.field(name, column.type), column),
                f"{len(grown)} rows, every {name} one {len(value)}-char value")  # fmt: skip
    if kind == "column" and table.num_columns:
        field = rng.choice(list(table.schema))
        at = table.schema.get_field_index(field.name)
        if rng.random() < 0.4:
            return table.remove_column(at), f"column {field.name} removed"
        for target in (pa.string(), pa.int32(), pa.binary(), pa.float64(), pa.large_string()):
            if target != field.type:
                try:
                    cast = pc.cast(table.column(at), target, safe=False)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    continue
                return table.set_column(
                    at, pa.field(field.name, target), cast
                ), f"column {field.name} as {target}"
        return table.remove_column(at), f"column {field.name} removed"
    if not n:
        return table, "rewritten as it was"
    # One cell, anywhere in the row's nested values (as the JSON mutations choose a slot).
    rows = table.to_pylist()
    row = rng.randrange(n)
    slots = [t for t in _slots(rows[row]) if t and not isinstance(_get(rows[row], t), dict | list)]
    if not slots:
        return table, "rewritten as it was"
    trail = rng.choice(slots)
    old = _get(rows[row], trail)
    if isinstance(old, bool):
        value: Any = not old
    elif isinstance(old, int):
        value = rng.choice(INTS)
    elif isinstance(old, str):
        value = rng.choice(STRINGS)
    else:
        value = rng.choice([*STRINGS[:3], *INTS[:3]])
    _replace_at(rows[row], trail, value)
    try:
        return pa.Table.from_pylist(rows, schema=loose), f"row {row} {list(trail)} := {str(value)[:40]!r}"
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return table, f"rewritten as it was (row {row} {list(trail)} takes no {type(value).__name__})"


def _agree(path: Path, root: Path, rows: int) -> str:
    """Make the lake's metadata agree with a rewritten file, as its writer could: a checkpoint
    list's summary (rows, bytes, as tests/test_trust.py's ``rewrite_list`` does); a Delta
    checkpoint's hint; the commits', records' and checkpoint lists' rows and bytes of a data file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = path.stat().st_size
    rel = path.relative_to(root).as_posix()
    changed = []
    if path.suffix == ".files":
        summary = path.with_name(path.name.split(".checkpoint.")[0] + ".checkpoint.json")
        if summary.exists():
            doc = json.loads(summary.read_text())
            doc["files"]["bytes"], doc["files"]["rows"] = size, rows
            doc["counts"]["files"] = rows
            summary.write_text(json.dumps(doc))
            changed.append(summary.name)
    elif path.name.endswith(".checkpoint.parquet"):
        hint = path.with_name("_last_checkpoint")
        if hint.exists():
            doc = json.loads(hint.read_text())
            doc["size"] = rows
            hint.write_text(json.dumps(doc))
            changed.append(hint.name)
    else:
        for meta in files_of(root):
            if meta.suffix == ".json" and "_lakesink" in meta.parts and rel in meta.read_text():
                docs, how = json_lines(meta)
                for doc in docs:
                    for trail in _slots(doc):
                        node = _get(doc, trail)
                        if isinstance(node, dict) and node.get("path") == rel:
                            node["rows"], node["bytes"] = rows, size
                write_json(meta, docs, how)
                changed.append(meta.name)
            elif meta.suffix == ".files":
                listed = pq.read_table(meta)
                entries = listed.to_pylist()
                if any(e.get("path") == rel for e in entries):
                    for e in entries:
                        if e.get("path") == rel:
                            e["rows"], e["bytes"] = rows, size
                    pq.write_table(
                        pa.Table.from_pylist(entries, schema=listed.schema), meta, compression="zstd"
                    )
                    changed.append(meta.name)
                    _agree(meta, root, len(entries))
    return ", ".join(changed) or "nothing to agree"


def parquet_rewrite(rng: random.Random, path: Path, root: Path) -> str:
    """A Parquet file read and written again by pyarrow -- a footer any reader accepts -- with
    other contents (rows, a cell, a column, a dictionary every row uses, null rows) and other
    encodings; half the time the lake's metadata is made to agree with it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception:  # noqa: BLE001 -- not a readable Parquet file (a list whose name says so)
        return flip(rng, path)
    table, what = _edit_table(rng, table)
    options, how = _write_options(rng, table)
    if "row_group_size" in options:
        # at most 50,000 row groups: enough for a footer far past the readers' bound (8 MiB),
        # and the writer's own metadata stays ~1 GB in this driver (a million: 5 GB)
        options["row_group_size"] = max(options["row_group_size"], -(-table.num_rows // 50_000))
    if any(pa.types.is_dictionary(f.type) for f in table.schema):
        # a dictionary column written plain would be its decoded size on disk (GBs); and each
        # row group repeats the dictionary page (and the value's statistics): one group only
        options["use_dictionary"] = True
        options["dictionary_pagesize_limit"] = 1 << 26
        for key in ("column_encoding", "row_group_size"):
            options.pop(key, None)
        how += " (dictionaries kept)"
    try:
        pq.write_table(table, path, **options)
    except Exception:  # noqa: BLE001 -- an encoding pyarrow will not write for this type
        pq.write_table(table, path)
        how = "default"
    agreed = f"; agreed: {_agree(path, root, table.num_rows)}" if rng.random() < 0.5 else ""
    return f"{what}; written {how}{agreed}"


# The Spark view's batches: "v1", then one JSON entry a line -------------------------------------------


def is_spark_batch(path: Path) -> bool:
    return path.parent.name == "_spark_metadata" and re.fullmatch(r"\d+(\.compact)?", path.name) is not None


def spark_metadata(rng: random.Random, path: Path, root: Path) -> str:
    """A batch of the Spark view (``_spark_metadata/<n>``): its ``v1`` header, an entry's value
    (paths out of the lake -- absolute, ``..`` and its percent-encoding, the file beside the
    lake --, sizes, actions), a key, or its entries repeated; sometimes renamed to a far batch id."""
    text = path.read_text()
    header, _, body = text.partition("\n")
    entries = [json.loads(line) for line in body.split("\n") if line]
    base = entries[0]["path"].rsplit("/", 1)[0] if entries and isinstance(entries[0].get("path"), str) else ""
    outside = base.rsplit("/", 1)[0] + "/victim/secret.parquet"
    kind = rng.choice(["header", "value", "value", "path", "path", "key", "repeat", "rename"])
    what = ""
    if kind == "header":
        header = rng.choice(["v2", "v0", "", "v1 ", "v99999999999999999999", "\ufeffv1"])
        what = f"header := {header!r}"
    elif kind == "path" and entries:
        at = rng.randrange(len(entries))
        entries[at]["path"] = rng.choice(
            [outside, base + "/../victim/secret.parquet", base + "/%2E%2E/victim/secret.parquet",
             base + "/_lakesink/table.json", "/etc/passwd", "victim/secret.parquet", base + "/", base + "//x"]
        )  # fmt: skip
        if rng.random() < 0.5:
            entries[at]["size"] = (root.parent / "victim" / "secret.parquet").stat().st_size
        what = f"entry {at} path := {entries[at]['path'][-60:]}"
    elif kind in ("value", "key") and entries:
        at = rng.randrange(len(entries))
        key = rng.choice(sorted(entries[at]))
        if kind == "key":
            del entries[at][key]
            what = f"entry {at}: deleted {key}"
        else:
            raw = rng.choice(VALUES)
            entries[at][key] = PLACEHOLDER
            what = f"entry {at} {key} := {raw[:40]}"
            lines = [
                json.dumps(e, separators=(",", ":")).replace(json.dumps(PLACEHOLDER), raw) for e in entries
            ]
            path.write_text(header + "".join("\n" + line for line in lines))
            return what
    elif kind == "repeat" and entries:
        times = rng.choice([1000, 100_000, 400_000])
        distinct = rng.random() < 0.5
        more = [
            dict(entries[-1], path=f"{base}/f{i:07d}.parquet") if distinct else entries[-1]
            for i in range(times)
        ]
        entries.extend(more)
        what = f"last entry repeated {times} times" + (" (distinct paths)" if distinct else "")
    elif kind == "rename":
        batch = rng.choice([10**6, 10**6 - 1, 9 * 10**18, (1 << 63) - 1, 10**20])
        target = path.with_name(f"{batch}.compact" if (batch + 1) % 10 == 0 else str(batch))
        path.rename(target)
        return f"renamed to {target.name}"
    else:
        header += "\n{not json"
        what = "a line that is not JSON"
    path.write_text(header + "".join("\n" + json.dumps(e, separators=(",", ":")) for e in entries))
    return what


# The Iceberg view's Avro files (manifest lists, manifests) ----------------------------------------


def is_avro(path: Path) -> bool:
    return path.suffix == ".avro"


def avro_long(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _avro_read_long(data: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), at


def avro_container(data: bytes) -> tuple[dict[str, bytes], bytes, list[tuple[int, bytes]]]:
    """An Avro object container's header entries, sync marker and blocks (records, bytes as
    stored); ValueError when it is none."""
    if data[:4] != b"Obj\x01":
        raise ValueError("no Avro magic")
    at, meta = 4, {}
    while True:
        count, at = _avro_read_long(data, at)
        if count == 0:
            break
        if count < 0:
            count = -count
            _, at = _avro_read_long(data, at)
        for _ in range(count):
            n, at = _avro_read_long(data, at)
            key = data[at : at + n].decode()
            at += n
            n, at = _avro_read_long(data, at)
            meta[key], at = data[at : at + n], at + n
    sync, at = data[at : at + 16], at + 16
    blocks = []
    while at < len(data):
        count, at = _avro_read_long(data, at)
        size, at = _avro_read_long(data, at)
        blocks.append((count, data[at : at + size]))
        at += size + 16
    return meta, sync, blocks


def avro_file(meta: dict[str, bytes], sync: bytes, blocks: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(b"Obj\x01" + avro_long(len(meta)))
    for key, value in meta.items():
        out += avro_long(len(key.encode())) + key.encode() + avro_long(len(value)) + value
    out += avro_long(0) + sync
    for count, block in blocks:
        out += avro_long(count) + avro_long(len(block)) + block + sync
    return bytes(out)


def deflated_zeros_after(head: bytes, zeros: int) -> bytes:
    """``head`` then ``zeros`` zero bytes, raw-deflated (a few MB per GB)."""
    import zlib

    packer = zlib.compressobj(1, zlib.DEFLATED, -15)
    out = [packer.compress(head)]
    chunk = bytes(16 << 20)
    for _ in range(zeros // len(chunk)):
        out.append(packer.compress(chunk))
    out.append(packer.flush())
    return b"".join(out)


def iceberg_avro(rng: random.Random, path: Path) -> str:
    """A manifest list or manifest of the Iceberg view, rewritten as a container pyiceberg
    still opens: a block that inflates to GBs (its records, then zeros), a block claiming
    more records than it holds, a codec lakesink does not write, a schema nested deep or
    of 100,000 fields, or 100,000 header entries."""
    import zlib

    data = path.read_bytes()
    try:
        meta, sync, blocks = avro_container(data)
    except (ValueError, IndexError, UnicodeDecodeError):
        return flip(rng, path)
    kind = rng.choice(["bomb", "bomb", "records", "codec", "schema", "header"])
    codec = meta.get("avro.codec", b"null")
    raw = [(n, zlib.decompress(b, -15) if codec == b"deflate" else b) for n, b in blocks]
    if kind == "bomb" and raw:
        zeros = rng.choice([64 << 20, 1 << 30, 3 << 30])
        at = rng.randrange(len(raw))
        meta["avro.codec"] = b"deflate"
        packed = [(n, deflated_zeros_after(b, zeros if i == at else 0)) for i, (n, b) in enumerate(raw)]
        path.write_bytes(avro_file(meta, sync, packed))
        return f"block {at} of {len(raw)} inflates to its records and {zeros >> 20} MiB of zeros"
    if kind == "records" and blocks:
        at = rng.randrange(len(blocks))
        count = rng.choice([2, 1000, 1 << 31, 1 << 62, -5])
        blocks[at] = (count, blocks[at][1])
        path.write_bytes(avro_file(meta, sync, blocks))
        return f"block {at} claims {count} records"
    if kind == "codec":
        meta["avro.codec"] = rng.choice([b"bzip2", b"zstandard", b"snappy", b"xz", b""])
        path.write_bytes(avro_file(meta, sync, blocks))
        return f"codec := {meta['avro.codec']!r}"
    if kind == "schema":
        if rng.random() < 0.5:
            deep = '{"type":"array","items":' * 5000 + '"long"' + "}" * 5000
            meta["avro.schema"] = deep.encode()
            what = "a schema of arrays nested 5,000 deep"
        else:
            fields = ",".join(f'{{"name":"f{i}","type":"null"}}' for i in range(100_000))
            meta["avro.schema"] = f'{{"type":"record","name":"r","fields":[{fields}]}}'.encode()
            what = "a schema of a record of 100,000 null fields"
        path.write_bytes(avro_file(meta, sync, blocks))
        return what
    for i in range(100_000):
        meta[f"k{i}"] = b"v"
    path.write_bytes(avro_file(meta, sync, blocks))
    return "100,000 more header entries"


def is_iceberg_metadata(path: Path) -> bool:
    return path.parent.name == "metadata" and path.name.endswith(".metadata.json")


def iceberg_metadata(rng: random.Random, path: Path) -> str:
    """A metadata file of the Iceberg view with the last entry of one of its lists (snapshots,
    the snapshot log, the metadata log, schemas) repeated: a valid file pydantic builds a model
    of each entry of; or one of its maps (refs, properties) given up to 200,000 more entries of
    numbers, which pydantic refuses one error each (the fuzz ledger's case 59370, session 23)."""
    doc = json.loads(path.read_text())
    key = rng.choice(
        ["snapshots", "snapshot-log", "snapshot-log", "metadata-log", "schemas", "refs", "properties"]
    )
    entries = doc.get(key)
    if isinstance(entries, dict):
        added = rng.choice([1000, 100_000, 200_000])
        entries.update({f"k{i}": i for i in range(added)})
        path.write_text(json.dumps(doc, separators=(",", ":")))
        return f"{key}: {added} entries of numbers added"
    if not isinstance(entries, list) or not entries:
        return json_value(rng, path)
    times = rng.choice([1000, 100_000, 1_000_000])
    doc[key] = entries + [entries[-1]] * times
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return f"{key}: its last entry repeated {times} times"


Mutation = Callable[..., str]
#: name -> (mutation, takes the root, applies to JSON only, applies to Parquet only)
MUTATIONS: dict[str, tuple[Mutation, bool, str]] = {
    "json_value": (json_value, False, "json"),
    "json_key": (json_key, False, "json"),
    "number_text": (number_text, False, "json"),
    "lengthen": (lengthen, False, "json"),
    "truncate": (truncate, False, "any"),
    "flip": (flip, False, "any"),
    "sparse": (sparse, False, "any"),
    "parquet_footer": (parquet_footer, False, "parquet"),
    "link_out": (link_out, True, "any"),
    "rename": (rename, True, "any"),
    "delete": (delete, False, "any"),
    "parquet_rewrite": (parquet_rewrite, True, "parquet"),
    "spark_metadata": (spark_metadata, True, "spark"),
    "iceberg_avro": (iceberg_avro, False, "avro"),
    "iceberg_metadata": (iceberg_metadata, False, "iceberg"),
}
#: How often each is drawn: the structure-aware ones most.
WEIGHTS = {"json_value": 6, "json_key": 2, "number_text": 4, "lengthen": 2, "truncate": 1, "flip": 1,
           "sparse": 1, "parquet_footer": 3, "link_out": 2, "rename": 2, "delete": 1, "parquet_rewrite": 4,
           "spark_metadata": 2, "iceberg_avro": 2, "iceberg_metadata": 2}  # fmt: skip


def is_parquet(path: Path) -> bool:
    return path.suffix in (".parquet", ".files", ".crc") or (
        ".checkpoint." in path.name and path.suffix != ".json"
    )


#: What each kind of mutation applies to (``MUTATIONS``' third field), by a file's name.
APPLIES: dict[str, Callable[[Path], bool]] = {
    "any": lambda p: True,
    "json": is_json,
    "parquet": is_parquet,
    "spark": is_spark_batch,
    "avro": is_avro,
    "iceberg": is_iceberg_metadata,
}


def applies_to(kind: str, files: list[Path]) -> bool:
    """Whether ``files`` (a lake's) hold one the mutation ``kind`` applies to (by name: a JSON
    file that does not parse is found out later, and the mutation falls back to ``flip``)."""
    return any(APPLIES[MUTATIONS[kind][2]](p) for p in files)


#: The folders of a lake's metadata: the log's, and the Delta, Spark and Iceberg views'.
METADATA_FOLDERS = frozenset({"_lakesink", "_delta_log", "_spark_metadata", "metadata"})


def mutate(rng: random.Random, root: Path, kind: str | None = None) -> tuple[str, str, str]:
    """Change one file of the lake at ``root``; returns (mutation, file, what was done).

    Without ``kind``, one is drawn; one the lake has no file for (``spark_metadata`` on a lake
    without views) is drawn again among those it has (before, it fell back to ``flip``): every
    other case is what it always was."""
    files = files_of(root)
    if kind is None:
        names = list(WEIGHTS)
        kind = rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
        if not applies_to(kind, files):
            names = [n for n in WEIGHTS if applies_to(n, files)]
            kind = rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
    fn, takes_root, applies = MUTATIONS[kind]
    candidates = [p for p in files if APPLIES[applies](p)]
    if applies == "json":
        candidates = [p for p in candidates if _loads(p)]
    if not candidates:  # a lake without such a file (no view, no Parquet metadata): any file
        kind, fn, takes_root = "flip", flip, False
        candidates = files
    # metadata more often than data: that is where the lake's writer speaks to the reader
    meta = [p for p in candidates if METADATA_FOLDERS.intersection(p.parts)]
    pool = meta if meta and rng.random() < 0.8 else candidates
    path = rng.choice(pool)
    rel = path.relative_to(root).as_posix()
    what = fn(rng, path, root) if takes_root else fn(rng, path)
    return kind, rel, what


def _loads(path: Path) -> bool:
    try:
        json_lines(path)
        return True
    except (ValueError, UnicodeDecodeError):
        return False
