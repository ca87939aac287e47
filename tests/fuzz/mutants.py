"""``make fuzz-mutants``: a check of the trust boundary removed, one at a time, that the fuzzer
must catch (issue 51, "Done when"; docs/design/trust.md, "Mutants").

Each mutant is a plausible mistake in the product (lakesink/ and reader/lakesink_reader/) of
one of the issue's classes -- outside the lake, memory and time, crashes, secrets -- with the
fuzzer options that reach it (``--mutation``, ``--template``). For each, the checkout's product,
fuzzer and simulation files are copied to a scratch folder (``tests.sim.mutants``'
``checkout_copy``; the work tree is never touched), the mutant planted there (``plant``: its
snippet must occur exactly once), and ``python -m tests.fuzz`` run from that copy for up to
``--cases`` cases until the first ``FAILED case N``; the run is then stopped.

    python -m tests.fuzz.mutants [--only NAME,...] [--cases N] [--seed S] [--json OUT] [--baseline]

A mutant is *caught* when a case fails, *survived* otherwise; the table gives the case and the
oracle's first message. Exit status 1 when one survived (unless it is listed as equivalent).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.sim.mutants import ROOT, Mutant, checkout_copy, plant

#: What a mutant's copy holds: the product, the fuzzer, and the test helpers its templates use.
COPIED = (
    "lakesink",
    "reader/lakesink_reader",
    "tests/__init__.py",
    "tests/fuzz",
    "tests/lakes.py",
    "tests/sim",
)
#: The issue's classes, in its order.
CLASSES = ("outside", "memory", "crash", "secret")


@dataclass(frozen=True)
class FuzzMutant(Mutant):
    #: One of :data:`CLASSES`.
    klass: str = ""
    #: The fuzzer's options that reach the mutant (a template, a mutation).
    options: tuple[str, ...] = ()
    #: Where its run starts and how many cases it takes at most, unless ``--seed`` / ``--cases``
    #: say (trust.md, "Session 19": why a mutant needs more, or another start).
    seed: int = 0
    cases: int = 150
    #: The module run as ``python -m`` with the fuzzer's ``--cases``/``--seed`` and the options:
    #: the fuzzer, or a sweep aimed at the mutant that prints what it prints.
    runner: str = "tests.fuzz"


MUTANTS = (
    # Outside the lake ---------------------------------------------------------------------------
    FuzzMutant(
        "folders-opened-following-links",
        "reader/lakesink_reader/storage/local.py",
        "_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC",
        "_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC",
        "a folder of the lake that is a link is followed out of the lake (the local backend's "
        "descriptors opened without O_NOFOLLOW)",
        klass="outside",
        options=("--mutation", "link_out"),
    ),
    FuzzMutant(
        "data-files-read-through-links",
        "reader/lakesink_reader/datafiles.py",
        "        storage.refuse_link(name)\n    parquet = ds.ParquetFileFormat()",
        "        pass\n    parquet = ds.ParquetFileFormat()",
        "a committed data file that is a link is read by pyarrow, which follows it: another "
        "tenant's rows returned",
        klass="outside",
        options=("--mutation", "link_out"),
    ),
    FuzzMutant(
        "dot-dot-allowed-in-names",
        "reader/lakesink_reader/names.py",
        r'//|/$|(^|/)\.\.?(/|$)"',
        r'//|/$|(^|/)\.(/|$)"',
        "the one name rule no longer refuses a `..` segment: a logged name reaches the lake's parent",
        klass="outside",
        # A Spark-view entry names a path (2 of its 8 choices have a `..`); a JSON value lands
        # on a commit's path too rarely (150 cases of json_value on v3 did not).
        options=("--mutation", "spark_metadata"),
    ),
    # Memory and time ----------------------------------------------------------------------------
    FuzzMutant(
        "metadata-read-whole",
        "reader/lakesink_reader/limits.py",
        "    data = storage.read_bytes(name, first_contact=first_contact, limit=kind.most + 1)",
        "    data = storage.read_bytes(name, first_contact=first_contact)",
        "a metadata file is read whole before its size is checked: a sparse 6 GiB file costs 6 GiB",
        klass="memory",
        options=("--mutation", "sparse"),
    ),
    FuzzMutant(
        "json-values-uncounted",
        "reader/lakesink_reader/jsondoc.py",
        "    if count_elements(data) > max_elements:\n        raise",
        "    if False:\n        raise",
        "a JSON document's values are not counted before decoding: a long list costs GBs",
        klass="memory",
        options=("--mutation", "lengthen"),
    ),
    FuzzMutant(
        "commit-actions-unbounded",
        "reader/lakesink_reader/format/v3/commits.py",
        "    if declared > limits.COMMIT_ACTIONS:\n        # The header's count",
        "    if False:\n        # The header's count",
        "a commit's header may count any number of actions: each line is decoded (~1 KB each)",
        klass="memory",
        options=("--mutation", "lengthen", "--template", "v3"),
    ),
    FuzzMutant(
        "parquet-footer-unbounded",
        "reader/lakesink_reader/format/decoded.py",
        "    if length > MAX_FOOTER or length > size - 12:",
        "    if length > size - 12:",
        "a metadata Parquet file's footer is decoded whatever its length (to ~10x: tens of MB "
        "of one-row groups cost GBs)",
        klass="memory",
        options=("--mutation", "parquet_rewrite", "--template", "v3parts"),
        # case 128 failed on the code of session 19 (a data file's dictionary, bounded since)
        seed=129,
    ),
    FuzzMutant(
        "data-file-claims-unchecked",
        "reader/lakesink_reader/datafiles.py",
        "        footers = _within_budget([f.footer for f in self.files], read_threads(self.storage))\n",
        "        footers = tuple(f.footer for f in self.files)\n",
        "a read decodes its data files whatever their footers claim: a column of one long value "
        "stored plain decodes to GBs from a few KB",
        klass="memory",
        options=("--mutation", "parquet_rewrite", "--template", "v3foreach"),
    ),
    FuzzMutant(
        "dictionary-value-counted-once",
        "reader/lakesink_reader/datafiles.py",
        "                most += found.most\n",
        "                most += found.least\n",
        "a dictionary text chunk is claimed at its pages' bytes: one long value every row uses "
        "decodes to rows times its length (ledger cases 10083, 13914)",
        klass="memory",
        options=("--mutation", "parquet_rewrite", "--template", "v3foreach"),
        cases=300,  # session 21: caught at case 166
    ),
    FuzzMutant(
        "row-groups-cost-nothing",
        "reader/lakesink_reader/datafiles.py",
        "    least = most = (ROW_GROUP_COST + COLUMN_CHUNK_COST * len(leaves)) * metadata.num_row_groups\n",
        "    least = most = 0\n",
        "a data file's row groups are free: 50,000 row groups of 4 rows cost pyarrow's scan 900 MiB",
        klass="memory",
        options=("--mutation", "parquet_rewrite", "--template", "v3foreach"),
    ),
    FuzzMutant(
        "versions-range-over-a-claim",
        "reader/lakesink_reader/v3.py",
        "        for start in range(first, last + 1, READ_BATCH):\n"
        "            stop = min(start + READ_BATCH, last + 1)",
        "        for start in range(first, last + 1, max(1, last + 1 - first)):\n            stop = last + 1",
        "every header a snapshot claims is asked for at once: a claimed version 9 * 10**18 builds "
        "a list over it",
        klass="memory",
        # rename's claim: a checkpoint, its list, its commit and the hint moved to a far version
        # (a checkpoint alone, copied, is never read: the hint names the old one).
        options=("--mutation", "rename", "--template", "v3"),
    ),
    # Crashes --------------------------------------------------------------------------------------
    FuzzMutant(
        "times-unbounded",
        "reader/lakesink_reader/jsondoc.py",
        "    if type(value) not in (int, float) or not 0 <= value <= MAX_SECONDS:",
        "    if type(value) not in (int, float) or not 0 <= value:",
        "a time past the year 9999 is taken: datetime raises OverflowError/ValueError in history",
        klass="crash",
        options=("--mutation", "number_text"),
        # caught at case 314: number_text lands on a commit's committed_at ~1 case in 300
        cases=400,
    ),
    FuzzMutant(
        "counts-unbounded",
        "reader/lakesink_reader/jsondoc.py",
        "    if type(value) is not int or not least <= value <= MAX_COUNT:",
        "    if type(value) is not int or not least <= value:",
        "a count, size or version past 2**63-1 is taken: int64 conversions raise OverflowError later",
        klass="crash",
        # number_text aimed at counts (random ones reach the one count no cross-check covers
        # about once in thousands of cases): tests/fuzz/count_sweep.py
        runner="tests.fuzz.count_sweep",
        options=("--template", "v3compacted"),
        cases=2000,
    ),
    FuzzMutant(
        "floats-unchecked",
        "reader/lakesink_reader/jsondoc.py",
        "    if not math.isfinite(value):\n        raise",
        "    if math.isnan(value):\n        raise",
        "1e999 decodes to infinity, and an int() of it raises OverflowError later",
        klass="crash",
        options=("--mutation", "number_text"),
    ),
    FuzzMutant(
        "list-errors-not-joined",
        "reader/lakesink_reader/format/v3/checkpoint.py",
        "            said = one_line(exc)  # fuzzer case 3994",
        "            said = str(exc)",
        "pyarrow's error for a damaged checkpoint list spans lines, and the reader's error quotes it",
        klass="crash",
        options=("--mutation", "flip", "--template", "v3"),
        # caught at case 279: a flip hits a page header of the checkpoint's list rarely
        cases=400,
    ),
    FuzzMutant(
        "iceberg-avro-unchecked",
        "lakesink/views/iceberg_view.py",
        "        iceberg_avro.check(data, name)\n",
        "        pass\n",
        "the Iceberg view's Avro files go to pyiceberg unchecked: a 3 MB manifest list of one "
        "deflate block inflates to 3 GB (verify: 6 GB, session 22)",
        klass="memory",
        options=("--mutation", "iceberg_avro", "--template", "v3iceberg"),
    ),
    FuzzMutant(
        "iceberg-metadata-unbounded",
        "lakesink/views/iceberg_view.py",
        "TableMetadataUtil.parse_obj(jsondoc.loads(data, max_elements=METADATA_VALUES))",
        'TableMetadataUtil.parse_raw(data.decode("utf-8"))',
        "the Iceberg view's metadata file goes to pydantic unbounded: a snapshot log of a million "
        "entries (50 MB) takes GBs",
        klass="memory",
        options=("--mutation", "iceberg_metadata", "--template", "v3iceberg"),
    ),
    FuzzMutant(
        "iceberg-refusal-every-error",
        "lakesink/views/iceberg_view.py",
        "    if isinstance(exc, ValidationError) and exc.error_count() > VALIDATION_ERRORS_SHOWN:\n"
        '        return f"{exc.error_count()} validation errors for {exc.title}"\n'
        "    return one_line(exc)[:200]\n",
        '    return " ".join(str(exc).split())[:200]\n',
        "the refusal of an Iceberg metadata file pydantic refuses is made of the error's whole text: "
        "200,000 refs of a 3.5 MB file make 42 MB of it, split into words (verify: 580 MiB, "
        "fuzz ledger case 59370, session 23)",
        klass="memory",
        options=("--mutation", "iceberg_metadata", "--template", "v3iceberg"),
    ),
    # Secrets ----------------------------------------------------------------------------------------
    FuzzMutant(
        "local-url-refusal-unredacted",
        "reader/lakesink_reader/storage/__init__.py",
        'raise ValueError(f"file:// URL {redacted(url)!r} names the host {host!r}: use file:///path")',
        'raise ValueError(f"file:// URL {url!r} names the host {host!r}: use file:///path")',
        "the refusal of a file:// URL with a host shows the URL, its user info included",
        klass="secret",
    ),
    FuzzMutant(
        "redaction-keeps-user-info",
        "reader/lakesink_reader/redact.py",
        "    text = _USER_INFO.sub(lambda m: f\"{m['head']}{HIDDEN}@\", text)\n",
        "",
        "redacted() hides signing parameters but not user info (`scheme://key:secret@`)",
        klass="secret",
    ),
)


@dataclass
class Outcome:
    name: str
    klass: str
    caught: bool
    case: int | None
    message: str | None
    cases_run: int
    seconds: float
    equivalent: bool
    #: The failing case fails on the unchanged code too (replayed there): not the mutant's.
    unchanged_fails: bool = False


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop the fuzzer this runner started, its forkserver and children (its own session; its
    work folder is in the scratch folder, removed with it)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run(mutant: FuzzMutant, cases: int, seed: int, *, log: bool = False, planted: bool = True) -> Outcome:
    """Plant ``mutant`` in a scratch copy and fuzz it until the first failing case (not
    ``planted``: the same run on the unchanged copy, which must stay clean)."""
    began = time.monotonic()
    case: int | None = None
    message: str | None = None
    ran = 0
    with tempfile.TemporaryDirectory(prefix=f"fuzz-mutant-{mutant.name}-") as scratch:
        copy = checkout_copy(Path(scratch) / "checkout", COPIED)
        if planted:
            plant(mutant, copy)
        # A mutant that does not compile would fail every case that imports its module: caught
        # for the wrong reason.
        compile((copy / mutant.path).read_text(), mutant.path, "exec")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(copy), str(copy / "reader")]),
            "TMPDIR": scratch,  # the fuzzer's work folder goes with the copy, whatever happens
        }
        command = [
            sys.executable,
            "-m",
            mutant.runner,
            "--cases",
            str(cases),
            "--seed",
            str(seed),
            *mutant.options,
        ]
        with subprocess.Popen(
            command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        ) as proc:  # fmt: skip
            assert proc.stdout is not None
            tail: list[str] = []
            try:
                for line in proc.stdout:
                    tail = [*tail[-20:], line]
                    if log:
                        print(f"    | {line.rstrip()}", flush=True)
                    if case is None:
                        failed = re.match(r"FAILED case (\d+):", line)
                        if failed:
                            case = int(failed.group(1))
                            ran = case - seed + 1
                        elif m := re.match(r"(\d+) case\(s\) from seed", line):
                            ran = int(m.group(1))
                    elif line.startswith("    ") and message is None:
                        message = line.strip()  # the oracle's first message
                        break
            finally:
                _stop(proc)
        if case is None and not ran:  # no summary line: the fuzzer itself failed (a broken plant)
            raise SystemExit(f"mutant {mutant.name}: the fuzzer stopped without running:\n{''.join(tail)}")
        unchanged_fails = False
        if case is not None and planted:  # the case replayed on the unchanged code: clean?
            (copy / mutant.path).write_text((ROOT / mutant.path).read_text())
            again = [sys.executable, "-m", mutant.runner, "--cases", "1", "--seed", str(case)]
            again += mutant.options
            replay = subprocess.run(again, cwd=copy, env=env, capture_output=True, text=True, check=False)
            unchanged_fails = "FAILED case" in replay.stdout
    return Outcome(
        mutant.name,
        mutant.klass,
        case is not None,
        case,
        message,
        ran,
        round(time.monotonic() - began, 1),
        mutant.equivalent,
        unchanged_fails,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.mutants", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    p.add_argument("--cases", type=int, help="fuzzer cases per mutant at most (default: the mutant's, 150)")
    p.add_argument("--seed", type=int, help="the first case's seed (default: the mutant's, 0)")
    p.add_argument("--json", help="write the outcomes to this file")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--log", action="store_true", help="print the fuzzer's output as it runs")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="run each chosen mutant's fuzzer options on the unchanged code instead (must be clean)",
    )
    args = p.parse_args(argv)
    unknown = set(filter(None, args.only.split(","))) - {m.name for m in MUTANTS}
    if unknown:
        p.error(f"unknown mutant(s) {sorted(unknown)}; --list names them")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only.split(",")]
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<34} {m.klass:<8} {' '.join(m.options) or '(any)':<44} {m.why}")
        return 0
    if args.baseline:  # each set of options once
        chosen = list({m.options: m for m in reversed(chosen)}.values())[::-1]
    outcomes = []
    for m in chosen:
        cases = args.cases if args.cases is not None else m.cases
        seed = args.seed if args.seed is not None else m.seed
        outcome = run(m, cases, seed, log=args.log, planted=not args.baseline)
        if args.baseline:
            outcome.name = " ".join(m.options) or "(any)"
        outcomes.append(outcome)
        what = f"caught at case {outcome.case}: {outcome.message}" if outcome.caught else "SURVIVED"
        if outcome.unchanged_fails:
            what = f"NOT CAUGHT: case {outcome.case} fails on the unchanged code too: {outcome.message}"
        what = f"{cases} from {seed}: {what}"
        if args.baseline:
            what = f"FAILED at case {outcome.case}: {outcome.message}" if outcome.caught else "clean"
        print(f"{outcome.name:<34} {m.klass:<8} {outcome.seconds:>6.1f} s  {what[:240]}", flush=True)
    caught = sum(o.caught and not o.unchanged_fails for o in outcomes)
    runs = "baseline runs failed" if args.baseline else "mutants caught"
    print(f"{caught} of {len(outcomes)} {runs}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    if args.baseline:
        return 1 if caught else 0
    return 0 if all((o.caught and not o.unchanged_fails) or o.equivalent for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
