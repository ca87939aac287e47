"""What executors of the test cluster get: lakesink as a ``--py-files`` zip, and a Python without it.

Why this way
------------
lakesink is pure Python, so it ships with each job as one zip via ``--py-files``: the
packages and modules ``pip install lakesink`` installs, as listed in ``setup.cfg`` (Spark puts
``.zip``/``.egg`` on the executors' ``sys.path``, but not a ``.whl``). Its binary dependencies
(pyarrow, boto3, pyspark) must match the executors' OS, CPU and Python: on a real cluster
they come with the executors' image or a packed environment (``spark.archives=env.tar.gz#env``
+ ``PYSPARK_PYTHON=./env/bin/python``). Shipping only our own code per job keeps the heavy
environment a cluster concern and lets a new lakesink version go out with a job, not with an
image rebuild.

On the one-host test cluster the executors' Python is a small venv (the "image"): it sees the
project's site-packages for the dependencies but NOT the project's editable install of
lakesink (a ``.pth`` path entry does not run the site-packages' own ``.pth`` hooks, where
the editable install lives). :func:`executor_python` checks that, in that Python, nothing of
the checkout imports, so a job that works on the cluster got lakesink from the shipped zip.
What this does NOT prove: that pyarrow/boto3 install on another OS or architecture, or that
a packed environment unpacks -- those are the cluster image's business.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What the executors' environment must provide (lakesink's S3 client is boto3).
RUNTIME_DEPENDENCIES = ("pyarrow", "boto3", "pyspark")
#: Checkout-only tooling: never shipped, so never importable on an executor either.
DEV_PACKAGES = ("devtools",)


def shipped_names(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(packages, top-level modules) that ``pip install`` installs, read from ``setup.cfg``.

    Packages as setuptools' ``find:`` finds them with ``[options.packages.find] include``
    (folders with an ``__init__.py``, nested only under packages); modules from
    ``[options] py_modules``. Read from the file, so the zip follows every change to it.
    """
    cfg = configparser.ConfigParser()
    if not cfg.read(root / "setup.cfg"):
        raise FileNotFoundError(f"no setup.cfg in {root}")
    patterns = cfg.get("options.packages.find", "include", fallback="").split()
    modules = cfg.get("options", "py_modules", fallback="").split()
    if cfg.get("options", "packages", fallback="").strip() != "find:" or not patterns:
        raise ValueError(f"{root / 'setup.cfg'}: expected 'packages = find:' with an include list")
    packages: list[str] = []
    tops = sorted(p for p in root.iterdir() if (p / "__init__.py").is_file() and not p.name.startswith("."))
    for top in tops:
        for init in sorted(top.rglob("__init__.py")):
            folder = init.parent
            parts = folder.relative_to(root).parts
            in_packages = all(
                (root.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))
            )
            name = ".".join(parts)
            if (
                in_packages
                and "__pycache__" not in parts
                and any(fnmatch.fnmatchcase(name, p) for p in patterns)
            ):
                packages.append(name)
    return packages, modules


#: The distributions of the checkout (each a folder with its setup.cfg): the reader (and the lake
#: contract) and the writers.
DISTRIBUTIONS = (Path("reader"), Path("."))


def shipped_tops(root: Path = ROOT) -> list[str]:
    """The top-level import names every distribution of the checkout installs."""
    tops: set[str] = set()
    for dist in DISTRIBUTIONS:
        packages, modules = shipped_names(root / dist)
        tops |= {p.split(".")[0] for p in packages} | set(modules)
    return sorted(tops)


def build_pyfiles_zip(dest: Path, root: Path = ROOT) -> Path:
    """Zip the installed packages (``.py`` and ``py.typed``) and modules for ``--py-files``.

    The same code ``pip wheel --no-deps ./reader .`` puts in the wheels; built directly because it takes
    milliseconds and needs no build backend. The names come from ``setup.cfg`` itself
    (:func:`shipped_names`), so a new subpackage or module cannot be left behind; a module it
    names that does not exist fails the ``write``.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for dist in DISTRIBUTIONS:
            base = root / dist
            packages, modules = shipped_names(base)
            for package in packages:
                folder = base.joinpath(*package.split("."))
                for path in sorted(folder.iterdir()):  # its subpackages are packages of their own
                    if path.is_file() and (path.suffix == ".py" or path.name == "py.typed"):
                        zf.write(path, path.relative_to(base).as_posix())
            for module in modules:
                zf.write(base / f"{module}.py", f"{module}.py")
    tmp.replace(dest)
    return dest


def spark_home() -> Path:
    """SPARK_HOME, or the installed pyspark package (its wheel carries bin/ and jars/)."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for cluster processes: ours minus Python/Spark settings that would leak
    this checkout (PYTHONPATH, PYSPARK_*) into executors -- they get only what a job ships."""
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("PYSPARK_", "SPARK_"))
    }
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.update(extra or {})
    return env


def site_packages() -> Path:
    """The site-packages folder of this interpreter's dependencies (where pyarrow lives)."""
    import pyarrow

    return Path(pyarrow.__file__).resolve().parent.parent


def executor_python(env_dir: Path) -> Path:
    """A Python for the executors that has the runtime dependencies but nothing of this checkout.

    A venv whose only ``.pth`` entry is this project's site-packages; created once per
    ``env_dir``, checked every time: ``RUNTIME_DEPENDENCIES`` must import, and neither what
    the zip ships nor ``devtools`` may (RuntimeError naming what is wrong).
    """
    python = env_dir / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True)
        ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
        (env_dir / "lib" / ver / "site-packages" / "runtime_deps.pth").write_text(f"{site_packages()}\n")
    ours = sorted({*shipped_tops(), *DEV_PACKAGES})
    probe = (
        "import importlib.util as u, sys\n"
        f"missing = [m for m in {RUNTIME_DEPENDENCIES!r} if u.find_spec(m) is None]\n"
        f"leaked = [m for m in {ours!r} if u.find_spec(m) is not None]\n"
        "sys.exit(f'missing {missing}, importable without shipping {leaked}' if missing or leaked else 0)\n"
    )
    # cwd: the venv's folder, as an executor runs in its own work dir; "python -c" puts the
    # cwd on sys.path, and the checkout would hand it lakesink.
    check = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=env_dir, env=clean_env()
    )
    if check.returncode != 0:
        raise RuntimeError(f"executor python {python} is not what it models: {check.stderr.strip()}")
    return python
