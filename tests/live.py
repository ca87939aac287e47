"""Test helpers for maintenance beside a live format-3 writer, and for kill -9 at a named step.

- :func:`kill_when_ready`: run a script in its own interpreter (the checkout on its path); it
  prints "ready" when it has reached the step a test aims at, and is then killed with -9.
- :class:`LiveWriter`: a ``write_stream(..., format_version=3)`` query with a short trigger over
  a folder that a thread keeps adding input files to, so that maintenance runs beside commits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: A child's PYTHONPATH: this checkout's lakesink and its reader (in a second checkout the venv's
#: editable install of lakesink_reader may point at another one).
CHECKOUT_PATH = f"{ROOT}{os.pathsep}{ROOT / 'reader'}"


def kill_when_ready(script: str, *args: str) -> None:
    """Run ``python -c script *args``; kill -9 it as soon as it prints "ready" (asserted)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": CHECKOUT_PATH},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)


class LiveWriter:
    """A format-3 writer committing a batch about every 200 ms while input keeps arriving.

    ``files`` input files of 100 ids each (file i holds ids i*100..i*100+99) arrive one every
    0.15 s; ``done`` is set when the last one is there. Use as a context manager: on exit the
    feeding ends and the query is stopped (``query.exception()`` is the test's to check).
    """

    def __init__(self, spark: Any, tmp_path: Path, lake: str, files: int) -> None:
        from test_epoch_v3 import add_input, stream

        import lakesink

        self.files, self.folder = files, tmp_path / "in"
        self._add = add_input
        add_input(self.folder, 0)
        self.query = lakesink.write_stream(
            stream(spark, self.folder), lake, checkpoint_location=str(tmp_path / "chk"),
            trigger={"processingTime": "200 milliseconds"}, format_version=3,
            # Spark's tasks publish, then the driver commits: the window in which a sweep or a
            # vacuum meets a batch in flight. Written on the driver (``auto`` for batches this
            # small, issue 52) the publish and the commit are back to back, and the race tests
            # beside a live writer saw no race in two CI runs of session 16.
            driver_write="never",
        )  # fmt: skip
        self.lake = lake
        self.done = threading.Event()
        self._feeder = threading.Thread(target=self._feed)

    def _feed(self) -> None:
        for i in range(1, self.files):
            self._add(self.folder, i)
            time.sleep(0.15)
        self.done.set()

    def __enter__(self) -> LiveWriter:
        self._feeder.start()
        while not os.path.exists(os.path.join(self.lake, "_lakesink", "log")):
            time.sleep(0.1)  # the first commit has made the log
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.wait(60)
        self._feeder.join(60)
        self.query.stop()
