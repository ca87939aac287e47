"""The S3 backend against a real moto server on 127.0.0.1 (HTTP, no in-process mocks), with the
fault-injecting proxy (tests/netfaults.py) where a test needs a fault: multipart staging,
lost answers, 409 conflicts, stores that ignore If-None-Match or list uploads like MinIO,
error translation, storage options, secrets, the reader over S3, and Spark end to end."""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from netfaults import Action, FaultProxy, Rule
from s3server import BUCKET, S3Server

from devtools.moto import free_port, start_moto, stop_moto
from lakesink import CommitError, LakeForeachWriter, StorageError, TableNotFoundError
from lakesink.cli import main
from lakesink.commit import FileWriter, WriteOptions
from lakesink.maintenance import sweep, verify
from lakesink_reader import Lake, SkippedFilesWarning, read_all, read_committed
from lakesink_reader.format.table import ensure_table, find_table
from lakesink_reader.names import data_file_name
from lakesink_reader.storage import open_storage
from lakesink_reader.storage.options import MIN_PART_SIZE
from lakesink_reader.storage.s3 import S3Storage
from lakesink_reader.storage.s3_upload import S3Sealed, part_size_for

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


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint_url) as started:
        yield started


def via(proxy: FaultProxy, s3: S3Server, **extra: Any) -> S3Storage:
    """A storage that talks to moto through the proxy, retrying quickly."""
    options = {
        **s3.storage_options,
        "endpoint_url": proxy.endpoint_url,
        "config_kwargs": {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 5}},
        **extra,
    }
    storage = open_storage(URL, options)
    assert isinstance(storage, S3Storage)
    return storage


def random_batch(start: int, rows: int, blob_bytes: int) -> pa.RecordBatch:
    """Incompressible rows: Parquet of ``rows * blob_bytes`` random bytes stays about that big."""
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.record_batch(
        [ids, pa.array([os.urandom(blob_bytes) for _ in range(rows)], pa.binary())], schema=SCHEMA
    )


def write_file(storage: S3Storage, partition: int, epoch: int, batch: pa.RecordBatch) -> str:
    name = data_file_name(partition, epoch, "00000000cafef00d")
    writer = FileWriter(storage, name, SCHEMA, WriteOptions(row_group_bytes=1 << 20, compression="none"))
    writer.write(batch)
    published = writer.publish()
    assert published is not None and published.won
    return name


def sealed_upload(storage: S3Storage, name: str, start: int = 0) -> S3Sealed:
    writer = FileWriter(storage, name, SCHEMA)
    writer.write(random_batch(start, 5, 10))
    sealed = writer.seal()
    assert isinstance(sealed, S3Sealed)
    return sealed


def read_ids(storage: S3Storage, name: str) -> list[int]:
    import pyarrow.parquet as pq

    fs, base = storage.arrow_filesystem()
    return pq.read_table(f"{base}/{name}", filesystem=fs).column("id").to_pylist()


# Multipart staging ------------------------------------------------------------------------------


