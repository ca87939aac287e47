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
#: Address space per simulation process of a mutant's run (a mutant may loop and allocate).
MEMORY_LIMIT = 6 << 30


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
        "verify-ok-ignores-file-problems",
        "lakesink/maintenance/verify.py",
        "        return not self.problems and self.delta_view_ok and self.spark_view_ok",
        "        return self.delta_view_ok and self.spark_view_ok",
        "verify exits 0 over a committed file that is missing or damaged (the verify invariant)",
    ),
    Mutant(
        "reader-skips-committed-files-by-default",
        "reader/lakesink_reader/lake.py",
        '            on_error = "raise" if isolation == "read_committed" else "skip"',
        '            on_error = "skip" if isolation == "read_committed" else "raise"',
        "a committed file that is gone (its version vacuumed during the read) is skipped: a read "
        "returns part of a version as if it were all of it (the reads invariant)",
    ),
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
        "versions inside the retention window are vacuumed (time travel to them fails; the "
        "retention invariant)",
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
    # The commit path (lakesink/commit) -------------------------------------------------------
    Mutant(
        "abort-deletes-a-committed-batch",
        "lakesink/commit/batches.py",
        "        if writer is not None and writer.last_batch >= batch:",
        "        if writer is not None and writer.last_batch > batch:",
        "an abort after a commit whose answer was lost deletes the files the log now lists",
        # Shown equivalent in simulation.md ("Mutants"): the only caller (WriterRun.abort) calls
        # it when a task's report is missing, so no commit call was handed these files and the
        # log cannot list them; the check only picks between deleting garbage now or by the sweep.
        equivalent=True,
    ),
    Mutant(
        "replay-deletes-the-files-it-committed",
        "lakesink/commit/batches.py",
        '        self._drop(files, listed=self._listed(result), why=f"batch {batch} is already committed")',
        '        self._drop(files, listed=(), why=f"batch {batch} is already committed")',
        "a retry after a lost answer finds its own commit and deletes the files it lists",
        # Shown equivalent in simulation.md ("Mutants"): a commit call whose own create made
        # the entry holding the batch returns "committed", so the version a skip names never
        # lists this attempt's files (unique to the attempt, handed to one commit call).
        equivalent=True,
    ),
    # The log's rules and the reader's format code (reader/lakesink_reader/format) -----------------
    Mutant(
        "append-replay-check-off-by-one",
        "reader/lakesink_reader/format/v3/state.py",
        '        if batch <= known.last_batch:\n            return "replay"',
        '        if batch < known.last_batch:\n            return "replay"',
        "a replay of a writer's last batch is taken for its next one",
    ),
    Mutant(
        "compaction-conflicts-checked-on-its-adds",
        "reader/lakesink_reader/format/v3/state.py",
        "for p in (r.path for r in pending.removes) if p in removed_after_base",
        "for p in (a.path for a in pending.adds) if p in removed_after_base",
        "two compactions of the same inputs both commit: their rows twice",
    ),
    Mutant(
        "abandon-of-a-committed-op",
        "reader/lakesink_reader/format/v3/state.py",
        '    if target is None:\n        return "commit"',
        '    if target is None or target.outcome == "committed":\n        return "commit"',
        "an abandon of a committed compaction: its outputs are deleted as garbage",
    ),
    Mutant(
        "checkpoint-past-the-pinned-version",
        "reader/lakesink_reader/format/v3/checkpoint.py",
        "        return c > 0 and (at_most is None or c <= at_most)",
        "        return c > 0 and (at_most is None or c <= at_most + 1)",
        "time travel to a version starts from the checkpoint after it",
    ),
    Mutant(
        "file-list-from-a-checkpoint-above-the-version",
        "reader/lakesink_reader/format/v3/checkpoint.py",
        "    if start is not None and start.version <= version:",
        "    if start is not None:",
        "the files of an older version listed from a newer checkpoint",
    ),
    Mutant(
        "file-list-keeps-a-file-removed-after-the-checkpoint",
        "reader/lakesink_reader/format/v3/checkpoint.py",
        "                del self.added[removed.path]",
        "                pass",
        "a file added and compacted away after a checkpoint stays live: its rows twice",
    ),
    Mutant(
        "snapshot-folds-its-checkpoint-again",
        "reader/lakesink_reader/format/v3/vlog.py",
        "            self._checkpointed = max(self._checkpointed, found.version)\n"
        "        headers = self.read_headers(state.version + 1, at_most)",
        "            self._checkpointed = max(self._checkpointed, found.version)\n"
        "        headers = self.read_headers(state.version, at_most)",
        "the commit a checkpoint holds is folded in again on top of it",
    ),
    # Maintenance (lakesink/maintenance) ------------------------------------------------------
    Mutant(
        "sweep-takes-the-next-batch-for-settled",
        "lakesink/maintenance/sweep.py",
        "        if w.retired or w.last_batch >= batch:",
        "        if w.retired or w.last_batch + 1 >= batch:",
        "the sweep deletes the published files of a writer's batch in flight",
    ),
    Mutant(
        "sweep-needs-files-from-after-the-floor",
        "lakesink/maintenance/sweep.py",
        "        (needed if v > floor else removed_before).update(r.path for r in commit.removes)",
        "        (needed if v > floor + 1 else removed_before).update(r.path for r in commit.removes)",
        "the files the oldest retained version reads, removed right after it, are deleted",
    ),
    Mutant(
        "compaction-deletes-outputs-on-unknown-outcome",
        "lakesink/maintenance/compact.py",
        "        if not committed and not unknown:",
        "        if not committed:",
        "a compaction whose create's answer is unknown deletes the outputs it may commit",
    ),
    Mutant(
        "abandon-deletes-committed-outputs",
        "lakesink/maintenance/compact.py",
        '        garbage = [] if (op is not None and op.outcome == "committed") else files.get(token, [])',
        "        garbage = files.get(token, [])",
        "settling a committed op deletes its outputs, which the log lists",
    ),
    # The views (lakesink/views) ---------------------------------------------------------------
    Mutant(
        "delta-view-drops-compaction-removes",
        "lakesink/views/delta.py",
        "    for r in commit.removes:",
        '    for r in (commit.removes if header.kind == "append" else ()):',
        "a compaction's inputs stay in the Delta view beside its outputs: rows twice",
    ),
    Mutant(
        "spark-view-compaction-without-a-compact-batch",
        "lakesink/views/spark_metadata_view.py",
        "k.position = (v, write(commit, k.position[1], jump=bool(commit.removes), state=state))",
        "k.position = (v, write(commit, k.position[1], jump=False, state=state))",
        "a compaction written as a batch of adds: Spark reads its inputs and outputs",
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
    Mutant(
        "first-commit-trusts-an-empty-log",
        "lakesink/commit/versions.py",
        "                self._check_first_commit_table()\n",
        "                pass\n",
        "a writer of a deleted lake creates version 0 of the new one with the old table id",
    ),
    Mutant(
        "commit-takes-files-written-for-another-table",
        "lakesink/writer/run.py",
        "            self.check_reports_table(reports, committer.log.table_id)\n",
        "",
        "files written into a lake since deleted are committed into the new one",
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


#: What a mutant's copy of the checkout holds: the product, and the simulation that runs it.
COPIED = ("lakesink", "reader/lakesink_reader", "tests/sim", "tests/__init__.py")


def checkout_copy(into: Path, paths: tuple[str, ...] = COPIED) -> Path:
    """The checkout's tracked files under ``paths`` (as they are in the work tree) under ``into``."""
    names = (
        subprocess.run(["git", "ls-files", "-z", *paths], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        source, target = ROOT / name, into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return into


def _bounded() -> None:
    """A mutant that makes the simulation allocate without end fails its seed, not the machine."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(mutant: Mutant, seeds: int, jobs: int, start: int) -> Outcome:
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        copy = checkout_copy(Path(scratch))
        plant(mutant, copy)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(copy / "reader")])}
        done = subprocess.run(
            [sys.executable, "-m", "tests.sim", "--seeds", str(seeds), "--start", str(start),
             "--actors", "all", "--jobs", str(jobs)],
            cwd=copy, env=env, capture_output=True, text=True, check=False, preexec_fn=_bounded,
        )  # fmt: skip
    failed = re.search(r"^FAIL seed (\d+): (\w+)", done.stdout, re.MULTILINE)
    died = re.search(r"^FAIL: \d+ seed\(s\) never reported .*?: \[(\d+)", done.stdout, re.MULTILINE)
    if failed is None and died is not None:  # a worker died (a crash, memory): a failed seed
        failed = re.match(r"(\d+)()", died.group(1))
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
