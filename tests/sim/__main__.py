"""``python -m tests.sim``: run seeds of the simulation (docs/design/simulation.md).

    python -m tests.sim --seeds 200 [--start 0] [--jobs 2] [--faults ...] [--actors ...]
    python -m tests.sim --seed 17 --trace      # replay one seed, printing every step

Exit status 1 when a seed fails; each failing seed is printed with its invariant and the
command that replays it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import IO

#: Fixed string hashing: sets of strings iterate in hash order, and the real code iterates some.
HASH_SEED = "0"


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        env = {**os.environ, "PYTHONHASHSEED": HASH_SEED}
        return subprocess.call(
            [sys.executable, "-m", "tests.sim", *(sys.argv[1:] if argv is None else argv)], env=env
        )
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument(
        "--seed", type=lambda text: [int(x) for x in text.split(",")], help="run this seed (or: 8,12,13)"
    )
    parser.add_argument("--trace", action="store_true", help="print every step of each seed")
    parser.add_argument(
        "--faults",
        default="all",
        help="comma-separated: lost,late,fail,delete,list,kill,stall,skew (default all)",
    )
    parser.add_argument(
        "--actors",
        default="all",
        help=(
            "comma-separated: writer,vacuum,compact,sweep,reader,verify,idle,views,multi,continue,"
            "foreach,upgrade (default all)"
        ),
    )
    parser.add_argument(
        "--world",
        default="any",
        choices=("any", "upgrade"),
        help="upgrade: every seed is an upgrade world (default: a seed picks it with chance 0.3 "
        "when the upgrade actor is allowed)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=400, help="steps before the busy phase ends (default 400)"
    )
    parser.add_argument(
        "--no-final-abandon",
        action="store_true",
        help="the final pass without compact's abandon of dead ops (vacuum, orphans, sync-views only)",
    )
    parser.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="the store under the lake: local (default), or s3 (the real S3Storage over in-process moto)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes to spread the seeds over (default 1)")
    parser.add_argument("--keep-going", action="store_true", help="run every seed even after a failure")
    parser.add_argument(
        "--digest", action="store_true", help="print each seed's trace digest (replay checks)"
    )
    parser.add_argument(
        "--ledger",
        help="append a JSON line per chunk of seeds run (commit, product source, range, clean, time) to it",
    )
    parser.add_argument(
        "--chunk", type=int, default=1000, help="with --ledger: seeds per ledger line (default 1000)"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a --jobs worker's output
    parser.add_argument(
        "--summary", metavar="LEDGER", help="sum a ledger: seeds run clean per product version and switches"
    )
    args = parser.parse_args(argv)
    if args.summary:
        return _summary(args.summary)
    if args.ledger and args.seed is None and not args.json:
        return _chunks(args)

    from tests.sim.run import Config

    cfg = Config.parse(
        args.faults, args.actors, args.max_steps, not args.no_final_abandon, args.world, args.store
    )
    seeds = args.seed if args.seed is not None else list(range(args.start, args.start + args.seeds))
    if args.jobs > 1 and len(seeds) > 1 and args.seed is None:  # (a --seed list runs in one)
        return _fan_out(args, seeds)
    logging.disable(logging.CRITICAL)  # the real code logs warnings under faults: the trace says it
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    from tests.sim.run import run_seed

    started = time.perf_counter()
    failed = 0
    for n, seed in enumerate(seeds, 1):
        outcome = run_seed(seed, cfg, base=base)
        digest = hashlib.sha256("\n".join(outcome.trace).encode()).hexdigest()[:16]
        if args.json:
            print(
                json.dumps(
                    {"seed": seed, "ok": outcome.ok, "violation": outcome.violation, "steps": outcome.steps}
                )
            )
        if args.trace:
            print("\n".join(outcome.trace))
        if args.digest:
            print(f"seed {seed} digest {digest} steps {outcome.steps} checks {outcome.checks}")
        if not outcome.ok:
            failed += 1
            if not args.json:
                print(f"FAIL seed {seed}: {outcome.violation}")
                if not args.trace:
                    print("  last steps:\n    " + "\n    ".join(outcome.trace[-25:]))
                print(f"  replay: python -m tests.sim --seed {seed} --trace {cfg.describe()}")
            if not args.keep_going:
                break
        if not args.json and not args.trace and n % 50 == 0:
            print(f"{n} seeds, {n / (time.perf_counter() - started):.2f} seeds/s", flush=True)
    if not args.json:
        elapsed = time.perf_counter() - started
        ran = n if seeds else 0
        print(
            f"{ran - failed} of {ran} seeds clean ({seeds[0]}..{seeds[ran - 1]}) in {elapsed:.1f} s: "
            f"{ran / elapsed:.2f} seeds/s; {cfg.describe()}"
        )
    return 1 if failed else 0


def _chunks(args: argparse.Namespace) -> int:
    """Run the seeds a chunk at a time, appending a ledger line after each: a long run that is
    stopped (a session's end) keeps what it finished, and the next run carries on from
    ``--start``. Issue 32 counts seeds run clean on one version of the product's source."""
    from tests.sim.run import Config

    source = _source_version()
    switches = Config.parse(
        args.faults, args.actors, args.max_steps, not args.no_final_abandon, args.world, args.store
    ).describe()
    failed = 0
    end = args.start + args.seeds
    for first in range(args.start, end, args.chunk):
        count = min(args.chunk, end - first)
        started = time.perf_counter()
        chunk = argparse.Namespace(**{**vars(args), "start": first, "seeds": count, "ledger": None})
        code, bad = _run_chunk(chunk)
        line = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **source,
            "start": first,
            "seeds": count,
            "clean": count - len(bad),  # a seed not reported by its worker is in ``bad``
            "failed": bad,
            # The switches spelled out: "all" grows when actors are added.
            "switches": switches,
            "max_steps": args.max_steps,
            "jobs": args.jobs,
            "seconds": round(time.perf_counter() - started, 1),
        }
        with open(args.ledger, "a", encoding="utf-8") as ledger:
            ledger.write(json.dumps(line) + "\n")
        failed += bool(code)
        if code and not args.keep_going:
            break
    return 1 if failed else 0


