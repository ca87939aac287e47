"""A lake cannot reach outside itself (docs/FORMAT.md, "Trust"; issue #37), tried as an attacker
with write access to one lake's folder would: small lakes built with lakesink's own writers
(Spark-free), then files edited by hand. Nothing outside the lake may be read, copied, listed in
a view or reported; crafted files fail as ``CorruptFileError`` (or are skipped where FORMAT.md
says so); no message carries an endpoint's user info or an option's value."""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from lakes import epoch_lake, v3_file, v3_name
from live import CHECKOUT_PATH
from test_compact import WRITER, build

from lakesink.cli import main
from lakesink.commit.versions import VersionedLogWriter
from lakesink.config import SinkConfig
from lakesink.spark.failures import lakesink_error
from lakesink.views.derived import files_lagging_views_list
from lakesink_reader import (
    CorruptFileError,
    DecodeBudgetError,
    Lake,
    LakeSinkError,
    datafiles,
    read_committed,
)
from lakesink_reader.format.v3.checkpoint import LAST_CHECKPOINT, LIST_SCHEMA
from lakesink_reader.format.v3.commits import PendingCommit
from lakesink_reader.names import TABLE_FILE
from lakesink_reader.redact import redacted
from lakesink_reader.storage import open_storage
from lakesink_reader.storage.hdfs import HdfsStorage
from lakesink_reader.storage.local import LocalStorage
from lakesink_reader.storage.options import S3_OPTIONS
from lakesink_reader.storage.s3 import S3Storage

