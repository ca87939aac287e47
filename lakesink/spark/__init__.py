"""The Spark adapters: Spark's writer hooks mapped onto the commit protocol (``lakesink.commit``).

- ``foreach``: ``LakeForeachWriter``, the row-at-a-time ``foreach`` writer;
- ``datasource``: ``format("lakesink")``, the epoch-mode Python data source (Arrow batches);
- ``start``: ``register`` and ``write_stream``, the ways to start an epoch-mode query;
- ``rows``: Spark rows and schemas into Arrow; ``workers``: what lakesink does about the cost
  of Spark's Python workers.

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
        from lakesink.spark.foreach import LakeForeachWriter

        return LakeForeachWriter
    if name in ("register", "write_stream"):
        from lakesink.spark import start

        return getattr(start, name)
    raise AttributeError(f"module 'lakesink.spark' has no attribute {name!r}")
