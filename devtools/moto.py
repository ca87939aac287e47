"""A throwaway moto S3 server on 127.0.0.1 for tests, demos and the bench: start, wait for, stop by PID.

Clients (boto3, s3fs, pyarrow) speak HTTP to it exactly as they would to AWS or MinIO. It
needs ``moto[server]`` (the ``test`` extra).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

#: Credentials the dev server accepts (it checks none unless started with
#: ``INITIAL_NO_AUTH_ACTION_COUNT``); never use them anywhere else.
DEV_KEY = "lakesink-dev-key"
DEV_SECRET = "lakesink-dev-secret"
DEV_REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto(
    port: int | None = None, *, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a moto S3 server on 127.0.0.1 and wait until it answers.

    Parameters
    ----------
    port
        Port to listen on; a free one when None.
    env
        Extra environment for the server, e.g. ``{"INITIAL_NO_AUTH_ACTION_COUNT": "0"}`` to make
        it check credentials.
    timeout
        Seconds to wait for the server to answer.

    Returns
    -------
    (process, endpoint_url)
        The caller stops it with :func:`stop_moto` (by PID).

    Raises
    ------
    RuntimeError
        When moto is not installed, or the server exits or does not answer in time (the
        message carries the end of its output).
    """
    if importlib.util.find_spec("moto") is None:
        raise RuntimeError("moto is not installed: pip install 'moto[server]>=5.1.11' (the 'test' extra)")
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    # An anonymous temp file, not a pipe: nobody reads the server's per-request log while it
    # runs (a full pipe would block it), and the file vanishes when the server exits.
    output = tempfile.TemporaryFile()  # noqa: SIM115 - closed below; the child keeps its copy
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true", **(env or {})},
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                return proc, url
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    stop_moto(proc)
                    output.seek(0)
                    tail = output.read()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"moto server on {url} did not start; its output:\n{tail}") from None
                time.sleep(0.1)
    finally:
        output.close()  # the child keeps its own descriptor


def stop_moto(server: subprocess.Popen[bytes] | int, timeout: float = 10.0) -> None:
    """Stop a server started by :func:`start_moto`, by its PID: SIGTERM, then SIGKILL.

    Takes the Popen (preferred: it also reaps the process) or a bare PID. A server that is
    already gone is not an error.
    """
    if isinstance(server, subprocess.Popen):
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        return
    try:
        os.kill(server, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(server, signal.SIGKILL)


def dev_storage_options(endpoint_url: str) -> dict[str, Any]:
    """lakesink ``storage_options`` for a dev server at ``endpoint_url``."""
    return {
        "endpoint_url": endpoint_url,
        "key": DEV_KEY,
        "secret": DEV_SECRET,
        "client_kwargs": {"region_name": DEV_REGION},
    }


def dev_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for the dev server at ``endpoint_url``."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=DEV_KEY,
        aws_secret_access_key=DEV_SECRET,
        region_name=DEV_REGION,
    )


def create_bucket(endpoint_url: str, bucket: str) -> None:
    """Create ``bucket`` on the dev server at ``endpoint_url``."""
    dev_client(endpoint_url).create_bucket(Bucket=bucket)
