"""Iceberg's own Java library reading a lake's Iceberg view, for the tests (issue 54).

``java/iceberg/pom.xml`` names iceberg-data and iceberg-parquet 1.12 (and the Hadoop client
pyspark bundles); ``make iceberg-jars`` copies the jars into ``java/iceberg/jars`` and compiles
the reader ``java/iceberg/src/main/java/lakesink/devtools/IcebergRead.java`` into
``java/iceberg/classes``. The reader finds the table from the lake's path as Iceberg's
file-system catalog does (``HadoopTables``: the version hint, then probes above it) and reads
rows with iceberg-data's generic reader: what a JVM engine's Iceberg integration does beneath
its SQL. One JVM per call (~3 s): ask everything of one lake in one call.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ICEBERG_DIR = ROOT / "java" / "iceberg"
JARS = ICEBERG_DIR / "jars"
CLASSES = ICEBERG_DIR / "classes"
MAIN = "lakesink.devtools.IcebergRead"


class IcebergJarsMissing(RuntimeError):
    """Iceberg's jars or the reader are not built: ``make iceberg-jars`` builds them."""


def classpath() -> str:
    """The reader's class path; IcebergJarsMissing naming ``make iceberg-jars`` when not built."""
    jars = sorted(JARS.glob("*.jar")) if JARS.is_dir() else []
    if not jars or not (CLASSES / "lakesink" / "devtools" / "IcebergRead.class").is_file():
        raise IcebergJarsMissing(
            f"Iceberg's Java reader is not built ({JARS}, {CLASSES}): run `make iceberg-jars` "
            "(Maven copies the jars of java/iceberg/pom.xml, javac compiles the reader)"
        )
    return os.pathsep.join([str(CLASSES), *(str(j) for j in jars)])


def read(
    lake: str, *requests: str, properties: dict[str, str] | None = None, timeout: float = 120
) -> dict[str, tuple[int, list[str]]]:
    """What Iceberg's Java library reads of the view of the lake at ``lake`` (a local path, an
    ``hdfs://`` or ``s3://`` URL), per request (``rows``, ``rows:<snapshot>``, ``column:<name>``,
    ``column:<name>:<snapshot>``, ``appended:<from>:<to>``; see the reader): the snapshot it
    read and the values, sorted (a column's ``<id>=<value>`` by id).
    ``properties``: an ``s3://`` lake's S3FileIO properties (``s3.endpoint``,
    ``s3.access-key-id``, ...). RuntimeError with the JVM's output when the reader fails
    (Iceberg refused the view)."""
    given = [f"-Diceberg.{k}={v}" for k, v in (properties or {}).items()]
    done = subprocess.run(
        ["java", "-Xmx512m", *given, "-cp", classpath(), MAIN, lake, *requests],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"Iceberg's Java reader failed on {lake}:\n{done.stderr[-4000:]}")
    out: dict[str, tuple[int, list[str]]] = {}
    for line in done.stdout.splitlines():
        request, snapshot, values = [*line.split(" ", 2), ""][:3]
        out[request] = (int(snapshot), values.split(",") if values else [])
    return out
