"""Imports inside functions say why they are there (the re-plumbing issue, item 3).

``.importlinter`` (``make lint``) keeps the layers pointing down and the modules of each package
free of import circles, so no import has to hide in a function to break one. What may still sit
in a function is an import that keeps a heavy module (pyspark, pyarrow and its submodules,
pandas, boto3, an optional extra, or a lakesink module that loads them) off a light path: Spark's
data-source lookup (test_discovery.py), ``import lakesink_reader`` (test_reader.py,
test_reader_v3.py), the ``lakesink`` command's start, the executors' workers. Each such import
carries a comment saying so -- on its line, or on a line of its own above it or above an
earlier one of the adjacent imports it stands with -- and this test fails, naming
``file:line``, for one that does not. A pragma alone (``# noqa``, ``# type: ignore[...]``)
says nothing. Pure ``ast`` and ``tokenize``: well under a second.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (ROOT / "lakesink", ROOT / "reader" / "lakesink_reader")
#: Comment text that explains nothing: tool pragmas.
PRAGMA = re.compile(
    r"^\s*(type:\s*ignore(\[[^\]]*\])?|noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?|fmt:\s*\w+|pragma:.*)"
)

Import = ast.Import | ast.ImportFrom


def _blocks(stmts: Sequence[ast.stmt], in_function: bool = False) -> Iterator[list[Import]]:
    """The function-level imports of ``stmts``, in runs of adjacent import statements."""
    block: list[Import] = []
    for stmt in stmts:
        if isinstance(stmt, Import):
            if in_function:
                block.append(stmt)
            continue
        if block:
            yield block
            block = []
        inner = in_function or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
        for name in ("body", "orelse", "finalbody"):
            yield from _blocks(getattr(stmt, name, None) or [], inner)
        for sub in (getattr(stmt, "handlers", None) or []) + (getattr(stmt, "cases", None) or []):
            yield from _blocks(sub.body, inner)
    if block:
        yield block


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line -> (the comment's text, whether the line holds nothing else)."""
    found: dict[int, tuple[str, bool]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row = token.start[0]
            found[row] = (token.string, not token.line[: token.start[1]].strip())
    return found


def _explains(comment: str) -> bool:
    """Whether a comment says something beyond pragmas (``# noqa: F401 - why`` does)."""
    for part in comment.split("#"):
        text = PRAGMA.sub("", part, count=1).strip(" -:;,")
        if text:
            return True
    return False


def undocumented(source: str) -> list[int]:
    """The lines of the function-level imports in ``source`` that no comment explains."""
    comments = _comments(source)

    def said(row: int, *, whole_line: bool) -> bool:
        text, alone = comments.get(row, ("", False))
        return _explains(text) and (alone or not whole_line)

    missing = []
    for block in _blocks(ast.parse(source).body):
        covered = False  # by a comment line above this import or an earlier one of the block
        for node in block:
            covered = covered or said(node.lineno - 1, whole_line=True)
            if not (covered or said(node.lineno, whole_line=False)):
                missing.append(node.lineno)
    return missing


def test_every_import_inside_a_function_says_why() -> None:
    problems = []
    files = sorted(f for package in PACKAGES for f in package.rglob("*.py"))
    assert len(files) > 50, files  # the packages were found
    for path in files:
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for row in undocumented(source):
            problems.append(f"{path.relative_to(ROOT)}:{row}: {lines[row - 1].strip()}")
    assert not problems, (
        "imports inside functions without a comment saying why (hoist them to the top, or say "
        "which heavy module they keep off which light path):\n" + "\n".join(problems)
    )


def test_the_check_finds_an_unexplained_import_and_accepts_the_explained_ones() -> None:
    source = """
import os  # module level: not checked

def f():
    import json
    # pyarrow.parquet (20 ms): only reads need it
    import pyarrow.parquet as pq

    import pyarrow.compute as pc
    return json, pq, pc

def g():
    try:
        # the s3 extra
        import boto3
    except ImportError:
        import botocore  # noqa: F401
    x = 1  # a trailing comment of another line
    import re
    import pandas  # noqa: F401 - pyarrow's to_pandas needs it
    import numpy  # type: ignore[import]  # numpy for the arrays

    def h():
        from pyspark import TaskContext
        return TaskContext
"""
    lines = source.splitlines()
    found = [lines[row - 1].strip() for row in undocumented(source)]
    assert found == [
        "import json",
        "import botocore  # noqa: F401",
        "import re",
        "from pyspark import TaskContext",
    ]
