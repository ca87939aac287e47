"""One case's steps, in a child process: the caps, the audit hook, the reader and the commands.

Runs in a process forked from a server that imported lakesink and pyarrow first (so a case
costs its own work, not the imports). Everything it finds goes back as one dict.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

#: What the case's resident memory may grow by (VmHWM; the driver also polls it and kills a child
#: past twice this): a crafted lake costs its reader little memory. The address space is capped
#: too, far higher (RLIMIT_AS: pyarrow's allocator and each thread's malloc arena reserve much
#: more than they touch), as a backstop that keeps a runaway case from the machine's memory.
RSS_CAP = 512 << 20
ADDRESS_CAP = 6 << 30
#: The audit events that name a path (their first argument; rename, link, symlink: two).
WATCHED = {
    "lakesink.folder", "open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
    "os.link", "os.symlink", "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.rmtree",
    "shutil.copyfile", "shutil.move", "os.walk", "glob.glob", "os.exec", "os.posix_spawn",
    "subprocess.Popen",
}  # fmt: skip
TWO_PATHS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"}
#: Where the events that take ``dir_fd`` carry it, per path (the local backend works relative to
#: folder descriptors): a relative path there is resolved through ``/proc/self/fd``.
DIR_FDS = {"os.remove": (1,), "os.rmdir": (1,), "os.mkdir": (2,), "os.rename": (2, 3), "os.link": (2, 3)}
#: (event, path) that acts on the name itself, never following a link there: only its folder
#: is resolved (a link's own name removed, renamed, or met by ``link(2)``'s EEXIST is inside).
NAME_ITSELF = {("os.remove", 0), ("os.rmdir", 0), ("os.mkdir", 0), ("os.rename", 0), ("os.rename", 1),
               ("os.link", 1), ("os.symlink", 1)}  # fmt: skip
#: Files outside the lake that a Python process may read for itself.
SYSTEM_FILES = ("/etc/localtime", "/etc/timezone", "/dev/null", "/dev/urandom")
SYSTEM_DIRS = ("/proc", "/sys", "/usr/share/zoneinfo", "/usr/lib", "/usr/local/lib", "/lib", "/lib64")


def status(key: str) -> int:
    m = re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read())  # noqa: SIM115 -- tiny
    return int(m.group(1)) << 10 if m else 0


def allowed_dirs() -> list[str]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.getcwd(), *SYSTEM_DIRS}
    dirs.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted({os.path.realpath(d) for d in dirs})


def install_audit(root: str, found: list[str]) -> None:
    """Record every watched event whose path, links resolved, is outside ``root`` and outside
    Python's own folders (an ``open`` with ``O_NOFOLLOW``, and the names of :data:`NAME_ITSELF`:
    their last part is not resolved).

    A path relative to a ``dir_fd`` the event carries is resolved through the descriptor. An
    ``open`` is audited without its ``dir_fd``: a relative ``O_NOFOLLOW`` open of one part (no
    ``/``, not ``..``) stays in the folder of its descriptor, and the local backend reports
    each folder descriptor it works in (``lakesink.folder``), which is checked instead; any
    other relative open is resolved from the working folder, as Python would."""
    root = os.path.realpath(root)
    allowed = allowed_dirs()
    busy = threading.local()

    def outside(path: str) -> bool:
        if path == root or path.startswith(root + os.sep) or path in SYSTEM_FILES:
            return False
        return not any(path == d or path.startswith(d + os.sep) for d in allowed)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in WATCHED or getattr(busy, "on", False):
            return
        busy.on = True
        try:
            if event == "lakesink.folder":  # the local backend's folder descriptor: where is it?
                real = os.path.realpath(os.readlink(f"/proc/self/fd/{args[0]}"))
                if outside(real):
                    found.append(f"{event} {args[1]!r} (is {real})")
                return
            paths = list(args[:2] if event in TWO_PATHS else args[:1])
            for i, given in enumerate(paths):
                if given is None or isinstance(given, int):
                    continue  # a descriptor: opened (and checked) by name before
                name = os.fsdecode(os.fspath(given))
                nofollow = (
                    event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & os.O_NOFOLLOW
                ) or (event, i) in NAME_ITSELF
                at = DIR_FDS.get(event, ())
                dir_fd = args[at[i]] if i < len(at) and at[i] < len(args) else None
                if not os.path.isabs(name) and isinstance(dir_fd, int) and dir_fd >= 0:
                    name = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
                elif event == "open" and nofollow and "/" not in name and name not in (".", ".."):
                    continue  # one part below a checked descriptor (see above)
                name = os.path.abspath(name)
                real = (
                    os.path.join(os.path.realpath(os.path.dirname(name)), os.path.basename(name))
                    if nofollow
                    else os.path.realpath(name)
                )
                if outside(real):
                    found.append(f"{event} {given!s} (is {real})")
        except Exception as exc:  # noqa: BLE001 -- a hook must not raise into the code it watches
            found.append(f"audit hook failed on {event}: {exc!r}")
        finally:
            busy.on = False

    sys.addaudithook(hook)


#: The case's secret (:func:`run_case` sets it): a token the lake's URL carries, which no
#: step's output or error may show (docs/FORMAT.md, "Trust": URLs are shown redacted).
SECRET = ""


def shown_secret(text: str) -> str | None:
    return "the URL's secret shown in the output" if SECRET and SECRET in text else None


def local_path(url: str) -> str:
    """The local folder of a case's lake URL (a ``file://`` URL, or already a path)."""
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(url).path) if url.startswith("file:") else url


