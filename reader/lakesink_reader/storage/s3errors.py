"""The one place where S3/botocore errors become lakesink errors (builtins where they fit).

Every message names the bucket/key (and the endpoint when it cannot be reached) and never the
credentials; the botocore exception is kept as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from lakesink_reader.errors import StorageError, TableNotFoundError

_DENIED = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AccountProblem",
        "403",
    }
)
_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})


def error_code(exc: ClientError) -> str:
    """The S3 error code of ``exc`` ("NoSuchKey", "PreconditionFailed", "404", ...)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def translate(
    exc: Exception, *, bucket: str, key: str | None, endpoint: str, attempts: int, first_contact: bool = False
) -> Exception:
    """The lakesink/builtin exception for a botocore error on ``s3://bucket/key``.

    Parameters
    ----------
    exc
        What botocore raised.
    bucket, key
        What was being accessed (``key`` None for bucket-level calls).
    endpoint
        The endpoint URL the client talks to (named when it cannot be reached).
    attempts
        How many attempts the client makes before giving up (named in connection errors).
    first_contact
        The request was a lake's opening one, which a connection error ends at once
        (:func:`end_unreachable_first_attempt`): the message says it was not retried.
    """
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    if isinstance(exc, ClientError):
        code = error_code(exc)
        message = exc.response.get("Error", {}).get("Message") or code
        if code == "NoSuchBucket":
            return TableNotFoundError(f"S3 bucket {bucket!r} does not exist (endpoint {endpoint}): {where}")
        if code in _NOT_FOUND:
            return FileNotFoundError(f"{where} does not exist")
        if code in _DENIED:
            return PermissionError(
                f"S3 denied access to {where} ({code}: {message}); check the credentials "
                "(storage_options key/secret/token, or the AWS environment/profile) and the "
                "bucket policy"
            )
        return StorageError(f"S3 request on {where} failed ({code}, HTTP {http_status(exc)}): {message}")
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return PermissionError(
            f"no usable AWS credentials for {where}: pass storage_options key/secret (and token), "
            "or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
        )
    if first_contact and isinstance(exc, BotoConnectionError):
        return StorageError(
            f"cannot reach the S3 endpoint {endpoint} for {where}: {type(exc).__name__} when opening "
            "the lake (not retried: a store that cannot be connected to at all is misconfigured or "
            "down). Check endpoint_url / AWS_ENDPOINT_URL and the network"
        )
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return StorageError(
            f"cannot reach the S3 endpoint {endpoint} for {where} after {attempts} attempt(s): "
            f"{type(exc).__name__}. Check endpoint_url / AWS_ENDPOINT_URL and the network; "
            "config_kwargs={'connect_timeout': ..., 'retries': {'max_attempts': ...}} tune the retries"
        )
    if isinstance(exc, BotoCoreError):
        return StorageError(f"S3 client error on {where}: {exc}")
    return exc


@contextmanager
def s3_errors(
    *, bucket: str, key: str | None, endpoint: str, attempts: int, first_contact: bool = False
) -> Iterator[None]:
    """Translate botocore errors raised in the block (see :func:`translate`), cause kept.

    Except for a store that cannot be reached: its cause is a chain of four socket-level
    exceptions (socket, urllib3, botocore) that says nothing the message does not, and a
    user then reads a hundred lines of traceback for one line of meaning.
    """
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        translated = translate(
            exc, bucket=bucket, key=key, endpoint=endpoint, attempts=attempts, first_contact=first_contact
        )
        if translated is exc:
            raise
        if isinstance(exc, BotoConnectionError):
            raise translated from None
        raise translated from exc


def describe(exc: Any) -> str:
    """A one-line description of a botocore error that is safe to log (no request details)."""
    if isinstance(exc, ClientError):
        return f"{error_code(exc)} (HTTP {http_status(exc)})"
    return type(exc).__name__


def end_unreachable_first_attempt(
    caught_exception: Exception | None = None, attempts: int = 0, **_: Any
) -> None:
    """A botocore ``needs-retry`` handler: a first attempt that could not connect ends the call.

    For the client that opens lakes (``S3Storage.read_bytes(..., first_contact=True)``). A
    connection refused, an unknown host, a connect timeout or a TLS failure on the very first
    request is a configuration error (a wrong endpoint_url, a store that is down), which
    botocore's retries only delay: 13-22 s with the default options. Raising here, before
    botocore sleeps, ends the call with the connection error itself. Anything else -- an
    answer, even a 503, or a connection reset after it was made -- is retried as usual, and
    so is a connection error after an attempt that reached the store.
    """
    if attempts == 1 and isinstance(caught_exception, BotoConnectionError):
        raise caught_exception
