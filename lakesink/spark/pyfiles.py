"""The ``--py-files`` of a session, where a streaming source's driver-side worker looks for them.

Spark 4.x starts the Python worker that plans a Python streaming source (``readStream`` of a
Python data source: ``PythonStreamingSourceRunner``) with its files folder set to
``<SparkFiles root>/streaming_job`` (``PythonWorkerUtils.writeSparkFiles(Some("streaming_job"),
...)``), a folder nothing creates, while ``spark-submit --py-files`` and ``addPyFile`` put the
zips at the root. A lake shipped that way (a cluster whose Python has no lakesink installed)
then fails its ``readStream.format("lakesink")`` at the first batch with ``No module named
'lakesink'``, while its writes and batch reads, planned by workers that get the root, work.
Seen on the standalone cluster (``tests/test_cluster.py``).

:func:`link_for_streaming_sources` (run by ``register``) links each of the session's Python
includes into that folder on the driver, so the worker finds them where it is told to look.
The links live in Spark's own temporary folder and go with it; a link that exists is left
alone. Best effort: a session without a local SparkContext (Spark Connect) has nothing to do.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: The folder Spark 4.x names for a streaming source's files, under the SparkFiles root.
STREAMING_FILES_DIR = "streaming_job"


def link_for_streaming_sources(spark: SparkSession) -> list[str]:
    """Link the session's ``--py-files`` zips into the streaming source's files folder; returns
    the links made (none when there is nothing to ship or they are there already)."""
    # pyspark.core is the classic API's: imported only for a session that has a SparkContext.
    from pyspark.core.files import SparkFiles

    includes = list(getattr(spark.sparkContext, "_python_includes", None) or [])
    if not includes:
        return []
    root = SparkFiles.getRootDirectory()
    target = os.path.join(root, STREAMING_FILES_DIR)
    made = []
    for name in includes:
        shipped, link = os.path.join(root, name), os.path.join(target, name)
        if not os.path.exists(shipped) or os.path.lexists(link):
            continue
        try:
            os.makedirs(target, exist_ok=True)
            os.symlink(shipped, link)
        except FileExistsError:
            continue  # another query of this application linked it meanwhile
        except OSError as exc:
            log.warning("could not link %s for streaming sources (%s): readStream of lakesink "
                        "may not find it", shipped, exc)  # fmt: skip
            continue
        made.append(link)
    if made:
        log.debug("linked %s for Spark's streaming-source worker", made)
    return made
