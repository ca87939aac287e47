"""``spark.read.format("lakesink").load(path)`` through Spark's own Parquet scan (issue 52).

A Python data source's rows pass through a Python worker, an extra projection and per-100-row
metric updates that no setting removes; Spark's file scan reads Parquet in the JVM, vectorized.
The driver pins the version and knows its files (``lakesink.spark.reading.plan_read``), so a
batch read can be ``spark.read.schema(<the lake's>).option("basePath", root).parquet(*files)``
over exactly those files: the same rows, the partition columns from the folders (lakesink
names them as Spark does), the lake's schema for every file (columns a file lacks read as
null, as the reader does).

It applies where Spark's Hadoop client reaches the files by itself: local disk (``file://``)
and HDFS, read without storage options. S3 through ``s3a`` needs hadoop-aws on Spark's class
path and lakesink's storage options translated into Hadoop's; until then an S3 lake, a read
with storage options, a Spark Connect session, a read with a schema of the user's, a session
where lakesink's checks are not installed (``lakesink.register``), or ``.option("scan",
"python")`` takes the Python data source (``lakesink.spark.reading``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.spark.reading import ReadPlan

#: The read option that picks the scan: "auto" (Spark's where it reaches the store), "spark"
#: (Spark's, or an error saying why not), "python" (the Python data source).
SCAN_OPTION = "scan"
SCANS = ("auto", "spark", "python")


def scan_choice(options: Mapping[str, str]) -> str:
    opts = {k.lower(): v for k, v in options.items()}
    choice = opts.get(SCAN_OPTION, "auto").strip().lower()
    if choice not in SCANS:
        raise ValueError(f"scan must be one of {', '.join(map(repr, SCANS))}, got {opts[SCAN_OPTION]!r}")
    return choice


def file_root(path: str) -> str | None:
    """The lake's root as Spark's Hadoop client names it, or None when Spark cannot reach it by
    itself (S3: lakesink's storage options are not Hadoop's)."""
    scheme = path.split("://", 1)[0].lower() if "://" in path else "file"
    if scheme == "file":
        local = path.split("://", 1)[1] if "://" in path else path
        return "file://" + os.path.abspath(local)
    if scheme in ("hdfs", "viewfs"):
        return path.rstrip("/")
    return None


def parquet_scan(spark: SparkSession, options: Mapping[str, str]) -> DataFrame | None:
    """The read as Spark's Parquet scan, or None for the Python data source (see the module)."""
    choice = scan_choice(options)
    if choice == "python":
        return None
    # Here, not at the top: the read plan loads pyarrow and the reader.
    from lakesink.spark.reading import plan_read

    plan = plan_read({k: v for k, v in options.items() if k.lower() != SCAN_OPTION})
    # lakesink's storage options are not Hadoop's: a lake that needs some is the Python source's.
    root = None if plan.storage_options else file_root(plan.path)
    if root is None:
        if choice == "spark":
            raise ValueError(
                f"scan='spark' reads {plan.path!r} through Spark's Hadoop client, which reaches local "
                "disk and HDFS without storage options only: drop the option (the Python data "
                "source reads it)"
            )
        return None
    return scan_of(spark, plan, root)


def scan_of(spark: SparkSession, plan: ReadPlan, root: str) -> DataFrame:
    # Here, not at the top: pyspark's Arrow type mapping loads pyarrow (the guard imports this module).
    from pyspark.sql.pandas.types import from_arrow_schema

    # Here, not at the top: the storage backends load pyarrow too.
    from lakesink_reader.storage import open_storage

    schema = from_arrow_schema(plan.schema)
    if not plan.files:
        return spark.createDataFrame([], schema)
    names = [name for name, _ in plan.files]
    storage = open_storage(plan.path, plan.storage_options)
    for name in names:
        # Spark's scan follows links, which could lead out of the lake: a committed name that
        # is one is refused, as every lakesink read refuses it (docs/FORMAT.md, "Trust").
        storage.refuse_link(name)
    return files_scan(spark, schema, root, names)


def files_scan(spark: SparkSession, schema: Any, root: str, names: Sequence[str]) -> DataFrame:
    """Spark's Parquet scan of the lake files ``names`` (relative to ``root``, :func:`file_root`'s)
    as the lake's ``schema`` (a StructType): the partition columns from the folders, columns a
    file lacks as nulls, in the lake's column order. No names: no rows, the same columns (Spark
    makes every column of a file scan nullable, with files or without)."""
    frame = spark.read.schema(schema).option("basePath", root).parquet(*[f"{root}/{name}" for name in names])
    # Spark puts the partition columns last; the lake's order is the read's.
    return frame.select(*[f"`{name}`" for name in schema.names]) if frame.columns != schema.names else frame


def is_spark_scan(frame: Any) -> bool:
    """Whether ``frame`` reads through Spark's file scan (for tests and the bench)."""
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return "FileScan parquet" in plan or "Scan parquet" in plan
