"""Local-disk backend: stage beside the target, fsync, publish by a no-clobber hard link.

Why not rename: os.rename, shutil.move, fsspec ``mv`` and pyarrow ``move`` all replace an
existing target. ``os.link`` fails with EEXIST instead, so it publishes atomically without
clobbering; the staged name is unlinked afterwards. Where hard links are not supported we use
``renameat2(RENAME_NOREPLACE)`` (Linux >= 3.15, glibc >= 2.28), which has the same meaning.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink.layout import new_attempt_id, staged_name
from lakesink.storage.base import PendingUpload, Sealed, StoredFile

if TYPE_CHECKING:
    import pyarrow.fs

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


@dataclass(frozen=True)
class LocalSealed(Sealed):
    staged: str  # the staged name, relative to the table root


def fsync_dir(path: str) -> None:
    """Make a directory entry change (create, link, unlink) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, raising FileExistsError if ``dst`` exists (never clobbers)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        renameat2 = libc.renameat2
    except AttributeError:  # pragma: no cover - glibc < 2.28 / not Linux
        raise OSError(errno.ENOSYS, "renameat2 is not available on this platform") from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
    if rc != 0:
        err = ctypes.get_errno()
        raise (
            OSError(err, os.strerror(err), src, None, dst)
            if err != errno.EEXIST
            else FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        )


def publish_noclobber(src: str, dst: str) -> None:
    """Make ``src`` visible as ``dst`` atomically; FileExistsError if ``dst`` already exists.

    ``src`` is gone afterwards in every outcome but an unexpected OSError.
    """
    try:
        os.link(src, dst)
    except FileExistsError:
        os.unlink(src)
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            rename_noreplace(src, dst)
        except FileExistsError:
            os.unlink(src)
            raise
        return
    os.unlink(src)


class LocalStagedFile:
    """A staged file on local disk: a hidden '.uncommitted' file beside its final name."""

    def __init__(self, storage: LocalStorage, name: str) -> None:
        self.name = name
        self._staged = _sibling(name, staged_name(os.path.basename(name), new_attempt_id()))
        self._path = storage.path_of(self._staged)
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        # "x": a staged name is unique per attempt; meeting one means a bug, never overwrite it.
        self._file = open(self._path, "xb", buffering=1 << 20)  # noqa: SIM115 - closed by seal/discard

    def write(self, data: bytes | memoryview, /) -> int:
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        """Called by pyarrow when it finishes; publication is :meth:`seal` + publish."""
        self._file.flush()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def seal(self) -> LocalSealed:
        size = self._file.tell()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return LocalSealed(name=self.name, size=size, staged=self._staged)

    def discard(self) -> None:
        self._file.close()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass


def _sibling(name: str, base: str) -> str:
    folder = os.path.dirname(name)
    return f"{folder}/{base}" if folder else base


class LocalStorage:
    """A table root on a local (POSIX) filesystem."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def path_of(self, name: str) -> str:
        return os.path.join(self.root, *name.split("/")) if name else self.root

    def stage(self, name: str) -> LocalStagedFile:
        return LocalStagedFile(self, name)

    def publish(self, sealed: Sealed) -> bool:
        assert isinstance(sealed, LocalSealed), sealed
        target = self.path_of(sealed.name)
        try:
            publish_noclobber(self.path_of(sealed.staged), target)
        except FileExistsError:
            return False
        finally:
            fsync_dir(os.path.dirname(target))
        return True

    def discard(self, sealed: Sealed) -> None:
        assert isinstance(sealed, LocalSealed), sealed
        try:
            os.unlink(self.path_of(sealed.staged))
        except FileNotFoundError:
            pass

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path_of(name))

    def list(self, folder: str = "") -> list[StoredFile]:
        prefix = f"{folder}/" if folder else ""
        try:
            entries = list(os.scandir(self.path_of(folder)))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            try:
                if entry.is_file():
                    stat = entry.stat()
                    found.append(StoredFile(prefix + entry.name, stat.st_size, stat.st_mtime))
            except FileNotFoundError:  # removed while we listed: not there any more
                continue
        return found

    def read_bytes(self, name: str) -> bytes:
        with open(self.path_of(name), "rb") as f:
            return f.read()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        staged = self.stage(name)
        try:
            staged.write(data)
            sealed = staged.seal()
        except BaseException:
            staged.discard()
            raise
        return self.publish(sealed)

    def put(self, name: str, data: bytes) -> None:
        staged = self.stage(name)
        try:
            staged.write(data)
            sealed = staged.seal()
            os.replace(self.path_of(sealed.staged), self.path_of(name))
        except BaseException:
            staged.discard()
            raise

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.path_of(name))
        except FileNotFoundError:
            pass

    def pending_uploads(self, folder: str = "") -> builtins.list[PendingUpload]:
        return []  # local disk has no multipart uploads; staged files are plain files

    def abort_upload(self, upload: PendingUpload) -> None:
        raise NotImplementedError("local storage has no multipart uploads")

    def root_exists(self) -> bool:
        return os.path.isdir(self.root)

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), self.root
