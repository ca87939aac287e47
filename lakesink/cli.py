"""The ``lakesink`` command: maintenance of a lake (the writers run inside Spark).

lakesink orphans PATH [--older-than 1h] [--delete] [--storage-option k=v ...] [--json]
lakesink verify PATH [--deep] [--all-versions] [--storage-option k=v ...] [--json]
lakesink offsets PATH [--writer W] [--all-sources] [--storage-option k=v ...]
lakesink status PATH [--leftovers] [--storage-option k=v ...] [--json]
lakesink history PATH [--limit N] [--storage-option k=v ...] [--json]
lakesink config PATH [NAME=VALUE ...] [--storage-option k=v ...] [--json]
lakesink compact PATH [--target-file-size 128MB] [--min-files 5] [--max-input 16GB] [--dry-run]
                 [--abandon-older-than 1h] [--storage-option k=v ...] [--json]
lakesink vacuum PATH [--retain 7d] [--delete] [--force] [--list] [--storage-option k=v ...] [--json]
lakesink upgrade PATH [--check] [--storage-option k=v ...] [--json]
lakesink sync-views PATH [--only all|delta|spark] [--check] [--storage-option k=v ...] [--json]
lakesink --version

Each subcommand imports what it runs when it runs: the maintenance modules and the reader's
``Lake`` load pyarrow (and the commit protocol), which ``--help``, ``--version`` and the start of
every other subcommand do without. Nothing here imports pyspark.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from lakesink import __version__
from lakesink_reader.errors import LakeSinkError
from lakesink_reader.redact import redacted
from lakesink_reader.storage import open_storage
from lakesink_reader.storage.options import parse_option_pairs

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"30m"``, ``"1h"``, ``"2d"`` -> seconds; ValueError naming the text."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"bad duration {text!r}: use a number with an optional unit s, m, h or d (e.g. 1h)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _duration(seconds: float) -> str:
    """``3600`` -> ``"1h"``: an age as it would be typed after --older-than."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:g}s"


