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


def lengthen(rng: random.Random, path: Path) -> str:
    """A list in the document repeated many times (a header of many actions, a long previous)."""
    docs, how = json_lines(path)
    line = rng.randrange(len(docs))
    times = rng.choice([1000, 100_000, 400_000])
    if how == "lines" and rng.random() < 0.3:  # many lines (a commit of many actions)
        docs.extend(docs[-1:] * times)
        write_json(path, docs, how)
        return f"last line repeated {times} times"
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
        if rng.random() < 0.5:
            shutil.copy(path, target)
            return f"copied to {target.name}"
        path.rename(target)
        return f"renamed to {target.name}"
    target = path.with_name(rng.choice([".." + name, name + ".uncommitted", "_" + name, name.upper()]))
    path.rename(target)
    return f"renamed to {target.name}"


def delete(rng: random.Random, path: Path) -> str:
    path.unlink()
    return "deleted"


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
}
#: How often each is drawn: the structure-aware ones most.
WEIGHTS = {"json_value": 6, "json_key": 2, "number_text": 4, "lengthen": 2, "truncate": 1, "flip": 1,
           "sparse": 1, "parquet_footer": 3, "link_out": 2, "rename": 2, "delete": 1}  # fmt: skip


def is_parquet(path: Path) -> bool:
    return path.suffix in (".parquet", ".files", ".crc") or (
        ".checkpoint." in path.name and path.suffix != ".json"
    )


def mutate(rng: random.Random, root: Path, kind: str | None = None) -> tuple[str, str, str]:
    """Change one file of the lake at ``root``; returns (mutation, file, what was done)."""
    names = list(WEIGHTS)
    kind = kind or rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
    fn, takes_root, applies = MUTATIONS[kind]
    candidates = files_of(root)
    if applies == "json":
        candidates = [p for p in candidates if is_json(p) and _loads(p)]
    elif applies == "parquet":
        candidates = [p for p in candidates if is_parquet(p)]
    # metadata more often than data: that is where the lake's writer speaks to the reader
    meta = [
        p
        for p in candidates
        if "_lakesink" in p.parts or "_delta_log" in p.parts or "_spark_metadata" in p.parts
    ]
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
