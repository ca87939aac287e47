"""Processes the dev tooling starts: launched, waited on and stopped by PID, with what they spawned.

Linux only: process trees are read from ``/proc``. Every process started with :func:`launch`
(or handed over with :func:`adopt`) is registered until :func:`stop` ends it; at interpreter
exit, :func:`stop_all` stops whatever is still registered, newest first. A command-line tool
also calls :func:`install_signal_handlers`, so SIGTERM/SIGHUP end it through the same path.

A PID is only signalled while it still runs the command line it had when it was seen: a PID
reused by an unrelated process is never hit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

#: A process as seen at one moment: (pid, command line then). See :func:`seen`.
Seen = tuple[int, str]


# -- the process tree -----------------------------------------------------------------------


def cmdline(pid: int) -> str:
    """The command line of ``pid``, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...), or None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie -- exited, not yet reaped -- counts as gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree, parents before their children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = parent_of(int(entry.name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ancestors(pid: int) -> list[int]:
    """The parent of ``pid``, its parent, ... up to (not including) init."""
    chain: list[int] = []
    current = parent_of(pid)
    while current and current > 1:
        chain.append(current)
        current = parent_of(current)
    return chain


def seen(pids: Iterable[int]) -> list[Seen]:
    """``pids`` with their command lines now, for :func:`kill_seen` and :func:`kill_leftovers`."""
    return [(pid, cmdline(pid)) for pid in pids]


def still_running(processes: Iterable[Seen]) -> list[Seen]:
    """Those of ``processes`` that run, with the same command line as when they were seen."""
    return [(pid, line) for pid, line in processes if alive(pid) and cmdline(pid) == line]


def kill_seen(processes: Iterable[Seen], sig: int = signal.SIGKILL) -> None:
    """Signal each process that still runs the command line it was seen with."""
    for pid, _ in still_running(processes):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_leftovers(processes: Sequence[Seen], grace: float) -> list[Seen]:
    """Give ``processes`` ``grace`` seconds to exit, then SIGKILL the rest; return the rest."""
    wait_until(lambda: not still_running(processes), grace)
    left = still_running(processes)
    kill_seen(left)
    return left


# -- waiting --------------------------------------------------------------------------------


def wait_until(
    check: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.2,
    give_up: Callable[[], bool] | None = None,
) -> T | None:
    """Call ``check`` until it returns something truthy, and return that.

    None once ``timeout`` seconds have passed, or as soon as ``give_up()`` is true (say, the
    process that should make ``check`` true has exited): the caller says what went wrong.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if (give_up is not None and give_up()) or time.monotonic() >= deadline:
            return None
        time.sleep(interval)


# -- started processes ----------------------------------------------------------------------


@dataclass
class Started:
    """One process started (or adopted) here: its Popen, a name for messages, its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        """The end of its log ("" without one)."""
        if self.log is None:
            return ""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


_REGISTRY: dict[int, Started] = {}


def launch(
    name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path | None = None
) -> Started:
    """Start ``cmd`` with its output appended to ``log``, and register it.

    It runs in a session of its own: a terminal's Ctrl-C reaches only us, and we stop our
    processes in order (jobs before workers before the master).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    return adopt(name, proc, log)


def adopt(name: str, proc: subprocess.Popen[bytes], log: Path | None = None) -> Started:
    """Register a process started elsewhere (the moto server), so :func:`stop_all` stops it too."""
    started = Started(name, proc, log)
    _REGISTRY[proc.pid] = started
    return started


def stop(started: Started, timeout: float = 20.0) -> None:
    """Stop ``started`` and everything it spawned, by PID; unregister it.

    SIGTERM first (a JVM runs its shutdown hooks: a worker kills its executors), SIGKILL after
    ``timeout``; then whatever it had spawned and left running (executors, Python workers)
    gets ``timeout`` seconds to exit before SIGKILL.
    """
    spawned = seen(descendants(started.pid))
    if started.running():
        with contextlib.suppress(ProcessLookupError):
            started.proc.terminate()
        try:
            started.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            started.proc.kill()
            started.proc.wait()
    else:
        started.proc.wait()  # reap it
    kill_leftovers(spawned, timeout)
    _REGISTRY.pop(started.pid, None)


def stop_all() -> None:
    """Stop every process still registered, newest first."""
    for started in reversed(list(_REGISTRY.values())):
        try:
            stop(started)
        except Exception as exc:  # noqa: BLE001 - keep stopping the others
            print(f"could not stop {started.name} (pid {started.pid}): {exc}", file=sys.stderr)


atexit.register(stop_all)


def install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit, so ``finally`` blocks and atexit stop what we started.

    SIGINT already raises KeyboardInterrupt. For command-line tools only: a library (or a
    test run) must not take over signals.
    """

    def _exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


def wait_for_log(started: Started, pattern: str, timeout: float) -> re.Match[str]:
    """The first match of ``pattern`` in the log of ``started``, once it is there.

    RuntimeError if the process exits first, TimeoutError after ``timeout`` seconds; both
    carry the end of its log.
    """
    regex = re.compile(pattern)
    match = wait_until(
        lambda: regex.search(started.tail(200_000)), timeout, give_up=lambda: not started.running()
    )
    if match is not None:
        return match
    # One last look: it may have logged the line just before it exited.
    match = regex.search(started.tail(200_000))
    if match is not None:
        return match
    if not started.running():
        raise RuntimeError(
            f"{started.name} (pid {started.pid}) exited with {started.proc.returncode} before "
            f"logging /{pattern}/; its log {started.log} ends:\n{started.tail()}"
        )
    raise TimeoutError(
        f"{started.name} (pid {started.pid}) did not log /{pattern}/ within {timeout:.0f}s; "
        f"its log {started.log} ends:\n{started.tail()}"
    )


def serve_in_foreground(running: Callable[[], bool], stop: Callable[[], None]) -> None:
    """``python -m devtools.<server>``: wait while ``running()``, until Ctrl-C (or SIGTERM, through
    :func:`install_signal_handlers`), then ``stop()`` -- which a second Ctrl-C cannot cut short."""
    try:
        while running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop()
