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
    "open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
    "os.link", "os.symlink", "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.rmtree",
    "shutil.copyfile", "shutil.move", "os.walk", "glob.glob", "os.exec", "os.posix_spawn",
    "subprocess.Popen",
}  # fmt: skip
TWO_PATHS = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"}
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
    Python's own folders (an ``open`` with ``O_NOFOLLOW``: its last part is not resolved)."""
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
            paths = list(args[:2] if event in TWO_PATHS else args[:1])
            for given in paths:
                if given is None or isinstance(given, int):
                    continue  # a descriptor: opened (and checked) by name before
                name = os.path.abspath(os.fsdecode(os.fspath(given)))
                nofollow = (
                    event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & os.O_NOFOLLOW
                )
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


def one_error_line(text: str) -> bool:
    return len([line for line in text.splitlines() if "error:" in line]) == 1


def cli_step(command: str, root: str) -> dict[str, Any]:
    from lakesink.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([command, root])
    verdict = "ok" if code in (0, 1) else "refused"
    problem = None
    if code not in (0, 1, 2):
        problem = f"exit {code}"
    elif code == 2 and not one_error_line(err.getvalue()):
        problem = "exit 2 without exactly one error line"
    elif "Traceback" in err.getvalue() + out.getvalue():
        problem = "a traceback in the output"
    return {"verdict": verdict, "exit": code, "problem": problem, "err": err.getvalue()[-300:]}


def read_step(root: str, victim_ids: range) -> dict[str, Any]:
    from lakesink_reader import Lake, LakeSinkError, read_committed

    try:
        lake = Lake(root)
        lake.files()
        table = read_committed(root)
        if lake.metadata.format_version >= 3:
            lake.versions()
            lake.history()
    except LakeSinkError as exc:
        text = str(exc)
        problem = "a multi-line error" if "\n" in text.strip() else None
        return {"verdict": "refused", "problem": problem, "err": f"{type(exc).__name__}: {text[:300]}"}
    ids = set(table.column("id").to_pylist()) if "id" in table.column_names else set()
    leaked = sorted(ids & set(victim_ids))[:5]
    return {"verdict": "ok", "problem": f"rows of the file outside: {leaked}" if leaked else None}


STEPS: dict[str, Callable[[str, range], dict[str, Any]]] = {
    "read": read_step,
    "status": lambda root, _: cli_step("status", root),
    "verify": lambda root, _: cli_step("verify", root),
    "history": lambda root, _: cli_step("history", root),
}


def run_case(root: str, victim_ids: range, steps: list[str], conn: Any) -> None:
    """The child's body: caps, hook, steps; the result dict sent through ``conn``."""
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
                outcome = STEPS[name](root, victim_ids)
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
