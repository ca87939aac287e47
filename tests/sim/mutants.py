"""``make mutants``: bugs planted in the product, one at a time, that the simulation must catch
(issue 50, item 5; docs/design/simulation.md, "Mutants").

Each mutant is a plausible one-line mistake: a file, a snippet that must occur in it exactly
once (a mutant whose snippet no longer matches is an error, so the list cannot rot silently),
its replacement, and why it matters. For each, the checkout's tracked files are copied to a
scratch folder, the mutant planted there, and the simulation run from that copy
(``python -m tests.sim --seeds N --actors all``) until its first failing seed.

    python -m tests.sim.mutants [--only NAME,...] [--seeds 300] [--jobs 2] [--json OUT]

A mutant is *caught* when a seed fails, *survived* otherwise; the table gives the seed and the
invariant. Exit status 1 when one survived (unless it is listed as equivalent).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    original: str
    replacement: str
    why: str
    #: Shown equivalent (no behaviour change) in simulation.md: its survival is no failure.
    equivalent: bool = False


MUTANTS = (
    Mutant(
        "abort-deletes-after-a-commit-call",
        "lakesink/writer/run.py",
        "        if len(present) == len(reports):",
        "        if len(present) != len(reports):",
        "an abort after a commit whose create is in flight deletes the files it commits (issue 50's hole)",
    ),
    Mutant(
        "commit-drops-files-on-unknown-outcome",
        "lakesink/commit/batches.py",
        "            self.in_doubt.add(batch)  # the entry may exist, or land later: keep every file\n"
        "            raise",
        "            self.in_doubt.add(batch)  # the entry may exist, or land later: keep every file\n"
        '            self._drop(files, listed=(), why="unknown")\n'
        "            raise",
        "a commit whose outcome is unknown deletes the files its late create commits",
    ),
    Mutant(
        "vacuum-goes-on-after-a-failed-log-delete",
        "lakesink/maintenance/vacuum.py",
        "                report.failed.append((name, str(exc)))\n                break",
        "                report.failed.append((name, str(exc)))\n                continue",
        "the deleted part of the log is no longer a prefix: a commit can land in it unseen",
    ),
    Mutant(
        "vacuum-retention-from-now",
        "lakesink/maintenance/vacuum.py",
        "    found = retention_version(storage, vlog, snap, now - retain)",
        "    found = retention_version(storage, vlog, snap, now)",
        "versions inside the retention window are vacuumed (time travel to them fails)",
    ),
    Mutant(
        "sweep-deletes-unsettled-files",
        "lakesink/maintenance/sweep.py",
        "        orphan = Orphan(kind, name, batch, age, entry.size, settled, why)\n"
        "        (findings if settled else kept).append(orphan)",
        "        orphan = Orphan(kind, name, batch, age, entry.size, settled, why)\n"
        "        findings.append(orphan)",
        "the sweep deletes published files of a batch whose commit may be in flight",
    ),
    Mutant(
        "delta-sync-below-the-floor",
        "lakesink/views/delta_view.py",
        "    oldest = max(oldest_commit(storage, vlog) or 0, state.retained_from)",
        "    oldest = oldest_commit(storage, vlog) or 0",
        "sync-views starts the Delta view below vacuum's floor, at commits whose files are gone",
    ),
    Mutant(
        "task-replay-bound-off-by-one",
        "lakesink/writer/run.py",
        "        if self.committed_through is not None and batch <= self.committed_through:",
        "        if self.committed_through is not None and batch <= self.committed_through + 1:",
        "the batch after the log's last is taken for a replay: its tasks write nothing",
    ),
    Mutant(
        "commit-skips-tasks-skipped-check",
        "lakesink/writer/run.py",
        "            tasks_skipped=any(r.skipped for r in reports),",
        "            tasks_skipped=False,",
        "a batch whose tasks took it for a replay is committed without their rows",
    ),
)


@dataclass
class Outcome:
    name: str
    caught: bool
    seed: int | None
    invariant: str | None
    seconds: float
    equivalent: bool


def plant(mutant: Mutant, copy: Path) -> None:
    target = copy / mutant.path
    text = target.read_text()
    found = text.count(mutant.original)
    if found != 1:
        raise SystemExit(f"mutant {mutant.name}: its snippet occurs {found} times in {mutant.path}, not once")
    target.write_text(text.replace(mutant.original, mutant.replacement))


def checkout_copy(into: Path) -> Path:
    """The checkout's tracked files (as they are in the work tree) under ``into``."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "lakesink", "reader/lakesink_reader", "tests/sim", "tests/__init__.py"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        source, target = ROOT / name, into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return into


def run(mutant: Mutant, seeds: int, jobs: int, start: int) -> Outcome:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        copy = checkout_copy(Path(scratch))
        plant(mutant, copy)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(copy / "reader")])}
        done = subprocess.run(
            [sys.executable, "-m", "tests.sim", "--seeds", str(seeds), "--start", str(start),
             "--actors", "all", "--jobs", str(jobs)],
            cwd=copy, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
    failed = re.search(r"^FAIL seed (\d+): (\w+)", done.stdout, re.MULTILINE)
    return Outcome(
        mutant.name,
        failed is not None,
        int(failed.group(1)) if failed else None,
        failed.group(2) if failed else None,
        round(time.monotonic() - began, 1),
        mutant.equivalent,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.mutants", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    p.add_argument("--seeds", type=int, default=300, help="seeds of --actors all per mutant (default 300)")
    p.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--jobs", type=int, default=2, help="processes per mutant's simulation (default 2)")
    p.add_argument("--json", help="write the outcomes to this file")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {m.name for m in MUTANTS}
    if unknown:
        p.error(f"unknown mutant(s) {sorted(unknown)}; --list names them")
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<40} {m.path}: {m.why}")
        return 0
    outcomes = []
    for m in chosen:
        outcome = run(m, args.seeds, args.jobs, args.start)
        outcomes.append(outcome)
        what = f"caught at seed {outcome.seed} ({outcome.invariant})" if outcome.caught else "SURVIVED"
        print(f"{m.name:<40} {what:<40} {outcome.seconds:>7.1f} s", flush=True)
    caught = sum(o.caught for o in outcomes)
    print(f"{caught} of {len(outcomes)} mutants caught within {args.seeds} seeds of --actors all")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 0 if all(o.caught or o.equivalent for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
