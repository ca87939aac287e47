"""The storage seam: what the commit protocol needs from a filesystem or object store.

A backend stages a file invisibly, publishes it without clobbering, discards it; lists,
reads and creates small files (create-if-absent); and lists and drops staged data that
crashed writers left. Every operation means the same on every backend; the shared suite
(``lakesink.storage_contract``) runs over each implementation.

Every write here may be retried after a lost answer (by botocore, or by NFS retransmitting a
``link``): each operation says what it returns when an earlier try of the same call already
succeeded.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from lakesink_reader.errors import CorruptFileError, StorageError, quietly
from lakesink_reader.names import NAME_RULE, unsafe_name

if TYPE_CHECKING:
    import pyarrow.fs


@dataclass(frozen=True)
class StoredFile:
    """A file (object) under the table root; ``name`` is relative, '/'-separated."""

    name: str
    size: int
    modified: float | None = None


@dataclass(frozen=True)
class Sealed:
    """A staged file whose bytes are all written and durable, waiting to be published.

    Small and picklable. Each backend subclasses it with what its publish needs.
    """

    name: str  # the final name, relative to the table root
    size: int


@dataclass(frozen=True)
class StagedEntry:
    """Staged data found in storage: a local ``.uncommitted`` file or an S3 upload never completed.

    ``name`` is the name it would be published as; ``started`` when staging began (seconds
    since the epoch; None when unknown); ``handle`` is the backend's own reference to it.
    """

    name: str
    kind: str  # "staged_file" | "multipart_upload"
    started: float | None
    size: int | None
    handle: str


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
        """Drop the staged bytes (unlink / abort the upload). Safe at any point, more than once."""
        ...


class Storage(Protocol):
    """A table root on some storage, addressed by '/'-separated names relative to it."""

    url: str

    def stage(self, name: str) -> StagedFile:
        """Start an invisible staged file that :meth:`publish` will make visible as ``name``."""
        ...

    def publish(self, sealed: Sealed) -> bool:
        """Atomically make ``sealed`` visible under its name, never replacing an existing file.

        True when ``sealed`` is what now stands under the name -- also when an earlier try of
        this publish succeeded and its answer was lost. False when another attempt's file
        stands there; the staged data is kept, for the caller to :meth:`discard` or to
        :meth:`supersede` the other file with.
        """
        ...

    def version(self, name: str) -> str | None:
        """A token that changes whenever the file ``name`` is replaced; None if it does not exist."""
        ...

    def supersede(self, sealed: Sealed, version: str) -> bool:
        """Atomically replace the file at ``sealed.name`` with ``sealed``, only if it is still ``version``.

        A compare-and-swap: False (the staged data kept) when the file changed meanwhile.
        Readers see the old file or the new one, never neither and never both.
        """
        ...

    def discard(self, sealed: Sealed) -> None:
        """Drop sealed-but-unpublished data. Safe to call more than once."""
        ...

    def staged(self, folder: str = "") -> builtins.list[StagedEntry]:
        """Staged data of ``folder`` (not recursive), however its writer died."""
        ...

    def drop_staged(self, entry: StagedEntry) -> None:
        """Remove staged data found by :meth:`staged`; data already gone is not an error."""
        ...

    def exists(self, name: str) -> bool: ...

    def refuse_link(self, name: str) -> None:
        """CorruptFileError naming ``name`` when it, or a folder it is in, is a symbolic link
        (followed, it could lead outside the lake: docs/FORMAT.md, "Trust"). For files opened
        through :meth:`arrow_filesystem`, which follows links; the backend's own reads and
        writes refuse links by themselves. Object stores have no links: nothing to do."""
        ...

    def list(self, folder: str = "") -> builtins.list[StoredFile]:
        """The files directly in ``folder`` (not recursive), all pages of them."""
        ...

    def folders(self, folder: str = "") -> builtins.list[str]:
        """The folders directly in ``folder`` (relative to the root, no trailing '/'), all pages
        of them: a partitioned lake's partition folders are found so. On an object store, a
        folder is a common prefix of keys; none when ``folder`` is missing."""
        ...

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        """The whole content of a small file; FileNotFoundError if it does not exist.

        ``limit`` (>= 1): only the first ``limit`` bytes, or the whole file when it is shorter --
        one ``read`` of a local file, one ranged GET on S3. The v3 log reads its commits' header
        lines so, without their actions.

        ``first_contact``: this read opens a lake -- a reader, a maintenance command, a query
        starting -- and is the first request that reaches the storage. A storage that cannot
        be connected to at all then fails at once: at start-up that is a configuration error,
        and retrying it only delays the message. The requests of a running query keep every
        retry (a store restarting refuses connections for a while too).
        """
        ...

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Create ``name`` with ``data`` atomically unless it exists.

        True when ``name`` now holds ``data``: created now, or by an earlier try whose answer
        was lost (the existing bytes are read back and compared). False when it holds other
        bytes. Callers make ``data`` unique (a commit id, a table id), so that equal bytes
        can only be their own write.
        """
        ...

    def put(self, name: str, data: bytes) -> None:
        """Atomically create or replace ``name`` (only for hints that are safe to lose)."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name``; a missing file is not an error."""
        ...

    def root_exists(self) -> bool:
        """Whether the table root exists at all (for "table not found" errors)."""
        ...

    def check_conditional_writes(self, name: str) -> None:
        """Raise StorageError if this storage would silently overwrite a create-if-absent write.

        The probe writes (and removes) temporary objects at ``name``, which the caller picks
        (the lake's layout: ``lakesink_reader.format.table.probe_store``)."""
        ...

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A pyarrow filesystem and the base path that names are joined onto."""
        ...


def checked_name(storage: Storage, name: str) -> str:
    """``name`` when it is a name a lake may hold: the storage's second line of defence behind
    the lake's name rule (``lakesink_reader.names``), so that no backend joins ``..`` or
    an absolute name onto its root. CorruptFileError naming the storage otherwise."""
    if name and unsafe_name(name, data=False):
        raise CorruptFileError(f"{storage.url}: refusing the name {name!r}: {NAME_RULE}")
    return name


SealedT = TypeVar("SealedT", bound=Sealed)


def expect_sealed(sealed: Sealed, kind: type[SealedT], storage: Storage) -> SealedT:
    """``sealed`` as this backend's token; TypeError naming both when it is another backend's."""
    if not isinstance(sealed, kind):
        raise TypeError(
            f"{storage!r} cannot publish or discard {type(sealed).__name__} {sealed.name!r}: "
            f"it was staged by another storage backend (expected {kind.__name__})"
        )
    return sealed


def sealed_copy(storage: Storage, name: str, data: bytes) -> Sealed:
    """``data`` staged under ``name``, durable and not yet visible (a backend's ``put`` and
    ``put_if_absent`` on file systems that publish by a no-clobber rename or link)."""
    staged = storage.stage(name)
    try:
        staged.write(data)
        return staged.seal()
    except BaseException:
        quietly(staged.discard, f"remove staged {name}")
        raise


def put_if_absent_by_publish(storage: Storage, name: str, data: bytes) -> bool:
    """``put_if_absent`` from ``publish``: a staged copy published without clobbering.

    When the name is taken, the object there is read back: equal bytes are this call's own
    earlier success (a retry after a lost answer), other bytes another writer's. At most one
    byte more than ``data`` is read: whoever wrote the lake's folder chose that file's size
    (fuzzer, session 19: vacuum's checkpoint write read a sparse 6 GiB summary whole).
    """
    sealed = sealed_copy(storage, name, data)
    if storage.publish(sealed):
        return True
    storage.discard(sealed)
    try:
        return storage.read_bytes(name, limit=len(data) + 1) == data
    except FileNotFoundError:
        return False


def check_put_if_absent(storage: Storage, name: str, where: str, refused: str) -> None:
    """The first step of every store probe: ``name`` is created once, and a second create must
    be refused and leave the first bytes. StorageError with ``refused`` when it is not."""
    if not storage.put_if_absent(name, b"1"):
        raise StorageError(f"probe {where} existed before it was written")
    if storage.put_if_absent(name, b"2") or storage.read_bytes(name) != b"1":
        raise StorageError(refused)