@pytest.mark.parametrize("in_flight", [1, 3])
def test_parts_upload_while_the_file_is_written_with_bounded_memory(
    s3: S3Server, proxy: FaultProxy, in_flight: int
) -> None:
    """Each part takes 0.3 s to upload (the proxy delays it): parts must go up while the file is
    still being written, and memory must stay within the documented bound."""
    import tracemalloc

    proxy.add_rule(Rule(Action.DELAY, operation="UploadPart", seconds=0.3))
    storage = via(proxy, s3, part_size=MIN_PART_SIZE, parts_in_flight=in_flight)
    name = "part-00000-epoch-000000000000.parquet"
    data = os.urandom(6 * MIN_PART_SIZE + 1234)  # 7 parts, the last a small one
    staged = storage.stage(name)
    tracemalloc.start()
    try:
        for i in range(0, len(data), 1 << 20):
            staged.write(memoryview(data)[i : i + (1 << 20)])
        uploaded_while_writing = proxy.requests("UploadPart")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert uploaded_while_writing >= 2
    # (2 * parts_in_flight + 1) parts, and one part of slack for the 1 MiB chunks and the rest.
    assert peak < (2 * in_flight + 2) * MIN_PART_SIZE, f"peak {peak / 2**20:.1f} MiB"
    assert staged.tell() == len(data)
    sealed = staged.seal()
    assert [n for n, _ in sealed.parts] == list(range(1, 8)) and sealed.size == len(data)
    assert not storage.exists(name) and storage.list("") == []  # invisible until published
    assert [s.name for s in storage.staged("")] == [name]  # but listed as staged
    assert pickle.loads(pickle.dumps(sealed)) == sealed
    assert storage.publish(sealed) is True
    obj = s3.client().get_object(Bucket=BUCKET, Key=f"t/{name}")
    assert obj["Body"].read() == data and obj["ETag"].endswith('-7"')
    assert storage.staged("") == [] and storage.list("_lakesink/staging") == []


def test_a_file_smaller_than_a_part_goes_up_at_seal_without_a_copy(s3: S3Server) -> None:
    """seal() hands the buffer itself to the upload, as write() does with a full part: a file
    below the part size (most files of an epoch) is not copied once more on its way up. Before,
    seal copied it (``bytes(buffer)``), and the upload's peak held the file twice over."""
    import tracemalloc

    storage = storage_of(s3)
    data = os.urandom(4 << 20)  # below the 8 MiB default part size: one part, sent by seal
    staged = storage.stage("small.parquet")
    staged.write(data)
    tracemalloc.start()
    try:
        sealed = staged.seal()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 2, f"seal allocated {peak / 2**20:.1f} MiB for a {len(data) >> 20} MiB file"
    assert storage.publish(sealed) is True
    assert storage.read_bytes("small.parquet") == data


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


# Lost answers, conflicts and stores that do not behave --------------------------------------------


def test_a_lost_answer_to_a_create_if_absent_is_recognised_as_our_own_success(
    s3: S3Server, proxy: FaultProxy
) -> None:
    storage = via(proxy, s3)
    rule = proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="PutObject", header="If-None-Match", times=1))
    # The server stores the record, the answer is lost, botocore retries and gets 412.
    assert (
        storage.put_if_absent("_lakesink/epochs/00000000000000000000.json", b'{"commit_id": "ours"}') is True
    )
    assert rule.fired == 1 and proxy.requests("PutObject") == 2
    # Another writer's bytes under the name: a real lost race.
    proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="PutObject", header="If-None-Match", times=1))
    assert (
        storage.put_if_absent("_lakesink/epochs/00000000000000000000.json", b'{"commit_id": "theirs"}')
        is False
    )


def test_a_lost_answer_to_a_complete_still_publishes_once(s3: S3Server, proxy: FaultProxy) -> None:
    storage = via(proxy, s3)
    name = data_file_name(0, 9)
    sealed = sealed_upload(storage, name)
    rule = proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="CompleteMultipartUpload", times=1))
    assert storage.publish(sealed) is True
    assert rule.fired == 1
    assert storage.publish(sealed) is True  # and once more, as a late retry would
    late = sealed_upload(storage, name, start=50)
    assert storage.publish(late) is False  # a different attempt at the name lost the race
    storage.discard(late)
    assert read_ids(storage, name) == list(range(5))
    assert s3.open_uploads() == [] and storage.staged("") == []


