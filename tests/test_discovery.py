"""``format("lakesink")`` on a plain SparkSession, found by pyspark itself: no ``register`` call.

pyspark 4 imports every installed top-level module named ``pyspark_*`` at its first lookup of a
Python data source and registers its ``DefaultSource``; lakesink installs ``pyspark_lakesink``.
Here: the wheels ship that module, and its import stays light. The query itself -- a plain
``SparkSession.builder`` session in an interpreter of its own, whose JVM has never seen
``register``, ``format("lakesink")`` found without it, the driver never importing lakesink, an
epoch-mode lake with every row -- runs once, in test_first_hour.py
(``test_a_named_format_lakesink_query_runs_without_register_from_any_folder``: from a folder
outside the checkout, nothing on PYTHONPATH), since each such run starts a JVM of its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheels_ship_the_discovery_module_and_the_reader(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT / "reader"),
         str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    import zipfile

    [writer] = tmp_path.glob("lakesink-*.whl")
    names = zipfile.ZipFile(writer).namelist()
    assert "pyspark_lakesink.py" in names and "lakesink/views/delta_view.py" in names
    others = ("devtools/", "tests/", "bench/", "reader/", "lakesink_reader/")
    assert not any(n.startswith(others) for n in names)
    [reader] = tmp_path.glob("lakesink_reader-*.whl")
    names = zipfile.ZipFile(reader).namelist()
    wanted = ("__init__.py", "format/v3/vlog.py", "storage/s3.py", "py.typed")
    assert {f"lakesink_reader/{n}" for n in wanted} <= set(names)
    assert not any(n.startswith(("lakesink/", "pyspark_lakesink")) for n in names)


def test_finding_the_data_source_imports_neither_pyarrow_nor_the_commit_protocol() -> None:
    """Spark's lookup worker imports ``pyspark_lakesink`` on the way to every query's start.

    It needs the class only; pyarrow and the commit protocol (0.25 CPU-s) wait for the hooks.
    """
    probe = (
        "import sys, pyspark_lakesink\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'numpy', 'boto3')"
        " or m.startswith(('lakesink.commit', 'lakesink.config'))))\n"
        "from lakesink.spark.datasource import import_hook_modules\n"
        "import_hook_modules()\n"
        "print('pyarrow' in sys.modules and 'lakesink.commit.files' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
