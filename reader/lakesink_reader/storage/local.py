"""Local-disk backend: stage beside the target, fsync, publish by a no-clobber hard link.

Why not rename: os.rename, shutil.move, fsspec ``mv`` and pyarrow ``move`` all replace an
existing target. ``os.link`` fails with EEXIST instead, so it publishes atomically without
clobbering; the staged name is unlinked afterwards. Where hard links are not supported we use
``renameat2(RENAME_NOREPLACE)`` (Linux >= 3.15, glibc >= 2.28), which has the same meaning.

On NFS a ``link`` whose reply was lost is retransmitted and then answers EEXIST although it
succeeded: an EEXIST whose target is our own staged inode is our success, not a lost race.

Every call opens the folders of a name one by one from the root's descriptor, never through a
link (``O_NOFOLLOW | O_DIRECTORY``), and then opens, links, renames or unlinks relative to the
last folder's descriptor: a folder swapped for a link after it was checked cannot lead a call
out of the lake (docs/FORMAT.md, "Trust"). Checking the path and then using it left that
window open (issue 51).
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from stat import S_ISDIR, S_ISLNK, S_ISREG
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


#: A folder below the root is opened so: never through a link (ELOOP), only a folder.
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file is read so: never through a link; O_NONBLOCK so that a FIFO put in the lake cannot
#: hold the open (a FIFO is then refused: it is no regular file).
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: A staged file is created so: a new file, never through a link.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def rename_noreplace(folder: int, src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` in the folder ``folder`` (a descriptor), raising
    FileExistsError if ``dst`` exists (never clobbers)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        renameat2 = libc.renameat2
    except AttributeError:  # pragma: no cover - glibc < 2.28 / not Linux
        raise OSError(errno.ENOSYS, "renameat2 is not available on this platform") from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = renameat2(folder, os.fsencode(src), folder, os.fsencode(dst), _RENAME_NOREPLACE)
    if rc != 0:
        err = ctypes.get_errno()
        raise (
            OSError(err, os.strerror(err), src, None, dst)
            if err != errno.EEXIST
            else FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
        )


def _same_file(folder: int, a: str, b: str) -> bool:
    sa, sb = (os.stat(n, dir_fd=folder, follow_symlinks=False) for n in (a, b))
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def publish_noclobber(folder: int, src: str, dst: str) -> bool:
    """Make ``src`` visible as ``dst`` atomically, never replacing another file; both are names
    in the folder ``folder`` (a descriptor).

    True when ``dst`` is now ``src``'s file (also after a retransmitted ``link`` answered
    EEXIST for our own success): ``src`` is gone then. False when another file already stood
    at ``dst``: ``src`` is kept.
    """
    try:
        os.link(src, dst, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        if not _same_file(folder, src, dst):
            return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            raise
        try:
            rename_noreplace(folder, src, dst)
        except FileExistsError:
            return False
        return True
    os.unlink(src, dir_fd=folder)
    return True


#: A lock older than this was left by a process that died holding it (it is held for the
#: length of one stat and one rename).
STALE_LOCK_SECONDS = 60.0


@contextlib.contextmanager
def locked(folder: int, name: str, shown: str) -> Iterator[None]:
    """Hold ``name`` in the folder ``folder`` (a descriptor) as an exclusive lock file (O_EXCL,
    atomic on local disks and NFSv3+); ``shown``: its path, for messages."""
    deadline = time.monotonic() + 2 * STALE_LOCK_SECONDS
    while True:
        try:
            os.close(os.open(name, _CREATE, 0o644, dir_fd=folder))
            break
        except FileExistsError:
            try:
                if (
                    time.time() - os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime
                    > STALE_LOCK_SECONDS
                ):
                    os.unlink(name, dir_fd=folder)  # its holder died: break it
                    continue
            except FileNotFoundError:
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"lock {shown} is held for longer than {STALE_LOCK_SECONDS:.0f} s"
                ) from None
            time.sleep(0.01)
    try:
        yield
    finally:
        os.unlink(name, dir_fd=folder)


class LocalStagedFile:
    """A staged file on local disk: a hidden '.uncommitted' file beside its final name."""

    def __init__(self, storage: LocalStorage, name: str) -> None:
        self.name = name
        folder, base = storage.split(name)
        staged = staged_name(base, new_attempt_id())
        self._storage = storage
        self._staged = _sibling(name, staged)
        self._path = storage.shown(self._staged)
        at = storage.open_folder(folder, create=True)
        try:
            # O_EXCL: a staged name is unique per attempt; meeting one means a bug, never overwrite it.
            fd = storage.opened(at, staged, _CREATE, self._staged)
        finally:
            os.close(at)
        self._file = open(fd, "wb", buffering=1 << 20)  # noqa: SIM115 - closed by seal/discard

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
        self._storage.delete(self._staged)


def _linked(at: int, part: str) -> bool:
    """Whether ``part``, which an ``O_NOFOLLOW | O_DIRECTORY`` open refused as no folder
    (ENOTDIR: Linux's answer for a link too), is a link -- or a folder now, which it was not
    when it was opened: a link swapped out again since."""
    try:
        mode = os.stat(part, dir_fd=at, follow_symlinks=False).st_mode
    except OSError:
        return False
    return S_ISLNK(mode) or S_ISDIR(mode)


def _token(stat: os.stat_result | None) -> tuple[int, int] | None:
    return None if stat is None else (stat.st_dev, stat.st_ino)


def _version(stat: os.stat_result | None) -> str | None:
    return None if stat is None else f"{stat.st_dev}:{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_size}"


def _sibling(name: str, base: str) -> str:
    folder = os.path.dirname(name)
    return f"{folder}/{base}" if folder else base


class LocalStorage:
    """A table root on a local (POSIX) filesystem."""

    #: Many small reads go in turn, not in threads (``logfiles.read_threads``): nothing waits on
    #: a network here, and threads contend for the GIL (3x slower per commit header, measured).
    read_threads = 1

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def path_of(self, name: str) -> str:
        """The path of ``name`` under the root, when the name is one a lake may hold and no part
        of it below the root is a symbolic link now (CorruptFileError otherwise): for messages
        and for files pyarrow opens (``refuse_link``). This backend's own calls do not use it:
        they open each folder from the root's descriptor (:meth:`open_folder`)."""
        if not name:
            return self.root
        self.refuse_link(name)
        return self.shown(name)

    def shown(self, name: str) -> str:
        """The path of ``name`` (a name :func:`checked_name` passed) under the root, checking
        nothing on disk: for messages."""
        return os.path.join(self.root, *name.split("/")) if name else self.root

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
                raise self._link(path)

    @staticmethod
    def _link(path: str) -> CorruptFileError:
        return CorruptFileError(
            f"{path} is a symbolic link (or was one as lakesink opened it): lakesink follows no link "
            'inside a lake, where it could lead to a file outside it (docs/FORMAT.md, "Trust"); '
            "replace it by the file itself"
        )

    # Descriptors: every call below resolves a name from the root's ------------------------

    def split(self, name: str) -> tuple[str, str]:
        """``name`` (checked: :func:`checked_name`) as its folder and its last part."""
        if not checked_name(self, name):
            raise ValueError(f"{self.url}: a file needs a name")
        folder, _, base = name.rpartition("/")
        return folder, base

    def opened(self, at: int, part: str, flags: int, name: str, mode: int = 0o666) -> int:
        """``os.open(part, flags, dir_fd=at)``; ``name`` is ``part``'s root-relative name, for
        messages. A link there (ELOOP under ``O_NOFOLLOW``; ENOTDIR with ``O_DIRECTORY``) is
        CorruptFileError naming it; other errors name the whole path."""
        try:
            return os.open(part, flags, mode, dir_fd=at)
        except OSError as exc:
            if exc.errno == errno.ELOOP or (
                exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY and _linked(at, part)
            ):
                raise self._link(self.shown(name)) from None
            raise OSError(exc.errno, exc.strerror, self.shown(name)) from None

    def open_folder(self, folder: str, *, create: bool = False) -> int:
        """A descriptor of ``folder`` (root-relative, already checked), for the caller to close:
        opened part by part from the root's, each part with ``O_NOFOLLOW | O_DIRECTORY``, so that
        no part is a link *when it is opened* -- what is checked is what is used. ``create``:
        missing folders (and the root) are made. FileNotFoundError / NotADirectoryError name the
        path; a link is CorruptFileError."""
        if create:
            os.makedirs(self.root, exist_ok=True)
        # The root may be a link: the user chose it.
        at = self.opened(_AT_FDCWD, self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, "")
        try:
            done = 0
            for part in folder.split("/") if folder else ():
                done += len(part) + 1
                try:
                    inner = self.opened(at, part, _FOLDER, folder[: done - 1])
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=at)
                    inner = self.opened(at, part, _FOLDER, folder[: done - 1])
                os.close(at)
                at = inner
            # For audit hooks (the fuzzer's): the folder each call works in, as a descriptor --
            # the calls below name files relative to it, which the "open" event cannot place.
            sys.audit("lakesink.folder", at, folder)
        except BaseException:
            os.close(at)
            raise
        return at

    @contextlib.contextmanager
    def _at(self, name: str) -> Iterator[tuple[int, str]]:
        """(a descriptor of ``name``'s folder, ``name``'s last part), the descriptor closed after."""
        folder, base = self.split(name)
        at = self.open_folder(folder)
        try:
            yield at, base
        finally:
            os.close(at)

    def _lstat(self, at: int, base: str, name: str) -> os.stat_result | None:
        """The file ``base`` in the folder ``at``, not followed; None when missing; a link is
        CorruptFileError (a lake holds none)."""
        try:
            stat = os.stat(base, dir_fd=at, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if S_ISLNK(stat.st_mode):
            raise self._link(self.shown(name))
        return stat

    # Staging and publishing ---------------------------------------------------------------

    def stage(self, name: str) -> LocalStagedFile:
        return LocalStagedFile(self, name)

    def publish(self, sealed: Sealed) -> bool:
        local = expect_sealed(sealed, LocalSealed, self)
        staged = self.split(local.staged)[1]
        with self._at(local.name) as (at, base):
            if (
                self._lstat(at, staged, local.staged) is None
                and _token(self._lstat(at, base, local.name)) == local.inode
            ):
                return True  # published by an earlier call
            try:
                won = publish_noclobber(at, staged, base)
            except BaseException:
                quietly(lambda: os.fsync(at), f"fsync {os.path.dirname(self.shown(local.name))}")
                raise
            os.fsync(at)  # the new name must survive a power loss
        return won

    def version(self, name: str) -> str | None:
        try:
            with self._at(name) as (at, base):
                stat = self._lstat(at, base, name)
        except FileNotFoundError:
            return None
        return _version(stat)

    def supersede(self, sealed: Sealed, version: str) -> bool:
        local = expect_sealed(sealed, LocalSealed, self)
        staged = self.split(local.staged)[1]
        with self._at(local.name) as (at, base):
            # POSIX has no conditional rename: a lock makes "still that version? then rename over
            # it" one step for every writer of this lake.
            lock = f".{base}.lock"
            with locked(at, lock, self.shown(_sibling(local.name, lock))):
                if _version(self._lstat(at, base, local.name)) != version:
                    return False
                os.replace(staged, base, src_dir_fd=at, dst_dir_fd=at)
            os.fsync(at)
        return True

    def discard(self, sealed: Sealed) -> None:
        self.delete(expect_sealed(sealed, LocalSealed, self).staged)

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
        try:
            with self._at(name) as (at, base):
                return self._lstat(at, base, name) is not None
        except (FileNotFoundError, NotADirectoryError):
            return False

    def list(self, folder: str = "") -> builtins.list[StoredFile]:
        found = []
        with self._scan(folder) as entries:
            for name, entry in entries:
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
        with self._scan(folder) as entries:
            for name, entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        found.append(name)
                except FileNotFoundError:  # removed while we listed
                    continue
        return found

    @contextlib.contextmanager
    def _scan(self, folder: str) -> Iterator[builtins.list[tuple[str, os.DirEntry[str]]]]:
        """The entries directly in ``folder``, with their root-relative names; none when missing.
        Listed from the folder's descriptor, which stays open while the caller reads the entries
        (``DirEntry.stat`` is an ``fstatat`` on it)."""
        prefix = f"{folder}/" if folder else ""
        try:
            at = self.open_folder(checked_name(self, folder))
        except (FileNotFoundError, NotADirectoryError):
            yield []
            return
        try:
            with os.scandir(at) as entries:
                yield [(prefix + e.name, e) for e in entries]
        finally:
            os.close(at)

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        with self._at(name) as (at, base):
            fd = self.opened(at, base, _READ, name)
        with open(fd, "rb") as f:
            if not S_ISREG(os.fstat(fd).st_mode):
                raise CorruptFileError(f"{self.shown(name)} is not a regular file")
            return f.read() if limit is None else f.read(limit)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        return put_if_absent_by_publish(self, name, data)

    def put(self, name: str, data: bytes) -> None:
        sealed = expect_sealed(sealed_copy(self, name, data), LocalSealed, self)
        try:
            with self._at(name) as (at, base):
                os.replace(self.split(sealed.staged)[1], base, src_dir_fd=at, dst_dir_fd=at)
        except BaseException:
            quietly(lambda: self.discard(sealed), f"remove staged {name}")
            raise

    def delete(self, name: str) -> None:
        # Unlinking a link removes the link itself, never what it points to.
        try:
            with self._at(name) as (at, base):
                os.unlink(base, dir_fd=at)
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
                f"file {self.shown(name)}",
                f"the file system at {self.root} replaced an existing file on a no-clobber publish "
                "(link(2) / renameat2(RENAME_NOREPLACE) was not honoured), so a retried or concurrent "
                "write could silently replace committed data; lakesink cannot write exactly once "
                "there. Put the lake on a POSIX file system (ext4, xfs, ...), HDFS or S3.",
            )
        finally:
            quietly(lambda: self.delete(name), f"delete probe file {self.shown(name)}")

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        # Here, not at the top: the storage backends load no pyarrow (Spark's data-source
        # lookup imports them); only reads need it.
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), self.root
