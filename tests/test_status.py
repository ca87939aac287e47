"""``lakesink status``: what a lake holds and who writes it, on format-3 and format-2 lakes."""

from __future__ import annotations

import json

import pytest
from lakes import epoch_lake, foreach_lake, v3_table
from test_reader_v3 import W1, W2, Writer

from lakesink.cli import main
from lakesink.commit.versions import VersionedLogWriter
from lakesink.maintenance import status


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
