"""A real moto S3 server on a free 127.0.0.1 port, one per test session, reset per test.

Clients (boto3, s3fs, pyarrow) speak HTTP to it, exactly as they would to AWS or MinIO. The
launcher itself is ``devtools.moto`` (the S3 demo uses it too).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devtools.moto import free_port, start_moto, stop_moto

__all__ = ["BUCKET", "S3Server", "free_port", "s3", "s3_server", "start_moto"]

BUCKET = "lake-bucket"
KEY = "testing-key"
SECRET = "testing-secret-do-not-log"


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    pid: int

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "endpoint_url": self.endpoint_url,
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def open_uploads(self, bucket: str = BUCKET) -> list[str]:
        """Keys of multipart uploads neither completed nor aborted (all pages)."""
        keys: list[str] = []
        for page in self.client().get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            keys.extend(u["Key"] for u in page.get("Uploads", ()))
        return keys


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    proc, url = start_moto()
    try:
        yield S3Server(url, proc.pid)
    finally:
        stop_moto(proc)


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The moto server, reset, with an empty bucket ``BUCKET``; checks no upload stays open."""
    s3_server.reset()
    client = s3_server.client()
    client.create_bucket(Bucket=BUCKET)
    yield s3_server
    assert s3_server.open_uploads() == [], "a multipart upload was left open"
