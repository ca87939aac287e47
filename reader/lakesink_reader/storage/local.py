"""Local-disk backend: stage beside the target, fsync, publish by a no-clobber hard link.

Why not rename: os.rename, shutil.move, fsspec ``mv`` and pyarrow ``move`` all replace an
existing target. ``os.link`` fails with EEXIST instead, so it publishes atomically without
clobbering; the staged name is unlinked afterwards. Where hard links are not supported we use
``renameat2(RENAME_NOREPLACE)`` (Linux >= 3.15, glibc >= 2.28), which has the same meaning.

On NFS a ``link`` whose reply was lost is retransmitted and then answers EEXIST although it
succeeded: an EEXIST whose target is our own staged inode is our success, not a lost race.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from stat import S_ISLNK
from typing import TYPE_CHECKING

from lakesink_reader.errors import CorruptFileError, quietly
from lakesink_reader.names import STAGED_SUFFIX, new_attempt_id, staged_name
from lakesink_reader.storage.base import (
    Sealed,
    StagedEntry,
    StoredFile,
    check_put_if_absent,
    checked_name,
    expect_sealed,
    put_if_absent_by_publish,
    sealed_copy,
)

if TYPE_CHECKING:
    import pyarrow.fs

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_STAGED = re.compile(r"^\.(?P<final>.+)\.(?P<attempt>[0-9a-f]{8,})" + re.escape(STAGED_SUFFIX) + "$")


@dataclass(frozen=True)
class LocalSealed(Sealed):
    staged: str  # the staged name, relative to the table root
    inode: tuple[int, int] = (0, 0)  # (st_dev, st_ino): tells our published file from another


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


def publish_noclobber(src: str, dst: str) -> bool:
    """Make ``src`` visible as ``dst`` atomically, never replacing another file.

    True when ``dst`` is now ``src``'s file (also after a retransmitted ``link`` answered
    EEXIST for our own success): ``src`` is gone then. False when another file already stood
    at ``dst``: ``src`` is kept.
    """
    try:
        os.link(src, dst)
    except FileExistsError:
        if not os.path.samefile(src, dst):
            return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            rename_noreplace(src, dst)
        except FileExistsError:
            return False
        return True
    os.unlink(src)
    return True


#: A lock older than this was left by a process that died holding it (it is held for the
#: length of one stat and one rename).
STALE_LOCK_SECONDS = 60.0


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold ``path`` as an exclusive lock file (O_EXCL, atomic on local disks and NFSv3+)."""
    deadline = time.monotonic() + 2 * STALE_LOCK_SECONDS
    while True:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            break
        except FileExistsError:
            try:
                if time.time() - os.stat(path).st_mtime > STALE_LOCK_SECONDS:
                    os.unlink(path)  # its holder died: break it
                    continue
            except FileNotFoundError:
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"lock {path} is held for longer than {STALE_LOCK_SECONDS:.0f} s"
                ) from None
            time.sleep(0.01)
    try:
        yield
    finally:
        os.unlink(path)


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
        stat = os.fstat(self._file.fileno())
        self._file.close()
        return LocalSealed(name=self.name, size=size, staged=self._staged, inode=(stat.st_dev, stat.st_ino))

    def discard(self) -> None:
        # Closing flushes the buffer, which fails again on a full disk (ENOSPC): the file
        # must be unlinked all the same, so a failing close is only logged.
        quietly(self._file.close, f"close staged file {self._path}")
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass


