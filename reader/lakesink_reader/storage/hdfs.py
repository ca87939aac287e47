"""HDFS backend, through ``hdfs-native`` (a Rust HDFS client: no JVM, no libhdfs).

A staged file is a hidden ``.<name>.<attempt>.uncommitted`` sibling of its final name,
created with ``create(overwrite=False)``; ``seal`` hsyncs it (the DataNodes fsync the bytes)
and closes it; ``publish`` renames it with ``rename(src, dst, overwrite=False)``, which is
atomic and fails when ``dst`` exists. Create-if-absent (``put_if_absent``) is the same stage,
seal and rename. Only :meth:`HdfsStorage.supersede` (a compare-and-swap under a lock file)
and :meth:`HdfsStorage.put` (hints that are safe to lose) ever replace a file.

Lost answers. hdfs-native retries a NameNode call after an I/O error on a new connection,
with a new call id, so the NameNode's retry cache cannot recognise it: a rename that took
effect and whose answer was lost comes back as FileNotFoundError (the source is gone),
FileExistsError (the destination is there: ours) or ``OSError("RPC listener disconnected")``.
Each is resolved by looking: the source gone and the destination holding our file (the
length and modification time the sealed file had; a rename keeps both) is our success; the
source still there with the destination free is a rename that never happened, tried again.

Paths: ``hdfs://namenode:port/path`` names the NameNode; ``hdfs:///path`` takes
``fs.defaultFS`` from ``$HADOOP_CONF_DIR`` (else ``$HADOOP_HOME/etc/hadoop``): hdfs-native
reads ``core-site.xml`` and ``hdfs-site.xml`` there (HA nameservices too) when a client is made,
in each process that makes one. ``storage_options={"config": {...}}`` adds Hadoop configuration
keys over those files.

The user (simple authentication): ``HADOOP_USER_NAME``, else the process's user. hdfs-native
reads ``HADOOP_USER_NAME`` each time it opens a NameNode connection (a reconnect too) and its
Python API takes no user, so ``storage_options={"user": "name"}`` sets ``HADOOP_USER_NAME`` for
the whole process when a client is first made -- and refuses (ValueError) when the process
already has another one: one process, one HDFS user. The option travels with the writer, so
Spark's Python workers take it too; Spark's own checkpoint writes use the JVM's user.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import re
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from hdfs_native import Client, FileStatus, FileWriter, WriteOptions

from lakesink_reader.errors import CommitError, StorageError, log, quietly
from lakesink_reader.names import STAGED_SUFFIX, new_attempt_id, staged_name
from lakesink_reader.redact import redacted
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
from lakesink_reader.storage.options import check_storage_options

if TYPE_CHECKING:
    import pyarrow.fs

HDFS_SCHEMES = ("hdfs", "viewfs")
HDFS_OPTIONS = ("config", "user")
USER_ENV = "HADOOP_USER_NAME"
USER_KEY = "lakesink.user"  # the user option, in the settings (see hdfs_settings)
_USER_LOCK = threading.Lock()
_STAGED = re.compile(r"^\.(?P<final>.+)\.(?P<attempt>[0-9a-f]{8,})" + re.escape(STAGED_SUFFIX) + "$")
#: Writes reach hdfs-native in pieces of about this size (pyarrow writes many small pieces).
_BUFFER = 1 << 20
#: A lock file older than this was left by a process that died holding it (see ``supersede``).
STALE_LOCK_SECONDS = 60.0
_ERRNO: dict[type[OSError], int] = {
    FileNotFoundError: errno.ENOENT,
    FileExistsError: errno.EEXIST,
    PermissionError: errno.EACCES,
    NotADirectoryError: errno.ENOTDIR,
    IsADirectoryError: errno.EISDIR,
}
#: How often a rename is tried again when it neither happened nor was refused.
RENAME_ATTEMPTS = 3


@dataclass(frozen=True)
class HdfsSealed(Sealed):
    """A staged file, hsynced and closed: its staged name and what tells it from another file."""

    staged: str  # the staged name, relative to the table root
    modified: int = 0  # the closed file's modification time (ms): a rename keeps it


def hdfs_settings(options: object, url: str) -> dict[str, str]:
    """The Hadoop configuration from ``storage_options`` (``{"config": {key: value}}``).

    The ``user`` option stands in it as ``lakesink.user`` (hdfs-native ignores keys it does not
    know): open_storage's cache keys on these settings, so lakes opened as two users differ.
    """
    given = check_storage_options(options, url)
    unknown = sorted(set(given) - set(HDFS_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown HDFS storage_options {unknown} for {redacted(url)}; known: {list(HDFS_OPTIONS)}"
        )
    config = given.get("config") or {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise TypeError(
            f"storage_options 'config' for {redacted(url)} must be a dict of Hadoop configuration keys "
            "to values"
        )
    settings = {key: str(value) for key, value in config.items()}
    user = hdfs_user(options, url)
    if user is not None:
        settings[USER_KEY] = user
    return settings


#: Hadoop's key for the permission bits new files and folders leave out, and its default.
UMASK_KEY = "fs.permissions.umask-mode"
DEFAULT_UMASK = 0o022
#: The mode hdfs-native's ``create_parent`` gives the folders it makes (measured, 0.14.7).
_NATIVE_FOLDER_MODE = 0o755
_SYMBOLIC_UMASK = re.compile(r"^([ugoa]*)=([rwx]*)$")


def hdfs_umask(config: Mapping[str, str], url: str) -> int:
    """The umask the cluster's own clients apply (``fs.permissions.umask-mode``: the ``config``
    storage option, else ``core-site.xml`` under ``HADOOP_CONF_DIR``, else 022). hdfs-native
    creates files with the mode it is given, unmasked: lakesink masks it, so that a lake's files
    are no more readable than the cluster's policy makes other files. Octal (``077``) or
    symbolic (``u=rwx,g=rx,o=``, the bits allowed), as Hadoop reads it; ValueError naming the key."""
    text = config.get(UMASK_KEY)
    if text is None:
        text = _core_site_value(UMASK_KEY)
    if text is None:
        return DEFAULT_UMASK
    text = text.strip()
    if re.fullmatch(r"0?[0-7]{1,3}", text):
        return int(text, 8)
    allowed = 0
    for clause in text.split(","):
        m = _SYMBOLIC_UMASK.match(clause.strip())
        if m is None:
            raise ValueError(
                f"{UMASK_KEY} for {redacted(url)} must be octal (022) or symbolic (u=rwx,g=rx,o=) "
                "(value not shown)"
            )
        who = m.group(1) or "a"
        bits = sum({"r": 4, "w": 2, "x": 1}[c] for c in set(m.group(2)))
        for w in "ugo" if "a" in who else who:
            allowed |= bits << {"u": 6, "g": 3, "o": 0}[w]
    return 0o777 & ~allowed


def _core_site_value(key: str) -> str | None:
    """``key`` in ``$HADOOP_CONF_DIR/core-site.xml`` (None: no such file or key)."""
    folder = os.environ.get("HADOOP_CONF_DIR")
    if not folder:
        return None
    try:
        tree = ET.parse(os.path.join(folder, "core-site.xml"))
    except (OSError, ET.ParseError):
        return None
    for prop in tree.getroot().iter("property"):
        if (prop.findtext("name") or "").strip() == key:
            return prop.findtext("value")
    return None


def hdfs_user(options: object, url: str) -> str | None:
    """The ``user`` storage option: a non-empty name without whitespace, or None."""
    user = check_storage_options(options, url).get("user")
    if user is None:
        return None
    if not isinstance(user, str) or not user or any(c.isspace() for c in user):
        raise ValueError(
            f"storage_options 'user' for {redacted(url)} must be an HDFS user name, without spaces "
            "(value not shown)"
        )
    return user


def pin_user(user: str, url: str) -> None:
    """Make ``user`` this process's HDFS user (``HADOOP_USER_NAME``); ValueError if it has another.

    hdfs-native reads the variable at every NameNode connection, so it cannot be set for one
    client only: it is set for the process, once, and a different user later is refused.
    """
    with _USER_LOCK:
        current = os.environ.get(USER_ENV)
        if current is None:
            os.environ[USER_ENV] = user
        elif current != user:
            raise ValueError(
                f"{redacted(url)}: storage_options user={user!r}, but this process's HDFS user is already "
                f"{USER_ENV}={current!r} (hdfs-native reads it at every connection: one user per process)"
            )


def parse_hdfs_url(url: str) -> tuple[str | None, str]:
    """``hdfs://nn:8020/a/b`` -> ("hdfs://nn:8020", "/a/b"); ``hdfs:///a/b`` -> (None, "/a/b")."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme not in HDFS_SCHEMES:
        raise ValueError(f"not an HDFS URL (want hdfs://namenode:port/path): {redacted(url)!r}")
    if parsed.query or parsed.fragment or "@" in parsed.netloc:
        raise ValueError(
            f"HDFS URL {redacted(url)!r} must not have a user, query or fragment (the user: HADOOP_USER_NAME)"
        )
    root = "/" + parsed.path.strip("/")
    return (f"{scheme}://{parsed.netloc}" if parsed.netloc else None), root


