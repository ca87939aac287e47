"""A SparkSession for local runs (jobs, tests, demo, bench) whose Python workers start fast and right.

Two things about Spark's Python workers, both settled before the JVM starts:

- Spark starts them with ``python3`` from PATH unless PYSPARK_PYTHON says otherwise; outside
  a venv-activated shell that is the wrong interpreter ("No module named 'pyarrow'"). They
  are pointed at the running interpreter.
- Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on their PYTHONPATH. Python cannot
  cache bytecode for modules imported from a zip, so every worker process compiles the
  pyspark modules it needs from source: measured with py-spy on the ``make bench`` stream,
  up to 0.5 CPU-s per process, and a streaming query through the Python Data Source API
  starts about ten of them (lookup, planning, commit, one per task slot), mostly one after
  another. With a pip-installed pyspark the same modules are installed next to the
  interpreter, compiled.
  So SPARK_HOME becomes a view of the pyspark package (symbolic links to ``bin``, ``jars``
  and the rest) without ``python/``: the zip is not found, and workers import the installed
  package -- the very same files. An explicit SPARK_HOME is kept as it is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def prepare_environment() -> None:
    """Set the variables Spark reads at JVM start (keeps explicit user settings)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if "SPARK_HOME" not in os.environ:
        home = installed_spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = str(spark_home_without_zip(home))


def installed_spark_home() -> Path | None:
    """The pip-installed pyspark package, which is a Spark home (bin/, jars/), or None."""
    spec = importlib.util.find_spec("pyspark")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent
    return home if (home / "jars").is_dir() and (home / "bin" / "spark-submit").is_file() else None


def spark_home_without_zip(home: Path) -> Path:
    """A view of Spark home ``home`` without its ``python/`` folder (see the module docstring).

    Built once per pyspark installation under the user's cache folder, atomically (concurrent
    sessions race to rename a finished view into place); ``home`` itself when it has no
    ``python/lib/pyspark.zip`` or the view cannot be built.
    """
    zip_path = home / "python" / "lib" / "pyspark.zip"
    if not zip_path.is_file():
        return home
    stat = zip_path.stat()
    key = hashlib.sha256(f"{home}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lakesink"
    view = cache / f"spark-home-{key}"
    if view.is_dir():
        return view
    try:
        cache.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=cache))
        for entry in home.iterdir():
            if _is_spark_home_part(entry):
                (building / entry.name).symlink_to(entry)
        try:
            building.rename(view)
        except OSError:  # another session renamed its view into place first: use that one
            for link in building.iterdir():
                link.unlink()
            building.rmdir()
    except OSError as exc:
        log.info("cannot build a SPARK_HOME view under %s (%s): workers will compile pyspark.zip", cache, exc)
        return home
    return view


def _is_spark_home_part(entry: Path) -> bool:
    """bin/, jars/, sbin/, data/, ... -- not python/ and not the pyspark package's own modules."""
    if entry.name in ("python", "__pycache__") or entry.suffix in (".py", ".pyi") or entry.name == "py.typed":
        return False
    return not (entry / "__init__.py").exists()


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
