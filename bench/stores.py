"""The remote store of the S3 runs: a moto server on 127.0.0.1, optionally behind a delaying proxy.

moto stands in for a remote service. It runs in a process of its own that the bench's parent
starts and stops (by PID), so it is no part of a child's process tree and its CPU is not
counted as the sink's; it is measured on its own, for the record. The proxy is the project's
fault-injecting one (``tests/netfaults.py``) with a single rule, a delay on every request: a
round trip to an object store in another building.
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procmem import tree_cpu_seconds

BUCKET = "lakesink-bench"
#: Every moto server this process started (stopped by the time ``s3_store`` returns): the smoke
#: test checks that none is left running.
MOTO_PIDS: list[int] = []
TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"


@dataclass
class S3Store:
    """A running moto server (and proxy): where the sink writes, and what it cost the server."""

    endpoint: str  # what the sink talks to: the proxy when there is one, else moto itself
    moto_endpoint: str
    moto_pid: int
    proxy: Any = None  # a netfaults.FaultProxy

    def storage_options(self) -> dict[str, Any]:
        from devtools.moto import dev_storage_options

        return dev_storage_options(self.endpoint)

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def moto_cpu_seconds(self) -> float:
        """CPU seconds the moto server has used so far."""
        return tree_cpu_seconds(self.moto_pid)["total"]

    def requests(self) -> dict[str, int]:
        """S3 requests through the proxy so far, by operation (empty without a proxy)."""
        if self.proxy is None:
            return {}
        return dict(collections.Counter(record.operation for record in self.proxy.log))


@contextlib.contextmanager
def s3_store(delay_seconds: float = 0.0) -> Iterator[S3Store]:
    """A fresh moto server with the bench's bucket, behind a proxy delaying each request if asked.

    Each run gets a fresh server: moto keeps every object in memory, and a run must not pay
    for the objects of the run before.
    """
    from devtools.moto import create_bucket, start_moto, stop_moto

    moto, url = start_moto()
    MOTO_PIDS.append(moto.pid)
    proxy = None
    try:
        create_bucket(url, BUCKET)
        store = S3Store(url, url, moto.pid)
        if delay_seconds:
            # The proxy is a test helper (tests/ is not a package): imported from its folder.
            if str(TESTS_DIR) not in sys.path:
                sys.path.append(str(TESTS_DIR))
            from netfaults import Action, FaultProxy, Rule  # type: ignore[import-not-found]

            proxy = FaultProxy(url).start()
            proxy.add_rule(Rule(Action.DELAY, seconds=delay_seconds))
            store = S3Store(proxy.endpoint_url, url, moto.pid, proxy)
        yield store
    finally:
        if proxy is not None:
            proxy.stop()
        stop_moto(moto)