def _sibling_path(path: str, base: str) -> str:
    return os.path.join(os.path.dirname(path), base)


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
        """The path of ``name`` under the root, when the name is one a lake may hold and no part
        of it below the root is a symbolic link (CorruptFileError otherwise): every read, write
        and listing of this backend goes through here, so none follows a link out of the lake."""
        if not name:
            return self.root
        self.refuse_link(name)
        return os.path.join(self.root, *name.split("/"))

    def refuse_link(self, name: str) -> None:
        # One lstat per part of the name below the root (the root itself may be a link: the
        # user chose it). A part that does not exist ends the walk: nothing below it does.
        path = self.root
        for part in checked_name(self, name).split("/"):
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return
            if S_ISLNK(mode):
                raise CorruptFileError(
                    f"{path} is a symbolic link: lakesink follows no link inside a lake, where it could "
                    'lead to a file outside it (docs/FORMAT.md, "Trust"); replace it by the file itself'
                )

    # Staging and publishing ---------------------------------------------------------------

    def stage(self, name: str) -> LocalStagedFile:
        return LocalStagedFile(self, name)

    def publish(self, sealed: Sealed) -> bool:
        local = expect_sealed(sealed, LocalSealed, self)
        target = self.path_of(local.name)
        if not os.path.exists(self.path_of(local.staged)) and self._is_ours(local):
            return True  # published by an earlier call
        try:
            won = publish_noclobber(self.path_of(local.staged), target)
        except BaseException:
            quietly(lambda: fsync_dir(os.path.dirname(target)), f"fsync {os.path.dirname(target)}")
            raise
        fsync_dir(os.path.dirname(target))  # the new name must survive a power loss
        return won

    def _is_ours(self, sealed: LocalSealed) -> bool:
        try:
            stat = os.stat(self.path_of(sealed.name))
        except FileNotFoundError:
            return False
        return (stat.st_dev, stat.st_ino) == sealed.inode

    def version(self, name: str) -> str | None:
        try:
            stat = os.stat(self.path_of(name))
        except FileNotFoundError:
            return None
        return f"{stat.st_dev}:{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}"

    def supersede(self, sealed: Sealed, version: str) -> bool:
        local = expect_sealed(sealed, LocalSealed, self)
        target = self.path_of(local.name)
        # POSIX has no conditional rename: a lock makes "still that version? then rename over
        # it" one step for every writer of this lake.
        with locked(_sibling_path(target, f".{os.path.basename(target)}.lock")):
            if self.version(local.name) != version:
                return False
            os.replace(self.path_of(local.staged), target)
        fsync_dir(os.path.dirname(target))
        return True

    def discard(self, sealed: Sealed) -> None:
        local = expect_sealed(sealed, LocalSealed, self)
        try:
            os.unlink(self.path_of(local.staged))
        except FileNotFoundError:
            pass

    def staged(self, folder: str = "") -> builtins.list[StagedEntry]:
        prefix = f"{folder}/" if folder else ""
        found = []
        for entry in self.list(folder):
            match = _STAGED.match(entry.name[len(prefix) :])
            if match is not None:
                found.append(
                    StagedEntry(
                        prefix + match.group("final"), "staged_file", entry.modified, entry.size, entry.name
                    )
                )
        return found

    def drop_staged(self, entry: StagedEntry) -> None:
        self.delete(entry.handle)

    # Small files --------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path_of(name))

    def list(self, folder: str = "") -> builtins.list[StoredFile]:
        found = []
        for name, entry in self._scan(folder):
            try:
                # A link is not listed, nor its target's size: ``refuse_link`` names it.
                if entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found.append(StoredFile(name, info.st_size, info.st_mtime))
            except FileNotFoundError:  # removed while we listed: not there any more
                continue
        return found

    def folders(self, folder: str = "") -> builtins.list[str]:
        found = []
        for name, entry in self._scan(folder):
            try:
                if entry.is_dir(follow_symlinks=False):
                    found.append(name)
            except FileNotFoundError:  # removed while we listed
                continue
        return found

    def _scan(self, folder: str) -> builtins.list[tuple[str, os.DirEntry[str]]]:
        """The entries directly in ``folder``, with their root-relative names; none when missing."""
        prefix = f"{folder}/" if folder else ""
        try:
            return [(prefix + e.name, e) for e in os.scandir(self.path_of(folder))]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        path = self.path_of(name)
        try:
            # O_NOFOLLOW: a link put there since path_of looked is refused all the same.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            self.refuse_link(name)  # names the link
            raise CorruptFileError(
                f"{path} is a symbolic link: lakesink follows no link inside a lake"
            ) from exc
        with open(fd, "rb") as f:
            return f.read() if limit is None else f.read(limit)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        return put_if_absent_by_publish(self, name, data)

    def put(self, name: str, data: bytes) -> None:
        sealed = expect_sealed(sealed_copy(self, name, data), LocalSealed, self)
        try:
            os.replace(self.path_of(sealed.staged), self.path_of(name))
        except BaseException:
            quietly(lambda: self.discard(sealed), f"remove staged {name}")
            raise

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.path_of(name))
        except FileNotFoundError:
            pass

    def root_exists(self) -> bool:
        return os.path.isdir(self.root)

    def check_conditional_writes(self, name: str) -> None:
        """Check that a no-clobber publish refuses an existing name, as POSIX ``link(2)`` does.

        A POSIX file system never replaces a file through ``link`` or ``renameat2(NOREPLACE)``,
        but some mounts only emulate them (FUSE file systems, SMB/CIFS shares): one that
        replaced an existing name would let a retried or concurrent write replace committed
        data. The probe is a temporary file under ``_lakesink/``, published twice: a few local
        file operations.
        """
        try:
            check_put_if_absent(
                self,
                name,
                f"file {self.path_of(name)}",
                f"the file system at {self.root} replaced an existing file on a no-clobber publish "
                "(link(2) / renameat2(RENAME_NOREPLACE) was not honoured), so a retried or concurrent "
                "write could silently replace committed data; lakesink cannot write exactly once "
                "there. Put the lake on a POSIX file system (ext4, xfs, ...), HDFS or S3.",
            )
        finally:
            quietly(lambda: self.delete(name), f"delete probe file {self.path_of(name)}")

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        # Here, not at the top: the storage backends load no pyarrow (Spark's data-source
        # lookup imports them); only reads need it.
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), self.root
