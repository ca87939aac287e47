"""``lakesink status``: what a lake holds and who writes it, on format-3 and format-2 lakes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from lakes import SCHEMA, epoch_lake, foreach_lake, v3_file, v3_name, v3_table
from test_reader_v3 import W1, W2, Writer, compact, live_adds

from lakesink.cli import main
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import status, upgrade
from lakesink_reader import Lake
from lakesink_reader.format.schemas import encode_schema
from lakesink_reader.format.table import read_table_metadata
from lakesink_reader.format.v3.commits import Continuation, PendingCommit, new_op_token, writer_tag
from lakesink_reader.storage import open_storage


def test_a_format_3_lake_shows_its_writers_offsets_and_files(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    log = VersionedLogWriter(storage, table_id, checkpoint_interval=5)
    first = Writer(log, W1)
    for batch in range(3):
        first.append(batch * 100, offsets=[{"ev": {"0": (batch + 1) * 20}}])
    second = Writer(log, W2, allow_other_queries=True)
    second.append(10_000, files=1, offsets=[{"ev": {"1": 7}}])
    # A dead task's staged file: left over, and reported.
    dead = storage.stage("part-00009-epoch-000000000009-00000000deadbeef.parquet")
    dead.write(b"half a file")
    dead.flush()

    found = status(lake)
    assert (found.format_version, found.mode, found.version) == (3, "epoch", 3)
    assert (found.files, found.rows) == (7, 70)
    assert found.small_files == 7 and found.bytes and found.bytes > 0
    assert [(w.id, w.first_batch, w.last_batch, w.offsets) for w in found.writers] == [
        (W1, 0, 2, [{"ev": {"0": 60}}]),
        (W2, 0, 0, [{"ev": {"1": 7}}]),
    ]
    assert found.writers[1].allow_other_queries and not found.writers[0].allow_other_queries
    assert found.staged == 1 and found.oldest_staged_age is not None
    assert main(["status", lake]) == 0
    out = capsys.readouterr().out
    assert f"writer {W1}: batches 0..2, last at version 2" in out and "latest version: 3" in out
    assert main(["status", lake, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == 70 and len(doc["writers"]) == 2
    assert "7 under 64 MiB (lakesink compact joins them)" in out


def test_status_counts_published_leftovers_when_asked_and_says_how_to_see_them(
    lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 53, item 4: after a kill, files published by a batch that never committed (kept: its
    replay settles them) and a losing attempt's file of a committed batch (removable). The plain
    status says it did not count them and how to; --leftovers counts them as `orphans` finds them."""
    storage, table_id = v3_table(lake, checkpoint_interval=5)
    writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=5), W1)
    for batch in range(3):
        writer.append(batch * 100)
    killed = [v3_file(storage, v3_name(W1, 3, p), 300 + p * 10, 10) for p in range(2)]  # batch 3: no commit
    losing = v3_file(storage, v3_name(W1, 1, 0), 100, 10)  # batch 1's other attempt: never listed

    assert main(["status", lake]) == 0
    out = capsys.readouterr().out
    assert "staged leftovers: 0" in out
    assert (
        "published leftovers: not counted (that lists every file): --leftovers counts them, "
        f"`lakesink orphans {lake}` names them" in out
    )

    assert main(["status", lake, "--leftovers"]) == 0
    out = capsys.readouterr().out
    kept_bytes = sum(f.size for f in killed)
    assert (
        f"leftovers (as `lakesink orphans` finds them): 1 removable: 1 unrecorded_file ({losing.size:,} "
        f"bytes); 2 kept ({kept_bytes:,} bytes): published, their batch not committed" in out
    ), out
    assert main(["orphans", lake]) == 0  # the same files, named
    orphans = capsys.readouterr().out
    assert losing.path in orphans and all(f.path in orphans for f in killed)
    assert "2 file(s) kept" in orphans

    assert main(["status", lake, "--leftovers", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["leftovers"] == {
        "older_than": 3600.0,
        "removable": {"unrecorded_file": [1, losing.size]},
        "kept": 2,
        "kept_bytes": kept_bytes,
    }
    assert main(["status", lake, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["leftovers"] is None
    # The query restarted and committed its batch 3 from another attempt: the killed files are
    # settled now, and removable (the writer's own sweep after its commit removes them).
    writer.append(300)
    assert main(["status", lake, "--leftovers"]) == 0
    assert "3 removable: 3 unrecorded_file" in capsys.readouterr().out


def test_status_piped_into_head_ends_quietly(lake: str) -> None:
    """`lakesink status PATH | head -1`: the reader goes away before lakesink writes (here: at
    once, so that the write always meets a closed pipe); no "Broken pipe" error follows."""
    import subprocess
    import sys

    storage, table_id = v3_table(lake, checkpoint_interval=5)
    writer = Writer(VersionedLogWriter(storage, table_id, checkpoint_interval=5), W1)
    for batch in range(3):
        writer.append(batch * 100)
    cli = subprocess.Popen(
        [sys.executable, "-m", "lakesink.cli", "status", lake],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert cli.stdout is not None
    cli.stdout.close()  # the reader is gone before the first line
    _, err = cli.communicate(timeout=60)
    assert "Broken pipe" not in err and "error" not in err.lower(), err


def test_format_2_lakes_show_epochs_and_files(tmp_path: str) -> None:
    epoch = status(str(epoch_lake(str(tmp_path) + "/epoch", epochs=3, partitions=2, rows_per_file=10).url))
    assert (epoch.format_version, epoch.mode, epoch.version, epoch.files, epoch.rows) == (
        2,
        "epoch",
        2,
        6,
        60,
    )
    assert epoch.writers == []
    each = status(str(foreach_lake(str(tmp_path) + "/foreach", epochs=2, partitions=2, rows_per_file=10).url))
    assert (each.mode, each.version, each.files) == ("foreach", None, 4)


def test_history_names_every_operation_a_lake_went_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``Lake.history()`` and ``lakesink history``: an upgraded format-2 lake, then a second
    query's appends, one that changes the schema, its continuation, a compaction, an
    auto-compaction, a vacuum."""
    lake = str(tmp_path / "lake")
    epoch_lake(lake, epochs=2, partitions=1, rows_per_file=10)
    assert upgrade(lake).status == "upgraded"  # versions 0, 1: the epochs; 2: the upgrade
    storage = open_storage(lake)
    metadata = read_table_metadata(storage)
    assert metadata.table_id
    log = VersionedLogWriter(storage, metadata.table_id, checkpoint_interval=metadata.log_interval)
    first = Writer(log, W1, allow_other_queries=True)
    first.append(1_000, offsets=[{"ev": {"0": 20}}])  # 3
    wider = SCHEMA.append(pa.field("note", pa.string()))
    schema_change = Writer(log, W1, allow_other_queries=True, schema=encode_schema(wider))
    schema_change.batch = 1
    schema_change.append(1_020, offsets=[{"ev": {"0": 40}}])  # 4
    Writer(log, W2, continues=Continuation(W1, 1, 4, [{"ev": {"0": 40}}], "kafka")).append(1_040)  # 5
    compact(log, live_adds(log, 3, 4), 1_000, 40)  # 6
    compact(log, live_adds(log, 5), 1_040, 20, trigger="auto")  # 7: as a writer's driver commits it
    log.commit(PendingCommit.vacuum(op_token=new_op_token(), retained_from=2))  # 8

    history = Lake(lake).history()
    assert [(e.version, e.operation) for e in history] == [
        (8, "vacuum"),
        (7, "auto-compaction"),
        (6, "compaction"),
        (5, "continuation"),
        (4, "schema change"),
        (3, "append"),
        (2, "upgrade"),
    ]  # fmt: skip  (versions 0 and 1 are below the vacuum's retained_from)
    assert (history[3].continues, history[3].writer, history[3].batch) == (W1, W2, 0)
    assert (history[2].add_files, history[2].remove_files, history[2].remove_rows) == (1, 4, 40)
    assert [e.version for e in Lake(lake).history(limit=2)] == [8, 7]
    assert [e.version for e in Lake(lake, version=4).history(limit=2)] == [4, 3]  # a pinned lake's
    with pytest.raises(ValueError, match="limit must be a number of versions >= 0"):
        Lake(lake).history(limit=-1)

    assert main(["history", lake]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["version", "committed", "(UTC)", "operation"] and len(out) == 8
    assert [line.split()[3] for line in out[1:]] == [
        "vacuum", "auto-compaction", "compaction", "continuation", "schema", "append", "upgrade",
    ]  # fmt: skip
    assert writer_tag(W2) in out[4] and "40" in out[3].split()  # the rows the compaction removed
    # Every column in line, "auto-compaction" (the longest operation) included.
    writer_at = out[0].index("writer")
    assert all(line[writer_at - 2 : writer_at] == "  " and line[writer_at] != " " for line in out[1:]), out
    assert main(["history", lake, "--limit", "1", "--json"]) == 0
    [doc] = json.loads(capsys.readouterr().out)
    assert (doc["version"], doc["operation"], doc["kind"]) == (8, "vacuum", "vacuum")
    with pytest.raises(SystemExit):
        main(["history", lake, "--limit", "many"])
    assert "'many' is not a whole number" in capsys.readouterr().err


def test_long_commands_show_a_bar_on_a_terminal_and_plain_lines_elsewhere() -> None:
    """The CLI's progress (compact, vacuum, orphans, verify, upgrade): tqdm's bar on a terminal,
    a line at each tenth of the way in a log."""
    import io

    from lakesink.cli import _progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = io.StringIO()
    show = _progress(log, "rewriting bins")
    for done in range(1, 21):
        show(done, 20)
    assert log.getvalue().splitlines() == [f"rewriting bins: {d}/20" for d in (1, *range(2, 21, 2))]
    terminal = Terminal()
    bar = _progress(terminal, "removing")
    for done in range(1, 4):
        bar(done, 3)
    assert "removing: 100%" in terminal.getvalue() and "3/3" in terminal.getvalue()
