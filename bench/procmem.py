"""Peak resident memory of a process tree, sampled from /proc in a background thread.

psutil is not a dependency; /proc is all we need on Linux. Each sample walks /proc once to
map parents to children, then sums VmRSS of the root and every descendant, split into the
JVM, Spark's Python workers and the rest (the driver's Python). RSS sums count pages shared
between forked Python workers more than once, which slightly overstates them -- the same way
``ps`` and ``top`` do.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the process ended while we listed
            continue
        # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def tree(root: int) -> list[int]:
    """``root`` and all its live descendants."""
    children = _children_map()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by ``root``'s tree, by kind and in total.

    Reaped children are included: a process that exited has its time in its parent's
    ``cutime``/``cstime``, so the difference of two calls also counts the Python workers that
    came and went in between. On a busy machine this is the steadier figure: wall time
    stretches with the load, CPU time much less.
    """
    ticks = {"jvm": 0, "python_workers": 0, "other": 0}
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        got = _rss_and_kind(pid)
        if got is None:
            continue
        # After the command name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
        ticks[got[1]] += sum(int(x) for x in fields[11:15])
    seconds = {kind: t / _TICK for kind, t in ticks.items()}
    seconds["total"] = sum(seconds.values())
    return seconds


def _rss_and_kind(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            rss = int(f.read().split()[1]) * _PAGE
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    if b"java" in cmdline.split(b"\0", 1)[0]:
        kind = "jvm"
    elif b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
        kind = "python_workers"
    else:
        kind = "other"
    return rss, kind


@dataclass
class PeakRSS:
    """Peak RSS (bytes) of the whole tree and of each kind of process in it."""

    total: int = 0
    jvm: int = 0
    python_workers: int = 0
    other: int = 0
    largest_python_worker: int = 0
    samples: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "peak_rss_bytes": self.total,
            "peak_rss_jvm_bytes": self.jvm,
            "peak_rss_python_workers_bytes": self.python_workers,
            "peak_rss_driver_python_bytes": self.other,
            # One Python worker process: a writer task (or an idle daemon, whichever is bigger).
            "peak_rss_largest_python_worker_bytes": self.largest_python_worker,
            "rss_samples": self.samples,
        }


class TreeSampler:
    """Sample the RSS of ``root``'s process tree every ``interval`` seconds until stopped."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.peak = PeakRSS()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{root}", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        sums = {"jvm": 0, "python_workers": 0, "other": 0}
        largest = 0
        for pid in tree(self.root):
            got = _rss_and_kind(pid)
            if got is not None:
                sums[got[1]] += got[0]
                if got[1] == "python_workers":
                    largest = max(largest, got[0])
        peak = self.peak
        peak.largest_python_worker = max(peak.largest_python_worker, largest)
        peak.samples += 1
        peak.total = max(peak.total, sum(sums.values()))
        peak.jvm = max(peak.jvm, sums["jvm"])
        peak.python_workers = max(peak.python_workers, sums["python_workers"])
        peak.other = max(peak.other, sums["other"])

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - start)))
