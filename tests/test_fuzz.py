"""The trust-boundary fuzzer (tests/fuzz, issue 51), bounded: 50 cases in well under a minute,
and the oracle itself checked -- a case that reads outside the lake, hangs, or raises something
other than a clear error is reported, so a clean run means something."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz import child
from tests.fuzz.run import Fuzzer, judge

#: Cases of the bounded run: ~0.7 s each on this 2-core machine (since session 22 a case reads
#: read_all and changes too, and one template in seven is the Iceberg view's: 50, not 60).
BOUNDED_CASES = int(os.environ.get("LAKESINK_FUZZ_CASES", "50"))
#: Where the bounded run starts (the ledger's runs start at 0; another start here finds others).
BOUNDED_START = int(os.environ.get("LAKESINK_FUZZ_START", "1000000"))


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    made = Fuzzer(tmp_path_factory.mktemp("fuzz"))
    yield made
    made.close()


def test_a_bounded_run_of_the_fuzzer_is_clean(fuzzer: Fuzzer) -> None:
    failed = []
    for seed in range(BOUNDED_START, BOUNDED_START + BOUNDED_CASES):
        case = fuzzer.run(seed)
        if case.failures:
            failed.append(
                f"{case.line()}: {case.failures} (replay: python -m tests.fuzz --seed {seed} --cases 1)"
            )
    assert not failed, "\n".join(failed)


def test_the_oracle_sees_a_read_outside_a_traceback_and_a_hang() -> None:
    lake = Path(__file__).parent  # stands in for a lake root: this folder is "inside"
    assert judge({"steps": {}, "audit": ["open /etc/passwd (is /etc/passwd)"]})
    assert judge({"steps": {"read": {"verdict": "crash", "problem": "KeyError: 'x'"}}, "audit": []})
    assert judge({"timeout": 30.0}) and judge({"memory": 2 << 30}) and judge({"died": -9})
    assert judge(
        {"steps": {"status": {"verdict": "ok", "problem": None}}, "audit": [], "rss_growth": 1 << 30}
    )
    assert not judge(
        {"steps": {"status": {"verdict": "refused", "problem": None}}, "audit": [], "rss_growth": 1}
    )
    # the hook itself, in a child of its own (an audit hook cannot be removed)
    code = (
        "import sys; from tests.fuzz.child import install_audit; found = []; "
        f"install_audit({str(lake)!r}, found); open({str(lake / 'test_fuzz.py')!r}).close(); "
        "import os; os.listdir('/etc'); at = os.open('/etc', os.O_RDONLY | os.O_DIRECTORY); "
        "\ntry: os.remove('no-such-file', dir_fd=at)\nexcept OSError: pass\nprint(found)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # a name relative to a descriptor outside (the local backend's way) is resolved through it
    assert "os.listdir /etc" in out and "test_fuzz.py" not in out, out
    assert "os.remove no-such-file (is /etc/no-such-file)" in out, out
    assert child.one_error_line("lakesink status: error: x\n") and not child.one_error_line("")


def test_the_fuzzer_catches_a_planted_mutant() -> None:
    """One check of the trust boundary removed (tests/fuzz/mutants.py: the local backend's folders
    opened without O_NOFOLLOW), in a scratch copy: the fuzzer's first case of ``--mutation
    link_out`` fails on it (~4 s), and the work tree is not touched."""
    from tests.fuzz.mutants import MUTANTS, run

    mutant = next(m for m in MUTANTS if m.name == "folders-opened-following-links")
    outcome = run(mutant, cases=3, seed=0)
    assert outcome.caught and outcome.case == 0, outcome
    assert outcome.message and outcome.message.startswith("outside the lake: lakesink.folder"), outcome
    assert mutant.original in (Path(__file__).parent.parent / mutant.path).read_text()
