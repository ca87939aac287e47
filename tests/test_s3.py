"""The S3 backend against a real moto server on 127.0.0.1: multipart staging, the commit race,
listing pagination, error translation, secrets, the reader over S3, and Spark end to end."""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from s3server import BUCKET, S3Server

from lakesink import LakeForeachWriter, StorageError, TableNotFoundError
from lakesink.commit import ParquetStage, WriteOptions, publish
from lakesink.devserver import free_port, start_moto, stop_moto
from lakesink.layout import committed_name
from lakesink.metadata import ensure_table
from lakesink.storage import open_storage
from lakesink.storage.s3 import MIN_PART_SIZE, S3Sealed, S3Storage, part_size_for
from reader import Lake, SkippedFilesWarning, read_all, read_committed

pytestmark = pytest.mark.s3

URL = f"s3://{BUCKET}/t"
SCHEMA = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
# Distinctive values, so that a leak anywhere is found by a plain substring search.
LEAKY = {
    "key": "AKIALEAKYKEY0123",
    "secret": "leaky-secret-value-9f8e7d",
    "token": "leaky-session-token-5c4b3a",
}


def storage_of(s3: S3Server, url: str = URL, **extra: Any) -> S3Storage:
    storage = open_storage(url, {**s3.storage_options, **extra})
    assert isinstance(storage, S3Storage)
    return storage


def random_batch(start: int, rows: int, blob_bytes: int) -> pa.RecordBatch:
    """Incompressible rows: Parquet of ``rows * blob_bytes`` random bytes stays about that big."""
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.record_batch(
        [ids, pa.array([os.urandom(blob_bytes) for _ in range(rows)], pa.binary())], schema=SCHEMA
    )


def write_file(storage: S3Storage, partition: int, epoch: int, batch: pa.RecordBatch) -> str:
    name = committed_name(partition, epoch, "00000000cafef00d")
    stage = ParquetStage(storage, name, SCHEMA, WriteOptions(row_group_bytes=1 << 20, compression="none"))
    stage.write(batch)
    sealed = stage.seal()
    assert sealed is not None and publish(storage, sealed)
    return name


# Multipart staging ------------------------------------------------------------------------------


