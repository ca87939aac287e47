"""The storage seam: what the commit protocol needs from a filesystem or object store.

A backend gives four things: stage a file invisibly, publish it without clobbering, discard
it, and list/read/create-if-absent small files. Local disk and S3 implement it; the shared
backend test suite (tests/test_storage_contract.py) runs over every implementation.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow.fs


@dataclass(frozen=True)
class StoredFile:
    """A file (object) under the table root; ``name`` is relative, '/'-separated."""

    name: str
    size: int
    modified: float | None = None


@dataclass(frozen=True)
class PendingUpload:
    """An S3 multipart upload that is started but neither completed nor aborted."""

    name: str
    upload_id: str
    started: float
    parts: int
    bytes: int


@dataclass(frozen=True)
class Sealed:
    """A staged file whose bytes are all written and durable, waiting to be published.

    Small and picklable: in epoch mode it travels from an executor to the driver inside a
    commit message, and a fresh storage object on the driver publishes it.
    """

    name: str  # the final name, relative to the table root
    size: int


class StagedFile(Protocol):
    """A writable binary stream that nobody can see until it is sealed and published."""

    name: str

    def write(self, data: bytes | memoryview, /) -> int: ...

    def tell(self) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    def seal(self) -> Sealed:
        """Make every byte durable (fsync / last part uploaded); the file stays invisible."""
        ...

    def discard(self) -> None:
        """Drop the staged bytes (unlink / abort the upload). Safe to call more than once."""
        ...


class Storage(Protocol):
    """A table root on some storage, addressed by '/'-separated names relative to it."""

    url: str

    def stage(self, name: str) -> StagedFile:
        """Start an invisible staged file that :meth:`publish` will make visible as ``name``."""
        ...

    def publish(self, sealed: Sealed) -> bool:
        """Atomically make ``sealed`` visible under its name, never replacing an existing file.

        Returns False (and discards the staged data) when the name already exists: another
        attempt won the race, which for the caller is success.
        """
        ...

    def discard(self, sealed: Sealed) -> None:
        """Drop sealed-but-unpublished data. Safe to call more than once."""
        ...

    def exists(self, name: str) -> bool: ...

    def list(self, folder: str = "") -> list[StoredFile]:
        """The files directly in ``folder`` (not recursive), all pages of them."""
        ...

    def read_bytes(self, name: str) -> bytes:
        """The whole content of a small file; FileNotFoundError if it does not exist."""
        ...

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Create ``name`` with ``data`` atomically unless it exists; False if it existed."""
        ...

    def put(self, name: str, data: bytes) -> None:
        """Atomically create or replace ``name`` (only for hints that are safe to lose)."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name``; a missing file is not an error."""
        ...

    def pending_uploads(self, folder: str = "") -> builtins.list[PendingUpload]:
        """In-flight multipart uploads in ``folder`` (always empty where there are none)."""
        ...

    def abort_upload(self, upload: PendingUpload) -> None: ...

    def root_exists(self) -> bool:
        """Whether the table root exists at all (for "table not found" errors)."""
        ...

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A pyarrow filesystem and the base path that names are joined onto."""
        ...
