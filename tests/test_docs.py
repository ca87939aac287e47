"""README and the user guide stay runnable as written: every command they show names a real
make target, CLI subcommand (with options the CLI accepts), script or module, and every
relative link of README resolves. Spark-free and fast; ``make docs`` (mkdocs --strict) checks
the links inside docs/.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakesink.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
#: What a user reads: the front page, the reader's page, the guide and the bench's logs. The
#: design notes (docs/design/) are working notes, and docs/FORMAT.md shows no commands.
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "reader" / "README.md",
        ROOT / "docs" / "index.md",
        *(ROOT / "docs" / "guide").glob("*.md"),
        *(ROOT / "bench" / "results").glob("*.md"),
    ]
)
SHELL_LANGS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: Folders that make fills (git-ignored): the pages name them, a fresh clone has none yet.
GENERATED = ("java/hdfs/jars", "java/hdfs/classes", "java/kafka/broker-jars", "java/kafka/connector-jars")
#: A file or folder of the checkout, as the pages name one (`lakesink/spark/warmup.py`).
CHECKOUT_PATH = re.compile(r"(?:lakesink|reader|jobs|scripts|bench|devtools|tests|java)/[\w./-]*\w")
#: Environment variables and make's VAR=value arguments.
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _shell_commands(page: Path) -> Iterator[tuple[str, list[str]]]:
    """Each command of the page's shell blocks, as its words: continuation lines joined,
    comments dropped, `a && b` split."""
    for m in FENCE.finditer(page.read_text()):
        if m.group(1) not in SHELL_LANGS:
            continue
        for line in re.sub(r"\\\n\s*", " ", m.group(2)).splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                yield line.strip(), words[:cut]
                words = words[cut + 1 :]


def _code_spans(page: Path) -> list[str]:
    """The inline code spans of the page's prose (outside fenced blocks)."""
    prose = FENCE.sub("", page.read_text())
    return re.findall(r"`([^`\n]+)`", prose)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z0-9][a-z0-9-]*):", text, re.M))


def _cli_subcommands() -> set[str]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("lakesink's parser has no subcommands")


