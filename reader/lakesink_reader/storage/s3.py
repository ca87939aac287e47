"""S3 backend: a staged file is a multipart upload to the final key; publishing completes it.

Why multipart and not "write a temp key, then rename": S3 has no rename (copy + delete is
neither atomic nor cheap), while a multipart upload is invisible until
CompleteMultipartUpload succeeds, and completing with ``If-None-Match: *`` never replaces an
existing object. So of several attempts at one key exactly one completes; the others get
412 Precondition Failed, and their caller discards their uploads (or, in foreach mode,
supersedes a truncated file: ``If-Match`` on the complete).

This module is ``S3Storage``: the whole storage seam for S3, one short method per operation
(about 480 lines, over the usual 400 because the seam has that many operations); the upload
writer is ``s3_upload``, error translation ``s3errors``, option checks ``options``.

Answers get lost, and botocore retries. Each upload carries the attempt's id as object
metadata (``x-amz-meta-lakesink-attempt``): when a complete's answer is lost and the retry
finds the key taken, that id says whether the object is ours (we won) or another attempt's.
ETags cannot say it: attempts that wrote identical bytes have identical ETags. A
create-if-absent ``PutObject`` whose retry answers 412 reads the object back and compares.

Staging markers. Before an upload starts, a small object ``_lakesink/staging/<name>.<attempt>``
is written, and it is deleted once the upload is completed or aborted. The markers are how
staged data is found (``staged()``): MinIO answers ListMultipartUploads only for an exact key
prefix, so a sweep cannot find uploads by listing a folder there; and a marker's
LastModified is when staging began (a multipart object's own LastModified is not, and moto
reports every upload as started in 2010). Uploads without a marker (started by lakesink
before 0.2) are found by listing uploads by prefix, where the store supports it.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from botocore.exceptions import ClientError

from lakesink_reader.errors import CommitError, StorageError, quietly
from lakesink_reader.names import STAGING_DIR
from lakesink_reader.redact import redacted
from lakesink_reader.storage.base import (
    Sealed,
    StagedEntry,
    StoredFile,
    check_put_if_absent,
    checked_name,
    expect_sealed,
)
from lakesink_reader.storage.options import check_endpoint, s3_client_settings, shown_url
from lakesink_reader.storage.s3_upload import ATTEMPT_METADATA, S3Sealed, S3StagedFile, marker_name
from lakesink_reader.storage.s3errors import end_unreachable_first_attempt, error_code, s3_errors

if TYPE_CHECKING:
    import boto3.session
    import pyarrow.fs

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix"); ValueError naming a bad URL."""
    parsed = urlparse(url)
    if parsed.scheme.lower() not in ("s3", "s3a"):
        raise ValueError(f"not an S3 URL (want s3://bucket/prefix): {redacted(url)!r}")
    bucket = parsed.netloc
    if not bucket or "@" in bucket or ":" in bucket:
        raise ValueError(f"S3 URL {redacted(url)!r} has no valid bucket name (want s3://bucket/prefix)")
    if parsed.query or parsed.fragment:
        raise ValueError(f"S3 URL {redacted(url)!r} must not have a query or fragment")
    return bucket, parsed.path.strip("/")