def test_multipart_file_streams_parts_with_bounded_memory(s3: S3Server) -> None:
    storage = storage_of(s3, part_size=MIN_PART_SIZE)
    data = os.urandom(12 * MIN_PART_SIZE // 5)  # 12 MiB: parts of 5 + 5 + 2 MiB
    staged = storage.stage("part-00000-epoch-000000000000.parquet")
    for i in range(0, len(data), 1 << 20):
        staged.write(memoryview(data)[i : i + (1 << 20)])
        assert len(staged._buffer) < MIN_PART_SIZE  # memory bound: at most one part buffered
    assert staged.tell() == len(data)
    [pending] = storage.pending_uploads("")
    assert (pending.parts, pending.bytes) == (2, 2 * MIN_PART_SIZE)  # parts went up while writing
    sealed = staged.seal()
    assert [n for n, _ in sealed.parts] == [1, 2, 3] and sealed.size == len(data)
    assert not storage.exists(sealed.name) and storage.list("") == []  # invisible until published
    assert pickle.loads(pickle.dumps(sealed)) == sealed  # travels to the driver in epoch mode
    assert storage.publish(sealed) is True
    obj = s3.client().get_object(Bucket=BUCKET, Key=f"t/{sealed.name}")
    assert obj["Body"].read() == data and obj["ETag"].endswith('-3"')
    assert storage.pending_uploads("") == []


def test_part_size_doubles_every_thousand_parts_and_is_validated(s3: S3Server) -> None:
    base = 8 << 20
    sizes = [part_size_for(n, base) for n in (1, 1000, 1001, 2001, 9001)]
    assert sizes == [base, base, 2 * base, 4 * base, 512 * base]
    assert part_size_for(9001, 16 << 20) == 5 << 30  # capped at S3's largest part
    # With the default part size, 10,000 growing parts hold S3's 5 TiB object limit.
    assert sum(part_size_for(n, base) for n in range(1, 10_001)) > 5 << 40
    with pytest.raises(ValueError, match=r"part_size.*1048576"):
        storage_of(s3, part_size=1 << 20)
    with pytest.raises(ValueError, match=r"\['bogus_option'\]"):
        storage_of(s3, bogus_option=1)


def test_parquet_over_several_parts_reads_back(s3: S3Server) -> None:
    storage = storage_of(s3, part_size=MIN_PART_SIZE)
    ensure_table(storage, SCHEMA, "foreach")
    batch = random_batch(0, 110, 100_000)  # ~11 MB of Parquet: 3 parts
    name = write_file(storage, 0, 0, batch)
    assert [f.name for f in Lake(URL, s3.storage_options).files()] == [name]
    table = read_committed(URL, storage_options=s3.storage_options)
    assert table.column("id").to_pylist() == list(range(110))
    assert table.column("blob").to_pylist() == batch.column(1).to_pylist()


# Commit race and idempotence --------------------------------------------------------------------


def test_two_attempts_racing_on_one_key_leave_one_object_one_winner(s3: S3Server) -> None:
    name = committed_name(4, 2, "00000000cafef00d")
    # Two executors: two storage objects, two uploads of different data to the same key.
    attempts = [storage_of(s3) for _ in range(2)]
    sealed = []
    for n, storage in enumerate(attempts):
        stage = ParquetStage(storage, name, SCHEMA)
        stage.write(random_batch(n * 100, 10, 10))
        sealed.append(stage.seal())
    assert len(s3.open_uploads()) == 2
    barrier = threading.Barrier(2)
    results: dict[int, bool] = {}

    def race(n: int) -> None:
        barrier.wait()
        results[n] = publish(attempts[n], sealed[n])  # type: ignore[arg-type]

    threads = [threading.Thread(target=race, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False, True]
    winner = next(n for n, won in results.items() if won)
    listed = [f.name for f in attempts[0].list("")]
    assert listed == [name]
    assert read_committed_ids(s3, attempts[0], name) == list(range(winner * 100, winner * 100 + 10))
    assert s3.open_uploads() == []  # the loser aborted its upload


def read_committed_ids(s3: S3Server, storage: S3Storage, name: str) -> list[int]:
    import pyarrow.parquet as pq

    fs, base = storage.arrow_filesystem()
    return pq.read_table(f"{base}/{name}", filesystem=fs).column("id").to_pylist()


def test_retried_publish_is_idempotent_and_a_late_loser_aborts(s3: S3Server) -> None:
    storage = storage_of(s3)
    name = committed_name(0, 9)
    stage = ParquetStage(storage, name, SCHEMA)
    stage.write(random_batch(0, 5, 10))
    sealed = stage.seal()
    assert isinstance(sealed, S3Sealed)
    assert storage.publish(sealed) is True
    assert storage.publish(sealed) is True  # the answer of the first complete was "lost"
    assert storage._is_ours(storage.key_of(name), sealed)  # the attempt id survived completion
    late = ParquetStage(storage, name, SCHEMA)
    late.write(random_batch(50, 5, 10))
    late_sealed = late.seal()
    assert isinstance(late_sealed, S3Sealed)
    assert not storage._is_ours(storage.key_of(name), late_sealed)
    assert storage.publish(late_sealed) is False
    assert read_committed_ids(s3, storage, name) == list(range(5))
    storage.discard(late_sealed)  # discarding an aborted upload again is fine


# Listing ----------------------------------------------------------------------------------------


def test_listing_pages_past_1000_objects(s3: S3Server) -> None:
    client = s3.client()
    names = [committed_name(p, 0) for p in range(1_050)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.put_object(Bucket=BUCKET, Key=f"t/{n}", Body=b"x"), names))
    client.put_object(Bucket=BUCKET, Key="t/_lakesink/table.json", Body=b"{}")  # a sub-folder
    client.put_object(Bucket=BUCKET, Key="t-other/part-x.parquet", Body=b"x")  # a sibling prefix
    storage = storage_of(s3)
    listed = storage.list("")
    assert sorted(f.name for f in listed) == sorted(names)
    assert all(f.size == 1 and f.modified is not None and f.modified > time.time() - 600 for f in listed)
    assert [f.name for f in storage.list("_lakesink")] == ["_lakesink/table.json"]
    assert storage.list("nothing-here") == []


def test_read_all_reports_in_flight_uploads_as_pending(s3: S3Server) -> None:
    storage = storage_of(s3)
    ensure_table(storage, SCHEMA, "foreach")
    write_file(storage, 0, 0, random_batch(0, 20, 10))
    in_flight = ParquetStage(
        storage, committed_name(1, 0, "00000000cafef00d"), SCHEMA, WriteOptions(row_group_bytes=1024)
    )
    in_flight.write(random_batch(100, 200, 10))  # a row group flushed: the upload is open
    try:
        files = Lake(URL, s3.storage_options).files("read_all")
        assert [(f.partition, f.state) for f in files] == [(0, "committed"), (1, "pending")]
        with pytest.warns(SkippedFilesWarning) as caught:
            table = read_all(URL, storage_options=s3.storage_options)
        assert sorted(table.column("id").to_pylist()) == list(range(20))
        [skipped] = next(w.message for w in caught if isinstance(w.message, SkippedFilesWarning)).skipped
        assert skipped.state == "pending" and skipped.path == f"{URL}/{in_flight.name}"
        assert read_committed(URL, storage_options=s3.storage_options).num_rows == 20
    finally:
        in_flight.discard()
    assert s3.open_uploads() == []


def test_env_vars_configure_endpoint_and_credentials(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = storage_of(s3)
    ensure_table(storage, SCHEMA, "foreach")
    write_file(storage, 0, 0, random_batch(0, 3, 10))
    for var, value in {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_ACCESS_KEY_ID": "env-key",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(var, value)
    assert read_committed(URL).column("id").to_pylist() == [0, 1, 2]  # no storage_options at all


# Bad input --------------------------------------------------------------------------------------


def test_missing_bucket_is_table_not_found_naming_it(s3: S3Server) -> None:
    storage = storage_of(s3, "s3://no-such-bucket/t")
    with pytest.raises(TableNotFoundError, match="no-such-bucket"):
        storage.list("")
    with pytest.raises(TableNotFoundError, match="no-such-bucket"):
        storage.stage("part-00000-epoch-000000000000.parquet")
    assert storage.root_exists() is False and storage.exists("x") is False
    with pytest.raises(TableNotFoundError, match="no-such-bucket"):
        read_committed("s3://no-such-bucket/t", storage_options=s3.storage_options)


def test_missing_prefix_is_table_not_found(s3: S3Server) -> None:
    with pytest.raises(TableNotFoundError, match=f"s3://{BUCKET}/nothing"):
        read_committed(f"s3://{BUCKET}/nothing", storage_options=s3.storage_options)


def test_unreachable_endpoint_fails_after_bounded_retries_naming_it() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = {
        "endpoint_url": endpoint,
        "key": "k",
        "secret": "s",
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 2}},
    }
    storage = open_storage(URL, options)
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as info:
        storage.list("")
    assert time.monotonic() - started < 15
    assert endpoint in str(info.value) and "after 2 attempt(s)" in str(info.value)
    assert info.value.__cause__ is not None  # botocore's error is kept
    assert open_storage(URL, {}).attempts == 5  # the default bound


def test_non_s3_scheme_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match=r"'gs'.*gs://x"):
        open_storage("gs://x/table")
    with pytest.raises(ValueError, match="gs://x"):
        LakeForeachWriter("gs://x/table")
    with pytest.raises(ValueError, match="no valid bucket"):
        open_storage("s3:///table")
    with pytest.raises(ValueError, match="not an S3 URL"):
        S3Storage("gs://x")
    assert open_storage("s3a://some-bucket/a/b/").url == "s3://some-bucket/a/b"  # Hadoop's spelling


