"""``python -m tests.fuzz.count_sweep``: the fuzzer's ``number_text`` aimed at counts. Every JSON
number of a template lake is set, one at a time, to 2**63 -- one past the largest count
``jsondoc.count`` takes -- and every step of the fuzzer's child is run on the lake so changed, in
this process. A case is one (number, step): case ``n`` is the same in every run (files in
``mutate.files_of``'s order, numbers in the file's). The oracle is the child's: a step may refuse,
never crash (a traceback where a refusal belongs).

    python -m tests.fuzz.count_sweep [--template T] [--cases N] [--seed S] [--check-out]

It prints what ``python -m tests.fuzz`` prints for a failing case (``FAILED case N: ...``, the
oracle's message indented) and its summary line, so ``make fuzz-mutants`` runs it for the
mutant ``counts-unbounded`` (``runner``), whose range check random ``number_text`` cases almost
never reach: the one count no cross-check covers (a writer's ``last_batch`` in a checkpoint
summary, which ``sync-views`` writes into the Delta view's int64 ``txn.version``) is one number
of ~500 in the template, and 2**63 one value of 13. ``--check-out`` takes the range check out
in this process (the mutant, without planting it). docs/design/trust.md, "Session 21".
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.fuzz import child, mutate, templates

PAST = b"9223372036854775808"  # 2**63


def _cases(source: Path) -> Iterator[tuple[Path, int, int, str]]:
    """Every (file, number's start, number's end, step) of the lake at ``source``, in order."""
    for path in mutate.files_of(source):
        if mutate.is_json(path):
            for number in mutate.NUMBER.finditer(path.read_bytes()):
                for step in child.STEPS:
                    yield path, number.start(), number.end(), step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz.count_sweep", description="number_text aimed at counts"
    )
    parser.add_argument("--template", default="v3compacted", choices=sorted(templates.TEMPLATES))
    parser.add_argument("--cases", type=int, default=10**9, help="how many cases at most (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the first case")
    parser.add_argument("--check-out", action="store_true", help="take jsondoc.count's range check out")
    args = parser.parse_args(argv)
    logging.disable(logging.CRITICAL)
    if args.check_out:
        from lakesink_reader import jsondoc

        jsondoc.MAX_COUNT = 10**100
    base = Path(tempfile.mkdtemp(prefix="lakesink-count-sweep-"))
    started, ran, failed = time.monotonic(), 0, 0
    try:
        source = templates.build(base)[args.template]
        for index, (path, start, end, step) in enumerate(_cases(source)):
            if index < args.seed:
                continue
            if ran == args.cases:
                break
            ran += 1
            work = base / "work"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(source, work, symlinks=True)
            data = path.read_bytes()
            (work / path.relative_to(source)).write_bytes(data[:start] + PAST + data[end:])
            try:
                outcome = child.STEPS[step](str(work), range(9000, 9050))
            except Exception as exc:  # noqa: BLE001 -- what the child records as a crash
                outcome = {"verdict": "crash", "problem": f"{type(exc).__name__}: {exc}"}
            if outcome.get("verdict") == "crash":
                failed += 1
                where = path.relative_to(source)
                print(f"FAILED case {index}: {args.template} {where} number at {start} := 2**63")
                print(f"    {step}: {outcome.get('problem')}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    seconds = round(time.monotonic() - started, 1)
    print(f"{ran} case(s) from seed {args.seed}: {ran - failed} clean, {failed} failed, {seconds} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
