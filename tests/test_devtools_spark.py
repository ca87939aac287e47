"""The local SparkSession's environment: the SPARK_HOME view whose workers import installed pyspark."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools.spark import installed_spark_home, prepare_environment, spark_home_without_zip


def fake_spark_home(root: Path, *, with_zip: bool = True) -> Path:
    """The layout of a pip-installed pyspark: a Python package that is also a Spark home."""
    for folder in ("bin", "jars", "data", "sql", "python/lib", "__pycache__"):
        (root / folder).mkdir(parents=True)
    (root / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (root / "jars" / "spark-core.jar").write_bytes(b"PK")
    (root / "sql" / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "py.typed").write_text("")
    if with_zip:
        (root / "python" / "lib" / "pyspark.zip").write_bytes(b"PK")
    return root


def test_the_view_links_the_spark_parts_and_leaves_out_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_spark_home(tmp_path / "pyspark")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    view = spark_home_without_zip(home)
    assert view.parent == tmp_path / "cache" / "lakesink"
    assert sorted(os.listdir(view)) == ["bin", "data", "jars"]
    for name in ("bin", "data", "jars"):
        assert (view / name).is_symlink() and (view / name).resolve() == (home / name).resolve()
    assert (view / "bin" / "spark-submit").is_file()
    # Built once: the next session finds it, and no half-built folder is left behind.
    assert spark_home_without_zip(home) == view
    assert os.listdir(view.parent) == [view.name]


def test_a_home_without_the_zip_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = fake_spark_home(tmp_path / "spark", with_zip=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert spark_home_without_zip(home) == home
    assert not (tmp_path / "cache").exists()


def test_a_cache_folder_that_cannot_be_made_falls_back_to_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = fake_spark_home(tmp_path / "pyspark")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert spark_home_without_zip(home) == home


def test_an_explicit_spark_home_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "their-spark"))
    prepare_environment()
    assert os.environ["SPARK_HOME"] == str(tmp_path / "their-spark")


@pytest.mark.spark
def test_workers_of_the_local_session_import_the_installed_pyspark(spark) -> None:  # type: ignore[no-untyped-def]
    installed = installed_spark_home()
    assert installed is not None
    if Path(os.environ["SPARK_HOME"]).resolve() == installed.resolve():
        pytest.skip("SPARK_HOME was set before the session started: the view is not in use")
    files = (
        spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("pyspark").__file__).collect()
    )
    assert files and all(Path(f).parent.resolve() == installed.resolve() for f in files), files
