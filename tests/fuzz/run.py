"""The fuzzer's driver: templates once, then each case in a fresh child under the caps."""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fuzz.child import MAINTENANCE, RSS_CAP, run_case
from tests.fuzz.mutate import MUTATIONS, applies_to, files_of, mutate
from tests.fuzz.templates import BUILT_IN_PLACE, TEMPLATES, VICTIM_IDS, build

#: A case's steps, in order, then one maintenance command (``child.MAINTENANCE``) in
#: :data:`MAINTENANCE_SHARE` of the cases; all of them may take at most this long (seconds).
STEPS = ["read", "status", "verify", "history", "secret_url"]
#: The share of cases whose steps open the lake through a ``file://`` URL carrying the case's
#: secret as a signing query parameter (which the local store ignores); every case also opens
#: it through a URL whose user info is the secret (refused): no output may show it.
SECRET_URL_SHARE = 0.5
MAINTENANCE_SHARE = 0.5
TIME_CAP = 30.0
#: How often the driver looks at a child's resident memory (seconds), and what a child holds
#: before its case starts (the preloaded modules: ~150 MiB).
POLL = 0.05
BASE_RSS = 300 << 20
#: What the child preloads (forkserver): a case pays for its work, not for these imports.
PRELOAD = ["lakesink.cli", "lakesink_reader.lake", "pyarrow.parquet", "pyarrow.compute", "tests.fuzz.child"]


@dataclass
class Case:
    seed: int
    template: str = ""
    maintenance: str = ""
    mutation: str = ""
    file: str = ""
    what: str = ""
    #: The URL the steps open the lake through ("": its path) and the secret URLs carry.
    url: str = ""
    secret: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        then = f" then {self.maintenance}" if self.maintenance else ""
        through = " (through a URL with a signing parameter)" if self.url else ""
        return f"case {self.seed}: {self.template} {self.mutation} {self.file}: {self.what}{then}{through}"


def rss(pid: int | None) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
        return int(m.group(1)) << 10 if m else 0
    except OSError:
        return 0


class Fuzzer:
    def __init__(self, workdir: Path | None = None, *, keep: bool = False) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="lakesink-fuzz-"))
        self.keep = keep
        self.templates = build(self.workdir / "templates")
        self.applicable = {
            kind: {name for name, root in self.templates.items() if applies_to(kind, files_of(root))}
            for kind in MUTATIONS
        }
        # Each thread's malloc arena reserves 64 MiB of address space: two arenas keep the
        # children's address space near what they use (the forkserver starts with this
        # environment, and the children it forks inherit it).
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def run(self, seed: int, *, template: str | None = None, mutation: str | None = None) -> Case:
        rng = random.Random(seed)
        # Given a mutation, a template it applies to (``spark_metadata``: one with views); a
        # mutation that applies to every template draws what it always drew.
        templates = [t for t in sorted(TEMPLATES) if not mutation or t in self.applicable[mutation]]
        case = Case(seed, template or rng.choice(templates))
        place = self.workdir / BUILT_IN_PLACE.get(case.template, f"case-{seed}")
        if place.exists():
            shutil.rmtree(place)
        shutil.copytree(self.templates[case.template].parent, place, symlinks=True)
        root = place / "lake"
        _move_spark_view(self.templates[case.template], root)
        start = time.monotonic()
        victim = _files(place / "victim")
        try:
            case.mutation, case.file, case.what = mutate(rng, root, mutation)
            # drawn after the mutation: a seed of the ledger's runs still makes the same one
            if rng.random() < MAINTENANCE_SHARE:
                case.maintenance = rng.choice(sorted(MAINTENANCE))
            # Drawn apart from the case's own draws: a seed's lake and mutation stay what they were.
            secrets = random.Random(f"secret {seed}")
            case.secret = f"fz{secrets.getrandbits(64):016x}zz"
            if secrets.random() < SECRET_URL_SHARE:
                case.url = f"file://localhost{root}?X-Amz-Security-Token={case.secret}"
            steps = [*STEPS, *([case.maintenance] if case.maintenance else [])]
            case.result = self._child(str(root), steps, case.url, case.secret)
            changed = sorted(set(victim.items()) ^ set(_files(place / "victim").items()))
            case.result["victim"] = [name for name, _ in changed]
        finally:
            case.seconds = round(time.monotonic() - start, 2)
            if not self.keep:
                shutil.rmtree(place, ignore_errors=True)
        case.failures = judge(case.result)
        return case

    def _child(self, root: str, steps: list[str], url: str, secret: str) -> dict[str, Any]:
        receive, send = self.ctx.Pipe(duplex=False)
        child = self.ctx.Process(
            target=run_case, args=(root, VICTIM_IDS, steps, send, url, secret), daemon=True
        )
        child.start()
        send.close()
        result: dict[str, Any] = {}
        deadline = time.monotonic() + TIME_CAP
        peak = 0
        while not result:
            if receive.poll(POLL):
                try:
                    result = receive.recv()
                except EOFError:
                    result = {}
                break
            peak = max(peak, rss(child.pid))
            if peak > 2 * RSS_CAP + BASE_RSS:
                result = {"memory": peak}
            elif time.monotonic() > deadline:
                result = {"timeout": TIME_CAP}
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
        if not result:
            result = {"died": child.exitcode}
        receive.close()
        return result


def _move_spark_view(template: Path, root: Path) -> None:
    """The Spark view's entries are absolute URIs of the lake's files: a copy's view names the
    template's, which makes it foreign to the copy (and every case's view "foreign" before its
    mutation). Point them at the copy, as a view derived there would."""
    folder = root / "_spark_metadata"
    if not folder.is_dir():
        return
    old, new = template.resolve().as_uri().encode(), root.resolve().as_uri().encode()
    for batch in folder.iterdir():
        if batch.is_file():
            batch.write_bytes(batch.read_bytes().replace(old + b"/", new + b"/"))


def _files(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (links as their target's name), by relative name."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = os.readlink(path).encode()
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


def judge(result: dict[str, Any]) -> list[str]:
    """The oracle: what in a child's result breaks the promise."""
    failures = []
    if "memory" in result:
        failures.append(f"memory: the child's resident memory reached {result['memory'] >> 20} MiB: killed")
    if "timeout" in result:
        failures.append(f"hang: no answer within {result['timeout']} s")
    if "died" in result:
        failures.append(f"the child died (exit {result['died']}): a crash or the memory cap")
    if "error" in result:
        failures.append(f"the harness failed in the child: {result['error'][-300:]}")
    for name, step in result.get("steps", {}).items():
        if step.get("problem"):
            failures.append(f"{name}: {step['problem']}")
    failures.extend(f"outside the lake: {event}" for event in result.get("audit", [])[:5])
    if result.get("victim"):
        failures.append(f"outside the lake: the victim folder changed: {result['victim'][:5]}")
    growth = result.get("rss_growth", 0)
    if growth > RSS_CAP:
        failures.append(f"memory: resident memory grew by {growth >> 20} MiB (cap {RSS_CAP >> 20})")
    return failures