class S3Storage:
    """A table root ``s3://bucket/prefix`` on S3 (AWS, MinIO, moto, ...), through boto3.

    Parameters
    ----------
    url
        ``s3://bucket/prefix`` (``s3a://`` is accepted as a synonym).
    storage_options
        fsspec/s3fs-style options, all optional; see :mod:`lakesink_reader.storage.options`.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        settings = s3_client_settings(storage_options, self.url)
        self.part_size: int = settings.part_size
        self.parts_in_flight: int = settings.parts_in_flight
        self.attempts: int = settings.attempts
        self._settings = settings
        self._client: Any = None
        self._opening_client: Any = None
        self._session: boto3.session.Session | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never shows storage_options: they may hold secrets
        return f"S3Storage({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_client=None, _opening_client=None, _session=None, _pool=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # The client -------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The boto3 S3 client, created on first use (boto3 clients are thread-safe)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    # Here, not at the top: boto3's session and botocore's config (280 modules,
                    # 0.2 CPU-s) wait for the first request; opening the storage needs neither.
                    import boto3.session
                    from botocore.config import Config

                    session = boto3.session.Session(**self._settings.session_kwargs.value)
                    client = session.client(
                        "s3", config=Config(**self._settings.config_kwargs), **self._settings.client_kwargs
                    )
                    # The endpoint_url option is checked; one from the environment or a profile
                    # (AWS_ENDPOINT_URL) is checked here, before any request could show it.
                    where = f"the S3 endpoint of {self.url} (from AWS_ENDPOINT_URL?)"
                    check_endpoint(str(client.meta.endpoint_url), where)
                    self._client = client
                    self._session = session
        return self._client

    @property
    def opening_client(self) -> Any:
        """A client like :attr:`client` whose first attempt at a request ends it if it cannot connect.

        Used for the request that opens a lake (``read_bytes(..., first_contact=True)``); see
        ``s3errors.end_unreachable_first_attempt``. A client of its own, so that the running
        writers' requests keep every retry. Cheap: the session's parsed service model is shared.
        """
        if self._opening_client is None:
            self.client  # noqa: B018 - builds the session first (taking the lock itself)
            with self._lock:
                if self._opening_client is None:
                    # Here, not at the top: botocore's config (150 modules), as in ``client``.
                    from botocore.config import Config

                    assert self._session is not None
                    opening = self._session.client(
                        "s3", config=Config(**self._settings.config_kwargs), **self._settings.client_kwargs
                    )
                    opening.meta.events.register_first("needs-retry.s3", end_unreachable_first_attempt)
                    self._opening_client = opening
        return self._opening_client

    @property
    def pool(self) -> ThreadPoolExecutor:
        """Threads that upload parts in the background (shared by this storage's staged files)."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max(2, self.parts_in_flight), thread_name_prefix="lakesink-s3-part"
                    )
        return self._pool

    @property
    def endpoint(self) -> str:
        """The endpoint URL the client talks to (after AWS_ENDPOINT_URL etc. are applied), as
        messages show it: without a user name or password (an ``AWS_ENDPOINT_URL`` may hold
        them; ``endpoint_url`` is refused with them)."""
        return shown_url(str(self.client.meta.endpoint_url))

    def errors(self, key: str | None, *, first_contact: bool = False) -> Any:
        """Context manager translating botocore errors on ``key`` (see ``s3errors``)."""
        return s3_errors(
            bucket=self.bucket,
            key=key,
            endpoint=self.endpoint,
            attempts=self.attempts,
            first_contact=first_contact,
        )

    def key_of(self, name: str) -> str:
        checked_name(self, name)  # never '..', never absolute: no key outside the lake's prefix
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
        """Complete the upload with ``If-None-Match: *``; False (upload kept) if the key is taken.

        Safe to call again after an answer was lost: an upload that already became the object
        counts as published. A 409 ConditionalRequestConflict (a concurrent conditional write
        to the key) means, as AWS documents, that this upload cannot complete any more: it is
        aborted and a CommitError asks for the data to be uploaded again (Spark retries the task).
        """
        s3 = expect_sealed(sealed, S3Sealed, self)
        return self._complete(s3, {"IfNoneMatch": "*"})

    def version(self, name: str) -> str | None:
        key = self.key_of(name)
        try:
            with self.errors(key):
                return str(self.client.head_object(Bucket=self.bucket, Key=key)["ETag"])
        except FileNotFoundError:
            return None

    def supersede(self, sealed: Sealed, version: str) -> bool:
        """Complete the upload over the object at its key, ``If-Match`` its ETag (``version``).

        AWS honours If-Match on CompleteMultipartUpload; a store that ignores it (moto 5.2)
        turns this into an unconditional atomic replace.
        """
        s3 = expect_sealed(sealed, S3Sealed, self)
        return self._complete(s3, {"IfMatch": version})

    def _complete(self, s3: S3Sealed, condition: dict[str, str]) -> bool:
        key = self.key_of(s3.name)
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in s3.parts]
        done = False
        try:
            with self.errors(key):
                try:
                    self.client.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=s3.upload_id,
                        MultipartUpload={"Parts": parts},
                        **condition,
                    )
                    done = True
                except ClientError as exc:
                    code = error_code(exc)
                    if code not in ("PreconditionFailed", "NoSuchUpload", "ConditionalRequestConflict"):
                        raise
                    if self._is_ours(key, s3):
                        done = True  # a retry of a complete whose answer was lost
                    elif code == "NoSuchUpload":
                        raise CommitError(
                            f"the multipart upload {s3.upload_id} of s3://{self.bucket}/{key} no longer "
                            "exists: it was aborted (by the orphan sweep or a lifecycle rule?) before it "
                            "could be completed; the task must be retried"
                        ) from exc
                    elif code == "ConditionalRequestConflict":
                        quietly(lambda: self._abort(key, s3.upload_id), f"abort upload of {key}")
                        done = True  # nothing is left to discard: the marker goes below
                        raise CommitError(
                            f"completing s3://{self.bucket}/{key} conflicted with a concurrent write "
                            "(409 ConditionalRequestConflict): the upload was aborted and its data must "
                            "be uploaded again; the task will be retried"
                        ) from exc
            return done  # False: the condition failed, and S3 keeps such an upload open for us
        finally:
            if done:
                if s3.retried_create:
                    quietly(lambda: self._abort_twins(key, s3.upload_id), f"abort twin uploads of {key}")
                quietly(
                    lambda: self.delete(marker_name(s3.name, s3.attempt)), f"delete staging marker of {key}"
                )

    def _is_ours(self, key: str, sealed: S3Sealed) -> bool:
        """Whether the object at ``key`` is the completion of ``sealed``'s upload."""
        try:
            with self.errors(key):
                head = self.client.head_object(Bucket=self.bucket, Key=key)
        except FileNotFoundError:
            return False
        return bool(head.get("Metadata", {}).get(ATTEMPT_METADATA) == sealed.attempt)

    def discard(self, sealed: Sealed) -> None:
        s3 = expect_sealed(sealed, S3Sealed, self)
        self._abort(self.key_of(s3.name), s3.upload_id)
        if s3.retried_create:
            self._abort_twins(self.key_of(s3.name), s3.upload_id)
        self.delete(marker_name(s3.name, s3.attempt))

    def _abort_twins(self, key: str, upload_id: str) -> None:
        """Abort the other open uploads of ``key``: twins left by a retried create.

        In epoch mode a key belongs to one attempt, so every other upload of it is such a
        twin. In foreach mode another attempt at the same (partition, epoch) may be uploading
        too; it loses the race to the file this attempt published (or discarded) anyway, and
        now fails a little earlier.
        """
        self._abort_uploads(key, keep=upload_id)

    def _abort_uploads(self, key: str, *, keep: str | None = None) -> None:
        """Abort every open upload of exactly ``key`` (listing by prefix also finds longer keys)."""
        for upload in self._uploads(key, None):
            if upload["Key"] == key and upload["UploadId"] != keep:
                self._abort(key, upload["UploadId"])

    def _abort(self, key: str, upload_id: str) -> None:
        """Abort an upload; one that is already gone (aborted or completed) is fine."""
        with self.errors(key):
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except ClientError as exc:
                if error_code(exc) != "NoSuchUpload":
                    raise

    def staged(self, folder: str = "") -> builtins.list[StagedEntry]:
        """Open uploads of ``folder``: by their staging markers, and by listing where the store can.

        The uploads are listed *before* the markers: a writer puts its marker before it creates
        its upload, so an upload listed here has its marker in the later listing for as long as
        the upload is open. An upload listed without a marker (an empty ``handle``) is therefore
        no live writer's: a twin a lost answer left, or one whose writer was killed.
        """
        found: dict[str, StagedEntry] = {}
        prefix = self._folder_prefix(folder)
        # Only ``folder``'s own uploads: moto ignores the delimiter and lists deeper keys too.
        uploads = [u for u in self._uploads(prefix, "/") if "/" not in u["Key"][len(prefix) :]]
        inner = folder.strip("/")
        # The markers of names in ``folder`` are in the same folder under STAGING_DIR.
        for marker in self.list(f"{STAGING_DIR}/{inner}" if inner else STAGING_DIR):
            name, _, attempt = marker.name[len(STAGING_DIR) + 1 :].rpartition(".")
            if not name or not attempt:
                continue
            seen = found.get(name)
            # Several attempts at one name (foreach mode): the youngest decides its age.
            started = max(filter(None, (marker.modified, seen.started if seen else None)), default=None)
            handles = f"{seen.handle}\n{marker.name}" if seen else marker.name
            found[name] = StagedEntry(name, "multipart_upload", started, None, handles)
        for upload in uploads:
            name = self._name_of(upload["Key"])
            if name not in found:
                found[name] = StagedEntry(name, "multipart_upload", upload["Initiated"].timestamp(), None, "")
        return builtins.list(found.values())

    def drop_staged(self, entry: StagedEntry) -> None:
        """Abort every open upload of ``entry.name`` (found by its exact key), then drop its markers."""
        self._abort_uploads(self.key_of(entry.name))
        for marker in filter(None, entry.handle.split("\n")):
            self.delete(marker)

    # Small files --------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        return self.version(name) is not None

    def refuse_link(self, name: str) -> None:
        checked_name(self, name)  # an object store has no links

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        key = self.key_of(name)
        client = self.opening_client if first_contact else self.client
        ranged = {} if limit is None else {"Range": f"bytes=0-{limit - 1}"}
        with self.errors(key, first_contact=first_contact):
            try:
                body = client.get_object(Bucket=self.bucket, Key=key, **ranged)["Body"]
            except ClientError as exc:
                if ranged and error_code(exc) == "InvalidRange":
                    return b""  # an empty object has no first byte to range over (416)
                raise
            try:
                return bytes(body.read())
            finally:
                body.close()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """``PutObject`` with ``If-None-Match: *``; on 412, True only if the object holds ``data``."""
        key = self.key_of(name)
        for attempt in range(CONFLICT_RETRIES + 1):
            with self.errors(key):
                try:
                    self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
                    return True
                except ClientError as exc:
                    code = error_code(exc)
                    if code == "PreconditionFailed":
                        break
                    # 409: a concurrent conditional write to the key; AWS says to retry.
                    if code != "ConditionalRequestConflict" or attempt == CONFLICT_RETRIES:
                        raise
            time.sleep(0.05 * 2**attempt)
        try:
            # our own earlier try, whose answer was lost? (at most one byte more than ours: see
            # base.put_if_absent_by_publish)
            return self.read_bytes(name, limit=len(data) + 1) == data
        except FileNotFoundError:
            return False

    def put(self, name: str, data: bytes) -> None:
        key = self.key_of(name)
        with self.errors(key):
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def delete(self, name: str) -> None:
        key = self.key_of(name)
        with self.errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    # Listing ------------------------------------------------------------------------------

    def list(self, folder: str = "") -> builtins.list[StoredFile]:
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

    def folders(self, folder: str = "") -> builtins.list[str]:
        prefix = self._folder_prefix(folder)
        found: builtins.list[str] = []
        with self.errors(prefix or None):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix, Delimiter="/"
            )
            for page in pages:
                found.extend(self._name_of(p["Prefix"].rstrip("/")) for p in page.get("CommonPrefixes", ()))
        return found

    def _uploads(self, prefix: str, delimiter: str | None) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        with self.errors(prefix or None):
            for page in self.client.get_paginator("list_multipart_uploads").paginate(**kwargs):
                yield from page.get("Uploads", ())

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

    def check_conditional_writes(self, name: str) -> None:
        """Probe that ``If-None-Match: *`` is honoured by PutObject and CompleteMultipartUpload.

        A store that ignores the header would let a second attempt silently replace a
        published file or a commit record (last writer wins): exactly-once cannot hold there,
        so the writer is refused when it creates a table. Costs six requests, once per table.
        """
        key = self.key_of(name)
        advice = (
            f"the S3 endpoint {self.endpoint} does not honour If-None-Match: * on {{}}, so a "
            "retried or concurrent write could silently replace committed data; lakesink cannot "
            "write exactly once there. Use a store with conditional writes (AWS S3, MinIO >= 2024)"
        )
        try:
            check_put_if_absent(self, name, f"object {key}", advice.format("PutObject"))
            staged = self.stage(name)
            staged.write(b"3")
            sealed = staged.seal()
            try:
                honoured = not self._complete(sealed, {"IfNoneMatch": "*"})  # False: a 412, as it must
            finally:
                quietly(lambda: self.discard(sealed), f"abort probe upload {key}")
            if not honoured:
                raise StorageError(advice.format("CompleteMultipartUpload"))
        finally:
            quietly(lambda: self.delete(name), f"delete probe object {key}")

    # Reading with pyarrow -----------------------------------------------------------------

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A ``pyarrow.fs.S3FileSystem`` with this storage's endpoint, region and credentials.

        Credentials come from the same boto3 session the writer uses (so profiles and roles
        resolve the same way), frozen at this call: temporary credentials are not refreshed.
        """
        # Here, not at the top: the storage backends load no pyarrow; only reads need it.
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
            # Never the user info: pyarrow gets the credentials as access_key / secret_key.
            kwargs["endpoint_override"] = endpoint.netloc.rpartition("@")[2] + endpoint.path.rstrip("/")
            kwargs["scheme"] = endpoint.scheme or "https"
        connect = self._settings.config_kwargs.get("connect_timeout")
        if isinstance(connect, int | float):
            kwargs["connect_timeout"] = float(connect)
        read = self._settings.config_kwargs.get("read_timeout")
        if isinstance(read, int | float):
            kwargs["request_timeout"] = float(read)
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return S3FileSystem(**kwargs), base