def _parses(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None when argparse accepts argv, else its error message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return None


def _job() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("stream_to_lake_doc", ROOT / "jobs" / "stream_to_lake.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_make(words: list[str], targets: set[str]) -> list[str]:
    return [
        f"`make {w}`: no such target in the Makefile"
        for w in words[1:]
        if not ASSIGNMENT.match(w) and not w.startswith("-") and w not in targets
    ]


def _check_lakesink(words: list[str], subcommands: set[str]) -> list[str]:
    if len(words) < 2 or words[1] in ("--help", "-h", "--version"):
        return []
    if words[1] not in subcommands:
        return [f"`lakesink {words[1]}`: not a subcommand of the CLI ({', '.join(sorted(subcommands))})"]
    problem = _parses(build_parser(), words[1:])
    return [f"`{shlex.join(words)}`: the CLI refuses it: {problem}"] if problem else []


def _check_job(words: list[str], tmp: Path) -> list[str]:
    """`python jobs/x.py ...` / `spark-submit [opts] jobs/x.py ...`: the script exists, and a
    job's arguments are ones it accepts (its --input folder is a placeholder: one made here)."""
    scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
    if not scripts:
        return [f"`{shlex.join(words)}`: names no script"]
    script, argv = words[scripts[0]], words[scripts[0] + 1 :]
    if not (ROOT / script).is_file():
        return [f"`{script}`: no such script"]
    if script != "jobs/stream_to_lake.py":
        return []
    if "--input" in argv:
        folder = tmp / "input"
        folder.mkdir(exist_ok=True)
        (folder / "part-0.parquet").touch()
        argv = list(argv)
        argv[argv.index("--input") + 1] = str(folder)
    problem = _parses_job(argv)
    return [f"`{shlex.join(words)}`: the job refuses it: {problem}"] if problem else []


def _parses_job(argv: list[str]) -> str | None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            _job().parse_args(argv)
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return None


def _check_pip(words: list[str]) -> list[str]:
    """pip's local requirements (`./reader`, `'.[spark,s3]'`, `dist/x.whl`) name folders that
    exist; a wheel in dist/ is what the line before it builds."""
    problems = []
    for w in words[2:]:
        path = re.sub(r"\[[^\]]*\]$", "", w)
        if (path == "." or path.startswith("./")) and not (ROOT / path).exists():
            problems.append(f"`{shlex.join(words)}`: {path} does not exist")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_shell_command_names_a_real_target_script_or_subcommand(page: Path, tmp_path: Path) -> None:
    targets, subcommands = _make_targets(), _cli_subcommands()
    problems = []
    for line, words in _shell_commands(page):
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if not words:
            continue
        program = words[0]
        if program == "make":
            problems += _check_make(words, targets)
        elif program in ("lakesink", ".venv/bin/lakesink"):
            problems += _check_lakesink(words, subcommands)
        elif program in ("python", "python3", ".venv/bin/python", "spark-submit"):
            if words[1:3] and words[1] == "-m":
                problems += _check_module(words[2])
            else:
                problems += _check_job(words, tmp_path)
        elif program in ("pip", ".venv/bin/pip"):
            problems += _check_pip(words)
        else:
            problems.append(f"`{line}`: {program!r} is no command this test knows; teach it, or fix the page")
    assert not problems, f"{_rel(page)}:\n" + "\n".join(problems)


def _check_module(name: str) -> list[str]:
    path = ROOT / name.replace(".", "/")
    if path.with_suffix(".py").is_file() or (path / "__main__.py").is_file():
        return []
    return [f"`python -m {name}`: no module {name} in the checkout"]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_inline_command_and_path_is_real(page: Path) -> None:
    """`make X`, `lakesink SUB`, `python -m M` in the prose, and the checkout's files it names
    (`jobs/stream_to_lake.py`, `lakesink/spark/warmup.py`, ...)."""
    targets, subcommands = _make_targets(), _cli_subcommands()
    problems = []
    for span in _code_spans(page):
        try:
            words = shlex.split(span, comments=True)
        except ValueError:
            words = span.split()
        if not words:
            continue
        if words[0] == "make" and len(words) > 1:
            problems += _check_make(words, targets)
        elif words[0] == "lakesink" and len(words) > 1 and re.fullmatch(r"[a-z-]+", words[1]):
            # Prose shortens options to their names (`lakesink orphans --delete`): only the
            # subcommand is checked here; the shell blocks are parsed whole.
            if words[1] not in subcommands:
                problems.append(f"`{span}`: {words[1]!r} is not a subcommand of the CLI")
        elif words[:2] == ["python", "-m"] and len(words) > 2:
            problems += _check_module(words[2])
        for word in words:
            m = CHECKOUT_PATH.fullmatch(word)
            if m and not m.group(0).startswith(GENERATED) and not (ROOT / m.group(0)).exists():
                problems.append(f"`{span}`: {m.group(0)} is not in the checkout")
    assert not problems, f"{_rel(page)}:\n" + "\n".join(problems)


def _slug(heading: str) -> str:
    """The anchor of a heading, as mkdocs' toc and GitHub make it for plain headings."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s+", "-", text)


def _anchors(page: Path) -> set[str]:
    prose = FENCE.sub("", page.read_text())
    return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", prose, re.M)}


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "reader" / "README.md"], ids=_rel)
def test_every_relative_link_of_the_readmes_resolves(page: Path) -> None:
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            problems.append(f"{target}: {file.name} has no heading #{anchor}")
    assert not problems, f"{_rel(page)}:\n" + "\n".join(problems)


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 400, f"README.md has {lines} lines: move the detail into docs/guide/ (at most 400)"


def test_every_guide_page_is_in_the_nav() -> None:
    """mkdocs --strict fails on a page outside the nav too; this says which, without mkdocs."""
    nav = (ROOT / "mkdocs.yml").read_text()
    docs = ROOT / "docs"
    missing = [
        str(p.relative_to(docs)) for p in sorted(docs.rglob("*.md")) if str(p.relative_to(docs)) not in nav
    ]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"
