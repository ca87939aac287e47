"""A SparkSession for local runs (jobs, tests, demo) whose Python workers can import lakesink.

Spark starts its Python workers with ``python3`` from PATH unless PYSPARK_PYTHON says
otherwise; outside a venv-activated shell that is the wrong interpreter ("No module named
'pyarrow'"). This module points them at the running interpreter before the JVM starts.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def prepare_environment() -> None:
    """Set the variables Spark reads at JVM start (keeps explicit user settings)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_session(app_name: str, *, master: str = "local[2,4]", **conf: str) -> SparkSession:
    """A local-mode SparkSession: ``local[N,F]`` runs N task threads, F attempts per task."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "60s")
    )
    for key, value in conf.items():
        builder = builder.config(key.replace("__", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
