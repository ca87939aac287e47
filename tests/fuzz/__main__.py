"""``python -m tests.fuzz``: run cases of the trust-boundary fuzzer (see ``tests/fuzz/__init__``).

    python -m tests.fuzz --cases 1000 --seed 0 --ledger bench/results/fuzz-ledger.jsonl
    python -m tests.fuzz --seed 17 --cases 1 --keep --verbose   # replay one case

Exit status 1 when a case fails; each failing case is printed with what failed and the
command that replays it.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.fuzz.mutate import MUTATIONS
from tests.fuzz.run import Fuzzer
from tests.fuzz.templates import TEMPLATES

#: What the fuzzer's cases test: the writer and reader packages, and the fuzzer itself.
PRODUCT = ("lakesink", "reader/lakesink_reader", "tests/fuzz")


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="how many cases (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the first case's seed (default 0)")
    parser.add_argument("--template", choices=sorted(TEMPLATES), help="only this template")
    parser.add_argument("--mutation", choices=sorted(MUTATIONS), help="only this mutation")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (printed) and each case's lake"
    )
    parser.add_argument("--verbose", action="store_true", help="print every case and its steps' outcomes")
    parser.add_argument("--ledger", type=Path, help="append a line of this run's results (JSON) to this file")
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error("--cases must be at least 1")
    logging.disable(logging.CRITICAL)  # the reader's warnings about skipped files: not the output
    # The code under test is the code at the start (the forkserver imports it then).
    commit = git("rev-parse", "--short=12", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", *PRODUCT))
    # Cases count toward one version of what they test, as the simulation's seeds do: a ledger
    # summed per product adds runs of several commits that changed none of it (a docs commit).
    product = "+".join(git("rev-parse", "--short=12", f"HEAD:{path}") for path in PRODUCT)
    started = time.monotonic()
    fuzzer = Fuzzer(keep=args.keep)
    if args.keep:
        print(f"work folder: {fuzzer.workdir}")
    failed = []
    kinds: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    try:
        for seed in range(args.seed, args.seed + args.cases):
            case = fuzzer.run(seed, template=args.template, mutation=args.mutation)
            kinds[case.mutation] += 1
            for name, step in case.result.get("steps", {}).items():
                outcomes[f"{name}:{step.get('verdict')}"] += 1
            if args.verbose:
                grown = case.result.get("rss_growth", 0) >> 20
                print(f"{case.line()} ({case.seconds} s, resident memory +{grown} MiB)")
                for name, step in case.result.get("steps", {}).items():
                    detail = step.get("err", "").strip().splitlines()[-1:] or [""]
                    print(f"    {name}: {step.get('verdict')} {step.get('seconds')} s {detail[0][:160]}")
            if case.failures:
                failed.append(case)
                print(f"FAILED {case.line()}")
                for failure in case.failures:
                    print(f"    {failure}")
                for step in case.result.get("steps", {}).values():
                    if step.get("trace"):
                        print("    " + step["trace"].replace("\n", "\n    "))
                        break
                extra = "".join(
                    f" --{k} {v}" for k, v in (("template", args.template), ("mutation", args.mutation)) if v
                )
                print(f"    replay: python -m tests.fuzz --seed {seed} --cases 1{extra} --verbose")
    finally:
        fuzzer.close()
    seconds = round(time.monotonic() - started, 1)
    print(
        f"{args.cases} case(s) from seed {args.seed}: {args.cases - len(failed)} clean, "
        f"{len(failed)} failed, "
        f"{seconds} s ({args.cases / seconds:.1f} cases/s)"
    )
    print("  mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if args.ledger:
        entry = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": commit,
            "product": product,
            "dirty": dirty,
            "start": args.seed,
            "cases": args.cases,
            "clean": args.cases - len(failed),
            "failed": [[c.seed, c.mutation, c.failures[0][:200]] for c in failed],
            "mutations": dict(sorted(kinds.items())),
            "outcomes": dict(sorted(outcomes.items())),
            "seconds": seconds,
        }
        with args.ledger.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
