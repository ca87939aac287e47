"""The ``lakesink`` console command (maintenance of a lake; the writers run inside Spark).

lakesink orphans PATH --older-than 1h [--delete] [--storage-option k=v ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from lakesink.errors import LakeSinkError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
#: Options whose values stay strings even when they look like numbers (a numeric secret...).
_STRING_OPTIONS = frozenset({"key", "secret", "token", "endpoint_url", "profile"})


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"30m"``, ``"1h"``, ``"2d"`` -> seconds; ValueError naming the text."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"bad duration {text!r}: use a number with an optional unit s, m, h or d (e.g. 1h)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``["endpoint_url=http://...", "client_kwargs.region_name=eu-west-1", "part_size=8388608"]``
    -> a nested dict. A dotted key nests; JSON-looking values (numbers, true/false, {...}) are
    decoded, except for credentials and URLs, which stay strings."""
    options: dict[str, Any] = {}
    for number, pair in enumerate(pairs, 1):
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            # Never echo the argument: it may be a mistyped "secret=...".
            raise ValueError(
                f"--storage-option number {number} is not KEY=VALUE (not shown: it may hold a secret)"
            )
        path = key.strip().split(".")
        value: Any = raw
        if path[-1] not in _STRING_OPTIONS:
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
        target = options
        for part in path[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ValueError(f"--storage-option {key!r}: {part!r} is both a value and a group")
        target[path[-1]] = value
    return options


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _orphans(args: argparse.Namespace) -> int:
    from lakesink.orphans import sweep_orphans

    report = sweep_orphans(
        args.path,
        older_than=parse_duration(args.older_than),
        delete=args.delete,
        storage_options=parse_storage_options(args.storage_option),
    )
    if args.json:
        doc = {
            "path": report.path,
            "older_than": report.older_than,
            "delete": report.delete,
            "findings": [vars(f) for f in report.findings],
            "removed": [f.name for f in report.removed],
            "failed": [{"name": f.name, "error": e} for f, e in report.failed],
        }
        print(json.dumps(doc, indent=2))
    else:
        verb = "removed" if args.delete else "found (dry run; --delete removes them)"
        print(f"{len(report.findings)} orphan(s) older than {args.older_than} in {report.path}, {verb}")
        for f in report.findings:
            status = ""
            if args.delete:
                status = "  FAILED" if any(f is g for g, _ in report.failed) else "  removed"
            upload = f"  upload {f.upload_id}" if f.upload_id else ""
            print(f"  {f.kind:<17} {_age(f.age):>7} {f.size:>12} B  {f.name}{upload}{status}")
        for f, error in report.failed:
            print(f"error: could not remove {f.name}: {error}", file=sys.stderr)
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakesink", description="Maintenance of lakesink tables.")
    commands = parser.add_subparsers(dest="command", required=True)
    orphans = commands.add_parser(
        "orphans",
        help="list (or --delete) multipart uploads and staged files left by crashed writers",
        description=(
            "List the multipart uploads and '.uncommitted' staged files older than --older-than "
            "under a table; with --delete, abort/delete them. Pick an age longer than any live "
            "task keeps a file staged. Credentials are best passed through the AWS environment "
            "(AWS_ACCESS_KEY_ID, AWS_PROFILE, ...): command lines are visible to other users."
        ),
    )
    orphans.add_argument("path", help="table root: local path, file:// or s3://bucket/prefix")
    orphans.add_argument("--older-than", required=True, help="minimum age, e.g. 3600, 90m, 1h, 2d")
    orphans.add_argument("--delete", action="store_true", help="remove what is found (default: dry run)")
    orphans.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a storage option, repeatable; dotted keys nest: client_kwargs.region_name=eu-west-1",
    )
    orphans.add_argument("--json", action="store_true", help="print the report as JSON")
    orphans.set_defaults(run=_orphans)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lakesink`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, OSError, LakeSinkError) as exc:
        print(f"lakesink {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
