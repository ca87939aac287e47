"""The fault-injecting proxy (tests/netfaults.py) in front of the moto S3 server.

Besides checking the proxy, these tests pin down how botocore and moto behave when a network
fault hits an S3 request, which is what the project's exactly-once fault model relies on: a lost
answer to a conditional put is retried into a 412 while the object is there, and a lost answer
to CompleteMultipartUpload is retried into a 200.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import time
from collections.abc import Iterator
from email.message import Message
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from netfaults import Action, FaultProxy, Request, Rule, operation
from s3server import BUCKET, KEY, SECRET, S3Server

from devtools.moto import start_moto, stop_moto

pytestmark = pytest.mark.s3

CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=2, read_timeout=5)
MIB = 1 << 20


def s3_client(endpoint_url: str, key: str = KEY, secret: str = SECRET) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=CONFIG,
    )


@pytest.fixture
def proxy(s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint_url) as p:
        yield p


@pytest.fixture
def client(proxy: FaultProxy) -> Iterator[Any]:
    """A boto3 client that talks to moto through the proxy."""
    with contextlib.closing(s3_client(proxy.endpoint_url)) as c:
        yield c


@pytest.fixture
def direct(s3: S3Server) -> Iterator[Any]:
    """A boto3 client that talks to moto directly: the truth about what the server holds."""
    with contextlib.closing(s3_client(s3.endpoint_url)) as c:
        yield c


def port_of(proxy: FaultProxy) -> int:
    return int(proxy.endpoint_url.rsplit(":", 1)[1])


def operations(proxy: FaultProxy) -> list[str]:
    return [r.operation for r in proxy.log]


def statuses(proxy: FaultProxy, op: str) -> list[int | str]:
    return [r.status for r in proxy.log if r.operation == op]


# Classification and rules, without a server ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("PUT", "/b/k", "PutObject"),
        ("GET", "/b/k?x-id=GetObject", "GetObject"),
        ("GET", "/b/k?partNumber=1&response-content-type=x", "GetObject"),
        ("HEAD", "/b/dir/k", "HeadObject"),
        ("DELETE", "/b/k", "DeleteObject"),
        ("POST", "/b?delete", "DeleteObjects"),
        ("POST", "/b/k?uploads", "CreateMultipartUpload"),
        ("PUT", "/b/k?partNumber=2&uploadId=u", "UploadPart"),
        ("POST", "/b/k?uploadId=u", "CompleteMultipartUpload"),
        ("DELETE", "/b/k?uploadId=u", "AbortMultipartUpload"),
        ("GET", "/b/k?uploadId=u&max-parts=3", "ListParts"),
        ("GET", "/b?list-type=2&prefix=a%2F&encoding-type=url", "ListObjectsV2"),
        ("GET", "/b/?list-type=2", "ListObjectsV2"),
        ("GET", "/b?uploads&prefix=x", "ListMultipartUploads"),
        ("HEAD", "/b", "HeadBucket"),
        ("PUT", "/b", "CreateBucket"),
        ("GET", "/b", "Other"),  # ListObjects (v1)
        ("GET", "/b/k?tagging", "Other"),
        ("PUT", "/b?versioning", "Other"),
        ("GET", "/", "Other"),  # ListBuckets
        ("POST", "/moto-api/reset", "Other"),
    ],
)
def test_operation_classification(method: str, target: str, expected: str) -> None:
    path, _, query = target.partition("?")
    assert operation(method, path, query) == expected


def test_copies_are_not_puts_and_keys_are_url_decoded() -> None:
    headers = Message()
    headers["x-amz-copy-source"] = "/b/src"
    assert operation("PUT", "/b/dst", "", headers) == "Other"
    request = Request.parse("PUT", "/lake-bucket/t/a%20b/%E2%82%AC%2Bx.parquet?x-id=PutObject", Message())
    assert (request.operation, request.bucket, request.key) == (
        "PutObject",
        "lake-bucket",
        "t/a b/€+x.parquet",
    )


def put_request(key: str = "k", **headers: str) -> Request:
    message = Message()
    for name, value in headers.items():
        message[name.replace("_", "-")] = value
    return Request.parse("PUT", f"/b/{key}", message)


def test_rule_matching_and_firing_controls() -> None:
    put = put_request()
    assert not Rule(Action.RESET, operation="GetObject").fire(put)
    assert Rule(Action.RESET, operation={"GetObject", "PutObject"}, method="put").fire(put)
    assert Rule(Action.RESET, key=r"\.parquet$").fire(put_request("t/x.parquet"))
    assert not Rule(Action.RESET, key="x").fire(Request.parse("HEAD", "/bx", Message()))  # no key
    header_rule = Rule(Action.RESET, header="if-none-match")
    assert not header_rule.fire(put) and header_rule.fire(put_request(If_None_Match="*"))
    assert header_rule.matched == 1  # a request that does not match is not counted

    def pattern(rule: Rule, n: int = 10) -> str:
        return "".join("x" if rule.fire(put) else "." for _ in range(n))

    assert pattern(Rule(Action.RESET, times=2)) == "xx........"
    assert pattern(Rule(Action.RESET, every=3)) == "..x..x..x."
    assert pattern(Rule(Action.RESET, after=2, times=3)) == "..xxx....."
    assert pattern(Rule(Action.RESET, after=1, every=2, times=2)) == "..x.x....."
    rule = Rule(Action.RESET, probability=0.5, seed=7)
    drawn = pattern(rule, 200)
    assert drawn == pattern(Rule(Action.RESET, probability=0.5, seed=7), 200)  # deterministic
    assert 60 < drawn.count("x") < 140 and (rule.matched, rule.fired) == (200, drawn.count("x"))


# Plain traffic -------------------------------------------------------------------------------


def test_plain_traffic_is_forwarded_and_logged(proxy: FaultProxy, client: Any) -> None:
    client.head_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="t/a b.txt", Body=b"hello")  # bytes
    client.put_object(Bucket=BUCKET, Key="t/c", Body=io.BytesIO(b"file-like"))  # Expect: 100-continue
    assert client.get_object(Bucket=BUCKET, Key="t/a b.txt")["Body"].read() == b"hello"
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="t/")
    assert [o["Key"] for o in listed["Contents"]] == ["t/a b.txt", "t/c"]

    parts = [b"a" * (5 * MIB), b"b" * 1000]
    upload = client.create_multipart_upload(Bucket=BUCKET, Key="t/big")["UploadId"]
    etags = [
        client.upload_part(Bucket=BUCKET, Key="t/big", UploadId=upload, PartNumber=n, Body=body)["ETag"]
        for n, body in enumerate(parts, 1)
    ]
    assert len(client.list_parts(Bucket=BUCKET, Key="t/big", UploadId=upload)["Parts"]) == 2
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]] == ["t/big"]
    client.complete_multipart_upload(
        Bucket=BUCKET,
        Key="t/big",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    assert client.head_object(Bucket=BUCKET, Key="t/big")["ContentLength"] == 5 * MIB + 1000
    assert client.get_object(Bucket=BUCKET, Key="t/big")["Body"].read() == b"".join(parts)  # streamed
    client.delete_object(Bucket=BUCKET, Key="t/c")
    client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "t/big"}]})
    with pytest.raises(ClientError) as missing:
        client.head_object(Bucket=BUCKET, Key="t/c")
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404

    assert operations(proxy) == [
        "HeadBucket",
        "PutObject",
        "PutObject",
        "GetObject",
        "ListObjectsV2",
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPart",
        "ListParts",
        "ListMultipartUploads",
        "CompleteMultipartUpload",
        "HeadObject",
        "GetObject",
        "DeleteObject",
        "DeleteObjects",
        "HeadObject",
    ]
    assert proxy.log[1].key == "t/a b.txt" and proxy.log[1].bucket == BUCKET
    assert [r.status for r in proxy.log][-3:] == [204, 200, 404]
    assert proxy.fired() == 0 and proxy.requests("UploadPart") == 2


# Faults and how botocore and moto answer them -------------------------------------------------


def test_lost_answer_to_conditional_put_is_retried_into_412_while_the_object_is_there(
    proxy: FaultProxy, client: Any, direct: Any
) -> None:
    rule = proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="PutObject", header="If-None-Match", times=1))
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=BUCKET, Key="t/x", Body=b"ours", IfNoneMatch="*")
    error = info.value.response
    assert error["Error"]["Code"] == "PreconditionFailed"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert error["ResponseMetadata"]["RetryAttempts"] == 1  # botocore retried the lost answer
    assert direct.get_object(Bucket=BUCKET, Key="t/x")["Body"].read() == b"ours"  # yet it IS there
    assert statuses(proxy, "PutObject") == ["lost", 412]
    assert (rule.matched, rule.fired, proxy.fired(Action.LOSE_RESPONSE)) == (2, 1, 1)


@pytest.mark.parametrize("conditional", [False, True], ids=["plain", "if-none-match"])
def test_lost_answer_to_complete_is_retried_into_200(
    proxy: FaultProxy, client: Any, direct: Any, conditional: bool
) -> None:
    upload = client.create_multipart_upload(Bucket=BUCKET, Key="t/mp")["UploadId"]
    etag = client.upload_part(Bucket=BUCKET, Key="t/mp", UploadId=upload, PartNumber=1, Body=b"p")["ETag"]
    proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="CompleteMultipartUpload", times=1))
    answer = client.complete_multipart_upload(
        Bucket=BUCKET,
        Key="t/mp",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        **({"IfNoneMatch": "*"} if conditional else {}),
    )
    # Observed: moto treats a second complete of the upload that made the current object as
    # idempotent and answers 200 with the same ETag, with or without If-None-Match (not a 412,
    # not NoSuchUpload), so the client cannot tell that its first attempt went through.
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert answer["ResponseMetadata"]["RetryAttempts"] == 1
    assert answer["ETag"] == direct.head_object(Bucket=BUCKET, Key="t/mp")["ETag"]
    assert statuses(proxy, "CompleteMultipartUpload") == ["lost", 200]
    assert direct.get_object(Bucket=BUCKET, Key="t/mp")["Body"].read() == b"p"


def test_reset_is_retried_and_applied_once(proxy: FaultProxy, client: Any, direct: Any) -> None:
    proxy.add_rule(Rule(Action.RESET, operation="CreateMultipartUpload", times=1))
    proxy.add_rule(Rule(Action.RESET, operation="PutObject", times=1))
    upload = client.create_multipart_upload(Bucket=BUCKET, Key="t/once")
    assert upload["ResponseMetadata"]["RetryAttempts"] == 1
    # The reset request never reached moto: only the retry opened an upload.
    assert [u["UploadId"] for u in direct.list_multipart_uploads(Bucket=BUCKET)["Uploads"]] == [
        upload["UploadId"]
    ]
    direct.abort_multipart_upload(Bucket=BUCKET, Key="t/once", UploadId=upload["UploadId"])
    # A conditional put that was reset is simply retried: no 412, as the first never arrived.
    put = client.put_object(Bucket=BUCKET, Key="t/p", Body=b"v", IfNoneMatch="*")
    assert put["ResponseMetadata"]["RetryAttempts"] == 1
    assert statuses(proxy, "CreateMultipartUpload") == ["reset", 200]
    assert statuses(proxy, "PutObject") == ["reset", 200]
    assert proxy.fired(Action.RESET) == 2


def test_server_errors_are_retried_until_they_stop(proxy: FaultProxy, client: Any) -> None:
    slow = proxy.add_rule(Rule(Action.ERROR_503, operation="PutObject", times=2))
    put = client.put_object(Bucket=BUCKET, Key="t/e", Body=io.BytesIO(b"v"))  # Expect: 100-continue
    assert put["ResponseMetadata"]["RetryAttempts"] == 2 and slow.fired == 2
    proxy.add_rule(Rule(Action.ERROR_500, operation="GetObject", times=1))
    got = client.get_object(Bucket=BUCKET, Key="t/e")
    assert got["Body"].read() == b"v" and got["ResponseMetadata"]["RetryAttempts"] == 1
    assert statuses(proxy, "PutObject") == [503, 503, 200]
    assert statuses(proxy, "GetObject") == [500, 200]
    assert (proxy.fired(Action.ERROR_503), proxy.fired(Action.ERROR_500), proxy.fired()) == (2, 1, 3)


def test_delay_adds_latency_and_a_blanket_delay_does_not_shadow_earlier_rules(
    proxy: FaultProxy, client: Any
) -> None:
    client.put_object(Bucket=BUCKET, Key="t/d", Body=b"v")
    proxy.add_rule(Rule(Action.RESET, operation="GetObject", times=1))
    latency = proxy.add_rule(Rule(Action.DELAY, seconds=0.3))  # everything, always: goes last
    started = time.monotonic()
    client.head_object(Bucket=BUCKET, Key="t/d")
    assert time.monotonic() - started >= 0.3
    got = client.get_object(Bucket=BUCKET, Key="t/d")
    assert got["Body"].read() == b"v" and got["ResponseMetadata"]["RetryAttempts"] == 1
    assert statuses(proxy, "GetObject") == ["reset", 200]
    assert latency.fired == 2 and proxy.fired(Action.DELAY) == 2


def test_strip_if_none_match_lets_a_conditional_put_overwrite(
    proxy: FaultProxy, client: Any, direct: Any
) -> None:
    client.put_object(Bucket=BUCKET, Key="t/s", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=BUCKET, Key="t/s", Body=b"second", IfNoneMatch="*")
    proxy.add_rule(Rule(Action.STRIP_IF_NONE_MATCH, header="If-None-Match"))
    client.put_object(Bucket=BUCKET, Key="t/s", Body=b"third", IfNoneMatch="*")
    assert direct.get_object(Bucket=BUCKET, Key="t/s")["Body"].read() == b"third"
    assert statuses(proxy, "PutObject") == [200, 412, 200]


def test_minio_upload_listing_shows_uploads_only_for_an_exact_key(
    proxy: FaultProxy, client: Any, direct: Any
) -> None:
    uploads = {
        key: direct.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"] for key in ("t/a", "t/b")
    }
    proxy.add_rule(Rule(Action.MINIO_UPLOAD_LISTING))

    def listed(**kwargs: str) -> list[str]:
        answer = client.list_multipart_uploads(Bucket=BUCKET, **kwargs)
        return [u["Key"] for u in answer.get("Uploads", ())]

    try:
        assert listed() == []
        assert listed(Prefix="t/") == []
        assert listed(Prefix="t/", Delimiter="/") == []
        assert listed(Prefix="t/a") == ["t/a"]  # moto's own answer, unchanged
        assert listed(Prefix="t/c") == []
        everything = direct.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
        assert sorted(u["Key"] for u in everything) == ["t/a", "t/b"]  # moto still has both
        assert proxy.fired(Action.MINIO_UPLOAD_LISTING) == 5
    finally:
        for key, upload in uploads.items():
            direct.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload)


# Other clients, raw HTTP framing, signatures, lifecycle ----------------------------------------


def test_pyarrow_reads_and_writes_through_the_proxy(proxy: FaultProxy, direct: Any) -> None:
    import pyarrow.fs as pafs

    data = bytes(range(256)) * (12 * 1024)  # 3 MiB
    direct.put_object(Bucket=BUCKET, Key="t/in", Body=data)
    fs = pafs.S3FileSystem(
        endpoint_override=proxy.endpoint_url.removeprefix("http://"),
        scheme="http",
        access_key=KEY,
        secret_key=SECRET,
        region="us-east-1",
    )
    proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="GetObject", times=1))  # retried by the SDK
    with fs.open_input_stream(f"{BUCKET}/t/in") as stream:
        assert stream.read() == data
    # The AWS C++ SDK uploads parts with Transfer-Encoding: chunked and an aws-chunked body.
    with fs.open_output_stream(f"{BUCKET}/t/out") as out:
        out.write(data)
    assert direct.get_object(Bucket=BUCKET, Key="t/out")["Body"].read() == data
    assert statuses(proxy, "GetObject")[0] == "lost" and proxy.requests("UploadPart") == 1


def test_s3fs_round_trip_through_the_proxy(proxy: FaultProxy) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        key=KEY, secret=SECRET, endpoint_url=proxy.endpoint_url, client_kwargs={"region_name": "us-east-1"}
    )
    proxy.add_rule(Rule(Action.LOSE_RESPONSE, operation="PutObject", times=1))
    fs.pipe(f"{BUCKET}/t/s3fs", b"q" * 1000)
    assert fs.cat(f"{BUCKET}/t/s3fs") == b"q" * 1000
    assert statuses(proxy, "PutObject") == ["lost", 200]


def http_exchange(sock: socket.socket, data: bytes, wait_for: bytes = b"\r\n\r\n") -> bytes:
    """Send ``data`` and read until ``wait_for`` has arrived (and any Content-Length body)."""
    sock.sendall(data)
    received = b""
    while wait_for not in received:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lengths = [int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    length = lengths[0] if lengths else 0
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_raw_http_expect_continue_chunked_bodies_and_keep_alive(proxy: FaultProxy, direct: Any) -> None:
    port = port_of(proxy)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        # moto checks no signatures here, so unsigned requests do.
        head = f"PUT /{BUCKET}/t/expect HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n".encode()
        assert http_exchange(sock, head + b"Content-Length: 5\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert http_exchange(sock, b"hello").startswith(b"HTTP/1.1 200")
        chunked = (
            f"PUT /{BUCKET}/t/chunked HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n"
        ).encode()
        assert http_exchange(sock, chunked).startswith(b"HTTP/1.1 200")  # same connection: kept alive
        proxy.add_rule(Rule(Action.ERROR_503, times=1))
        refused = http_exchange(sock, head + b"Content-Length: 5\r\n\r\n", b"</Error>")
        # No 100 Continue for a request answered with an error: its body is never sent, so the
        # connection cannot carry another request and is closed.
        assert refused.startswith(b"HTTP/1.1 503") and b"<Code>SlowDown</Code>" in refused
        assert b"Connection: close" in refused and sock.recv(100) == b""
    assert direct.get_object(Bucket=BUCKET, Key="t/expect")["Body"].read() == b"hello"
    assert direct.get_object(Bucket=BUCKET, Key="t/chunked")["Body"].read() == b"hello world"
    assert [r.status for r in proxy.log] == [200, 200, 503]


@pytest.fixture(scope="module")
def auth_moto() -> Iterator[tuple[str, str, str]]:
    """A moto server that checks SigV4 signatures: (url, key, secret) of a user allowed s3:*.

    moto checks nothing until ``INITIAL_NO_AUTH_ACTION_COUNT`` requests have been served (by
    default never); the three IAM calls use them up.
    """
    proc, url = start_moto(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    try:
        iam = boto3.client(
            "iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        with contextlib.closing(iam):
            iam.create_user(UserName="lake")
            allow = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
            policy = json.dumps({"Version": "2012-10-17", "Statement": [allow]})
            iam.put_user_policy(UserName="lake", PolicyName="s3", PolicyDocument=policy)
            key = iam.create_access_key(UserName="lake")["AccessKey"]
        yield url, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        stop_moto(proc)


def test_signatures_still_verify_through_the_proxy(auth_moto: tuple[str, str, str]) -> None:
    import pyarrow.fs as pafs

    url, key, secret = auth_moto
    with (
        FaultProxy(url) as proxy,
        contextlib.closing(s3_client(proxy.endpoint_url, key, secret)) as client,
        contextlib.closing(s3_client(proxy.endpoint_url, key, "wrong")) as impostor,
    ):
        client.create_bucket(Bucket="signed")
        client.put_object(Bucket="signed", Key="a", Body=io.BytesIO(b"v"), IfNoneMatch="*")  # Expect, CRC32
        fs = pafs.S3FileSystem(
            endpoint_override=proxy.endpoint_url.removeprefix("http://"),
            scheme="http",
            access_key=key,
            secret_key=secret,
            region="us-east-1",
        )
        with fs.open_output_stream("signed/b") as out:  # chunked + aws-chunked, signed headers
            out.write(b"w" * 1000)
        assert client.get_object(Bucket="signed", Key="b")["Body"].read() == b"w" * 1000
        with pytest.raises(ClientError) as bad:
            impostor.head_object(Bucket="signed", Key="a")
        assert bad.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403  # checking is on
        # If-None-Match is a signed header: a store that checks signatures rejects the request
        # once it is removed, so STRIP_IF_NONE_MATCH only makes sense against a lax server (the
        # test server is one).
        proxy.add_rule(Rule(Action.STRIP_IF_NONE_MATCH))
        with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
            client.put_object(Bucket="signed", Key="a", Body=b"v2", IfNoneMatch="*")


def test_stop_cuts_idle_and_delayed_connections_promptly(s3: S3Server) -> None:
    proxy = FaultProxy(s3.endpoint_url).start()
    port = port_of(proxy)
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)
    assert http_exchange(idle, f"HEAD /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()).startswith(
        b"HTTP/1.1 200"
    )
    delay = proxy.add_rule(Rule(Action.DELAY, seconds=30))
    delayed = socket.create_connection(("127.0.0.1", port), timeout=5)
    delayed.sendall(f"HEAD /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    deadline = time.monotonic() + 5
    while delay.fired == 0:  # until the request is asleep in its DELAY
        assert time.monotonic() < deadline, "the delayed request never reached the proxy"
        time.sleep(0.01)
    proxy.stop()
    with idle, delayed:
        # Each socket times out after 5 s: an empty read before that is the proxy cutting it,
        # not the 30 s delay ending.
        assert idle.recv(100) == b"" and delayed.recv(100) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    proxy.stop()  # a second stop is harmless


def test_an_unreachable_upstream_is_a_502() -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{placeholder.getsockname()[1]}"  # bound, not listening: refused
        with (
            FaultProxy(dead) as proxy,
            socket.create_connection(("127.0.0.1", port_of(proxy))) as s,
        ):
            answer = http_exchange(s, b"GET /b/k HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"</Error>")
            assert answer.startswith(b"HTTP/1.1 502") and b"BadGateway" in answer
            assert [(r.operation, r.status) for r in proxy.log] == [("GetObject", 502)]
