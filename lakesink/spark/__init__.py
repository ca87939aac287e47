"""The Spark adapters: Spark's writer hooks mapped onto the commit protocol (``lakesink.commit``),
and Spark's reader hooks onto the reader (``lakesink_reader``).

- ``foreach``: ``LakeForeachWriter``, the row-at-a-time ``foreach`` writer;
- ``datasource``: ``format("lakesink")``, the one Python data source: the epoch-mode streaming
  write (Arrow batches), and the doors ``reading`` (``spark.read``) and ``streaming``
  (``spark.readStream``: the lake as a source) read through;
- ``start``: ``register`` and ``write_stream``, the ways to start an epoch-mode query; ``guard``
  and ``preflight``: what is refused at ``start()``; ``failures``: a run's refusal raised as itself;
- ``checkpoints``: what lakesink reads of Spark's checkpoint; ``runs``: a run's memo on the driver;
- ``rows``: Spark rows and schemas into Arrow; ``workers`` and ``warmup``: what lakesink does
  about the cost of Spark's Python workers.

Importing this package does not import pyspark: ``foreach`` needs none until a task runs, and
the modules that subclass pyspark's classes are imported when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakesink.spark.foreach import LakeForeachWriter
    from lakesink.spark.start import register, write_stream

__all__ = ["LakeForeachWriter", "register", "write_stream"]


def __getattr__(name: str) -> Any:
    if name == "LakeForeachWriter":
        # Here, not at the top: foreach loads pyarrow and the commit protocol.
        from lakesink.spark.foreach import LakeForeachWriter

        return LakeForeachWriter
    if name in ("register", "write_stream"):
        # Here, not at the top: start loads pyspark, the commit protocol and pyarrow.
        from lakesink.spark import start

        return getattr(start, name)
    raise AttributeError(f"module 'lakesink.spark' has no attribute {name!r}")