def one_error_line(text: str) -> bool:
    return len([line for line in text.splitlines() if "error:" in line]) == 1


def cli_step(command: str, root: str, *options: str) -> dict[str, Any]:
    from lakesink.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([command, root, *options])
    verdict = "ok" if code in (0, 1) else "refused"
    problem = None
    if code not in (0, 1, 2):
        problem = f"exit {code}"
    elif code == 2 and not one_error_line(err.getvalue()):
        problem = "exit 2 without exactly one error line"
    elif "Traceback" in err.getvalue() + out.getvalue():
        problem = "a traceback in the output"
    problem = problem or shown_secret(err.getvalue() + out.getvalue())
    return {"verdict": verdict, "exit": code, "problem": problem, "err": err.getvalue()[-300:]}


def read_step(root: str, victim_ids: range) -> dict[str, Any]:
    from lakesink_reader import Lake, LakeSinkError, read_committed

    try:
        lake = Lake(root)
        lake.files()
        table = read_committed(root)
        # read_all sees staged files too, and skips and reports what it cannot read
        everything = lake.read("read_all").table
        changed = table.slice(0, 0)
        if lake.metadata.format_version >= 3 and lake.mode != "foreach":  # a foreach lake has no log
            lake.versions()
            lake.history()
            changed = lake.changes(0).table  # what a job following the lake reads
    except LakeSinkError as exc:
        text = str(exc)
        problem = "a multi-line error" if "\n" in text.strip() else shown_secret(text)
        return {"verdict": "refused", "problem": problem, "err": f"{type(exc).__name__}: {text[:300]}"}
    read = (table, everything, changed)
    ids = {i for t in read if "id" in t.column_names for i in t.column("id").to_pylist()}
    leaked = sorted(ids & set(victim_ids))[:5]
    return {"verdict": "ok", "problem": f"rows of the file outside: {leaked}" if leaked else None}


#: The maintenance commands a case may run after the reads, on its own copy of the lake: they
#: write, copy and delete, and a crafted lake must lead none of that outside either (the audit
#: hook; the driver compares the victim folder before and after; compact's output is read).
#: And the other commands an operator runs by hand: every row of every retained version, the
#: upgrade of a format-2 lake (a format-3 one says it is one), a writer's offsets, the lake's
#: defaults, the leftovers counted.
MAINTENANCE = {
    "sync-views": ["sync-views"],
    "compact": ["compact", "--min-files", "2", "--target-file-size", "1MB"],
    "vacuum": ["vacuum", "--retain", "0", "--force", "--delete"],
    "orphans": ["orphans", "--older-than", "0", "--delete"],
    "verify-deep": ["verify", "--deep", "--all-versions"],
    "upgrade": ["upgrade"],
    "offsets": ["offsets"],
    "config": ["config"],
    "status-leftovers": ["status", "--leftovers"],
}