def _summary(path: str) -> int:
    """Seeds run clean per (product version, switches), with their ranges and time."""
    groups: dict[tuple[str, str, int], list[dict[str, object]]] = {}
    with open(path, encoding="utf-8") as ledger:
        for line in ledger:
            if line.strip():
                row = json.loads(line)
                product = str(row["product"]) + ("+dirty" if row["product_dirty"] else "")
                key = (product, str(row["switches"]), int(row["max_steps"]))
                groups.setdefault(key, []).append(row)
    for (product, switches, steps), rows in groups.items():
        seeds = sum(int(str(r["seeds"])) for r in rows)
        clean = sum(int(str(r["clean"])) for r in rows)
        hours = sum(float(str(r["seconds"])) for r in rows) / 3600
        failed = sorted(int(s) for r in rows for s in r["failed"])  # type: ignore[attr-defined]
        spans = _spans(sorted(int(str(r["start"])) + i for r in rows for i in range(int(str(r["seeds"])))))
        commits = sorted({str(r["commit"]) for r in rows})
        print(
            f"product {product} (commits {', '.join(commits)}), {switches} "
            f"--max-steps {steps}: {clean} of {seeds} seeds clean ({spans}) in {hours:.1f} h"
            + (f"; failed: {failed[:20]}" if failed else "")
        )
    return 0


def _spans(seeds: list[int]) -> str:
    spans: list[str] = []
    for seed in seeds:
        if spans and spans[-1].endswith(f"-{seed - 1}"):
            spans[-1] = spans[-1].rsplit("-", 1)[0] + f"-{seed}"
        elif spans and spans[-1] == str(seed - 1):
            spans[-1] = f"{seed - 1}-{seed}"
        else:
            spans.append(str(seed))
    return ", ".join(spans)


