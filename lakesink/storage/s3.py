"""S3 backend: a staged file is a multipart upload to the final key; publishing completes it.

Why multipart and not "write a temp key, then rename": S3 has no rename (copy + delete is
neither atomic nor cheap), while a multipart upload is invisible until
CompleteMultipartUpload succeeds, and completing with ``If-None-Match: *`` never replaces an
existing object. So of several attempts at one key, exactly one completes; the others get
412 Precondition Failed and abort their uploads.

Each upload carries the attempt's id as object metadata (``x-amz-meta-lakesink-attempt``):
when a complete's answer is lost and the retry finds the key taken, that id says whether the
object there is ours (we won) or another attempt's (we lost). ETags cannot say it: two
attempts that wrote identical bytes have identical ETags.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from lakesink.errors import CommitError, StorageError
from lakesink.layout import new_attempt_id
from lakesink.storage.base import PendingUpload, Sealed, StoredFile
from lakesink.storage.s3errors import error_code, s3_errors

if TYPE_CHECKING:
    import boto3.session
    import pyarrow.fs

log = logging.getLogger(__name__)

MIN_PART_SIZE = 5 << 20  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 << 30
MAX_PARTS = 10_000
DEFAULT_PART_SIZE = 8 << 20
#: After every this many parts the part size doubles, so with the default part size a file
#: can grow to S3's 5 TiB object limit within 10,000 parts, while small files keep small
#: (memory-cheap) parts.
PARTS_PER_SIZE_STEP = 1_000
ATTEMPT_METADATA = "lakesink-attempt"
CONFLICT_RETRIES = 5

_OPTIONS = frozenset(
    {"endpoint_url", "key", "secret", "token", "profile", "client_kwargs", "config_kwargs", "part_size"}
)
_DEFAULT_CONFIG: dict[str, Any] = {
    "connect_timeout": 10,
    "read_timeout": 60,
    "retries": {"mode": "standard", "max_attempts": 5},
}


@dataclass(frozen=True)
class S3Sealed(Sealed):
    """A sealed multipart upload: every part uploaded, not completed. Holds no credentials."""

    upload_id: str
    attempt: str
    parts: tuple[tuple[int, str], ...]  # (part number, ETag), in order


def part_size_for(part_number: int, base: int) -> int:
    """The size of part ``part_number`` (1-based): ``base``, doubling every 1,000 parts."""
    return min(base << ((part_number - 1) // PARTS_PER_SIZE_STEP), MAX_PART_SIZE)


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix"); ValueError naming a bad URL."""
    parsed = urlparse(url)
    if parsed.scheme.lower() not in ("s3", "s3a"):
        raise ValueError(f"not an S3 URL (want s3://bucket/prefix): {url!r}")
    bucket = parsed.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ValueError(f"S3 URL {url!r} has no valid bucket name (want s3://bucket/prefix)")
    if parsed.query or parsed.fragment:
        raise ValueError(f"S3 URL {url!r} must not have a query or fragment")
    return bucket, parsed.path.strip("/")