def maintenance_step(command: str) -> Callable[[str, range], dict[str, Any]]:
    def step(root: str, victim_ids: range) -> dict[str, Any]:
        name, *options = MAINTENANCE[command]
        outcome = cli_step(name, root, *options)
        if outcome["problem"] is None:
            copied = sorted(_ids_in_lake(local_path(root)) & set(victim_ids))[:5]
            if copied:
                outcome["problem"] = f"rows of the file outside copied into the lake: {copied}"
        return outcome

    return step


#: The largest footer and row count of a file this check reads: a copy lakesink made is small;
#: a crafted file is the mutation's, and reading it whole would cost this check, not the product,
#: the child's memory cap (50,000 one-row groups: 600 MiB).
_COPY_FOOTER, _COPY_ROWS = 1 << 20, 1_000_000


def _ids_in_lake(root: str) -> set[int]:
    """The ids of every regular Parquet file in the lake that reads (links not followed) and is
    small enough to be a copy lakesink made."""
    import pyarrow.parquet as pq

    found: set[int] = set()
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".parquet") and not os.path.islink(path) and "_delta_log" not in path:
                with contextlib.suppress(Exception):  # a damaged file: the mutation's, not a copy
                    with open(path, "rb") as f:
                        f.seek(-8, os.SEEK_END)
                        if int.from_bytes(f.read(4), "little") > _COPY_FOOTER:
                            continue
                    parquet = pq.ParquetFile(path)
                    if parquet.metadata.num_rows <= _COPY_ROWS:
                        found.update(parquet.read(columns=["id"]).column("id").to_pylist())
    return found


def secret_url_step(root: str, victim_ids: range) -> dict[str, Any]:
    """The lake opened through a URL whose user info is the case's secret (the local store
    refuses user info): the refusal, by the reader and by the CLI, must not show it."""
    from lakesink_reader import Lake

    url = f"file://fuzz:{SECRET}@localhost{local_path(root)}"
    try:
        Lake(url).files()
        text = ""
    except Exception as exc:  # noqa: BLE001 -- any refusal; what it shows is the question
        text = f"{type(exc).__name__}: {exc}"
    outcome = cli_step("status", url)
    if outcome["problem"] is None:
        outcome["problem"] = shown_secret(text)
    return outcome


STEPS: dict[str, Callable[[str, range], dict[str, Any]]] = {
    "read": read_step,
    "secret_url": secret_url_step,
    "status": lambda root, _: cli_step("status", root),
    "verify": lambda root, _: cli_step("verify", root),
    "history": lambda root, _: cli_step("history", root),
    **{name: maintenance_step(name) for name in MAINTENANCE},
}


def run_case(
    root: str, victim_ids: range, steps: list[str], conn: Any, url: str | None = None, secret: str = ""
) -> None:
    """The child's body: caps, hook, steps; the result dict sent through ``conn``. The steps open
    the lake through ``url`` (a URL of ``root`` that may carry ``secret``) where given."""
    global SECRET
    SECRET = secret
    result: dict[str, Any] = {"steps": {}, "audit": []}
    # The reader's warnings (a skipped checkpoint, an ignored hint) are not the oracle's: quiet.
    logging.disable(logging.CRITICAL)
    try:
        size = status("VmSize")
        resource.setrlimit(resource.RLIMIT_AS, (size + ADDRESS_CAP, size + ADDRESS_CAP))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak (VmHWM) starts at the current RSS
        before = status("VmRSS")
        install_audit(root, result["audit"])
        for name in steps:
            start = time.monotonic()
            try:
                outcome = STEPS[name](url or root, victim_ids)
            except MemoryError:
                outcome = {"verdict": "crash", "problem": "MemoryError: the address-space cap was hit"}
            except BaseException as exc:  # noqa: BLE001 -- that is what the oracle looks for
                lines = traceback.format_exception(exc)
                outcome = {"verdict": "crash", "problem": f"{type(exc).__name__}: {str(exc)[:300]}",
                           "trace": "".join(lines)[-3000:]}  # fmt: skip
            outcome["seconds"] = round(time.monotonic() - start, 3)
            result["steps"][name] = outcome
        result["rss_growth"] = status("VmHWM") - before
    except BaseException as exc:  # noqa: BLE001
        result["error"] = "".join(traceback.format_exception(exc))[-3000:]
    conn.send(result)
    conn.close()