def _answer_lost(exc: OSError) -> bool:
    """Whether a call may have taken effect although it failed: its connection dropped mid-call
    ("RPC listener disconnected"), or hdfs-native's own retry of it met its effect ("exists")."""
    return isinstance(exc, FileExistsError) or "disconnected" in str(exc)


def _first_line(exc: BaseException) -> str:
    """An HDFS error's message without the NameNode's Java stack trace."""
    rpc = _rpc_error(exc)
    if rpc is not None:
        return f"{rpc[0].rsplit('.', 1)[-1]}: {rpc[1]}"
    text = str(exc.args[-1] if exc.args and isinstance(exc.args[-1], str) else exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


#: hdfs-native's RuntimeError for a NameNode's Java exception: ``RPCError("class", "message\n\tat ...")``.
_RPC_ERROR = re.compile(r'RPCError\("(?P<cls>[\w.$]+)", "(?P<msg>(?:[^"\\]|\\[^n])*)')


def _rpc_error(exc: BaseException) -> tuple[str, str] | None:
    """(Java class, first line of its message) of a NameNode's exception, else None."""
    match = _RPC_ERROR.search(str(exc))
    if match is None:
        return None
    return match.group("cls"), match.group("msg").replace('\\"', '"').strip()


class HdfsStagedFile:
    """A staged file on HDFS: a hidden ``.uncommitted`` sibling of its final name, open for writing."""

    def __init__(self, storage: HdfsStorage, name: str) -> None:
        self.name = name
        self._storage = storage
        self._buffer = bytearray()
        self._size = 0
        self._closed = False
        self._writer: FileWriter | None = None
        self._staged, self._path = "", ""
        folder = name.rpartition("/")[0]
        if folder and storage.folder_mode != _NATIVE_FOLDER_MODE:
            # create_parent makes folders 0755 whatever the umask: make them first, masked (one
            # more call, only on clusters whose umask is not 022; an existing folder is kept).
            with storage.errors(folder):
                storage.client.mkdirs(
                    storage.path_of(folder), permission=storage.folder_mode, create_parent=True
                )
        for attempt in range(RENAME_ATTEMPTS):
            self._staged = _sibling(name, staged_name(name.rsplit("/", 1)[-1], new_attempt_id()))
            self._path = storage.path_of(self._staged)
            try:
                with storage.errors(self._staged):
                    try:
                        self._writer = storage.client.create(
                            self._path,
                            WriteOptions(overwrite=False, create_parent=True, permission=storage.file_mode),
                        )
                    except OSError as exc:
                        if not _answer_lost(exc) or attempt == RENAME_ATTEMPTS - 1:
                            raise
                        # A fresh attempt id is never taken: our own create whose answer was lost
                        # (retried by hdfs-native: "exists"), or a dropped connection. A file it
                        # made has no writer here: drop it and stage under a new name.
                        quietly(partial(storage.delete_retrying, self._staged), f"delete staged {self._path}")
                        continue
                break
            except FileExistsError as exc:
                raise StorageError(f"could not create a staged file for {storage.url}/{name}: {exc}") from exc

    def write(self, data: bytes | memoryview, /) -> int:
        self._buffer += data
        self._size += len(data)
        if len(self._buffer) >= _BUFFER:
            self._drain()
        return len(data)

    def _drain(self) -> None:
        if self._buffer:
            with self._storage.errors(self._staged, data=True):
                self._open_writer().write(bytes(self._buffer))
            self._buffer.clear()

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        self._drain()

    def close(self) -> None:
        """Called by pyarrow when it finishes; publication is :meth:`seal` + publish."""
        self._drain()

    @property
    def closed(self) -> bool:
        return self._closed

    def seal(self) -> HdfsSealed:
        self._drain()
        with self._storage.errors(self._staged, data=True):
            if self._size:
                self._open_writer().hsync()  # the DataNodes fsync the last block before we publish
            self._open_writer().close()
            self._closed = True
            status = self._storage.client.get_file_info(self._path)
        if status.length != self._size:
            raise StorageError(
                f"staged file {self._path} has {status.length} bytes, {self._size} were written"
            )
        if status.replication == 1 and self._size:
            _note_replication_one(self._path)
        return HdfsSealed(
            name=self.name, size=self._size, staged=self._staged, modified=status.modification_time
        )

    def discard(self) -> None:
        if not self._closed:
            self._closed = True
            self._buffer.clear()
            self._close_quietly()
        self._storage.delete(self._staged)

    def _open_writer(self) -> FileWriter:
        if self._writer is None:
            raise StorageError(f"staged file {self._path} was discarded")
        return self._writer

    def _close_quietly(self) -> None:
        """Close the hdfs-native writer, logging a failure without its traceback, and drop it.

        A logged traceback would keep the writer, and through it the client, alive for as long
        as the log record lives (pytest keeps them until a test's teardown); a client dropped
        after its NameNode has gone away was seen to hold the dropping thread for minutes.
        """
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.close()
        except Exception as exc:  # noqa: BLE001 - a cleanup step: the caller's outcome wins
            log.warning(
                "could not close staged file %s (%s: %s); the orphan sweep will remove what is left",
                self._path,
                type(exc).__name__,
                _first_line(exc),
            )
        del writer


_REPLICATION_ONE_NOTED = threading.Event()


def _note_replication_one(path: str) -> None:
    """Say once per process that files here have replication 1, which makes closing them slow.

    The client's ``complete`` usually reaches the NameNode before the only DataNode's block
    report, is answered false, and hdfs-native tries again 500 ms later (docs/guide/storage.md,
    "HDFS"). With two replicas or more the last DataNode of the pipeline reports before the client hears back.
    """
    if not _REPLICATION_ONE_NOTED.is_set():
        _REPLICATION_ONE_NOTED.set()
        log.info(
            "%s has replication 1: closing a file on HDFS then mostly waits ~0.5 s for the "
            "DataNode's block report (with replication 2 or more it does not)",
            path,
        )


def _sibling(name: str, base: str) -> str:
    folder = name.rsplit("/", 1)[0] if "/" in name else ""
    return f"{folder}/{base}" if folder else base


class HdfsStorage:
    """A table root on HDFS (``hdfs://namenode:port/path``), through hdfs-native."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.namenode, self.root = parse_hdfs_url(url)
        self._config = hdfs_settings(storage_options, url)
        self.user = hdfs_user(storage_options, url)
        self.url = f"{self.namenode}{self.root}" if self.namenode else f"hdfs://{self.root}"
        #: New files' and folders' modes: rw (rwx) for all, less the cluster's umask (Hadoop's rule).
        umask = hdfs_umask(self._config, url)
        self.file_mode, self.folder_mode = 0o666 & ~umask, 0o777 & ~umask
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"HdfsStorage({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_lock=None, _clients={})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # The client -------------------------------------------------------------------------

    def _client(self, kind: str) -> Client:
        if self._pid != os.getpid():  # a forked child: the parent's client threads are not here
            self._clients, self._pid = {}, os.getpid()
        client = self._clients.get(kind)
        if client is None:
            with self._lock:
                client = self._clients.get(kind)
                if client is None:
                    if self.user is not None:
                        pin_user(self.user, self.url)
                    config = dict(self._config)
                    if kind == "opening":  # one try: an unreachable NameNode at start is a config error
                        config["dfs.client.failover.max.attempts"] = "0"
                    with self.errors(None):
                        client = self._clients[kind] = Client(self.namenode, config)
        return client

    @property
    def client(self) -> Client:
        """The hdfs-native client (made on first use in each process; thread-safe)."""
        return self._client("main")

    @contextlib.contextmanager
    def errors(self, name: str | None, *, data: bool = False) -> Iterator[None]:
        """hdfs-native's errors with the path and without Java stack traces; unreachable: StorageError.

        ``data``: the call writes a file's bytes, to a DataNode, which is what may be unreachable.
        """
        where = f"{self.url}/{name}" if name else self.url
        unreachable = "a DataNode (or the NameNode) for" if data else "the HDFS NameNode of"
        try:
            yield
        except (
            FileNotFoundError,
            FileExistsError,
            PermissionError,
            NotADirectoryError,
            IsADirectoryError,
        ) as exc:
            raise type(exc)(exc.errno or _ERRNO[type(exc)], _first_line(exc), where) from exc
        except RuntimeError as exc:  # hdfs-native's configuration errors, the NameNode's exceptions
            rpc = _rpc_error(exc)
            if rpc is not None and rpc[0].endswith("AccessControlException"):
                raise PermissionError(errno.EACCES, rpc[1], where) from exc
            if "No fs.defaultFS setting found" in str(exc):
                raise ValueError(
                    f"{self.url} names no NameNode and no fs.defaultFS is configured: give it "
                    "(hdfs://namenode:8020/path), or set HADOOP_CONF_DIR to the folder of your "
                    "cluster's core-site.xml"
                ) from exc
            if "No NameNode hosts" in str(exc):
                raise ValueError(
                    f"{self.url}: no NameNode found for {self.namenode or 'fs.defaultFS'}: give its port "
                    "(hdfs://namenode:8020/path), or configure the nameservice in $HADOOP_CONF_DIR"
                ) from exc
            raise StorageError(f"HDFS client error on {where}: {_first_line(exc)}") from exc
        except (ConnectionError, TimeoutError) as exc:
            raise StorageError(f"cannot reach {unreachable} {where}: {_first_line(exc)}") from exc
        except OSError as exc:
            if "Connection refused" in str(exc) or "os error 111" in str(exc):
                raise StorageError(f"cannot reach {unreachable} {where}: {_first_line(exc)}") from exc
            if "ParentNotDirectory" in str(exc):
                raise NotADirectoryError(errno.ENOTDIR, _first_line(exc), where) from exc
            raise StorageError(f"HDFS error on {where}: {_first_line(exc)}") from exc

    def path_of(self, name: str) -> str:
        checked_name(self, name)  # never '..', never absolute: no key outside the lake's prefix
        if not name:
            return self.root
        return f"{self.root.rstrip('/')}/{name}"

    def _name_of(self, path: str) -> str:
        return path[len(self.root.rstrip("/")) + 1 :]

    def _status(self, name: str) -> FileStatus | None:
        try:
            with self.errors(name):
                return self.client.get_file_info(self.path_of(name))
        except FileNotFoundError:
            return None

    # Staging and publishing ---------------------------------------------------------------

    def stage(self, name: str) -> HdfsStagedFile:
        return HdfsStagedFile(self, name)

    def publish(self, sealed: Sealed) -> bool:
        """Rename the staged file to its name, never over an existing file (see the module doc)."""
        return self._rename(expect_sealed(sealed, HdfsSealed, self), overwrite=False)

    def _rename(self, sealed: HdfsSealed, *, overwrite: bool) -> bool:
        src, dst = self.path_of(sealed.staged), self.path_of(sealed.name)
        for _ in range(RENAME_ATTEMPTS):
            try:
                self.client.rename(src, dst, overwrite)
                return True
            except PermissionError as exc:
                raise PermissionError(
                    exc.errno or errno.EACCES, _first_line(exc), f"{self.url}/{sealed.name}"
                ) from exc
            except OSError:  # refused, or its answer lost (FileNotFound/FileExists/disconnected)
                won = self._renamed(sealed)
                if won is not None:
                    return won
        raise StorageError(
            f"renaming {src} to {dst} on {self.url} failed {RENAME_ATTEMPTS} times without taking effect"
        )

    def _renamed(self, sealed: HdfsSealed) -> bool | None:
        """After a rename failed or lost its answer: True (it took effect), False (refused), None (retry)."""
        staged_there = self._status(sealed.staged) is not None
        if self._is_ours(sealed):
            return True
        if staged_there:
            return False if self._status(sealed.name) is not None else None
        raise CommitError(
            f"the staged file {self.path_of(sealed.staged)} on {self.url} no longer exists and "
            f"{sealed.name} is not its publication: it was removed (by the orphan sweep?) before it "
            "could be published; the task must be retried"
        )

    def _is_ours(self, sealed: HdfsSealed) -> bool:
        status = self._status(sealed.name)
        return (
            status is not None
            and status.length == sealed.size
            and status.modification_time == sealed.modified
            and self._status(sealed.staged) is None
        )

    def version(self, name: str) -> str | None:
        status = self._status(name)
        return None if status is None else f"{status.modification_time}:{status.length}"

    def supersede(self, sealed: Sealed, version: str) -> bool:
        """Replace the file if it is still ``version``: a version check and a rename, under a lock file.

        HDFS has no conditional rename, so every writer of this lake takes ``.<name>.lock``
        (created with overwrite=False) for the check and the replacing rename.
        """
        hdfs = expect_sealed(sealed, HdfsSealed, self)
        with self._locked(_sibling(hdfs.name, f".{hdfs.name.rsplit('/', 1)[-1]}.lock")):
            if self.version(hdfs.name) != version:
                return False
            return self._rename(hdfs, overwrite=True)

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        deadline = time.monotonic() + 2 * STALE_LOCK_SECONDS
        token = uuid.uuid4().hex.encode()
        while not self.put_if_absent(name, token):
            status = self._status(name)
            if status is not None and time.time() - status.modification_time / 1000 > STALE_LOCK_SECONDS:
                self.delete(name)  # its holder died: break it
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"lock {self.path_of(name)} is held for longer than {STALE_LOCK_SECONDS:.0f} s"
                )
            time.sleep(0.02)
        try:
            yield
        finally:
            self.delete(name)

    def discard(self, sealed: Sealed) -> None:
        self.delete(expect_sealed(sealed, HdfsSealed, self).staged)

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
        return self._status(name) is not None

    def refuse_link(self, name: str) -> None:
        checked_name(self, name)  # HDFS links are off unless a cluster enables them

    def list(self, folder: str = "") -> builtins.list[StoredFile]:
        path = self.path_of(folder.strip("/"))
        found = []
        try:
            with self.errors(folder or None):
                for status in self.client.list_status(path, False):
                    if status.isdir or status.path.rstrip("/") == path.rstrip("/"):
                        continue  # a folder, or ``path`` itself when it is a file
                    found.append(
                        StoredFile(self._name_of(status.path), status.length, status.modification_time / 1000)
                    )
        except (FileNotFoundError, NotADirectoryError):
            return []
        return found

    def folders(self, folder: str = "") -> builtins.list[str]:
        path = self.path_of(folder.strip("/"))
        try:
            with self.errors(folder or None):
                return [
                    self._name_of(status.path)
                    for status in self.client.list_status(path, False)
                    if status.isdir and status.path.rstrip("/") != path.rstrip("/")
                ]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_bytes(self, name: str, *, first_contact: bool = False, limit: int | None = None) -> bytes:
        client = self._client("opening") if first_contact else self.client
        with self.errors(name):
            return client.read(self.path_of(name)).read(-1 if limit is None else limit)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        return put_if_absent_by_publish(self, name, data)

    def put(self, name: str, data: bytes) -> None:
        sealed = expect_sealed(sealed_copy(self, name, data), HdfsSealed, self)
        try:
            self._rename(sealed, overwrite=True)
        except BaseException:
            quietly(lambda: self.discard(sealed), f"remove staged {name}")
            raise

    def delete(self, name: str) -> None:
        with self.errors(name):
            self.client.delete(self.path_of(name), False)

    def delete_retrying(self, name: str) -> None:
        """:meth:`delete`, tried again while the connection that just lost an answer is still
        reported as disconnected (hdfs-native notices a dropped connection a few calls late)."""
        for attempt in range(5):
            try:
                self.delete(name)
                return
            except StorageError as exc:
                if "disconnected" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.1 * 2**attempt)

    def root_exists(self) -> bool:
        with self.errors(None):
            try:
                return bool(self.client.get_file_info(self.root).isdir)
            except FileNotFoundError:
                return False

    def check_conditional_writes(self, name: str) -> None:
        """Probe that ``create`` and ``rename`` with overwrite=False refuse an existing name.

        HDFS refuses both; a file system that only looks like HDFS (a gateway, a proxy) might
        not, and would let a retried or concurrent write replace committed data. Costs a few
        NameNode calls, once per writer start.
        """
        advice = (
            f"the HDFS at {self.url} replaced an existing file on {{}} with overwrite=False, so a "
            "retried or concurrent write could silently replace committed data; lakesink cannot "
            "write exactly once there"
        )
        try:
            check_put_if_absent(self, name, f"file {self.path_of(name)}", advice.format("rename"))
            try:
                with self.errors(name):
                    self.client.create(
                        self.path_of(name), WriteOptions(overwrite=False, permission=self.file_mode)
                    ).close()
            except FileExistsError:
                pass
            else:
                raise StorageError(advice.format("create"))
            if self.read_bytes(name) != b"1":
                raise StorageError(advice.format("create"))
        finally:
            quietly(lambda: self.delete(name), f"delete probe file {self.path_of(name)}")

    # Reading with pyarrow -----------------------------------------------------------------

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """pyarrow over hdfs-native's fsspec filesystem (no JVM): for reading only.

        Writing never goes through it: its ``open('wb')`` overwrites by default.
        """
        # Here, not at the top: fsspec and pyarrow.fs, for reads only (writers never need them).
        from hdfs_native.fsspec import HdfsFileSystem
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        client = self.client  # first: it sets the process's user (the ``user`` option) if it must
        parsed = urlparse(self.namenode or "hdfs://")
        fs = HdfsFileSystem(host=parsed.hostname, port=parsed.port, skip_instance_cache=True, **self._config)
        fs.client = client  # the same NameNode, configuration and user as the writers
        return PyFileSystem(FSSpecHandler(fs)), self.root  # type: ignore[abstract]