def test_a_409_conflict_aborts_the_upload_and_asks_for_the_task_to_be_retried(
    s3: S3Server, proxy: FaultProxy
) -> None:
    storage = via(proxy, s3)
    name = data_file_name(1, 1)
    sealed = sealed_upload(storage, name)
    proxy.add_rule(Rule(Action.CONFLICT_409, operation="CompleteMultipartUpload", times=1))
    with pytest.raises(CommitError, match=r"409 ConditionalRequestConflict.*uploaded again"):
        storage.publish(sealed)
    assert s3.open_uploads() == [] and not storage.exists(name) and storage.staged("") == []
    # Through a FileWriter, as the writers use it: the error propagates, nothing is left.
    writer = FileWriter(storage, name, SCHEMA)
    writer.write(random_batch(0, 5, 10))
    proxy.add_rule(Rule(Action.CONFLICT_409, operation="CompleteMultipartUpload", times=1))
    with pytest.raises(CommitError, match="409"):
        writer.publish()
    assert s3.open_uploads() == [] and not storage.exists(name) and storage.staged("") == []


def test_a_store_that_ignores_if_none_match_is_refused_when_the_table_is_created(
    s3: S3Server, proxy: FaultProxy
) -> None:
    storage = via(proxy, s3)
    rule = proxy.add_rule(Rule(Action.STRIP_IF_NONE_MATCH))
    with pytest.raises(StorageError, match=r"does not honour If-None-Match.*PutObject"):
        ensure_table(storage, SCHEMA, "epoch")
    assert rule.fired > 0
    assert not storage.exists("_lakesink/table.json")  # nothing of the table was written
    assert [f.name for f in storage.list("_lakesink")] == [] and s3.open_uploads() == []
    proxy.clear_rules()
    # A store that honours it on PutObject but not on CompleteMultipartUpload.
    proxy.add_rule(Rule(Action.STRIP_IF_NONE_MATCH, operation="CompleteMultipartUpload"))
    with pytest.raises(StorageError, match="CompleteMultipartUpload"):
        ensure_table(storage, SCHEMA, "epoch")
    proxy.clear_rules()
    ensure_table(storage, SCHEMA, "epoch")
    assert [f.name for f in storage.list("_lakesink")] == ["_lakesink/table.json"]


def test_staged_uploads_are_found_where_uploads_cannot_be_listed_by_prefix(
    s3: S3Server, proxy: FaultProxy
) -> None:
    """MinIO lists uploads only for an exact key: the staging markers find them anyway."""
    storage = via(proxy, s3)
    ensure_table(storage, SCHEMA, "foreach")
    dead = FileWriter(storage, data_file_name(3, 0), SCHEMA, WriteOptions(row_group_bytes=1024))
    dead.write(random_batch(0, 200, 10))  # a writer killed mid-file: its upload stays open
    proxy.add_rule(Rule(Action.MINIO_UPLOAD_LISTING))
    by_prefix = storage.client.list_multipart_uploads(Bucket=BUCKET, Prefix="t/")  # through the proxy
    assert by_prefix.get("Uploads", []) == [] and len(s3.open_uploads()) == 1  # hidden, but there
    found = sweep(storage, older_than=0, delete=True)
    assert [(o.kind, o.name) for o in found.removed] == [("multipart_upload", dead.name)]
    assert s3.open_uploads() == [] and storage.list("_lakesink/staging") == []


# Listing and the reader -------------------------------------------------------------------------


def test_read_all_reports_in_flight_uploads_as_staged(s3: S3Server) -> None:
    storage = storage_of(s3)
    ensure_table(storage, SCHEMA, "foreach")
    write_file(storage, 0, 0, random_batch(0, 20, 10))
    in_flight = FileWriter(
        storage, data_file_name(1, 0, "00000000cafef00d"), SCHEMA, WriteOptions(row_group_bytes=1024)
    )
    in_flight.write(random_batch(100, 200, 10))  # a row group flushed: the upload is open
    try:
        files = Lake(URL, s3.storage_options).files("read_all")
        assert [(f.partition, f.state) for f in files] == [(0, "committed"), (1, "staged")]
        with pytest.warns(SkippedFilesWarning) as caught:
            table = read_all(URL, storage_options=s3.storage_options)
        assert sorted(table.column("id").to_pylist()) == list(range(20))
        [skipped] = next(w.message for w in caught if isinstance(w.message, SkippedFilesWarning)).skipped
        assert skipped.state == "staged" and "upload in flight" in skipped.reason
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
    """The requests of a running query retry a refused connection (the store may be restarting)."""
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = {
        "endpoint_url": endpoint,
        "key": "k",
        "secret": "s",
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 2}},
    }
    storage = open_storage(URL, options)
    # max_attempts counts retries, as in botocore: 2 of them make 3 attempts.
    for request in (lambda: storage.list(""), lambda: ensure_table(storage, SCHEMA, "epoch")):
        with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as info:
            request()
        assert endpoint in str(info.value) and "after 3 attempt(s)" in str(info.value)
        # One error, not a chain of four socket-level ones: the message names botocore's.
        assert info.value.__cause__ is None and "EndpointConnectionError" in str(info.value)
    assert open_storage(URL, {}).attempts == 6  # the default bound: 5 retries