OUTSIDE = "../victim/secret.parquet"
SECRET_IDS = range(9000, 9050)
#: Versions 0..5 (two files of 50 ids each: ids 0..599), a checkpoint at version 4.
LAKE_IDS = list(range(600))
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One lake built once; each test works on its own copy."""
    base = tmp_path_factory.mktemp("template")
    build(str(base / "lake"), batches=6, interval=4)
    return base / "lake"


@pytest.fixture
def lake(template: Path, tmp_path: Path) -> str:
    """A copy of the template lake at ``tmp_path/lake``, beside another tenant's file
    ``tmp_path/victim/secret.parquet`` (the lake's schema, ids 9000..9049)."""
    shutil.copytree(template, tmp_path / "lake", symlinks=True)
    v3_file(open_storage(str(tmp_path / "victim")), "secret.parquet", SECRET_IDS.start, len(SECRET_IDS))
    return str(tmp_path / "lake")


def victim(lake: str) -> Path:
    return Path(lake).parent / "victim" / "secret.parquet"


def log_dir(lake: str) -> Path:
    return Path(lake) / "_lakesink" / "log"


def rewrite_list(lake: str, edit: Callable[[pa.Table], pa.Table], **write: Any) -> Path:
    """Rewrite the checkpoint's file list through ``edit`` and make its small part agree (rows,
    bytes), as an attacker who can write the folder would."""
    summary = next(log_dir(lake).glob("*.checkpoint.json"))
    doc = json.loads(summary.read_text())
    listed = log_dir(lake) / doc["files"]["name"]
    table = edit(pq.read_table(listed))
    pq.write_table(table, listed, **{"compression": "zstd", **write})
    doc["files"]["bytes"] = listed.stat().st_size
    doc["files"]["rows"] = doc["counts"]["files"] = table.num_rows
    summary.write_text(json.dumps(doc))
    return listed


def with_path(path: str, lake: str) -> Callable[[pa.Table], pa.Table]:
    """An edit that points the list's first row at ``path`` (with the outside file's sizes)."""

    def edit(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        rows[0].update(path=path, bytes=victim(lake).stat().st_size, rows=len(SECRET_IDS))
        return pa.Table.from_pylist(rows, schema=LIST_SCHEMA)

    return edit


def ids(lake: str) -> list[int]:
    return sorted(read_committed(lake).column("id").to_pylist())


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def lake_ids_on_disk(lake: str) -> set[int]:
    """Every id in every regular Parquet file inside the lake (links are not followed)."""
    found: set[int] = set()
    for folder, _, names in os.walk(lake):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".parquet") and not os.path.islink(path):
                found.update(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    return found


def view_text(lake: str) -> str:
    """Everything the derived views hold (JSON and Parquet as bytes)."""
    return "".join(
        p.read_bytes().decode("latin-1")
        for folder in ("_delta_log", "_spark_metadata")
        for p in (Path(lake) / folder).rglob("*")
        if p.is_file()
    )


# 1. One name rule for every name read from the lake --------------------------------------------


@pytest.mark.parametrize(
    "entry", [OUTSIDE, "/etc/passwd", "s3://other-bucket/x.parquet", "file:/etc/x", "a/./b.parquet",
              "a//b.parquet", "a\\b.parquet", "a\x00.parquet", "_lakesink/table.json"],
)  # fmt: skip
def test_a_checkpoint_list_naming_a_file_outside_is_refused(lake: str, entry: str) -> None:
    listed = rewrite_list(lake, with_path(entry, lake))
    for read in (lambda: Lake(lake).files(), lambda: read_committed(lake)):
        with pytest.raises(CorruptFileError) as caught:
            read()
        assert listed.name in str(caught.value) and repr(entry) in str(caught.value)


def test_maintenance_commands_never_reach_the_file_a_list_names(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = victim(lake).read_bytes()
    rewrite_list(lake, with_path(OUTSIDE, lake))
    for args in (
        ["verify", lake],
        ["compact", lake, "--min-files", "2"],
        ["sync-views", lake],
        ["vacuum", lake, "--retain", "0", "--force", "--delete"],
    ):
        code, out = cli(args, capsys)
        assert code != 0 and "refusing the entry" in out and OUTSIDE in out, (args, out)
        assert "Traceback" not in out and "found" not in out  # verify reports no outside size
    assert victim(lake).read_bytes() == secret  # neither read into the lake, nor removed
    assert not set(SECRET_IDS) & lake_ids_on_disk(lake)
    assert "victim" not in view_text(lake)


def test_a_commit_naming_a_file_outside_is_refused(lake: str) -> None:
    commit = log_dir(lake) / f"{5:020d}.json"
    lines = commit.read_text().splitlines()
    add = json.loads(lines[1])
    add["add"]["path"] = OUTSIDE
    commit.write_text("\n".join([lines[0], json.dumps(add), *lines[2:]]) + "\n")
    with pytest.raises(CorruptFileError, match=re.escape(repr(OUTSIDE))) as caught:
        read_committed(lake)
    assert commit.name in str(caught.value)


def test_a_format_2_record_naming_a_file_outside_is_refused(tmp_path: Path) -> None:
    lake = str(tmp_path / "lake")
    epoch_lake(lake)
    v3_file(open_storage(str(tmp_path / "victim")), "secret.parquet", SECRET_IDS.start, len(SECRET_IDS))
    record = Path(lake) / "_lakesink" / "epochs" / f"{1:020d}.json"
    doc = json.loads(record.read_text())
    doc["files"][0]["path"] = OUTSIDE
    record.write_text(json.dumps(doc))
    for read in (lambda: Lake(lake).files(), lambda: read_committed(lake)):
        with pytest.raises(CorruptFileError, match=re.escape(repr(OUTSIDE))) as caught:
            read()
        assert record.name in str(caught.value)


def test_every_backend_refuses_a_name_that_leaves_its_root(tmp_path: Path) -> None:
    local = open_storage(str(tmp_path / "lake"))
    s3 = S3Storage("s3://bucket/lake")
    hdfs = HdfsStorage("hdfs://127.0.0.1:1/lake")
    for bad in ("../x", "a/../../x", "/etc/passwd", "a//b"):
        for refuse in (local.read_bytes, local.exists, s3.key_of, hdfs.path_of):
            with pytest.raises(CorruptFileError, match="refusing the name"):
                refuse(bad)  # type: ignore[operator]
    assert s3.key_of("_lakesink/log/x.json") == "lake/_lakesink/log/x.json"


# 2. Symbolic links are refused on local disk ------------------------------------------------------


def test_a_data_file_linked_outside_is_refused_by_reader_verify_and_compact(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    linked = sorted(f.name for f in Lake(lake).files())[-1]
    os.unlink(os.path.join(lake, linked))
    os.symlink(victim(lake), os.path.join(lake, linked))
    with pytest.raises(CorruptFileError, match="symbolic link") as caught:
        read_committed(lake)
    assert linked in str(caught.value)
    code, out = cli(["verify", lake, "--json"], capsys)
    problems = json.loads(out[out.index("{") :])["problems"]
    assert code != 0 and [p["name"] for p in problems] == [linked]
    assert "symbolic link" in problems[0]["problem"]
    assert str(len(SECRET_IDS)) + " rows" not in out and "found" not in out
    code, out = cli(["compact", lake, "--min-files", "2", "--target-file-size", "1GB"], capsys)
    assert code != 0 and "symbolic link" in out and linked in out
    assert not set(SECRET_IDS) & lake_ids_on_disk(lake)  # nothing copied in


def test_a_log_folder_linked_to_another_lake_is_refused(
    lake: str, tmp_path: Path, template: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    shutil.copytree(template, other)
    before = sorted(os.listdir(other / "_lakesink" / "log"))
    crafted = tmp_path / "crafted" / "_lakesink"
    crafted.mkdir(parents=True)
    shutil.copy(other / TABLE_FILE, crafted / "table.json")
    (crafted / "log").symlink_to(other / "_lakesink" / "log")
    with pytest.raises(CorruptFileError, match="symbolic link"):
        Lake(str(crafted.parent)).files()
    code, out = cli(["vacuum", str(crafted.parent), "--retain", "0", "--force", "--delete"], capsys)
    assert code != 0 and "symbolic link" in out
    assert sorted(os.listdir(other / "_lakesink" / "log")) == before


#: Exchanges two names atomically (renameat2 RENAME_EXCHANGE) for argv[3] seconds, then prints
#: how many times: a folder and a link to another folder, each under the other's name by turns.
SWAPPER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, end = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), time.monotonic() + float(sys.argv[3])
swaps = 0
print("ready", flush=True)
while time.monotonic() < end:
    for _ in range(100):
        if libc.renameat2(-100, a, -100, b, 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
        swaps += 1
print(swaps, flush=True)
"""


def test_a_folder_swapped_for_a_link_is_never_followed(tmp_path: Path) -> None:
    """Issue 51, item 2: ``sub`` is swapped with a link to a folder outside the lake in a loop,
    while the local backend reads, lists, checks, deletes and writes in it. Each call sees the
    folder or refuses the link; none reads, lists, deletes or writes a file outside. The race is
    live: the calls see both the folder and the link, and the swapper counts its swaps."""
    lake, outside = tmp_path / "lake", tmp_path / "victim"
    (lake / "sub").mkdir(parents=True)
    outside.mkdir()
    (lake / "link").symlink_to(outside)
    names = [f"f{i:03d}.json" for i in range(200)]
    for name in [*names, "outside-only.json"]:
        (outside / name).write_bytes(b"secret")
    before = sorted(os.listdir(outside))
    storage = LocalStorage(str(lake))
    real = os.open(lake / "sub", os.O_RDONLY | os.O_DIRECTORY)  # the lake's folder, wherever it is
    seen: Counter[str] = Counter()
    wrong: list[str] = []

    def call(what: str, op: Callable[..., Any], *args: Any) -> Any:
        try:
            return op(*args)
        except CorruptFileError as exc:
            assert "symbolic link" in str(exc), exc
            seen["link"] += 1
        except OSError as exc:  # the folder left under the call: it followed the link
            wrong.append(f"{what}: {exc!r}")
        return None

    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(lake / "sub"), str(lake / "link"), "2"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "ready\n"
        i = 0
        while swapper.poll() is None:
            name = names[i % len(names)]
            i += 1
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=real)
            os.write(fd, b"lake")
            os.close(fd)
            read = call("read", storage.read_bytes, f"sub/{name}")
            if read not in (None, b"lake"):
                wrong.append(f"read {read!r}")
            seen["folder"] += read == b"lake"
            listed = call("list", storage.list, "sub") or []
            if "sub/outside-only.json" in {f.name for f in listed}:
                wrong.append("listed outside")
            if call("exists", storage.exists, "sub/outside-only.json"):
                wrong.append("exists outside")
            call("delete", storage.delete, f"sub/{name}")
            call("write", storage.put_if_absent, f"sub/new-{i}.json", b"lake")
            if sorted(os.listdir(outside)) != before:
                wrong.append(f"outside changed: {set(os.listdir(outside)) ^ set(before)}")
                break
    finally:
        os.close(real)
        swapper.kill()
        out, _ = swapper.communicate()
    assert not wrong, (wrong[:5], seen)
    assert all((outside / name).read_bytes() == b"secret" for name in before)
    swaps = int(out.split()[-1]) if out.strip() else 0
    assert swaps > 1000 and seen["link"] > 10 and seen["folder"] > 10, (swaps, seen)


# 3. Crafted files fail cleanly ---------------------------------------------------------------------


def test_deep_json_in_a_commit_header_is_a_corrupt_file(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    commit = log_dir(lake) / f"{5:020d}.json"
    header, rest = commit.read_text().split("\n", 1)
    commit.write_text(header.replace('"source_offsets":null', f'"source_offsets":{DEEP}') + "\n" + rest)
    with pytest.raises(CorruptFileError, match="nested deeper") as caught:
        read_committed(lake)
    assert commit.name in str(caught.value)
    for args in (["status", lake], ["verify", lake]):
        code, out = cli(args, capsys)
        assert code != 0 and commit.name in out and "Traceback" not in out, (args, out)


@pytest.mark.parametrize("damaged", ["summary", "hint"])
def test_a_damaged_checkpoint_or_hint_is_skipped(
    lake: str, damaged: str, caplog: pytest.LogCaptureFixture
) -> None:
    summary = next(log_dir(lake).glob("*.checkpoint.json"))
    target = summary if damaged == "summary" else Path(lake) / LAST_CHECKPOINT
    target.write_text(DEEP)
    with caplog.at_level(logging.WARNING):
        assert ids(lake) == LAKE_IDS
        assert len(Lake(lake).files()) == 12
    assert any("damaged" in r.getMessage() for r in caplog.records)


def test_deep_json_in_table_json_is_a_corrupt_file(lake: str, capsys: pytest.CaptureFixture[str]) -> None:
    (Path(lake) / TABLE_FILE).write_text(DEEP)
    with pytest.raises(CorruptFileError, match=r"table\.json"):
        read_committed(lake)
    code, out = cli(["verify", lake], capsys)
    assert code != 0 and "table.json" in out and "Traceback" not in out


def test_a_small_list_claiming_many_rows_is_refused_quickly_in_little_memory(lake: str) -> None:
    """18 KB of Parquet claiming 300,000 rows of one dictionary-encoded path: refused before a row
    is decoded, and the lake read from its commits instead (the checkpoint is derived data)."""
    rows = 300_000

    def bomb(table: pa.Table) -> pa.Table:
        one = table.slice(0, 1).to_pylist()[0]
        return pa.table(
            {f.name: pa.repeat(pa.scalar(one[f.name], f.type), rows) for f in LIST_SCHEMA},
            schema=LIST_SCHEMA,
        )

    listed = rewrite_list(lake, bomb, use_dictionary=True)
    assert listed.stat().st_size < 20_000 and pq.ParquetFile(listed).metadata.num_rows == rows
    script = """
import re, sys, time
import pyarrow.compute, pyarrow.parquet
pyarrow.array([1])  # pyarrow's first array imports pandas where installed: not what the list costs
from lakesink_reader import Lake

def status(key):
    return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10

lake = Lake(sys.argv[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM) to the current RSS
before, start = status("VmRSS"), time.monotonic()
files = lake.files()
print(len(files), time.monotonic() - start, status("VmHWM") - before)
"""
    env = {**os.environ, "PYTHONPATH": CHECKOUT_PATH}
    out = subprocess.run(
        [sys.executable, "-c", script, lake], capture_output=True, text=True, env=env, check=True
    )
    found, seconds, grown = out.stdout.split()
    assert int(found) == 12  # the live files, from the commits
    assert float(seconds) < 1.0 and int(grown) < 50 << 20, out.stdout
    assert "claims 300000 rows" in out.stderr  # logged: not reading from that checkpoint


def test_a_list_repeating_one_long_path_is_refused(lake: str) -> None:
    """Few rows, each the same long path from one dictionary entry: refused before decoding."""

    def repeat(table: pa.Table) -> pa.Table:
        first = table.slice(0, 1).to_pylist()[0]
        return pa.Table.from_pylist([{**first, "path": "x" * 60_000}] * 400, schema=LIST_SCHEMA)

    listed = rewrite_list(lake, repeat, use_dictionary=True)
    with pytest.raises(CorruptFileError, match="listed twice") as caught:
        Lake(lake).files()
    assert listed.name in str(caught.value)


def test_a_list_that_unpacks_far_beyond_its_size_is_refused(lake: str) -> None:
    """Plain pages that zstd shrinks a thousandfold: refused from the footer, not decompressed."""

    def inflate(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        for row in rows:
            row["stats"] = "0" * 200_000
        return pa.Table.from_pylist(rows, schema=LIST_SCHEMA)

    listed = rewrite_list(lake, inflate, use_dictionary=False)
    with pytest.raises(CorruptFileError, match="unpacks to") as caught:
        Lake(lake).files()
    assert listed.name in str(caught.value)


#: A child's peak memory while it runs a step over a lake (VmHWM reset first): prints
#: "<seconds> <bytes grown> <answer>". argv: the lake, then a CLI command and its arguments (none:
#: ``Lake.files()``; ``read_committed``: that, reading around missing files; ``read_committed_raise``:
#: that, as a user calls it).
MEASURED = """
import contextlib, io, re, sys, time
import pyarrow
pyarrow.array([1])  # pyarrow's first array imports pandas where installed: not the step's cost
from lakesink.cli import main
from lakesink_reader import Lake, read_committed

def status(key):
    return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM) to the current RSS
before, start = status("VmRSS"), time.monotonic()
if len(sys.argv) > 2 and sys.argv[2] in ("read_committed", "read_committed_raise"):
    try:
        on_error = "skip" if sys.argv[2] == "read_committed" else "raise"
        answer = str(read_committed(sys.argv[1], on_error=on_error).num_rows)
    except Exception as exc:
        answer = f"{type(exc).__name__}: {exc}"
elif len(sys.argv) > 2:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main([sys.argv[2], sys.argv[1], *sys.argv[3:]])
    answer = f"exit {code}: " + " ".join(out.getvalue().split())
else:
    try:
        answer = str(len(Lake(sys.argv[1]).files()))
    except Exception as exc:
        answer = f"{type(exc).__name__}: {exc}"
print(time.monotonic() - start, status("VmHWM") - before, answer)
"""


def measured(lake: str, *command: str) -> tuple[float, int, str]:
    """(seconds, bytes grown, answer) of ``Lake(lake).files()``, or of the CLI ``command``, in a
    child process."""
    env = {**os.environ, "PYTHONPATH": CHECKOUT_PATH}
    out = subprocess.run(
        [sys.executable, "-c", MEASURED, lake, *command], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    seconds, grown, answer = out.stdout.strip().split(" ", 2)
    return float(seconds), int(grown), answer


def test_a_list_whose_stats_dictionary_every_row_uses_is_refused_before_decoding(lake: str) -> None:
    """Issue 51: 3,000 rows of one dictionary-encoded 300 KB `stats` value -- a 9 KB list whose
    row count, size and footer sizes all pass -- decoded to 900 MB (1.7 GB and 4 s for
    ``Lake.files()``). Dictionaries are counted per use before they are decoded."""
    rows, value = 3_000, pa.scalar("0" * 300_000)
    chunk = pa.repeat(value, 100)  # every chunk the same array: this test holds 30 MB, not 900

    def bomb(table: pa.Table) -> pa.Table:
        one = table.slice(0, 1).to_pylist()[0]
        columns = {f.name: pa.repeat(pa.scalar(one[f.name], f.type), rows) for f in LIST_SCHEMA}
        columns["path"] = pa.array([f"f{i:05d}.parquet" for i in range(rows)])
        columns["stats"] = pa.chunked_array([chunk] * (rows // len(chunk)))
        return pa.Table.from_arrays([columns[f.name] for f in LIST_SCHEMA], schema=LIST_SCHEMA)

    listed = rewrite_list(lake, bomb, dictionary_pagesize_limit=1 << 26, row_group_size=rows)
    footer = pq.ParquetFile(listed).metadata
    assert listed.stat().st_size < 20_000 and footer.num_rows == rows
    assert "RLE_DICTIONARY" in footer.row_group(0).column(7).encodings
    seconds, grown, answer = measured(lake)
    assert answer.startswith("CorruptFileError") and "decode to 900" in answer and listed.name in answer
    assert seconds < 1.0 and grown < 50 << 20, (seconds, grown)


VIEW_CHECKPOINT = "_delta_log/00000000000000000004.checkpoint.parquet"
#: A modification time no commit of the lake has (ms): the mark of the other tenant's checkpoint.
THEIR_TIME = 1_234_567_890_123


def append(lake: str, batches: range) -> None:
    """More batches of the template's writer (two files of 50 ids each), Spark-free."""
    storage = open_storage(lake)
    vlog = VersionedLogWriter(storage, Lake(lake).metadata.table_id or "", checkpoint_interval=4)
    for batch in batches:
        name = functools.partial(v3_name, WRITER, batch)
        adds = [
            v3_file(storage, name(p), 1000 * batch + 50 * p, 50, batch=batch, partition=p) for p in range(2)
        ]
        vlog.commit(PendingCommit.append(writer_id=WRITER, batch=batch, run="run00001", adds=adds))


def test_a_view_checkpoint_linked_outside_is_never_read(
    lake: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 51: the view checkpoint the Delta view's hint names is read, for its files' times,
    when the next one is written -- through pyarrow's file system, which follows a link: another
    tenant's checkpoint was read and its values copied into the lake's ``_delta_log``. Read
    through the lake's storage, the link is refused and the times come from the commits."""
    caplog.set_level(logging.INFO)
    assert cli(["sync-views", lake], capsys)[0] == 0
    checkpoint = Path(lake) / VIEW_CHECKPOINT
    theirs = victim(lake).parent / "checkpoint.parquet"
    table = pq.read_table(checkpoint)
    adds = table.column("add").combine_chunks()
    times = pa.array([THEIR_TIME] * len(adds), pa.int64())
    marked = pa.StructArray.from_arrays(
        [times if f.name == "modificationTime" else adds.field(f.name) for f in adds.type],
        fields=list(adds.type), mask=adds.is_null(),
    )  # fmt: skip
    pq.write_table(table.set_column(table.schema.get_field_index("add"), "add", marked), theirs)
    before = theirs.read_bytes()
    checkpoint.unlink()
    checkpoint.symlink_to(theirs)
    append(lake, range(6, 9))  # versions 6..8: the view's next checkpoint is due at 8
    code, out = cli(["sync-views", lake], capsys)
    assert code == 0 and "Traceback" not in out, out
    written = pq.read_table(Path(lake) / "_delta_log" / f"{8:020d}.checkpoint.parquet")
    written_times = set(pc.struct_field(written.column("add"), "modificationTime").to_pylist())
    assert THEIR_TIME not in written_times and len(written_times - {None}) > 1, written_times
    assert any("symbolic link" in r.getMessage() for r in caplog.records)  # said why it was not used
    assert checkpoint.is_symlink() and theirs.read_bytes() == before  # left alone, not replaced


def null_rows(table: pa.Table) -> pa.Table:
    """2,000,000 rows of nulls after the honest ones: ~0.2 MB on disk (10M: 0.8 MB, 3.8 GB read)."""
    return pa.concat_tables([table, pa.table({f.name: pa.nulls(2_000_000, f.type) for f in table.schema})])


def one_path_for_every_row(table: pa.Table) -> pa.Table:
    """5,000 adds of one dictionary-encoded 400 KB path: decodes to 2 GB (the footer's sizes, the
    rows per byte pass: 13 KB)."""
    add = table.schema.field("add").type
    path = pa.repeat(pa.scalar("x" * 400_000), 100)  # every block the same array: 40 MB here
    block = pa.StructArray.from_arrays(
        [path if f.name == "path" else pa.nulls(len(path), f.type) for f in add], fields=list(add)
    )
    rows = pa.table(
        {
            f.name: pa.chunked_array([block] * 50) if f.name == "add" else pa.nulls(5_000, f.type)
            for f in table.schema
        }
    )
    return pa.concat_tables([table, rows])


@pytest.mark.parametrize("craft", [null_rows, one_path_for_every_row])
def test_a_crafted_view_checkpoint_is_refused_before_decoding(
    lake: str, craft: Callable[[pa.Table], pa.Table], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51: a Delta-view checkpoint of 10M null rows (0.8 MB) took 3.8 GB; one of a path
    used by every row decodes to rows x its length. Its rows are bounded by the lake's actions
    (live files, writers, protocol, metaData) where they are known, and by its size (2 bytes a
    row) where not; its text columns are counted per use before they are decoded."""
    assert cli(["sync-views", lake], capsys)[0] == 0
    checkpoint = Path(lake) / VIEW_CHECKPOINT
    pq.write_table(
        craft(pq.read_table(checkpoint)), checkpoint, compression="zstd", dictionary_pagesize_limit=1 << 26,
        row_group_size=1 << 22,
    )  # fmt: skip
    assert checkpoint.stat().st_size < 1 << 20
    seconds, grown, answer = measured(lake, "sync-views")  # checks the newest view checkpoint
    assert "not a checkpoint lakesink wrote" in answer and "Traceback" not in answer, answer
    assert seconds < 2 and grown < 100 << 20, (seconds, grown >> 20, answer)
    seconds, grown, answer = measured(lake, "verify")  # lists the view's files: refused, skipped
    assert "Traceback" not in answer and seconds < 5 and grown < 100 << 20, (seconds, grown >> 20, answer)


def test_maintenance_looks_for_its_own_files_only_in_what_a_lagging_view_lists(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a view behind the retained versions lists is its writer's choice (a checkpoint can
    name ~100M short names): ``vacuum`` and ``orphans`` look in it for the files they would
    delete only, and hold nothing else of it."""
    assert cli(["sync-views", lake], capsys)[0] == 0
    append(lake, range(6, 9))  # the view stays at version 5
    checkpoint = Path(lake) / VIEW_CHECKPOINT
    table = pq.read_table(checkpoint)
    one = table.filter(pc.is_valid(table.column("add"))).slice(0, 1).to_pylist()[0]["add"]
    rng = random.Random(51)  # names with random parts, as lakesink's own: 2+ bytes a row on disk
    names = ["junk-000007.parquet", *(f"junk-{rng.getrandbits(32):08x}.parquet" for _ in range(100_000))]
    junk = pa.Table.from_pylist([{"add": {**one, "path": name}} for name in names], schema=table.schema)
    pq.write_table(pa.concat_tables([table, junk]), checkpoint, compression="zstd")
    storage = open_storage(lake)
    assert len(files_lagging_views_list(storage, 9)) > 100_000  # everything the view lists
    ours = {one["path"], "junk-000007.parquet", "not-listed.parquet"}
    kept = files_lagging_views_list(storage, 9, ours)
    assert set(kept) == ours - {"not-listed.parquet"} and "sync-views" in kept[one["path"]]


@pytest.mark.parametrize("text", [DEEP, "{" * 100_000, "{[1]: 'x'}", "{'a': " * 500 + "1" + "}" * 500])
def test_malformed_storage_options_get_the_one_error(text: str) -> None:
    with pytest.raises(ValueError, match=r"must be a JSON object .* \(value not shown\)"):
        SinkConfig.from_options({"path": "/tmp/x", "storage_options": text})


# 3b. Data files are read within a budget (lakesink_reader.datafiles) ------------------------------

#: 50 rows (a data file's rows in the template) of one 8 MB value: 400 MB decoded, past a read's
#: budget (256 MiB and 64 times what the files hold), from a file of a few KB.
BOMB_VALUE = 8_000_000


def bombed_data_file(lake: str, dictionary: bool = False) -> str:
    """The lake's newest data file rewritten with the same ids, each row's label one 8 MB value
    stored plain and compressed (its footer says 400 MB), or once in a dictionary every row uses
    (its footer's sizes say 8 MB) -- its size in the log made to agree."""
    name = sorted(f.name for f in Lake(lake).files())[-1]
    path = Path(lake) / name
    table = pq.read_table(path)
    label = pa.DictionaryArray.from_arrays(
        pa.array([0] * table.num_rows, pa.int32()), pa.array(["x" * BOMB_VALUE])
    )
    table = table.set_column(table.schema.get_field_index("label"), "label", label.cast(pa.string()))
    pq.write_table(
        table, path, compression="zstd", use_dictionary=dictionary, dictionary_pagesize_limit=BOMB_VALUE * 2
    )
    size = path.stat().st_size
    assert size < 100_000
    footer = pq.ParquetFile(path).metadata.row_group(0)
    text = footer.column(table.schema.get_field_index("label"))
    assert text.has_dictionary_page == dictionary
    assert (text.total_uncompressed_size < BOMB_VALUE * 2) == dictionary  # what the footer's sizes say
    for commit in log_dir(lake).glob("*.json"):
        text = commit.read_text()
        if name in text:
            lines = [json.loads(line) for line in text.splitlines()]
            for line in lines:
                if line.get("add", {}).get("path") == name:
                    grown, line["add"]["bytes"] = size - line["add"]["bytes"], size
            lines[0]["commit"]["counts"]["add_bytes"] += grown
            commit.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return name


@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary"])
def test_a_data_file_that_decodes_to_hundreds_of_megabytes_is_refused_before_it_is_decoded(
    lake: str, dictionary: bool
) -> None:
    """Plain pages that zstd shrinks a thousandfold, or one dictionary value every row uses (the
    fuzzer ledger's cases 10083 and 13914: its footer's sizes count it once; its SizeStatistics
    say what it decodes to): refused from the footer, not decompressed, by the reader, ``verify
    --deep`` and ``compact``, by name, within a few MB; ``read_all`` reads around it."""
    name = bombed_data_file(lake, dictionary)
    _, grown, answer = measured(lake, "read_committed_raise")
    assert answer.startswith("DecodeBudgetError") and name in answer and "decode to" in answer, answer
    assert grown < 80 << 20, (grown, answer)
    if not dictionary:  # the same two ways in (a read of several files, one file) as below
        _, grown, answer = measured(lake, "read_committed")  # on_error="skip"
        assert answer == str(len(LAKE_IDS) - 50) and grown < 80 << 20, (grown, answer)
        _, grown, answer = measured(lake, "verify", "--deep")
        assert answer.startswith("exit 1") and name in answer and "decode to" in answer, answer
        assert grown < 80 << 20, (grown, answer)
    _, grown, answer = measured(lake, "compact", "--min-files", "2", "--target-file-size", "1GB")
    assert answer.startswith("exit 2") and "decode to" in answer, answer
    assert grown < 80 << 20, (grown, answer)


def test_a_dictionary_of_a_writer_without_size_statistics_is_bounded_by_its_longest_value(
    lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a footer's SizeStatistics cannot be had (here: no footer is walked for them), a
    dictionary chunk's claim is its values times its longest dictionary value, read from the
    chunk's first row: the bomb is refused as the footers tell, and honest files are read."""
    monkeypatch.setattr(datafiles, "MAX_SIZESTATS_FOOTER", -1)
    honest = read_committed(lake)
    name = bombed_data_file(lake, dictionary=True)
    with pytest.raises(DecodeBudgetError, match="as their footers tell") as caught:
        read_committed(lake)
    assert name in str(caught.value)
    assert read_committed(lake, on_error="skip").num_rows == honest.num_rows - 50


def test_a_data_file_footer_past_its_bound_is_refused_unread(lake: str) -> None:
    """A footer of more than 8 MiB (here, key-value metadata; a data file of 100,000 one-row
    groups is another) is refused from the file's last 8 bytes."""
    name = sorted(f.name for f in Lake(lake).files())[-1]
    path = Path(lake) / name
    table = pq.read_table(path)
    table = table.replace_schema_metadata({"junk": "x" * (9 << 20)})
    pq.write_table(table, path)
    with pytest.raises(CorruptFileError, match="footer holds") as caught:
        read_committed(lake)
    assert name in str(caught.value)
    assert len(read_committed(lake, on_error="skip")) == len(LAKE_IDS) - 50


# 4. Credentials out of every message ----------------------------------------------------------------

KEY, SECRET = "AKIAEXAMPLE", "SuperSecret123"
PLANTED = f"http://{KEY}:{SECRET}@127.0.0.1:1"


def assert_clean(*texts: str) -> None:
    for text in texts:
        assert KEY not in text and SECRET not in text, text


def test_endpoint_user_info_and_option_values_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    messages = []
    for options in (
        {"endpoint_url": PLANTED},
        {"endpoint_url": PLANTED.removeprefix("http://")},
        {"client_kwargs": {"endpoint_url": PLANTED}},
        {"key": KEY, "secret": 12345},  # a refusal names the option, not its value
        {"part_size": SECRET},
    ):
        with pytest.raises((ValueError, TypeError)) as caught:
            read_committed("s3://bucket/lake", storage_options=options)
        messages.append(str(caught.value))
    assert "'key'" in messages[0] and "'secret'" in messages[0]  # the way out
    assert "12345" not in messages[3]
    for command in ("verify", "status", "compact", "vacuum", "sync-views"):
        code, out = cli([command, "s3://bucket/lake", "--storage-option", f"endpoint_url={PLANTED}"], capsys)
        assert code != 0 and "endpoint_url" in out
        messages.append(out)
    monkeypatch.setenv("AWS_ENDPOINT_URL", PLANTED)
    with pytest.raises(ValueError, match="AWS_ENDPOINT_URL") as env_error:
        read_committed("s3://bucket/lake", storage_options={"key": "k", "secret": "s"})
    messages.append(str(env_error.value))
    assert_clean(*messages, *(r.getMessage() for r in caplog.records), caplog.text)


def test_spark_redacts_storage_options_holding_a_secret() -> None:
    """Spark redacts a data source option whose name *or value* matches spark.redaction.regex
    (``Utils.redact``; its default below). storage_options travels as one JSON text holding the
    option names, so every credential option lakesink takes makes its value match."""
    spark_default = re.compile(r"(?i)secret|password|token|access[.]?key")
    for name in ("secret", "token"):
        assert name in S3_OPTIONS
        assert spark_default.search(json.dumps({"endpoint_url": "http://h:1", name: "x"}))
    # botocore's own names, given through client_kwargs, match too
    for name in ("aws_secret_access_key", "aws_session_token"):
        assert spark_default.search(json.dumps({"client_kwargs": {name: "x"}}))


def test_hdfs_files_honour_the_cluster_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    url = "hdfs://127.0.0.1:1/lake"
    assert HdfsStorage(url).file_mode == 0o644
    assert HdfsStorage(url, {"config": {"fs.permissions.umask-mode": "077"}}).file_mode == 0o600
    assert HdfsStorage(url, {"config": {"fs.permissions.umask-mode": "u=rwx,g=rx,o="}}).file_mode == 0o640
    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>fs.permissions.umask-mode</name><value>027</value></property>"
        "</configuration>"
    )
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    assert HdfsStorage(url).file_mode == 0o640
    with pytest.raises(ValueError, match=re.escape("fs.permissions.umask-mode")):
        HdfsStorage(url, {"config": {"fs.permissions.umask-mode": "rwx"}})


# Issue 51: numbers, element counts, claimed versions, sizes by kind -------------------------------

HUGE_INT = "1" + "0" * 400


def one_line_error(code: int, out: str, name: str) -> None:
    """The CLI's refusal: exit 2, one line naming the file, no traceback."""
    lines = [line for line in out.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1 and name in lines[0] and "Traceback" not in out, out


def edit_file(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("number", ["1e999", "-1e999", HUGE_INT, "NaN", "Infinity"])
@pytest.mark.parametrize("where", ["table", "header", "action"])
def test_numbers_out_of_range_are_corrupt_files(
    lake: str, number: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``1e999`` overflows to infinity (``int(inf)`` is an OverflowError), ``10**400`` and NaN are
    no version, count or time: the decoder refuses them, naming the file."""
    if where == "table":
        target = Path(lake) / TABLE_FILE
        edit_file(target, '"created_at": ', f'"created_at": {number}, "x": ')
    else:
        target = log_dir(lake) / f"{5:020d}.json"
        old = '"committed_at":' if where == "header" else '"rows":'
        edit_file(target, old, f'{old}{number},"x":')
    with pytest.raises(CorruptFileError, match=re.escape(target.name)):
        read_committed(lake)
    # status and history read commit headers only: an action line is verify's (and the reader's)
    for command in ("status", "verify", "history") if where != "action" else ("verify",):
        one_line_error(*cli([command, lake], capsys), target.name)


@pytest.mark.parametrize("when", [str(1 << 63), "-1", "1e300", "true"])
def test_a_time_no_date_holds_is_a_corrupt_file(
    lake: str, when: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the fuzzer (case 257): ``committed_at`` 2**63 made ``history`` raise OverflowError
    from ``datetime.fromtimestamp``. Times are seconds from 0 to the end of year 9999."""
    commit = log_dir(lake) / f"{5:020d}.json"  # after the checkpoint: every read reads it
    text = commit.read_text()
    committed = re.search(r'"committed_at":[^,]+', text)
    assert committed is not None
    commit.write_text(text.replace(committed.group(0), f'"committed_at":{when}', 1))
    with pytest.raises(CorruptFileError, match="committed_at must be a time"):
        read_committed(lake)
    one_line_error(*cli(["history", lake], capsys), commit.name)


@pytest.mark.parametrize("number", [str(1 << 31), str((1 << 63) - 1)])
def test_a_partition_no_spark_task_has_is_a_corrupt_file(
    lake: str, number: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the fuzzer (session 19, ``--mutation number_text`` case 305): an add's
    ``partition`` of 2**63-1 passed the count's range and raised OverflowError where the file
    list is built (int32). A partition id is a Java int."""
    commit = log_dir(lake) / f"{5:020d}.json"
    edit_file(commit, '"partition":0', f'"partition":{number}')
    with pytest.raises(CorruptFileError, match="partition must be at most"):
        read_committed(lake)
    one_line_error(*cli(["verify", lake], capsys), commit.name)


@pytest.mark.parametrize("number", ["1e999", HUGE_INT, "NaN", str(1 << 63)])
def test_out_of_range_checkpoint_and_hint_are_skipped(
    lake: str, number: str, caplog: pytest.LogCaptureFixture
) -> None:
    summary = next(log_dir(lake).glob("*.checkpoint.json"))
    edit_file(summary, '"version":4', f'"version":{number}')
    (Path(lake) / LAST_CHECKPOINT).write_text(f'{{"version": {number}}}')
    with caplog.at_level(logging.WARNING):
        assert ids(lake) == LAKE_IDS
        assert [v.version for v in Lake(lake).versions()] == list(range(6))
    assert any("damaged" in r.getMessage() for r in caplog.records)


def test_a_header_of_a_million_empty_objects_is_refused_quickly(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's 60 MiB ``[{},{},...]`` (under the byte and depth limits) took 217 s and 4.5 GB
    to decode: the element count (commas and brackets, counted in C) refuses it first."""
    commit = log_dir(lake) / f"{5:020d}.json"
    header, rest = commit.read_text().split("\n", 1)
    bomb = "[" + "{}," * (20 << 20) + "{}]"
    commit.write_text(header.replace('"source_offsets":null', f'"source_offsets":{bomb}') + "\n" + rest)
    assert commit.stat().st_size > 60 << 20
    start = time.monotonic()
    with pytest.raises(CorruptFileError, match="values"):
        read_committed(lake)
    one_line_error(*cli(["history", lake], capsys), commit.name)
    assert time.monotonic() - start < 10


def test_a_checkpoint_claiming_a_huge_version_builds_no_range(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint, its list, its commit and the hint all claiming version 9 * 10**18 (within
    int64): versions and history read the commits that exist and stop at the first gap."""
    claimed = 9 * 10**18
    log = log_dir(lake)
    summary = next(log.glob("*.checkpoint.json"))
    doc = json.loads(summary.read_text())
    listed = log / doc["files"]["name"]
    doc["version"], doc["files"]["name"] = claimed, f"{claimed:020d}{listed.name[20:]}"
    listed.rename(log / doc["files"]["name"])
    summary.unlink()
    (log / f"{claimed:020d}.checkpoint.json").write_text(json.dumps(doc))
    header, rest = (log / f"{4:020d}.json").read_text().split("\n", 1)
    head = json.loads(header)
    head["commit"].update(version=claimed, read_version=claimed - 1)
    (log / f"{claimed:020d}.json").write_text(json.dumps(head, separators=(",", ":")) + "\n" + rest)
    (Path(lake) / LAST_CHECKPOINT).write_text(json.dumps({"version": claimed}))
    start = time.monotonic()
    with pytest.raises(CorruptFileError, match=f"{6:020d}.json is missing"):
        Lake(lake).versions()
    one_line_error(*cli(["history", lake], capsys), f"{6:020d}.json")
    assert time.monotonic() - start < 10


SPARSE = 6 << 30


def sparse(path: Path) -> None:
    """``path`` made a 6 GiB file of zeros that takes no disk (an attacker's cost: nothing)."""
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.truncate(SPARSE)


@pytest.mark.parametrize("kind", ["table", "commit", "checkpoint", "hint", "lease"])
def test_a_sparse_huge_file_is_refused_by_its_kind_limit(
    lake: str, kind: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Each read of lake metadata passes its kind's limit (``lakesink_reader.limits``): a 6 GiB
    file is refused having read at most the limit, never read whole."""
    target = {
        "table": Path(lake) / TABLE_FILE,
        "commit": log_dir(lake) / f"{5:020d}.json",
        "checkpoint": next(log_dir(lake).glob("*.checkpoint.json")),
        "hint": Path(lake) / LAST_CHECKPOINT,
        "lease": Path(lake) / "_lakesink" / "ops" / "0123456789abcdef.json",
    }[kind]
    target.parent.mkdir(exist_ok=True)
    sparse(target)
    start = time.monotonic()
    if kind in ("table", "commit"):
        with pytest.raises(CorruptFileError, match="bytes, the most a"):
            read_committed(lake)
        # the file keeps its first bytes: status reads a commit's header line alone, verify all
        one_line_error(*cli(["verify", lake], capsys), target.name)
    else:  # hints, checkpoints and leases are skipped: the lake reads from what else is there
        with caplog.at_level(logging.WARNING):
            assert ids(lake) == LAKE_IDS
        assert cli(["status", lake], capsys)[0] == 0
    assert time.monotonic() - start < 20


def test_a_sparse_huge_format_2_record_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "lake")
    epoch_lake(path)
    record = Path(path) / "_lakesink" / "epochs" / f"{1:020d}.json"
    sparse(record)
    with pytest.raises(CorruptFileError, match="the most a format-2 epoch record"):
        read_committed(path)
    one_line_error(*cli(["verify", path], capsys), record.name)


def test_a_create_that_finds_a_huge_file_at_its_name_reads_no_more_than_its_own_bytes(tmp_path: Path) -> None:
    """``put_if_absent`` that finds its name taken reads back what is there, to tell its own
    earlier try (a lost answer) from another writer's: at most its own length and one byte more.
    Found by the fuzzer (session 19, ``--mutation sparse`` case 1): ``vacuum`` writing its
    checkpoint over a sparse 6 GiB summary at that name read it whole (MemoryError)."""
    import tracemalloc

    storage = LocalStorage(str(tmp_path))
    name = f"_lakesink/log/{4:020d}.checkpoint.json"
    assert storage.put_if_absent(name, b"{}")
    with open(tmp_path / name, "r+b") as f:
        f.truncate(256 << 20)  # sparse: an attacker's cost is nothing
    tracemalloc.start()
    try:
        assert not storage.put_if_absent(name, b'{"version": 4}')
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # the file is 256 MiB


SECRET_URLS = [
    "s3://AKIAEXAMPLE:SuperSecret123@bucket/lake",
    "s3a://AKIAEXAMPLE:SuperSecret123@bucket/lake",
    "hdfs://hdfsuser:SuperSecret123@namenode:8020/lake",
    "s3://bucket/lake?X-Amz-Security-Token=SuperSecret123&X-Amz-Signature=SuperSecret123",
    "s3://bucket/lake?X-Amz-Credential=AKIAEXAMPLE%2F20260101&sig=SuperSecret123",
    "file://user:SuperSecret123@/tmp/lake",
    "gs://AKIAEXAMPLE:SuperSecret123@bucket/lake",
    "https://user:SuperSecret123@host/lake?sig=SuperSecret123",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_a_lake_url_s_secrets_are_never_echoed(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The refusal of a URL carrying credentials names the URL redacted (``***``), in the reader,
    the CLI and the Spark door's options (the same ``lakesink_reader.redact.redacted``)."""
    messages = []
    for attempt in (
        lambda: read_committed(url),
        lambda: Lake(url),
        lambda: SinkConfig.from_options({"path": url}).storage(),
    ):
        with pytest.raises((ValueError, TypeError, LakeSinkError)) as caught:
            attempt()
        messages.append(str(caught.value))
    for command in ("status", "verify", "history", "sync-views", "compact", "vacuum"):
        code, out = cli([command, url], capsys)
        assert code == 2 and len(out.strip().splitlines()) == 1, out
        messages.append(out)
    for text in messages:
        assert "SuperSecret123" not in text and "***" in text, text


def test_a_spark_failure_s_lakesink_line_is_redacted() -> None:
    """The Spark door raises lakesink's error remade from Spark's text: redacted there too."""
    text = "... lakesink_reader.errors.CorruptFileError: s3://k:SuperSecret123@b/x/_lakesink/table.json: bad"
    found = lakesink_error(RuntimeError(text))
    assert isinstance(found, CorruptFileError) and "SuperSecret123" not in str(found)
    assert "s3://***@b/x" in str(found)


@pytest.mark.parametrize("view_file", ["_delta_log/00000000000000000005.json", "_spark_metadata/19.compact"])
def test_a_sparse_huge_view_file_is_refused(
    lake: str, view_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Delta-view commit or a Spark-view compact file made 6 GiB: read to the view-file limit
    (256 MiB) and refused, naming it; status reports the Delta view unknown (~350 MB peak, 2-4 s)."""
    assert cli(["sync-views", lake], capsys)[0] == 0
    target = Path(lake) / view_file
    sparse(target)
    for command in ("sync-views", "verify"):
        one_line_error(*cli([command, lake], capsys), target.name)
    code, out = cli(["status", lake], capsys)
    assert code == 0 and "Traceback" not in out, out
    # the Spark view's status reads its newest batch only: the compact file is sync's and verify's
    assert ("the most a view file may hold" in out) == view_file.startswith("_delta_log"), out


def test_the_fuzzer_s_findings_stay_fixed(
    tmp_path: Path, lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """tests/fuzz found these (docs/design/trust.md): each is one clear error, quickly."""
    # case 1213: one add line repeated 400,000 times, under the commit limit
    commit = log_dir(lake) / f"{5:020d}.json"
    lines = commit.read_text().splitlines(keepends=True)
    commit.write_text("".join(lines) + lines[-1] * 400_000)
    start = time.monotonic()
    with pytest.raises(CorruptFileError, match="400002 action lines, but its header counts 2"):
        read_committed(lake)
    assert time.monotonic() - start < 5
    # case 1247: an arrow_schema that is not Arrow IPC (pyarrow raises the builtin OSError)
    edit_file(Path(lake) / TABLE_FILE, '"arrow_schema": "', '"arrow_schema": "xxxx')
    one_line_error(*cli(["status", lake], capsys), "table.json")
    # case 1199: a format-2 record listing one file 100,000 times
    path = str(tmp_path / "v2")
    epoch_lake(path)
    record = Path(path) / "_lakesink" / "epochs" / f"{1:020d}.json"
    doc = json.loads(record.read_text())
    doc["files"] = doc["files"][:1] * 100_000
    record.write_text(json.dumps(doc))
    with pytest.raises(CorruptFileError, match="listed more than once"):
        read_committed(path)


def test_redaction_is_linear_and_cli_errors_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fuzzer case 2257: a format-2 record naming a 1 MB path; the CLI's error quoted it, and
    ``redacted``'s unbounded scheme pattern backtracked over it for minutes."""
    for text in ("x" * 1_000_000, "?" + "a" * 1_000_000, "?key" * 200_000, "a://" * 250_000):
        start = time.monotonic()
        redacted(text)
        assert time.monotonic() - start < 2
    path = str(tmp_path / "v2")
    epoch_lake(path)
    record = Path(path) / "_lakesink" / "epochs" / f"{1:020d}.json"
    doc = json.loads(record.read_text())
    doc["files"][0]["path"] = "x" * (1 << 20)
    record.write_text(json.dumps(doc))
    start = time.monotonic()
    code, out = cli(["verify", path], capsys)
    assert code == 2 and len(out) < 10_000 and "characters left out" in out and time.monotonic() - start < 10


@pytest.mark.parametrize("names", ["same", "distinct"])
def test_a_table_json_of_400000_partition_columns_is_refused_in_linear_time(
    lake: str, names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fuzzer (template v3parts, `lengthen` of table.json's partition_columns to 400,001 names):
    the duplicate check counted each name over the whole list (``cols.count``), ~10**11 steps:
    the reader hung. Counted once now, and the message shows a few names, not the list."""
    table = Path(lake) / TABLE_FILE
    doc = json.loads(table.read_text())
    doc["reader_features"] = ["partitions"]
    doc["partition_columns"] = ["bucket"] * 400_001 if names == "same" else [f"c{i}" for i in range(400_001)]
    table.write_text(json.dumps(doc))
    start = time.monotonic()
    with pytest.raises(CorruptFileError, match="partition_columns: partition_by names") as refused:
        Lake(lake)
    assert len(str(refused.value)) < 2000, len(str(refused.value))
    code, out = cli(["status", lake], capsys)
    assert code == 2 and out.count("error:") == 1 and "Traceback" not in out, out
    assert time.monotonic() - start < 10  # ~0.2 s; before: hours


def with_big_footer(table: pa.Table) -> pa.Table:
    """``table`` with 9 MiB of key-value metadata, which Parquet keeps in the footer: a footer as
    long as 9,000 one-row groups make, written in a fraction of the time."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), b"pad": b"x" * (9 << 20)})


@pytest.mark.parametrize("where", ["view checkpoint", "file list"])
def test_a_metadata_file_whose_footer_is_huge_is_refused_before_it_is_decoded(
    lake: str, where: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Fuzzer (template v3parts, case 105): a Delta-view checkpoint rewritten with one row per
    row group (38,000 of them: a 122 MB footer, 200 MB in all, under the view-file limit) took
    `verify` to 1.3 GB -- pyarrow decodes a footer whole when the file opens, to ~10x its size.
    A footer longer than ``decoded.MAX_FOOTER`` (8 MiB; lakesink's own stay < 1 MB) is refused
    from the file's last 8 bytes; a list refused so is skipped for the commits. (The footers here
    are long by their key-value metadata: as long, and quicker to write than 9,000 row groups.)"""
    from lakesink_reader.format.decoded import MAX_FOOTER

    assert cli(["sync-views", lake], capsys)[0] == 0
    if where == "view checkpoint":
        path = Path(lake) / VIEW_CHECKPOINT
        pq.write_table(with_big_footer(pq.read_table(path)), path)
        command: tuple[str, ...] = ("verify",)
    else:
        path = rewrite_list(lake, with_big_footer)
        command = ()  # Lake(lake).files(): the list is skipped, the commits read instead
    footer = int.from_bytes(path.read_bytes()[-8:-4], "little")
    assert footer > MAX_FOOTER, footer
    seconds, grown, answer = measured(lake, *command)
    assert "Traceback" not in answer and grown < 100 << 20, (seconds, grown >> 20, answer)
    if where == "view checkpoint":
        assert "its Parquet footer holds" in answer and path.name in answer, answer
    else:
        with caplog.at_level(logging.WARNING):
            assert len(Lake(lake).files()) == 12 and ids(lake) == LAKE_IDS
        assert any("Parquet footer holds" in r.getMessage() for r in caplog.records), caplog.records


def test_a_commit_whose_header_counts_more_actions_than_a_commit_may_hold_is_refused_unread(
    lake: str,
) -> None:
    """The header's count of actions is the lake writer's too: 300,000 short distinct add lines
    (31 MB) that it counts decoded to ~1 KB each (256 MiB of them: ~1.6 million, ~2 GB). A count
    over ``limits.COMMIT_ACTIONS`` is refused from the header, before a line is decoded; and
    lakesink's own writers refuse to commit more."""
    from lakesink_reader import limits
    from lakesink_reader.format.v3.commits import AddFile, RemoveFile

    commit = log_dir(lake) / f"{5:020d}.json"
    header, first = commit.read_text().splitlines()[:2]
    doc = json.loads(header)
    n = 300_000
    counts = doc["commit"]["counts"]
    counts.update(add_files=n, add_rows=n, add_bytes=n, add_histogram=[n] + [0] * 11)
    add = json.loads(first)["add"]
    add.update(rows=1, bytes=1, stats={"numRecords": 1})
    line = json.dumps({"add": add}, separators=(",", ":"), sort_keys=True)
    name = add["path"]
    commit.write_text(
        json.dumps(doc, separators=(",", ":"), sort_keys=True)
        + "\n"
        + "".join(line.replace(name, f"f{i:07d}.parquet") + "\n" for i in range(n))
    )
    assert commit.stat().st_size > 30_000_000
    seconds, grown, answer = measured(lake)
    assert "300,000 file actions, more than the 200,000" in answer and commit.name in answer, answer
    # the commit's bytes are read (31 MB), nothing is decoded: before, 300,000 actions ~ 350 MB
    assert grown < 150 << 20, (seconds, grown >> 20, answer)
    with pytest.raises(CorruptFileError, match="more than the 200,000 a commit may hold"):
        read_committed(lake)
    inputs = [RemoveFile(f"f{i:07d}.parquet", 1, 1) for i in range(limits.COMMIT_ACTIONS)]
    with pytest.raises(ValueError, match="a commit holds at most 200,000 file actions"):
        PendingCommit.compact(
            op_token="0" * 16, base_version=5, removes=inputs, adds=[AddFile("out.parquet", 1, 1)]
        )


def test_a_spark_view_batch_of_200000_names_costs_verify_little(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fuzzer (v3views, `spark_metadata`, case 7): a Spark-view batch of 400,000 distinct entries
    (76 MB, under the view-file limit) took `verify` to 656 MiB and 18 s: the batch decoded whole
    (~1.5 KB an entry), then a `stat` of each listed name not in the lake. Entries are decoded
    one at a time now, and `verify` looks for at most 1,000 gone files one by one."""
    assert cli(["sync-views", lake], capsys)[0] == 0
    folder = Path(lake) / "_spark_metadata"
    newest = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    text = newest.read_text()
    entry = json.loads(text.splitlines()[-1])
    base = entry["path"].rsplit("/", 1)[0]
    lines = (
        json.dumps({**entry, "path": f"{base}/f{i:07d}.parquet"}, separators=(",", ":"))
        for i in range(200_000)
    )
    newest.write_text(text + "".join("\n" + line for line in lines))
    seconds, grown, answer = measured(lake, "verify")
    assert "1000 or more file(s) that are gone" in answer and "Traceback" not in answer, answer
    assert grown < 150 << 20, (seconds, grown >> 20, answer)  # before: ~330 MiB at 200,000


def with_stats(lake: str, n: int, stats: Any) -> Path:
    """Version 5 of ``lake`` rewritten as an append of ``n`` adds (of files that do not exist),
    each with ``stats``; header counts to match."""
    commit = log_dir(lake) / f"{5:020d}.json"
    header, first = commit.read_text().splitlines()[:2]
    doc = json.loads(header)
    doc["commit"]["counts"].update(add_files=n, add_rows=n, add_bytes=n, add_histogram=[n] + [0] * 11)
    add = json.loads(first)["add"]
    add.update(rows=1, bytes=1, stats=stats)
    line, name = json.dumps({"add": add}, separators=(",", ":"), sort_keys=True), add["path"]
    with commit.open("w") as out:
        out.write(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")
        out.writelines(line.replace(name, f"f{i:07d}.parquet") + "\n" for i in range(n))
    return commit


def test_a_commit_of_many_small_stats_values_costs_about_its_size(lake: str) -> None:
    """Issue 51: 50,000 adds whose stats are 100 empty objects each (19 MiB, under every limit)
    took ``Lake.files()``, ``read_committed`` and ``verify`` to ~450 MiB (23 times the commit)
    when stats were decoded into objects. A decoded commit holds its stats as their canonical
    text now, decoded one line at a time: what it costs is about what an honest commit of its
    size costs (~6 times: the bytes read, the text, the actions and the file list built)."""
    commit = with_stats(lake, 50_000, [{}] * 100)
    size = commit.stat().st_size
    assert size > 18 << 20  # 19.4 MB
    for step, answer in (((), "50010"), (("read_committed",), "500"), (("verify",), "exit 1")):
        seconds, grown, said = measured(lake, *step)
        assert said.startswith(answer), said
        # before: 449-452 MiB grown for each step (7 s); here ~115-130 MiB
        assert grown < 8 * size, (step, seconds, grown >> 20)


@pytest.mark.parametrize(
    ("stats", "refused"),
    [
        # One line of a million values (1 MB): ~70 MB built while it was decoded; an action
        # line holds at most limits.ACTION_VALUES.
        ([{}] * 499_990, "more than 300000 values"),
        # Re-encoded, 1e15 is 1000000000000000.0: the text kept would outgrow the commit.
        ([1e15] * 1000, "its stats encode to"),
    ],
)
def test_an_action_line_cannot_build_much_more_than_itself(lake: str, stats: Any, refused: str) -> None:
    commit = with_stats(lake, 2, stats)
    if isinstance(stats[0], float):  # json.dumps writes 1e15 as 1000000000000000.0: shorten it
        commit.write_text(commit.read_text().replace("1000000000000000.0", "1e15"))
    with pytest.raises(CorruptFileError, match=refused) as caught:
        read_committed(lake)
    assert commit.name in str(caught.value)


def test_size_statistics_are_read_from_a_footer_and_a_damaged_footer_gives_none(tmp_path: Path) -> None:
    """``format.sizestats`` reads what pyarrow writes (each text chunk's unencoded bytes: the
    sum of its values' lengths), and any truncation or byte change of the footer gives an
    answer or None within its bytes -- never an exception, never a loop over a claimed count."""
    from lakesink_reader.format.sizestats import unencoded_text_bytes

    texts = [f"value-{i}" * (i % 7) for i in range(3000)]
    table = pa.table({"text": texts, "n": list(range(3000)), "label": ["a", "b", "c"] * 1000})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=1000)
    data = path.read_bytes()
    footer = data[-8 - int.from_bytes(data[-8:-4], "little") : -8]
    found = unencoded_text_bytes(footer)
    expected = [[sum(len(t) for t in texts[g * 1000 : (g + 1) * 1000]), None, 1000] for g in range(3)]
    assert found == expected
    rng = random.Random(7)
    for cut in range(len(footer)):  # the row groups whole, or nothing
        assert unencoded_text_bytes(footer[:cut]) in (None, found)
    for _ in range(500):
        damaged = bytearray(footer)
        damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        answer = unencoded_text_bytes(bytes(damaged))
        assert answer is None or isinstance(answer, list)
    # A list that claims a billion elements in three bytes is refused by the bytes it has.
    assert unencoded_text_bytes(b"\x49\xfc\xff\xff\xff\x03") is None  # field 4: a list of structs


@pytest.mark.parametrize(
    "lease", ["[]", '"x"', "7", '{"refreshed_at": "yesterday"}', '{"refreshed_at": 1e308}']
)
def test_a_crafted_compaction_lease_is_abandoned_without_a_traceback(
    lake: str, lease: str, capsys: Any
) -> None:
    """Session 22: an ops lease that is JSON but no object (``[]``) made ``compact`` raise
    AttributeError (the fuzzer's templates held no lease until then). A lease is only a time:
    one that does not say it is read as the file's own time, and the op it names is abandoned
    (or kept) as any other."""
    ops = Path(lake) / "_lakesink" / "ops"
    ops.mkdir(exist_ok=True)
    (ops / "0123456789abcdef.json").write_text(lease)
    old = time.time() - 86_400
    os.utime(ops / "0123456789abcdef.json", (old, old))
    assert main(["compact", lake, "--min-files", "2"]) == 0, capsys.readouterr()
    assert main(["verify", lake]) == 0


def test_no_command_shows_a_signing_parameter_of_the_lake_s_url(lake: str, capsys: Any) -> None:
    """Session 22: ``lakesink offsets`` printed the lake's URL as given, a signing query
    parameter included (the local store ignores the query): the fuzzer's cases had never run
    ``offsets``. Every command's output, through such a URL, shows none of it."""
    url = f"file://localhost{lake}?X-Amz-Security-Token=SuperSecret123"
    commands = ["status", "verify", "history", "offsets", "config", "upgrade", "sync-views", "compact"]
    for command in [*commands, "vacuum", "orphans"]:
        _, out = cli([command, url], capsys)
        assert "SuperSecret123" not in out, (command, out)


def test_an_error_text_of_megabytes_becomes_a_short_line() -> None:
    """A decoder's text is as long as crafted input makes it (session 23: pydantic's 42 MB for
    200,000 errors): ``one_line`` keeps its head, so a refusal costs no copy of it in words."""
    from lakesink_reader.errors import ONE_LINE_CHARS, one_line

    line = one_line(ValueError("a\nb " * 1_000_000))
    assert line.startswith("a b a b") and line.endswith(" ...") and "\n" not in line
    assert len(line) <= ONE_LINE_CHARS + 4
    assert one_line(ValueError("short\n  text")) == "short text"
