"""A real moto S3 server on a free 127.0.0.1 port, one per test session, reset per test.

Clients (boto3, s3fs, pyarrow) speak HTTP to it, exactly as they would to AWS or MinIO.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

BUCKET = "lake-bucket"


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    pid: int

    @property
    def storage_options(self) -> dict[str, object]:
        return {
            "endpoint_url": self.endpoint_url,
            "key": "testing-key",
            "secret": "testing-secret-do-not-log",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing-key",
            aws_secret_access_key="testing-secret-do-not-log",
            region_name="us-east-1",
        )

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto(port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``moto_server`` on 127.0.0.1 and wait until it answers; the caller stops it by PID."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server on {url} did not start") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    proc, url = start_moto()
    try:
        yield S3Server(url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The moto server, reset, with an empty bucket ``BUCKET``; checks no upload stays open."""
    s3_server.reset()
    client = s3_server.client()
    client.create_bucket(Bucket=BUCKET)
    yield s3_server