def test_an_unreachable_endpoint_fails_at_once_when_a_lake_is_opened(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused connection on the first request of a reader, a maintenance command or a
    starting query is a configuration error: it fails on that request, naming the endpoint,
    not after botocore's retries (13-22 s with the default options). The time bound is coarse
    on purpose; bench/ is where timing targets belong."""
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    options = {"endpoint_url": endpoint, "key": "k", "secret": "s"}  # default retries and timeouts
    openers: dict[str, Callable[[], object]] = {
        "read_committed": lambda: read_committed(URL, storage_options=options),
        "read_all": lambda: read_all(URL, storage_options=options),
        "Lake": lambda: Lake(URL, storage_options=options),
        "verify": lambda: verify(URL, storage_options=options),
        "sweep": lambda: sweep(URL, older_than=3600, storage_options=options),
        # How write_stream's start() and the foreach checks on the driver first reach a lake.
        "find_table": lambda: find_table(open_storage(URL, options)),
    }
    for name, open_lake in openers.items():
        started = time.monotonic()
        with pytest.raises(StorageError, match=f"cannot reach the S3 endpoint {endpoint}") as info:
            open_lake()
        elapsed = time.monotonic() - started
        assert "not retried" in str(info.value) and elapsed < 8, f"{name}: {elapsed:.1f} s, {info.value}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    started = time.monotonic()
    assert main(["verify", URL, f"--storage-option=endpoint_url={endpoint}"]) == 2
    assert f"cannot reach the S3 endpoint {endpoint}" in capsys.readouterr().err
    assert time.monotonic() - started < 8


def test_opening_a_lake_still_retries_a_store_that_answers_with_errors(
    s3: S3Server, proxy: FaultProxy
) -> None:
    """Only a connection that cannot be made at all ends the first request: a reset or a 503
    (the store is there, and busy) is retried as every request is."""
    options = {**s3.storage_options, "endpoint_url": proxy.endpoint_url}
    ensure_table(open_storage(URL, options), SCHEMA, "foreach")
    reset = proxy.add_rule(Rule(Action.RESET, operation="GetObject", key="table.json$", times=1))
    busy = proxy.add_rule(Rule(Action.ERROR_503, operation="GetObject", key="table.json$", times=2))
    assert Lake(URL, storage_options=options).mode == "foreach"
    assert (reset.fired, busy.fired) == (1, 2)


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


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"key": 123}, r"'key' .* must be a string, got int"),
        ({"endpoint_url": 123}, r"'endpoint_url' .* must be a string, got int"),
        (
            {"endpoint_url": "127.0.0.1:9000"},
            r"'endpoint_url'.*must be a URL starting with http:// or https:// \(value not shown\)",
        ),
        ({"config_kwargs": {"retries": 5}}, r"config_kwargs\['retries'\].*must be a dict"),
        ({"client_kwargs": "eu-west-1"}, r"'client_kwargs' .* must be a dict, got str"),
        ({"part_size": "8MiB"}, r"'part_size' .* must be an int, got str"),
        ("key=abc", r"storage_options for s3://lake-bucket/t must be a dict .* got str"),
    ],
)
def test_storage_options_of_the_wrong_type_are_named_on_the_driver(options: Any, complaint: str) -> None:
    with pytest.raises((TypeError, ValueError), match=complaint) as info:
        LakeForeachWriter(URL, schema=SCHEMA, storage_options=options)
    shown = str(info.value)
    assert "abc" not in shown and "123" not in shown.replace("got int", "") and "9000" not in shown
    with pytest.raises((TypeError, ValueError), match=complaint):
        open_storage(URL, options)


def test_storage_options_for_a_local_path_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\['endpoint_url'\] do not apply to the local path"):
        open_storage(str(tmp_path), {"endpoint_url": "http://127.0.0.1:1"})


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
    texts = [repr(storage), str(storage), repr(writer), repr(vars(storage)), repr(vars(writer))]
    sealed = sealed_upload(storage, data_file_name(0, 0))  # moto accepts any credentials
    texts += [repr(sealed), pickle.dumps(sealed).decode("latin-1")]
    assert storage.publish(sealed) is True
    second = FileWriter(storage, data_file_name(0, 0), SCHEMA)
    second.write(random_batch(0, 5, 10))
    published = second.publish()  # logs the lost race
    assert published is not None and not published.won
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
    assert any("discarded our copy" in r.getMessage() for r in caplog.records)  # logs were captured
    assert_no_secrets(texts)
    assert s3.open_uploads() == []


# Spark end to end -------------------------------------------------------------------------------


@pytest.mark.spark
def test_write_stream_to_an_unreachable_endpoint_fails_at_once_before_starting(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import lakesink

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
    options = {"endpoint_url": endpoint, "key": "k", "secret": "s"}
    df = spark.readStream.format("rate").load()
    started = time.monotonic()
    with pytest.raises(StorageError, match=f"cannot reach the S3 endpoint {endpoint}.*not retried"):
        lakesink.write_stream(df, URL, checkpoint_location=str(tmp_path / "chk"), storage_options=options)
    elapsed = time.monotonic() - started
    assert elapsed < 8, f"write_stream took {elapsed:.1f} s to fail"
    assert spark.streams.active == []


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
        warnings.simplefilter("error", SkippedFilesWarning)  # nothing left to skip
        assert sorted(read_all(URL, storage_options=s3.storage_options).column("id").to_pylist()) == list(
            range(3_000)
        )
    table = read_committed(URL, storage_options=s3.storage_options)
    assert sorted(table.column("id").to_pylist()) == list(range(3_000))
    files = Lake(URL, s3.storage_options).files()
    assert {f.epoch for f in files} == {0, 1} and all(f.state == "committed" for f in files)
    assert s3.open_uploads() == []


def test_a_lost_answer_to_a_create_leaves_no_twin_upload(s3: S3Server, proxy: FaultProxy) -> None:
    storage = via(proxy, s3)
    rule = proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="CreateMultipartUpload", times=2))
    for name in (data_file_name(0, 0), data_file_name(1, 0)):
        writer = FileWriter(storage, name, SCHEMA)
        writer.write(random_batch(0, 5, 10))
        if name.startswith("part-00000"):
            assert writer.publish() is not None
        else:
            writer.discard()
    assert rule.fired == 2  # each create started an upload nobody heard of, then retried
    assert s3.open_uploads() == [] and storage.staged("") == []


def test_a_worker_process_builds_one_client_per_lake_and_environment(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark reuses Python workers: each task and commit opens its storage, and must not pay
    for a new boto3 client each time (about 0.2 CPU-s each)."""
    first = open_storage(URL, s3.storage_options)
    assert first.list("") == [] and open_storage(URL, dict(s3.storage_options)) is first
    assert open_storage(URL, {**s3.storage_options, "part_size": 16 << 20}) is not first
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")  # the environment is part of a client
    assert open_storage(URL, s3.storage_options) is not first
