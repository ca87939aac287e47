"""The file writer without Spark (stage, seal, publish, discard), on local disk and on S3 (moto).
The batch commit has its own tests (``test_batches.py``, ``test_v3_log.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from lakes import SCHEMA, rows

from lakesink import CommitError, SchemaMismatchError, StorageError
from lakesink.commit import FileWriter, WriteOptions
from lakesink.config import SinkConfig
from lakesink_reader.format.table import ensure_table
from lakesink_reader.names import data_file_name
from lakesink_reader.storage import Storage, open_storage


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "s3":
        from s3server import BUCKET

        server = request.getfixturevalue("s3")
        table = open_storage(f"s3://{BUCKET}/lake", server.storage_options)
    else:
        table = open_storage(str(tmp_path / "lake"))
    ensure_table(table, SCHEMA, "epoch")
    yield table


def data_files(storage: Storage) -> list[str]:
    return sorted(f.name for f in storage.list("") if f.name.endswith(".parquet"))


# The file writer --------------------------------------------------------------------------------


def staged_left(storage: Storage) -> list[str]:
    return [s.name for s in storage.staged("")]


def test_a_batch_of_another_schema_is_refused_naming_the_columns(storage: Storage) -> None:
    file = FileWriter(storage, data_file_name(0, 0), SCHEMA, WriteOptions(row_group_bytes=1024))
    file.write(rows(0, 500))
    other = pa.record_batch(
        [pa.array(["x"]), pa.array([1], pa.int32()), pa.array(["y"])], names=["id", "bucket", "label"]
    )
    with pytest.raises(SchemaMismatchError, match="does not fit the table schema"):
        file.write(other)
    extra = pa.record_batch([pa.array([1], pa.int64()), pa.array([1.0])], names=["id", "score"])
    with pytest.raises(SchemaMismatchError, match=r"'score' \(double\) is new"):
        file.write(extra)
    file.discard()
    assert staged_left(storage) == [] and data_files(storage) == []


def test_a_failing_publish_discards_the_staged_file_and_raises_its_own_error(storage: Storage) -> None:
    name = data_file_name(0, 0, "a" * 16)
    file = FileWriter(storage, name, SCHEMA, WriteOptions(row_group_bytes=1024))
    file.write(rows(0, 1_000))
    for staged in storage.staged(""):  # a sweep with too short an age takes the file away
        storage.drop_staged(staged)
    with pytest.raises((FileNotFoundError, CommitError, StorageError)):
        file.publish()
    assert staged_left(storage) == [] and data_files(storage) == []


def test_options_of_the_wrong_type_are_named() -> None:
    with pytest.raises(TypeError, match="row_group_bytes must be int, got '64MiB'"):
        WriteOptions(row_group_bytes="64MiB")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown compression 'zip'"):
        WriteOptions(compression="zip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1 KiB"):
        WriteOptions(dictionary_page_bytes=10)
    # A level the codec has not: refused where the writer is configured, not in every task.
    with pytest.raises(ValueError, match=r"compression_level 23 is out of zstd's range -\d+\.\.22"):
        WriteOptions(compression_level=23)
    with pytest.raises(ValueError, match=r"compression_level 0 is out of gzip's range 1\.\.9"):
        SinkConfig.from_options({"path": "/tmp/lake", "compression": "gzip", "compression_level": "0"})
    assert WriteOptions(compression="snappy").compression_level == 1  # ignored by codecs without levels
    # A typo lists the options a user sets, not Spark's own nor write_stream's internal ones.
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['compresion'\]") as typo:
        SinkConfig.from_options({"path": "/tmp/lake", "compresion": "zstd"})
    assert "'compression'" in str(typo.value)
    assert not any(k in str(typo.value) for k in ("'path'", "checkpointlocation", "queryname", "'observer'"))


FULL_DISK = textwrap.dedent(
    """
    import json, os, sys
    import pyarrow as pa
    from lakesink.commit import FileWriter, WriteOptions
    from lakesink_reader.storage import open_storage
    lake = sys.argv[1]
    storage = open_storage(lake)
    schema = pa.schema([("blob", pa.binary())])
    try:
        with FileWriter(storage, "part-00000-epoch-000000000000.parquet", schema,
                        WriteOptions(row_group_bytes=1 << 20, compression="none")) as file:
            for _ in range(8):
                blobs = pa.array([os.urandom(100_000) for _ in range(10)])
                file.write(pa.record_batch([blobs], schema=schema))
        error = None
    except OSError as exc:
        error = exc.errno
    print(json.dumps({"errno": error, "left": sorted(os.listdir(lake))}))
    """
)


def test_a_full_disk_leaves_no_staged_file_behind(tmp_path: Path) -> None:
    """ENOSPC from a real 256 KiB tmpfs (or EFBIG from a file-size limit where mounting is not allowed)."""
    import errno
    import resource

    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                             capture_output=True, check=False).returncode == 0  # fmt: skip
    lake = mount / "lake"
    lake.mkdir()
    code = FULL_DISK
    if not mounted:  # the same path through the file-size limit: writes fail with EFBIG
        limit = (
            "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, {resource.RLIM_INFINITY}))\n"
        )
        code = limit + code
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(lake)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=False)
    assert result["errno"] == (errno.ENOSPC if mounted else errno.EFBIG)
    assert result["left"] == []  # the staged file went, although closing it failed again