@pytest.fixture(scope="module")
def auth_server() -> Iterator[tuple[str, dict[str, str]]]:
    """A second moto server that checks credentials: IAM user ``lake`` may do anything on S3.

    moto authenticates only after ``INITIAL_NO_AUTH_ACTION_COUNT`` unauthenticated actions;
    the three IAM calls that create the user, its policy and its key use them up.
    """
    import boto3

    proc, url = start_moto(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    try:
        kw: dict[str, Any] = {"endpoint_url": url, "region_name": "us-east-1"}
        iam = boto3.client("iam", aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap", **kw)
        iam.create_user(UserName="lake")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="lake", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="lake")["AccessKey"]
        good = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
        boto3.client(
            "s3", aws_access_key_id=good["key"], aws_secret_access_key=good["secret"], **kw
        ).create_bucket(Bucket="auth-bucket")
        yield url, good
    finally:
        stop_moto(proc)


@pytest.mark.parametrize("bad", ["key", "secret"])
def test_bad_credentials_are_permission_errors_without_the_secret(
    auth_server: tuple[str, dict[str, str]], bad: str
) -> None:
    url, good = auth_server
    base = {"endpoint_url": url, "client_kwargs": {"region_name": "us-east-1"}}
    open_storage("s3://auth-bucket/t", {**base, **good}).put("probe", b"ok")  # the good key works
    creds = {**good, bad: LEAKY[bad]}
    storage = open_storage("s3://auth-bucket/t", {**base, **creds})
    with pytest.raises(PermissionError, match="s3://auth-bucket/t/probe") as info:
        storage.read_bytes("probe")
    expected = "InvalidAccessKeyId" if bad == "key" else "SignatureDoesNotMatch"
    assert expected in str(info.value)
    assert_no_secrets(traceback.format_exception(info.value), creds["secret"])


# Secrets ----------------------------------------------------------------------------------------


def assert_no_secrets(texts: Any, *extra: str) -> None:
    blob = "\n".join(texts) if not isinstance(texts, str) else texts
    for secret in (*LEAKY.values(), *extra):
        assert secret not in blob


def test_secrets_never_appear_in_reprs_errors_or_logs(s3: S3Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lakesink")
    caplog.set_level(logging.INFO)
    options = {"endpoint_url": s3.endpoint_url, **LEAKY, "client_kwargs": {"region_name": "us-east-1"}}
    storage = open_storage(URL, options)
    writer = LakeForeachWriter(URL, schema=SCHEMA, storage_options=options)
    texts = [repr(storage), str(storage), repr(writer), repr(vars(storage))]
    stage = ParquetStage(storage, committed_name(0, 0), SCHEMA)  # moto accepts any credentials
    stage.write(random_batch(0, 5, 10))
    sealed = stage.seal()
    texts += [repr(sealed), pickle.dumps(sealed).decode("latin-1")]
    assert storage.publish(sealed) is True
    stage2 = ParquetStage(storage, committed_name(0, 0), SCHEMA)
    stage2.write(random_batch(0, 5, 10))
    assert publish(storage, stage2.seal()) is False  # logs the lost race
    errors: list[BaseException] = []
    for bad in (
        lambda: open_storage("s3://no-such-bucket/t", options).list(""),
        lambda: open_storage(URL, {**options, "part_size": 1}),
        lambda: open_storage(URL, {**options, "nonsense": LEAKY["secret"]}),
        lambda: open_storage(
            URL,
            {
                **options,
                "endpoint_url": f"http://127.0.0.1:{free_port()}",
                "config_kwargs": {"retries": {"max_attempts": 1}},
            },
        ).read_bytes("x"),
    ):
        with pytest.raises(Exception) as info:  # any error: its text is what we check
            bad()
        errors.append(info.value)
    texts += ["".join(traceback.format_exception(e)) for e in errors]
    texts += [r.getMessage() for r in caplog.records] + [caplog.text]
    assert any("already committed" in r.getMessage() for r in caplog.records)  # logs were captured
    assert_no_secrets(texts)
    assert s3.open_uploads() == []


# Spark end to end -------------------------------------------------------------------------------


@pytest.mark.spark
def test_spark_foreach_to_s3_with_a_failed_attempt_keeps_every_row_once(
    spark, s3: S3Server, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from faults import FailFirstAttempt

    source = tmp_path / "in"
    for i in range(2):
        spark.range(i * 1_500, (i + 1) * 1_500).selectExpr(
            "id", "concat('row-', cast(id as string)) as label"
        ).coalesce(1).write.parquet(str(source / f"b{i}"))
        for part in (source / f"b{i}").glob("part-*.parquet"):
            part.rename(source / f"input-{i}.parquet")
    schema = spark.read.parquet(str(source)).schema
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source)).repartition(2)
    # Tiny row groups: the failing attempt has already started its multipart upload when it
    # fails, so its abort (not just "nothing was ever staged") is what is checked at the end.
    writer = FailFirstAttempt(
        URL,
        schema=df.schema,
        storage_options=s3.storage_options,
        after_rows=100,
        batch_rows=64,
        write_options=WriteOptions(row_group_bytes=1024),
    )
    query = (
        df.writeStream.foreach(writer)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left to skip
        assert sorted(read_all(URL, storage_options=s3.storage_options).column("id").to_pylist()) == list(
            range(3_000)
        )
    table = read_committed(URL, storage_options=s3.storage_options)
    assert sorted(table.column("id").to_pylist()) == list(range(3_000))
    files = Lake(URL, s3.storage_options).files()
    assert {f.epoch for f in files} == {0, 1} and all(f.state == "committed" for f in files)
    assert s3.open_uploads() == []
