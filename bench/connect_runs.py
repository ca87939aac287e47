"""The stream from Spark Connect clients: ``format("lakesink")`` and ``format("parquet")`` through one server.

One server (``devtools.connect.ConnectServer``: pyspark's own, on 127.0.0.1, the stream's
master, its Python workers running this interpreter, which has lakesink) serves the Connect
runs of a bench session, and is stopped by its PID after them. Each run is a client child
(``child.py``, session ``connect``, a user's environment) that builds its session with
``SparkSession.builder.remote(url)`` and nothing else, measured as the other children are:
rows/s from ``start()`` to the end. The work is the server's, so each run also has the CPU-s
of the server's process tree over the client's life, and its peak RSS meanwhile.

A server outlives its queries: its JIT and its Python daemons carry over from one client to
the next, as on any long-lived server. So each sink first runs one epoch's files of the
input, unmeasured, right before its measured run: each measured run finds the server warm
for its own sink, and Spark's sink runs before lakesink's workers exist.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from child import Sink
from launch import RunFailed, run_child, user_env
from procmem import TreeSampler, tree_cpu_seconds

if TYPE_CHECKING:
    from throughput import Stream

    from devtools.connect import ConnectServer

#: The Connect runs of the stream, by the names ``--sinks`` takes: what the client writes with.
CONNECT_RUNS: dict[str, Sink] = {"connect-parquet": "parquet", "connect": "format"}
#: Every Connect server this process started (stopped by the time the stream phase ends): the
#: smoke test checks that none is left running.
SERVER_PIDS: list[int] = []


def start_server(stream: Stream) -> tuple[ConnectServer, float]:
    """A Connect server with the stream's master, and the seconds it took to listen; RunFailed if none."""
    from devtools.connect import ConnectServer

    began = time.monotonic()
    server = ConnectServer(stream.work / "connect-server", master=stream.master)
    try:
        server.start()
    except RuntimeError as exc:
        raise RunFailed(f"the Spark Connect server did not start: {exc}") from None
    assert server.process is not None  # started
    SERVER_PIDS.append(server.process.pid)
    return server, time.monotonic() - began


def run_connect(stream: Stream, server: ConnectServer, name: str, label: str, out: str) -> dict[str, Any]:
    """The warm-up, then the measured client run of ``name``: the child's figures and the server's."""
    assert server.process is not None  # started
    sink = CONNECT_RUNS[name]
    warm, warm_input = f"{label}-warm-up", _warm_up_input(stream)
    warm_up = _client(stream, server, warm, sink, str(stream.work / "out" / warm), input=warm_input)
    run_child(warm_up, stream.work, user_env(), stream.rss_interval)
    pid = server.process.pid
    cpu = tree_cpu_seconds(pid)["total"]
    with TreeSampler(pid, stream.rss_interval) as server_rss:
        measured = _client(stream, server, label, sink, out)
        figures = run_child(measured, stream.work, user_env(), stream.rss_interval)
    server_cpu = tree_cpu_seconds(pid)["total"] - cpu
    client_cpu = figures["query_cpu_seconds"]
    figures.update(
        server_cpu_seconds=server_cpu,
        client_cpu_seconds=client_cpu,
        # The server's CPU over the client's whole life (its session too) and the client's over
        # the query: what the query cost, give or take the session's set-up and stop.
        rows_per_cpu_second=figures["rows"] / (server_cpu + client_cpu),
        server_peak_rss_bytes=server_rss.peak.total,
        server_peak_rss_python_workers_bytes=server_rss.peak.python_workers,
    )
    return figures


def _client(stream: Stream, server: ConnectServer, label: str, sink: Sink, out: str, **changes: Any) -> Any:
    return stream.spec(label, sink, out, session="connect", remote=server.url, spark_conf={}, **changes)


def _warm_up_input(stream: Stream) -> str:
    """The stream's first epoch's files (links to them), made once."""
    folder = stream.work / "input-connect-warm-up"
    if not folder.exists():
        folder.mkdir()
        for path in sorted(stream.input.glob("*.parquet"))[: stream.files_per_trigger]:
            (folder / path.name).symlink_to(path.resolve())
    return str(folder)