class S3StagedFile:
    """A multipart upload being written: parts go up as the buffer fills (memory ~ one part)."""

    def __init__(self, storage: S3Storage, name: str) -> None:
        self.name = name
        self._storage = storage
        self._key = storage.key_of(name)
        self._attempt = new_attempt_id()
        self._base_part_size = storage.part_size
        self._buffer = bytearray()
        self._parts: list[tuple[int, str]] = []
        self._size = 0
        self._closed = False
        with storage.errors(self._key):
            self.upload_id: str = storage.client.create_multipart_upload(
                Bucket=storage.bucket, Key=self._key, Metadata={ATTEMPT_METADATA: self._attempt}
            )["UploadId"]

    def __repr__(self) -> str:
        return f"S3StagedFile(s3://{self._storage.bucket}/{self._key}, upload_id={self.upload_id!r})"

    def write(self, data: bytes | memoryview, /) -> int:
        if self._closed:
            raise ValueError(f"write to a sealed or discarded staged file {self._key!r}")
        n = memoryview(data).nbytes
        self._buffer += data
        self._size += n
        while len(self._buffer) >= self._next_part_size():
            size = self._next_part_size()
            self._upload_part(memoryview(self._buffer)[:size])
            del self._buffer[:size]
        return n

    def _next_part_size(self) -> int:
        return part_size_for(len(self._parts) + 1, self._base_part_size)

    def _upload_part(self, body: memoryview | bytes) -> None:
        number = len(self._parts) + 1
        if number > MAX_PARTS:
            raise StorageError(
                f"s3://{self._storage.bucket}/{self._key} would need more than {MAX_PARTS} parts "
                f"({self._size} bytes so far); raise storage_options part_size (now {self._base_part_size})"
            )
        with self._storage.errors(self._key):
            etag = self._storage.client.upload_part(
                Bucket=self._storage.bucket,
                Key=self._key,
                UploadId=self.upload_id,
                PartNumber=number,
                Body=bytes(body),
            )["ETag"]
        self._parts.append((number, etag))

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing to do: bytes go up a part at a time, and the last part at :meth:`seal`."""

    def close(self) -> None:
        """Called by pyarrow when its writer finishes; publication is :meth:`seal` + publish."""

    @property
    def closed(self) -> bool:
        return self._closed

    def seal(self) -> S3Sealed:
        if self._closed:
            raise ValueError(f"staged file {self._key!r} was already sealed or discarded")
        if self._buffer or not self._parts:  # an upload needs at least one part, even empty
            self._upload_part(bytes(self._buffer))
            self._buffer = bytearray()
        self._closed = True
        return S3Sealed(
            name=self.name,
            size=self._size,
            upload_id=self.upload_id,
            attempt=self._attempt,
            parts=tuple(self._parts),
        )

    def discard(self) -> None:
        self._closed = True
        self._buffer = bytearray()
        self._storage._abort(self._key, self.upload_id)


class S3Storage:
    """A table root ``s3://bucket/prefix`` on S3 (AWS, MinIO, moto, ...), through boto3.

    Parameters
    ----------
    url
        ``s3://bucket/prefix`` (``s3a://`` is accepted as a synonym).
    storage_options
        fsspec/s3fs-style options, all optional:

        ``endpoint_url``
            A non-AWS endpoint (MinIO, moto). ``AWS_ENDPOINT_URL(_S3)`` work too.
        ``key``, ``secret``, ``token``
            Credentials; without them boto3's chain (environment, profile, instance role)
            applies. They never appear in logs, errors or reprs.
        ``profile``
            A named profile from ``~/.aws/config``.
        ``client_kwargs``
            Extra ``boto3.client`` arguments, e.g. ``{"region_name": "eu-west-1"}``.
        ``config_kwargs``
            ``botocore.config.Config`` arguments, merged over lakesink's defaults
            (``connect_timeout=10``, ``read_timeout=60``, ``retries={"mode": "standard",
            "max_attempts": 5}``).
        ``part_size``
            Multipart part size in bytes (5 MiB .. 5 GiB, default 8 MiB): a writer holds about
            one part in memory. It doubles every 1,000 parts to stay within S3's 10,000.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        options = dict(storage_options or {})
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:  # name the options, never their values (they may be secrets)
            raise ValueError(
                f"unknown S3 storage_options {unknown} for {self.url}; known: {sorted(_OPTIONS)}"
            )
        part_size = options.pop("part_size", DEFAULT_PART_SIZE)
        if not isinstance(part_size, int) or not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ValueError(
                f"storage_options part_size must be an int from {MIN_PART_SIZE} (5 MiB) to "
                f"{MAX_PART_SIZE} (5 GiB) bytes, got {part_size!r}"
            )
        self.part_size: int = part_size
        for name in ("client_kwargs", "config_kwargs"):
            if not isinstance(options.get(name) or {}, Mapping):
                raise ValueError(f"storage_options {name} must be a dict, got {type(options[name]).__name__}")
        client_kwargs = dict(options.get("client_kwargs") or {})
        config_kwargs = dict(options.get("config_kwargs") or {})
        self._session_kwargs = _Redacted(
            {
                k: v
                for k, v in (
                    ("aws_access_key_id", options.get("key")),
                    ("aws_secret_access_key", options.get("secret")),
                    ("aws_session_token", options.get("token")),
                    ("profile_name", options.get("profile")),
                )
                if v is not None
            }
        )
        if options.get("endpoint_url"):
            client_kwargs["endpoint_url"] = options["endpoint_url"]
        self._client_kwargs = client_kwargs
        retries = {**_DEFAULT_CONFIG["retries"], **dict(config_kwargs.pop("retries", None) or {})}
        self._config_kwargs: dict[str, Any] = {**_DEFAULT_CONFIG, **config_kwargs, "retries": retries}
        self.attempts = int(retries.get("total_max_attempts") or retries.get("max_attempts") or 1)
        self._client: Any = None
        self._session: boto3.session.Session | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never shows storage_options: they may hold secrets
        return f"S3Storage({self.url!r})"

    # The client -------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The boto3 S3 client, created on first use (boto3 clients are thread-safe)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3.session
                    from botocore.config import Config

                    session = boto3.session.Session(**self._session_kwargs.value)
                    self._client = session.client(
                        "s3", config=Config(**self._config_kwargs), **self._client_kwargs
                    )
                    self._session = session
        return self._client

    @property
    def endpoint(self) -> str:
        """The endpoint URL the client talks to (after AWS_ENDPOINT_URL etc. are applied)."""
        return str(self.client.meta.endpoint_url)

    def errors(self, key: str | None) -> Any:
        """Context manager translating botocore errors on ``key`` (see ``s3errors``)."""
        return s3_errors(bucket=self.bucket, key=key, endpoint=self.endpoint, attempts=self.attempts)

    def key_of(self, name: str) -> str:
        if name.startswith("/") or "//" in name:
            raise ValueError(f"bad name {name!r}: names are relative, '/'-separated")
        return f"{self.prefix}/{name}" if self.prefix else name

    def _folder_prefix(self, folder: str) -> str:
        folder = folder.strip("/")
        return self.key_of(folder) + "/" if folder else (f"{self.prefix}/" if self.prefix else "")

    def _name_of(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    # Staging and publishing ---------------------------------------------------------------

    def stage(self, name: str) -> S3StagedFile:
        return S3StagedFile(self, name)

    def publish(self, sealed: Sealed) -> bool:
        """Complete the upload with ``If-None-Match: *``; False (upload aborted) if the key exists.

        Safe to call again after an answer was lost: an upload that already became the object
        counts as published. A 409 ConditionalRequestConflict (a concurrent write to the key
        still in progress) is retried, then reported as a CommitError.
        """
        if not isinstance(sealed, S3Sealed):
            raise TypeError(f"S3Storage.publish needs an S3Sealed, got {type(sealed).__name__}")
        key = self.key_of(sealed.name)
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in sealed.parts]
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                with self.errors(key):
                    try:
                        self.client.complete_multipart_upload(
                            Bucket=self.bucket,
                            Key=key,
                            UploadId=sealed.upload_id,
                            MultipartUpload={"Parts": parts},
                            IfNoneMatch="*",
                        )
                        return True
                    except ClientError as exc:
                        code = error_code(exc)
                        if code == "ConditionalRequestConflict":
                            raise _Conflict from exc
                        if code not in ("PreconditionFailed", "NoSuchUpload"):
                            raise
                        if self._is_ours(key, sealed):
                            return True  # a retry of a complete whose answer was lost
                        if code == "NoSuchUpload":
                            raise CommitError(
                                f"the multipart upload {sealed.upload_id} of s3://{self.bucket}/{key} "
                                "no longer exists: it was aborted (by the orphan sweep or a lifecycle "
                                "rule?) before it could be completed; the task must be retried"
                            ) from exc
                        self._abort(key, sealed.upload_id)  # S3 keeps a 412'd upload open
                        return False
            except _Conflict as conflict:
                if attempt == CONFLICT_RETRIES:
                    raise CommitError(
                        f"completing s3://{self.bucket}/{key} kept conflicting with a concurrent "
                        f"write (409 ConditionalRequestConflict, {CONFLICT_RETRIES + 1} tries); "
                        "the staged upload is left for discard()"
                    ) from conflict.__cause__
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _is_ours(self, key: str, sealed: S3Sealed) -> bool:
        """Whether the object at ``key`` is the completion of ``sealed``'s upload."""
        try:
            with self.errors(key):
                head = self.client.head_object(Bucket=self.bucket, Key=key)
        except FileNotFoundError:
            return False
        return bool(head.get("Metadata", {}).get(ATTEMPT_METADATA) == sealed.attempt)

    def discard(self, sealed: Sealed) -> None:
        if not isinstance(sealed, S3Sealed):
            raise TypeError(f"S3Storage.discard needs an S3Sealed, got {type(sealed).__name__}")
        self._abort(self.key_of(sealed.name), sealed.upload_id)

    def _abort(self, key: str, upload_id: str) -> None:
        """Abort an upload; one that is already gone (aborted or completed) is fine."""
        with self.errors(key):
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except ClientError as exc:
                if error_code(exc) != "NoSuchUpload":
                    raise

    # Small files --------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        key = self.key_of(name)
        try:
            with self.errors(key):
                self.client.head_object(Bucket=self.bucket, Key=key)
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, name: str) -> bytes:
        key = self.key_of(name)
        with self.errors(key):
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """``PutObject`` with ``If-None-Match: *``: False when the key exists (412)."""
        key = self.key_of(name)
        for attempt in range(CONFLICT_RETRIES + 1):
            with self.errors(key):
                try:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                    return True
                except ClientError as exc:
                    code = error_code(exc)
                    if code == "PreconditionFailed":
                        return False
                    if code != "ConditionalRequestConflict" or attempt == CONFLICT_RETRIES:
                        raise
            time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def put(self, name: str, data: bytes) -> None:
        key = self.key_of(name)
        with self.errors(key):
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def delete(self, name: str) -> None:
        key = self.key_of(name)
        with self.errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    # Listing ------------------------------------------------------------------------------

    def list(self, folder: str = "") -> list[StoredFile]:
        prefix = self._folder_prefix(folder)
        found = []
        with self.errors(prefix or None):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/"
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    if obj["Key"].endswith("/"):
                        continue  # a "folder marker" some tools create, not a file
                    found.append(
                        StoredFile(
                            self._name_of(obj["Key"]), int(obj["Size"]), obj["LastModified"].timestamp()
                        )
                    )
        return found

    def _uploads(self, prefix: str, delimiter: str | None) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        with self.errors(prefix or None):
            for page in self.client.get_paginator("list_multipart_uploads").paginate(**kwargs):
                yield from page.get("Uploads", ())

    def pending_uploads(self, folder: str = "") -> builtins.list[PendingUpload]:
        """In-flight multipart uploads directly in ``folder``, with their parts and bytes so far."""
        found = []
        for upload in self._uploads(self._folder_prefix(folder), "/"):
            key, upload_id = upload["Key"], upload["UploadId"]
            parts = size = 0
            try:
                with self.errors(key):
                    pages = self.client.get_paginator("list_parts").paginate(
                        Bucket=self.bucket, Key=key, UploadId=upload_id
                    )
                    for page in pages:
                        for part in page.get("Parts", ()):
                            parts += 1
                            size += int(part["Size"])
            except FileNotFoundError:
                continue  # completed or aborted while we listed
            found.append(
                PendingUpload(self._name_of(key), upload_id, upload["Initiated"].timestamp(), parts, size)
            )
        return found

    def abort_upload(self, upload: PendingUpload) -> None:
        self._abort(self.key_of(upload.name), upload.upload_id)

    def root_exists(self) -> bool:
        """The bucket exists and, for a prefix, something (an object or an upload) is under it."""
        try:
            with self.errors(None):
                self.client.head_bucket(Bucket=self.bucket)
        except FileNotFoundError:
            return False
        if not self.prefix:
            return True
        prefix = f"{self.prefix}/"
        with self.errors(prefix):
            listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1)
        if listed.get("KeyCount", 0) > 0:
            return True
        return next(iter(self._uploads(prefix, None)), None) is not None

    # Reading with pyarrow -----------------------------------------------------------------

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A ``pyarrow.fs.S3FileSystem`` with this storage's endpoint, region and credentials.

        Credentials come from the same boto3 session the writer uses (so profiles and roles
        resolve the same way), frozen at this call: temporary credentials are not refreshed.
        """
        from pyarrow.fs import S3FileSystem

        client = self.client
        assert self._session is not None
        kwargs: dict[str, Any] = {"region": client.meta.region_name or "us-east-1"}
        credentials = self._session.get_credentials()
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            kwargs.update(access_key=frozen.access_key, secret_key=frozen.secret_key)
            if frozen.token:
                kwargs["session_token"] = frozen.token
        else:
            kwargs["anonymous"] = True
        endpoint = urlparse(self.endpoint)
        if not (endpoint.hostname or "").endswith(".amazonaws.com"):
            kwargs["endpoint_override"] = endpoint.netloc + endpoint.path.rstrip("/")
            kwargs["scheme"] = endpoint.scheme or "https"
        connect = self._config_kwargs.get("connect_timeout")
        if isinstance(connect, int | float):
            kwargs["connect_timeout"] = float(connect)
        read = self._config_kwargs.get("read_timeout")
        if isinstance(read, int | float):
            kwargs["request_timeout"] = float(read)
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return S3FileSystem(**kwargs), base


class _Redacted:
    """Holds credentials; its repr hides them (so does ``repr(vars(storage))``)."""

    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<redacted>"


class _Conflict(Exception):
    """Internal: a 409 ConditionalRequestConflict that publish retries."""
