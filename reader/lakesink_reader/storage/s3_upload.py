"""S3 staging: a staged file is a multipart upload to its final key, written part by part.

``S3StagedFile`` is the writer side of ``S3Storage.stage``: a staging marker first, then the
upload; parts go up in the background while the caller encodes the next one; ``seal`` hands
back an ``S3Sealed`` token that ``S3Storage.publish`` completes. Part sizes double every 1,000
parts so that a file can reach S3's 5 TiB object limit within its 10,000 parts.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink_reader.errors import StorageError
from lakesink_reader.names import STAGING_DIR, new_attempt_id
from lakesink_reader.storage.base import Sealed
from lakesink_reader.storage.options import MAX_PART_SIZE

if TYPE_CHECKING:
    from lakesink_reader.storage.s3 import S3Storage

MAX_PARTS = 10_000
#: After every this many parts the part size doubles, so with the default part size a file
#: can grow to S3's 5 TiB object limit within 10,000 parts, while small files keep small
#: (memory-cheap) parts.
PARTS_PER_SIZE_STEP = 1_000
ATTEMPT_METADATA = "lakesink-attempt"  # the attempt id, as object metadata (see s3.py)


@dataclass(frozen=True)
class S3Sealed(Sealed):
    """A sealed multipart upload: every part uploaded, not completed. Holds no credentials."""

    upload_id: str
    attempt: str
    parts: tuple[tuple[int, str], ...]  # (part number, ETag), in order
    retried_create: bool = False  # see S3StagedFile: a lost answer may have left a twin upload


def part_size_for(part_number: int, base: int) -> int:
    """The size of part ``part_number`` (1-based): ``base``, doubling every 1,000 parts."""
    return min(base << ((part_number - 1) // PARTS_PER_SIZE_STEP), MAX_PART_SIZE)


def marker_name(name: str, attempt: str) -> str:
    return f"{STAGING_DIR}/{name}.{attempt}"


class S3StagedFile:
    """A multipart upload being written.

    Parts go up in the background while the caller encodes the next one: at most
    ``parts_in_flight`` parts are in the air, so memory stays about
    ``(2 * parts_in_flight + 1) * part size``: the part being filled, and each part uploading
    with the copy botocore makes of it (measured with tracemalloc by tests/test_s3.py).
    """

    def __init__(self, storage: S3Storage, name: str) -> None:
        self.name = name
        self._storage = storage
        self._key = storage.key_of(name)
        self._attempt = new_attempt_id()
        self._marker = marker_name(name, self._attempt)
        self._base_part_size = storage.part_size
        self._buffer = bytearray()
        self._next_part = 1
        self._uploading: list[Future[tuple[int, str]]] = []
        self._slots = threading.BoundedSemaphore(storage.parts_in_flight)
        self._size = 0
        self._closed = False
        # The marker first: whatever happens next, a sweep can find this upload by it.
        storage.put(self._marker, json.dumps({"name": name, "attempt": self._attempt}).encode())
        with storage.errors(self._key):
            created = storage.client.create_multipart_upload(
                Bucket=storage.bucket, Key=self._key, Metadata={ATTEMPT_METADATA: self._attempt}
            )
        self.upload_id: str = created["UploadId"]
        # A create that botocore retried may have started an upload whose answer was lost: a
        # twin of this one that nobody would ever complete or abort. Remembered, so that the
        # publish or discard of this file aborts it too.
        self._retried_create = int(created.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0

    def __repr__(self) -> str:
        return f"S3StagedFile(s3://{self._storage.bucket}/{self._key}, upload_id={self.upload_id!r})"

    def write(self, data: bytes | memoryview, /) -> int:
        if self._closed:
            raise ValueError(f"write to a sealed or discarded staged file {self._key!r}")
        n = memoryview(data).nbytes
        self._buffer += data
        self._size += n
        while len(self._buffer) >= self._next_part_size():
            # The full buffer itself becomes the part (no copy of it); only what spills over
            # the part size is copied into the next buffer.
            size = self._next_part_size()
            part, self._buffer = self._buffer, bytearray(memoryview(self._buffer)[size:])
            del part[size:]
            self._upload_part(part)
        return n

    def _next_part_size(self) -> int:
        return part_size_for(self._next_part, self._base_part_size)

    def _upload_part(self, body: bytes | bytearray) -> None:
        number = self._next_part
        if number > MAX_PARTS:
            raise StorageError(
                f"s3://{self._storage.bucket}/{self._key} would need more than {MAX_PARTS} parts "
                f"({self._size} bytes so far); raise storage_options part_size (now {self._base_part_size})"
            )
        self._raise_failed_part()
        self._slots.acquire()  # blocks while parts_in_flight parts are uploading
        try:
            future = self._storage.pool.submit(self._put_part, number, body)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        self._uploading.append(future)
        self._next_part += 1

    def _put_part(self, number: int, body: bytes | bytearray) -> tuple[int, str]:
        storage = self._storage
        with storage.errors(self._key):
            etag = storage.client.upload_part(
                Bucket=storage.bucket, Key=self._key, UploadId=self.upload_id, PartNumber=number, Body=body
            )["ETag"]
        return number, str(etag)

    def _raise_failed_part(self) -> None:
        for future in self._uploading:
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]

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
        if self._buffer or self._next_part == 1:  # an upload needs at least one part, even empty
            # The buffer itself becomes the last part, as in write (no copy of it: a file smaller
            # than a part is all buffer); nothing writes to it after the seal.
            last, self._buffer = self._buffer, bytearray()
            self._upload_part(last)
        parts = sorted(future.result() for future in self._uploading)  # raises a failed part's error
        self._closed = True
        return S3Sealed(
            name=self.name,
            size=self._size,
            upload_id=self.upload_id,
            attempt=self._attempt,
            parts=tuple(parts),
            retried_create=self._retried_create,
        )

    def discard(self) -> None:
        self._closed = True
        self._buffer = bytearray()
        for future in self._uploading:  # let parts in the air land before the abort
            future.exception()
        self._storage._abort(self._key, self.upload_id)
        if self._retried_create:
            self._storage._abort_twins(self._key, self.upload_id)
        self._storage.delete(self._marker)