def _run_chunk(args: argparse.Namespace) -> tuple[int, list[int]]:
    """One chunk in worker processes (--jobs, at least one): exit status and failing seeds."""
    seeds = list(range(args.start, args.start + args.seeds))
    bad: list[int] = []
    code = _fan_out(args, seeds, failed=bad)
    return code, bad


def _source_version() -> dict[str, object]:
    """What the seeds ran on: the commit, and the git trees of the product's source (the writer
    and reader packages) and of the simulation itself, with whether they had uncommitted
    changes -- seeds count toward one version of both, whatever else changed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*cmd: str) -> str:
        run = subprocess.run(["git", "-C", root, *cmd], capture_output=True, text=True, check=False)
        return run.stdout.strip()

    product = ("lakesink", "reader/lakesink_reader", "tests/sim")
    return {
        "commit": git("rev-parse", "--short=12", "HEAD"),
        "product": "+".join(git("rev-parse", "--short=12", f"HEAD:{p}") for p in product),
        "product_dirty": bool(git("status", "--porcelain", "--", *product)),
    }


def _fan_out(args: argparse.Namespace, seeds: list[int], failed: list[int] | None = None) -> int:
    """Split the seeds over ``--jobs`` worker processes (interleaved), gather their lines."""
    started = time.perf_counter()
    common = ["--faults", args.faults, "--actors", args.actors, "--max-steps", str(args.max_steps), "--json"]
    common += ["--world", args.world]
    if args.keep_going:
        common.append("--keep-going")
    if args.no_final_abandon:
        common.append("--no-final-abandon")
    if args.store != "local":
        common += ["--store", args.store]
    workers = []
    block = -(-len(seeds) // args.jobs)
    for j in range(args.jobs):
        part = seeds[j * block : (j + 1) * block]
        if part:
            cmd = [
                sys.executable,
                "-m",
                "tests.sim",
                "--start",
                str(part[0]),
                "--seeds",
                str(len(part)),
                *common,
            ]
            workers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    # One reader thread per worker: read one after the other, a worker whose pipe filled up
    # (64 KiB, ~600 seeds) would wait for the parent, and the run would go at one process's pace.
    results: list[dict[str, object]] = []

    def gather(stream: IO[str]) -> None:
        for line in stream:
            results.append(json.loads(line))  # list.append is atomic under the GIL

    readers = [threading.Thread(target=gather, args=(w.stdout,), daemon=True) for w in workers]
    for reader in readers:
        reader.start()
    reported = 0
    while any(r.is_alive() for r in readers):
        time.sleep(1.0)
        if len(results) >= reported + 500:
            reported = len(results) // 500 * 500
            print(
                f"{len(results)} seeds, {len(results) / (time.perf_counter() - started):.2f} seeds/s",
                flush=True,
            )
    for worker in workers:
        worker.wait()
    elapsed = time.perf_counter() - started
    bad = [r for r in results if not r["ok"]]
    # A worker that died reported fewer seeds than it was given: those count as failed.
    seen = {int(str(r["seed"])) for r in results}
    lost = [s for s in seeds if s not in seen]
    if failed is not None:
        failed.extend(sorted(int(str(r["seed"])) for r in bad))
        failed.extend(lost)
    if lost:
        print(f"FAIL: {len(lost)} seed(s) never reported (a worker died): {lost[:10]}")
    for r in bad:
        print(f"FAIL seed {r['seed']}: {r['violation']}")
        switches = f"--faults {args.faults} --actors {args.actors}" + (
            f" --world {args.world}" if args.world != "any" else ""
        )
        print(f"  replay: python -m tests.sim --seed {r['seed']} --trace {switches}")
    print(
        f"{len(results) - len(bad)} of {len(results)} seeds clean ({seeds[0]}..{seeds[-1]}) in "
        f"{elapsed:.1f} s over {args.jobs} processes: {len(results) / elapsed:.2f} seeds/s; "
        f"--faults {args.faults} --actors {args.actors}"
    )
    return 1 if bad or lost else 0


if __name__ == "__main__":
    sys.exit(main())
