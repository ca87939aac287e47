"""Lets pyspark find ``format("lakesink")`` by itself, with no ``lakesink.register(spark)``.

At its first lookup of a Python data source, pyspark (4.0+) imports every installed top-level
module whose name starts with ``pyspark_`` and registers its ``DefaultSource`` under the
source's ``name()`` (``pyspark/sql/worker/lookup_data_sources.py``). Keep this module tiny and
its imports safe: if any such module fails to import, pyspark skips the lookup of *every*
Python data source.
"""

from lakesink.spark.datasource import LakeSinkDataSource as DefaultSource

__all__ = ["DefaultSource"]