def _progress(stream: TextIO, what: str, *, json_out: bool = False) -> Callable[[int, int], None] | None:
    """A ``progress(done, total)`` for long runs: a bar (tqdm) on a terminal; elsewhere (a log,
    a CI job) a plain line at the first step and at each tenth of the way -- but none beside
    ``--json`` off a terminal, whose reader may take stderr with stdout."""
    if stream.isatty():
        # Here, not at the top: only a terminal shows a bar, and tqdm's import is not free.
        from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs: a bar is all it does here

        bars: list[Any] = []

        def bar(done: int, total: int) -> None:
            if not bars:
                bars.append(tqdm(total=total, desc=what, file=stream, leave=True, dynamic_ncols=True))
            bars[0].update(done - bars[0].n)
            if done >= total:
                bars[0].close()

        return bar
    if json_out:
        return None
    said = [-1]

    def lines(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth != said[0]:
            said[0] = tenth
            stream.write(f"{what}: {done}/{total}\n")
            stream.flush()

    return lines


def _orphans(args: argparse.Namespace) -> int:
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.commit.files import DEFAULT_STAGED_AGE
    from lakesink.maintenance.sweep import sweep

    if args.older_than is None and args.delete:
        # Staged data younger than the age may be a live task's: removing it fails the task
        # (Spark retries it, and a task that always takes longer than the age never succeeds).
        # How long a task of this job keeps a file staged is for the operator to say.
        raise ValueError(
            "--delete needs --older-than: staged data younger than that may belong to a task "
            "still writing, and removing it fails the task. Pick an age longer than any task of "
            "the job keeps a file staged (the writers' own sweep uses their staged_cleanup_age, "
            f"{_duration(DEFAULT_STAGED_AGE)} by default); run without --delete to see what is there"
        )
    older_than = DEFAULT_STAGED_AGE if args.older_than is None else parse_duration(args.older_than)
    report = sweep(
        args.path,
        older_than=older_than,
        delete=args.delete,
        storage_options=parse_option_pairs(args.storage_option),
        progress=_progress(sys.stderr, "removing", json_out=args.json),
        views=True,
    )
    if args.json:
        doc = {
            "path": report.path,
            "older_than": report.older_than,
            "delete": report.delete,
            "findings": [_orphan_doc(o) for o in report.findings],
            "kept": [_orphan_doc(o) for o in report.kept],
            "removed": [o.name for o in report.removed],
            "failed": [{"name": o.name, "error": e} for o, e in report.failed],
        }
        print(json.dumps(doc, indent=2))
        return 0 if report.ok else 1
    verb = "removed" if args.delete else "found (dry run; --delete removes them)"
    print(f"{len(report.findings)} orphan(s) in {report.path}, {verb}")
    if args.older_than is None:
        print(
            f"staged data of epochs not yet committed is listed when older than {_duration(older_than)} "
            "(the default --older-than): younger, it may be a live task's; --older-than 0 lists all of it"
        )
    failed = {id(o) for o, _ in report.failed}
    for o in report.findings:
        status = ("  FAILED" if id(o) in failed else "  removed") if args.delete else ""
        size = "?" if o.size is None else str(o.size)
        print(f"  {o.kind:<17} {_age(o.age):>7} {size:>12} B  {o.name}  ({o.reason}){status}")
    if report.kept:
        print(f"{len(report.kept)} file(s) kept: published, but their epoch has no record yet")
        for o in report.kept:
            print(f"  {o.kind:<17} {_age(o.age):>7} {o.size or 0:>12} B  {o.name}  ({o.reason})")
    for o, error in report.failed:
        print(f"error: could not remove {o.name}: {error}", file=sys.stderr)
    return 0 if report.ok else 1


def _orphan_doc(o: Any) -> dict[str, Any]:
    return {
        "kind": o.kind,
        "name": o.name,
        "epoch": o.epoch,
        "age": o.age,
        "size": o.size,
        "settled": o.settled,
        "reason": o.reason,
    }


def _versions_checked(versions: tuple[int, int] | None) -> str:
    if versions is None:
        return ""
    first, last = versions
    if first == last:
        return f" at version {last} (the latest; --all-versions checks every retained one)"
    return f" at versions {first}..{last} (every retained one)"


def _verify(args: argparse.Namespace) -> int:
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.maintenance.verify import verify

    report = verify(
        args.path,
        deep=args.deep,
        storage_options=parse_option_pairs(args.storage_option),
        progress=_progress(sys.stderr, "checking", json_out=args.json),
        all_versions=args.all_versions,
    )
    if args.json:
        doc = {
            "path": report.path,
            "checked": report.checked,
            "problems": [{"name": p.name, "epoch": p.epoch, "problem": p.problem} for p in report.problems],
            "delta_view": report.delta_view,
            "spark_view": report.spark_view,
            "iceberg_view": report.iceberg_view,
            "versions": list(report.versions) if report.versions is not None else None,
        }
        print(json.dumps(doc, indent=2))
    else:
        state = "ok" if report.ok else f"{len(report.problems)} problem(s)"
        where = f"{report.path}{_versions_checked(report.versions)}"
        print(f"{report.checked} committed file(s) checked in {where}: {state}")
        for p in report.problems:
            print(f"  epoch {p.epoch}: {p.name}: {p.problem}")
        if report.delta_view is not None:
            print(f"  Delta view (_delta_log/, derived): {report.delta_view}")
        if report.spark_view is not None:
            print(f"  Spark view (_spark_metadata/, derived): {report.spark_view}")
        if report.iceberg_view is not None and report.iceberg_view != "absent":
            print(f"  Iceberg view (metadata/, derived): {report.iceberg_view}")
        if report.problems:
            print(
                "what to do: docs/guide/maintenance.md, 'lakesink verify and repairing a lake' (restore "
                "the files, or read around them with read_committed(..., on_error='skip'))",
                file=sys.stderr,
            )
    return 0 if report.ok else 1


def _sync_views(args: argparse.Namespace) -> int:
    """``sync-views``: the Delta view, the Spark view, or both (``--only``)."""
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.views.delta_view import delta_sync
    from lakesink.views.iceberg_layout import has_view
    from lakesink.views.spark_metadata_view import spark_sync
    from lakesink_reader.format.table import read_table_metadata

    storage = open_storage(args.path, parse_option_pairs(args.storage_option))
    only, write = args.only, not args.check
    docs: dict[str, Any] = {}
    ok = True
    if only in ("all", "delta"):
        delta = delta_sync(
            storage, write=write, progress=_progress(sys.stderr, "Delta view versions", json_out=args.json)
        )
        docs["delta"] = vars(delta)
        # (all views: a schema Delta cannot take is a state of the lake, not a failure of the sync)
        ok = ok and delta.state in ("ok", "absent", *(("unsupported",) if only == "all" else ()))
        if not args.json:
            print(f"{delta.path}: Delta view (_delta_log/) {delta.summary()}")
            print(f"  lake version {delta.lake_version}, view version {delta.view_version}, "
                  f"{len(delta.written)} commit(s) written")  # fmt: skip
    if only in ("all", "spark"):
        spark = spark_sync(storage, write=write)
        docs["spark"] = vars(spark)
        ok = ok and spark.state in ("ok", "absent")
        if not args.json:
            print(f"{spark.path}: Spark view (_spark_metadata/) {spark.summary()}")
            print(f"  lake version {spark.lake_version}, view version {spark.view_version} (batch "
                  f"{spark.batch}), {len(spark.written)} version(s) written")  # fmt: skip
    # The Iceberg view on lakes that keep one (or when asked for): pyiceberg loads only then.
    if only == "iceberg" or (
        only == "all" and (has_view(storage) or read_table_metadata(storage).iceberg_view)
    ):
        # Here, not at the top: pyiceberg, which lakes without an Iceberg view need not have.
        from lakesink.views.iceberg_view import iceberg_sync

        iceberg = iceberg_sync(storage, write=write, create=True if only == "iceberg" else None)
        docs["iceberg"] = vars(iceberg)
        ok = ok and iceberg.state in ("ok", "absent", *(("unsupported",) if only == "all" else ()))
        if not args.json:
            print(f"{iceberg.path}: Iceberg view (metadata/) {iceberg.summary()}")
            print(f"  lake version {iceberg.lake_version}, view version {iceberg.view_version}, "
                  f"{len(iceberg.written)} snapshot(s) written")  # fmt: skip
    if args.json:
        print(json.dumps(docs, indent=2))
    return 0 if ok else 1


def _compact(args: argparse.Namespace) -> int:
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.maintenance.compact import compact, parse_size

    report = compact(
        args.path,
        target_file_size=parse_size(args.target_file_size),
        min_files=args.min_files,
        max_input=parse_size(args.max_input),
        dry_run=args.dry_run,
        abandon_older_than=parse_duration(args.abandon_older_than),
        storage_options=parse_option_pairs(args.storage_option),
        progress=_progress(sys.stderr, "rewriting bins", json_out=args.json),
    )
    if args.json:
        doc = {
            "path": report.path,
            "op": report.token,
            "status": report.status,
            "base_version": report.base_version,
            "version": report.version,
            "live_files": report.live_files,
            "bins": [
                {"files": [f.path for f in b.inputs], "bytes": b.size, "rows": b.rows} for b in report.bins
            ],
            "outputs": [{"path": a.path, "bytes": a.size, "rows": a.rows} for a in report.outputs],
            "abandoned": [
                {"op": a.token, "version": a.version, "removed": list(a.removed)} for a in report.abandoned
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    for a in report.abandoned:
        what = "would abandon" if a.version is None and report.status == "dry_run" else "abandoned"
        print(f"{what} op {a.token} (a dead or idle run): {len(a.removed)} file(s) of it")
    if report.status == "dry_run":
        print(
            f"dry run: {report.input_files} of {report.live_files} live file(s) ({report.input_bytes} B) of "
            f"{report.path} would be rewritten into {len(report.bins)} file(s), based on version "
            f"{report.base_version}"
        )
    elif report.status == "nothing_to_do":
        print(
            f"nothing to compact in {report.path} at version {report.base_version} "
            f"({report.live_files} live files)"
        )
    else:
        print(
            f"compacted {report.input_files} of {report.live_files} live file(s) ({report.input_bytes} B) of "
            f"{report.path} into {len(report.outputs)} at version {report.version} (op {report.token})"
        )
    for i, b in enumerate(report.bins):
        out = f" -> {report.outputs[i].path}" if i < len(report.outputs) else ""
        print(f"  bin {i}: {len(b.inputs)} file(s), {b.size} B, {b.rows} rows{out}")
    return 0


#: What each kind of file vacuum removes is, in its summary (``--list`` gives each file's reason).
VACUUM_KINDS = {
    "removed_file": "removed from the table before the retained range (compactions replaced them)",
    "unrecorded_file": "listed by no retained version, their batches settled (failed or replayed attempts')",
    "staged_file": "staged data of settled batches, or older than the writers' age",
    "multipart_upload": "uploads never completed, of settled batches or older than the writers' age",
    "lease": "leases of finished maintenance ops",
    "probe": "leftovers of the store check",
    "view_file": "the Iceberg view's metadata and Avro files of snapshots it no longer holds",
}
#: Files kept shown without ``--list``.
KEPT_SHOWN = 20


def _by_kind(orphans: Sequence[Any]) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for o in orphans:
        count, size = found.get(o.kind, (0, 0))
        found[o.kind] = (count + 1, size + (o.size or 0))
    return found


def _vacuum(args: argparse.Namespace) -> int:
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.maintenance.vacuum import RETAIN_FLOOR, vacuum

    retain = parse_duration(args.retain)
    if retain < RETAIN_FLOOR and not args.force:  # said as a CLI user gives it (not force=True)
        raise ValueError(
            f"--retain {args.retain} is below the safety floor of 24h: readers of older versions and "
            "writers whose clocks run late could find their files gone. Add --force if that is what "
            "you want"
        )
    report = vacuum(
        args.path,
        retain=retain,
        delete=args.delete,
        force=args.force,
        storage_options=parse_option_pairs(args.storage_option),
        progress=_progress(sys.stderr, "removing", json_out=args.json),
    )
    if args.json:
        doc = {
            "path": report.path,
            "retain": report.retain,
            "delete": report.delete,
            "latest": report.latest,
            "retained_from": report.retained_from,
            "previous_retained_from": report.previous_retained_from,
            "version": report.version,
            "checkpoint": report.checkpoint,
            "files": [_orphan_doc(o) for o in report.files],
            "kept": [_orphan_doc(o) for o in report.kept],
            "log_entries": report.log_entries,
            "removed": report.removed,
            "failed": [{"name": n, "error": e} for n, e in report.failed],
        }
        print(json.dumps(doc, indent=2))
        return 0 if report.ok else 1
    if report.retained_from is None:
        print(f"nothing to vacuum in {report.path}: no version was committed more than {args.retain} ago")
        return 0
    verb = "removed" if args.delete else "would go (dry run; --delete removes them)"
    done = f" (vacuum commit at version {report.version})" if report.version is not None else ""
    print(f"{report.path}: versions {report.retained_from}..{report.latest} stay readable{done}")
    print(f"{len(report.files)} file(s) and {len(report.log_entries)} log entr(ies) {verb}")
    if args.list:
        for o in report.files:
            size = "?" if o.size is None else str(o.size)
            print(f"  {o.kind:<17} {_age(o.age):>7} {size:>12} B  {o.name}  ({o.reason})")
        for name in report.log_entries:
            print(f"  {'log':<17} {name}")
    else:
        for kind, (count, total) in _by_kind(report.files).items():
            print(f"  {kind:<17} {count:>7,} file(s) {total:>14,} B  {VACUUM_KINDS.get(kind, '')}")
        if report.log_entries:
            first, last = report.log_entries[0].rsplit("/", 1)[-1], report.log_entries[-1].rsplit("/", 1)[-1]
            print(f"  {'log':<17} {len(report.log_entries):>7,} entr(ies)  {first} .. {last}")
        if report.files:
            print("  (--list names each file and why)")
    if report.kept:
        # (a batch that may still be committed, or a file a derived view behind the floor lists)
        print(f"{len(report.kept)} file(s) listed by no retained version kept, each for its reason:")
        for o in report.kept if args.list else report.kept[:KEPT_SHOWN]:
            print(f"  {o.kind:<17} {_age(o.age):>7} {o.size or 0:>12} B  {o.name}  ({o.reason})")
        if not args.list and len(report.kept) > KEPT_SHOWN:
            print(f"  ... and {len(report.kept) - KEPT_SHOWN} more (--list shows them all)")
    for name, error in report.failed:
        print(f"error: could not remove {name}: {error}", file=sys.stderr)
    return 0 if report.ok else 1


def _status(args: argparse.Namespace) -> int:
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.maintenance.status import status

    found = status(
        args.path, storage_options=parse_option_pairs(args.storage_option), leftovers=args.leftovers
    )
    if args.json:
        print(json.dumps(found.to_json(), indent=2, default=str))
        return 0

    def when(seconds: float | None) -> str:
        if seconds is None:
            return "-"
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")

    unit = "version" if found.has_log else "epoch"
    print(f"{found.path}: format {found.format_version}, {found.mode} mode, table {found.table_id}")
    print(f"  latest {unit}: {'-' if found.version is None else found.version} at {when(found.committed_at)}")
    rows = "?" if found.rows is None else f"{found.rows:,}"
    # (compact joins two or more small files of a folder: one alone is nothing to do)
    joins = " (lakesink compact joins them)" if (found.small_files or 0) > 1 else ""
    print(f"  live: {found.files} file(s), {rows} row(s), {found.bytes or 0:,} bytes; "
          f"{found.small_files} under 64 MiB{joins}")  # fmt: skip
    for w in found.writers:
        lineage = (f", continues {w.continues}" if w.continues else "") + (
            f", retired: continued by {w.continued_by}" if w.continued_by else ""
        )
        print(f"  writer {w.id}: batches {w.first_batch}..{w.last_batch}, last at version {w.last_version} "
              f"({when(w.committed_at)}), offsets {json.dumps(w.offsets)}{lineage}")  # fmt: skip
    age = "" if found.oldest_staged_age is None else f", the oldest {_age(found.oldest_staged_age)} old"
    print(f"  staged leftovers: {found.staged} ({found.staged_bytes:,} bytes{age}); running compactions: "
          f"{found.running_ops}")  # fmt: skip
    print(_leftovers_line(found.leftovers, found.path))
    if found.delta_view is not None:
        print(f"  Delta view (_delta_log/, derived): {found.delta_view}")
    if found.spark_view is not None:
        print(f"  Spark view (_spark_metadata/, derived): {found.spark_view}")
    if found.iceberg_view is not None:
        print(f"  Iceberg view (metadata/, derived): {found.iceberg_view}")
    return 0


def _leftovers_line(found: Any, path: str) -> str:
    """``lakesink status``'s line on published leftovers: counted with --leftovers (the sweep's
    plan, read-only), else said not to be, and how to see them."""
    names = f"`lakesink orphans {path}` names them"
    if found is None:
        return f"  published leftovers: not counted (that lists every file): --leftovers counts them, {names}"
    removable = ", ".join(
        f"{count:,} {kind} ({size:,} bytes)" for kind, (count, size) in found.removable.items()
    )
    total = sum(count for count, _ in found.removable.values())
    line = f"  leftovers (as `lakesink orphans` finds them): {total:,} removable" + (
        f": {removable}" if removable else ""
    )
    if found.kept:
        line += (
            f"; {found.kept:,} kept ({found.kept_bytes:,} bytes): published, their batch not committed "
            "(in flight, or killed: the query's restart settles them)"
        )
    return line


def _upgrade(args: argparse.Namespace) -> int:
    # This subcommand's modules, not at the top: they load pyarrow (module docstring).
    from lakesink.maintenance.upgrade import upgrade

    report = upgrade(
        args.path,
        check=args.check,
        storage_options=parse_option_pairs(args.storage_option),
        progress=_progress(sys.stderr, "importing", json_out=args.json),
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    elif report.status == "already_format_3":
        since = (
            f" (upgraded from format {report.from_format}: the upgrade is version {report.upgrade_version})"
            if report.fence_epoch is not None
            else ""
        )
        print(f"{report.path} is already format 3{since}")
    elif report.mode == "foreach":
        verb = "would replace" if report.status == "would_upgrade" else "replaced"
        print(f"{report.path}: foreach lake of format {report.from_format}: {verb} table.json with format 3 "
              "(foreach lakes have no log)")  # fmt: skip
    else:
        u, f = report.upgrade_version, report.fence_epoch
        epochs = (f"epochs {report.first_epoch}..{(f or 0) - 1} as versions 0..{(u or 0) - 1}"
                  if report.imported else "no epochs")  # fmt: skip
        if report.status == "would_upgrade":
            fence = "create a fence record at" if report.fence_created else "reuse the fence at"
            print(f"would upgrade {report.path} from format {report.from_format}: {fence} epoch {f} of the "
                  f"epoch log, import {epochs}, commit the upgrade at version {u}"
                  + (" with a checkpoint there" if u else "")
                  + ", then replace table.json with format 3")  # fmt: skip
        else:
            print(f"upgraded {report.path} from format {report.from_format} to 3: imported {epochs}; the "
                  f"upgrade is version {u} (the epoch log is fenced at epoch {f})")  # fmt: skip
    if not report.ok:
        print(f"lakesink upgrade: error: {report.strays_message()}", file=sys.stderr)
        return 1
    return 0


def _offsets(args: argparse.Namespace) -> int:
    # Here, not at the top: the reader's Lake loads pyarrow (this subcommand's alone).
    from lakesink_reader import Lake

    lake = Lake(args.path, storage_options=parse_option_pairs(args.storage_option))
    offsets = lake.offsets(args.writer)
    if offsets is None:
        print(
            f"lakesink offsets: {redacted(lake.path)}: the writer recorded no source offsets (its checkpoint "
            "location was not readable by the driver)",
            file=sys.stderr,
        )
        return 1
    # One source: its offsets as the source takes them back (Kafka: startingOffsets).
    print(json.dumps(offsets[0] if len(offsets) == 1 and not args.all_sources else offsets))
    return 0


def _setting(text: str) -> tuple[str, bool | None]:
    """``NAME=VALUE`` of ``lakesink config``: a lake default, true/false, or unset to remove it."""
    name, sep, value = text.partition("=")
    values = {"true": True, "false": False, "unset": None}
    if not sep or not name.strip() or value.strip().lower() not in values:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=true, NAME=false or NAME=unset")
    return name.strip(), values[value.strip().lower()]


def _config(args: argparse.Namespace) -> int:
    # Here, not at the top: table.json's schema loads pyarrow (this subcommand's alone).
    from lakesink.maintenance.lake_defaults import LAKE_DEFAULTS, lake_defaults, set_lake_defaults
    from lakesink_reader.format.table import read_table_metadata

    storage = open_storage(args.path, parse_option_pairs(args.storage_option))
    metadata = (
        set_lake_defaults(storage, dict(args.settings)) if args.settings else read_table_metadata(storage)
    )
    defaults = lake_defaults(metadata)
    if args.json:
        print(json.dumps(defaults))
        return 0
    for name in LAKE_DEFAULTS:
        print(f"{name} = {str(defaults[name]).lower() if name in defaults else 'unset'}")
    return 0


def _history(args: argparse.Namespace) -> int:
    # Here, not at the top: the reader's Lake and the v3 commit records load pyarrow (this
    # subcommand's alone).
    from lakesink_reader import Lake
    from lakesink_reader.format.v3.commits import writer_tag

    lake = Lake(args.path, storage_options=parse_option_pairs(args.storage_option))
    entries = lake.history(args.limit)
    if args.json:
        print(json.dumps([{**dataclasses.asdict(e), "operation": e.operation} for e in entries], indent=2))
        return 0
    # The operation column as wide as its longest entry ("auto-compaction" is 15): the rest in line.
    operation = -max([13, *(len(e.operation) for e in entries)])
    columns = (("version", 8), ("committed (UTC)", -19), ("operation", operation), ("writer", -16),
               ("batch", 6),
               ("+files", 7), ("+rows", 12), ("+bytes", 14),
               ("-files", 7), ("-rows", 12), ("-bytes", 14))  # fmt: skip

    def line(values: Sequence[object]) -> str:  # width < 0: left-aligned
        return "  ".join(
            f"{v:<{-w}}" if w < 0 else f"{v:>{w}}" for v, (_, w) in zip(values, columns, strict=True)
        )

    print(line([name for name, _ in columns]))
    for e in entries:
        when = datetime.datetime.fromtimestamp(e.committed_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        # The writer's tag (as its data files' names carry it; status and offsets take it), or
        # a maintenance op's token.
        who = writer_tag(e.writer) if e.writer else e.op or "-"
        counts = (e.add_files, e.add_rows, e.add_bytes, e.remove_files, e.remove_rows, e.remove_bytes)
        batch = "-" if e.batch is None else e.batch
        print(line([e.version, when, e.operation, who, batch, *(f"{n:,}" for n in counts)]))
    if not entries:
        print("(nothing committed yet)")
    return 0


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def _storage_option_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a storage option, repeatable; dotted keys nest: client_kwargs.region_name=eu-west-1. "
        "Pass credentials through the AWS environment instead: command lines are visible to other users",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakesink", description="Maintenance of lakesink tables.")
    parser.add_argument("--version", action="version", version=f"lakesink {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    orphans = commands.add_parser(
        "orphans",
        help="list (or --delete) what crashed or losing writers left: staged files, open uploads, "
        "unrecorded files",
        description=(
            "List the orphans of a table: staged files and open multipart uploads of dead tasks, and "
            "(epoch mode) published files that their epoch's record does not list, and the Iceberg "
            "view's files of snapshots it no longer holds. With --delete, "
            "remove them. What the epoch log proves garbage goes whatever its age; staged data of an "
            "epoch not yet committed only when older than --older-than (pick an age longer than any "
            "task keeps a file staged); a published file whose epoch has no record yet is never removed."
        ),
    )
    orphans.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    orphans.add_argument(
        "--older-than",
        metavar="AGE",
        help="the age from which staged data of an epoch not committed yet counts as a dead task's, "
        "e.g. 3600, 90m, 1h, 2d (default for a dry run: 1h, the writers' own staged_cleanup_age; "
        "--delete needs it given, chosen longer than any task keeps a file staged)",
    )
    orphans.add_argument("--delete", action="store_true", help="remove what is found (default: dry run)")
    _storage_option_argument(orphans)
    orphans.add_argument("--json", action="store_true", help="print the report as JSON")
    orphans.set_defaults(run=_orphans)

    check = commands.add_parser(
        "verify",
        help="check that every committed file is there and readable (read-only); exit 1 if not",
        description=(
            "Check every committed file of a table: present, of the recorded size and row count, a "
            "Parquet file of the table's schema. Read-only. Exit status 1 names each problem."
        ),
    )
    check.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    check.add_argument("--deep", action="store_true", help="read every row, not only each file's footer")
    check.add_argument(
        "--all-versions",
        action="store_true",
        help="format 3: the files of every retained version (what time travel reads), not only the latest's",
    )
    _storage_option_argument(check)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(run=_verify)

    offsets = commands.add_parser(
        "offsets",
        help="print where a writer's last committed batch ended, as its source takes offsets back",
        description=(
            "Print the source offsets at the end of a writer's last committed batch (format-3 lakes): "
            "with one source, that source's offset JSON -- for Kafka, the startingOffsets a new query "
            "continues from. To restart a query whose checkpoint is lost, start it with these "
            "offsets and continue_writer=<the writer> (docs/guide/kafka.md, 'Restart from the lake')."
        ),
    )
    offsets.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    offsets.add_argument("--writer", help="the writer's id or 16-hex tag (default: the lake's one writer)")
    offsets.add_argument("--all-sources", action="store_true", help="print the list, one entry per source")
    _storage_option_argument(offsets)
    offsets.set_defaults(run=_offsets)

    views = commands.add_parser(
        "sync-views",
        help="format 3: write what the lake's derived views miss (_delta_log/, _spark_metadata/, metadata/)",
        description=(
            "Bring the derived views of a format-3 epoch lake to its latest version: the Delta view "
            "(_delta_log/: every missing commit from the oldest retained version, and the due "
            "checkpoint) and the Spark view (_spark_metadata/: the latest version, as a compact batch "
            "when the view is absent or behind) and, on lakes that keep one (table.json's iceberg_view), "
            "the Iceberg view (metadata/: a snapshot of the latest version). For lakes written before "
            "the views, or without them, "
            "or whose views were deleted. The views are derived from the lake's own log, never the "
            "truth. Exit 1 when a view holds content lakesink did not write, or cannot be built."
        ),
    )
    views.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    views.add_argument(
        "--only", choices=("all", "delta", "spark", "iceberg"), default="all", help="the views to sync"
    )
    views.add_argument("--check", action="store_true", help="check the views; write nothing")
    _storage_option_argument(views)
    views.add_argument("--json", action="store_true", help="print the reports as JSON")
    views.set_defaults(run=_sync_views)

    state = commands.add_parser(
        "status",
        help="what a lake holds and who writes it: versions, writers, offsets, files, leftovers",
        description=(
            "Print a lake's format, latest version (or epoch), its writers with their last batch, "
            "offsets and lineage (format 3), live files, rows and bytes, small files, staged "
            "leftovers and running compactions. Read-only; never reads a format-3 lake's file list "
            "unless --leftovers asks it to count the published leftovers."
        ),
    )
    state.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    state.add_argument(
        "--leftovers",
        action="store_true",
        help="also count published leftovers (files of killed or losing attempts that no version "
        "lists), as `lakesink orphans` finds them: lists every data file and reads the live file list",
    )
    _storage_option_argument(state)
    state.add_argument("--json", action="store_true", help="print the status as JSON")
    state.set_defaults(run=_status)

    past = commands.add_parser(
        "history",
        help="format 3: what happened to a lake, one line per version, newest first",
        description=(
            "Print a format-3 lake's retained versions, newest first: when each was committed, the "
            "operation (append, continuation, schema change, compaction, auto-compaction, abandon, "
            "vacuum, upgrade), "
            "the writer (its tag) or the maintenance op's token, the batch, and the files, rows and "
            "bytes it added and removed. Read-only; reads the commits' first lines only."
        ),
    )
    past.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    past.add_argument("--limit", type=_count, default=None, metavar="N", help="the newest N versions only")
    _storage_option_argument(past)
    past.add_argument("--json", action="store_true", help="print the versions as JSON")
    past.set_defaults(run=_history)

    config = commands.add_parser(
        "config",
        help="format 3: show or set the lake's defaults for its writers (auto_compact, iceberg_view)",
        description=(
            "Show the defaults a format-3 lake keeps for its writers in its table.json, or set them: "
            "auto_compact=true makes every query that does not set the auto_compact option compact the "
            "lake's small files after its commits (a query reads it when it starts); iceberg_view=true "
            "makes them keep the lake's Iceberg view (metadata/), which `lakesink sync-views` then "
            "writes; NAME=unset "
            "removes one. The change is a compare-and-swap of table.json: if it changed meanwhile, "
            "nothing is written and the command fails (exit 2), to be run again."
        ),
    )
    config.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    config.add_argument(
        "settings",
        nargs="*",
        type=_setting,
        metavar="NAME=VALUE",
        help="auto_compact=true|false|unset, iceberg_view=true|false|unset",
    )
    _storage_option_argument(config)
    config.add_argument("--json", action="store_true", help="print the defaults as JSON")
    config.set_defaults(run=_config)

    comp = commands.add_parser(
        "compact",
        help="format 3: rewrite small committed files into larger ones, as one commit",
        description=(
            "Rewrite the small live files of a format-3 lake (under half the target size, oldest first) "
            "into files of about the target size, as one commit: every version shows the same rows, "
            "reads of older versions keep using the old files (until vacuum). Safe beside live writers: "
            "appends never conflict with it; a concurrent compaction of the same files makes one of "
            "the two fail with nothing committed. First abandons the ops of dead runs (the log does not "
            "know them, their lease is older than --abandon-older-than) and removes their files."
        ),
    )
    comp.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    comp.add_argument(
        "--target-file-size", default="128MB", metavar="SIZE", help="output size (default 128MB)"
    )
    comp.add_argument(
        "--min-files", type=int, default=5, metavar="N", help="rewrite bins of N files or more (5)"
    )
    comp.add_argument("--max-input", default="16GB", metavar="SIZE", help="bytes read at most per run (16GB)")
    comp.add_argument("--dry-run", action="store_true", help="only show the bins; write nothing")
    comp.add_argument(
        "--abandon-older-than",
        default="1h",
        metavar="AGE",
        help="abandon ops of runs idle this long (lease not refreshed), and remove their files (default 1h)",
    )
    _storage_option_argument(comp)
    comp.add_argument("--json", action="store_true", help="print the report as JSON")
    comp.set_defaults(run=_compact)

    vac = commands.add_parser(
        "vacuum",
        help="format 3: retain versions of the last --retain, remove what older ones alone need",
        description=(
            "Retain the versions committed within --retain (and the newest one before): with --delete, "
            "commit that retention floor R (readers then refuse older versions), remove the data files "
            "no version from R on lists (those compactions replaced before R, and orphans whose writer "
            "or op is settled: never a file a live writer may still commit), then the log entries "
            "below the checkpoint at or below R. Dry run by default. --retain below 24h needs --force. "
            "Killed anywhere, a rerun converges."
        ),
    )
    vac.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    vac.add_argument("--retain", default="7d", metavar="AGE", help="keep versions this young readable (7d)")
    vac.add_argument("--delete", action="store_true", help="commit the floor and remove (default: dry run)")
    vac.add_argument("--force", action="store_true", help="allow --retain below the 24h safety floor")
    vac.add_argument(
        "--list", action="store_true", help="name each file and log entry and why (default: a summary)"
    )
    _storage_option_argument(vac)
    vac.add_argument("--json", action="store_true", help="print the report as JSON")
    vac.set_defaults(run=_vacuum)

    up = commands.add_parser(
        "upgrade",
        help="convert a format-1/2 lake to format 3 in place (safe to rerun, or to kill)",
        description=(
            "Convert a lake of format 1 or 2 to format 3 in place. Epoch mode: fence the epoch log "
            "(a running format-2 writer then fails at its next epoch; restarted, it writes format 3 "
            "from its checkpoint), import every epoch as a version of the format-3 log, commit the "
            "upgrade, and replace table.json -- the commit point. Killed anywhere, a rerun completes "
            "it; until the commit point the lake stays a readable format-2 lake. Foreach lakes: "
            "table.json only. A lake already of format 3 is left alone (exit 0). Exit 1 when a "
            "format-2 record follows the fence: its rows are not in the format-3 lake."
        ),
    )
    up.add_argument("path", help="table root: local path, file://, s3://bucket/prefix or hdfs://")
    up.add_argument("--check", action="store_true", help="only say what would be done; write nothing")
    _storage_option_argument(up)
    up.add_argument("--json", action="store_true", help="print the report as JSON")
    up.set_defaults(run=_upgrade)
    return parser


#: The most of an error message the CLI prints: a message may quote a name read from a lake,
#: which its writer may have made a megabyte long.
MESSAGE_CHARS = 4000


def _shortened(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    half = MESSAGE_CHARS // 2
    return f"{message[:half]} ... ({len(message) - 2 * half} characters left out) ... {message[-half:]}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lakesink`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = int(args.run(args))
        sys.stdout.flush()  # here, where a reader gone away is handled (not at the interpreter's exit)
        return status
    except BrokenPipeError:
        # Whoever read our output went away (`lakesink status PATH | head -3`): not an error to
        # report. Point stdout at /dev/null so that the interpreter's last flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError, LakeSinkError) as exc:
        # Redacted again here (the backends' messages are already): whatever a message quotes, a
        # lake URL's user info or signature never reaches a terminal or a log collector.
        print(f"lakesink {args.command}: error: {_shortened(redacted(str(exc)))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
