"""Storage options: checked once, where they enter, with errors that name the option, never its value.

Writers take them as a dict (``storage_options=``), ``format("lakesink")`` as one JSON option,
the ``lakesink`` command and the jobs as repeated ``KEY=VALUE`` pairs: all end up here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lakesink_reader import jsondoc
from lakesink_reader.redact import redacted

#: Every option, with the type it must have. Values are never printed: they may be secrets.
S3_OPTIONS: dict[str, type | tuple[type, ...]] = {
    "endpoint_url": str,
    "key": str,
    "secret": str,
    "token": str,
    "profile": str,
    "client_kwargs": Mapping,
    "config_kwargs": Mapping,
    "part_size": int,
    "parts_in_flight": int,
}
#: Options whose values stay strings on a command line even when they look like numbers.
_STRING_OPTIONS = frozenset(name for name, kind in S3_OPTIONS.items() if kind is str)

MIN_PART_SIZE = 5 << 20  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 << 30
DEFAULT_PART_SIZE = 8 << 20
DEFAULT_PARTS_IN_FLIGHT = 2
_DEFAULT_CONFIG: dict[str, Any] = {
    "connect_timeout": 10,
    "read_timeout": 60,
    "retries": {"mode": "standard", "max_attempts": 5},
}


class Redacted:
    """Holds credentials; its repr hides them (so does ``repr(vars(storage))``)."""

    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<redacted>"

    def __getstate__(self) -> dict[str, Any]:
        return self.value

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.value = state


@dataclass(frozen=True)
class S3Settings:
    """What ``S3Storage`` makes of its storage options."""

    part_size: int
    parts_in_flight: int
    attempts: int
    session_kwargs: Redacted
    client_kwargs: dict[str, Any]
    config_kwargs: dict[str, Any]


def check_storage_options(options: object, url: str) -> dict[str, Any]:
    """``options`` as a plain dict, or TypeError/ValueError naming what is wrong (never a value)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"storage_options for {redacted(url)} must be a dict of option names to values, "
            f"got {type(options).__name__} (value not shown: it may hold a secret)"
        )
    return dict(options)


def check_endpoint(endpoint: object, what: str) -> None:
    """An S3 endpoint URL: http(s), and without a user name or password in it -- botocore would
    take them, and every connection error, log line and pyarrow filesystem would then carry
    them. ValueError naming ``what`` (never the value) otherwise."""
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"{what} must be a URL starting with http:// or https:// (value not shown)")
    if "@" in urlsplit(endpoint).netloc:
        raise ValueError(
            f"{what} holds a user name or password (user:pass@host), which would show in every error "
            "message: give the access key id as the 'key' option and the secret as 'secret' (or use a "
            "profile or the environment), and the endpoint as scheme://host:port (value not shown)"
        )


def shown_url(url: str) -> str:
    """``url`` as messages and logs show it: without a user name or password (an endpoint:
    its host only; a lake URL is shown by :func:`lakesink_reader.redact.redacted`)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def check_local_options(options: object, url: str) -> None:
    """A local path takes no storage options: name any that were given."""
    given = check_storage_options(options, url)
    if given:
        raise ValueError(
            f"storage_options {sorted(given)} do not apply to the local path {redacted(url)}; "
            "they are for s3:// lakes"
        )


def s3_client_settings(options: object, url: str) -> S3Settings:
    """Check S3 storage options and turn them into boto3 session, client and config arguments."""
    given = check_storage_options(options, url)
    unknown = sorted(set(given) - set(S3_OPTIONS))
    if unknown:
        raise ValueError(
            f"unknown S3 storage_options {unknown} for {redacted(url)}; known: {sorted(S3_OPTIONS)}"
        )
    for name, value in given.items():
        kind = S3_OPTIONS[name]
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            want = "a dict" if kind is Mapping else {"int": "an int", "str": "a string"}[kind.__name__]  # type: ignore[union-attr]
            raise TypeError(
                f"storage_options {name!r} for {redacted(url)} must be {want}, got {type(value).__name__} "
                "(value not shown)"
            )
    endpoint = given.get("endpoint_url")
    if endpoint is not None:
        check_endpoint(endpoint, f"storage_options 'endpoint_url' for {redacted(url)}")
    part_size = given.get("part_size") or DEFAULT_PART_SIZE
    if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
        raise ValueError(
            f"storage_options part_size must be an int from {MIN_PART_SIZE} (5 MiB) to "
            f"{MAX_PART_SIZE} (5 GiB) bytes, got {part_size!r}"
        )
    in_flight = given.get("parts_in_flight") or DEFAULT_PARTS_IN_FLIGHT
    if not 1 <= in_flight <= 64:
        raise ValueError(f"storage_options parts_in_flight must be from 1 to 64, got {in_flight!r}")
    client_kwargs = dict(given.get("client_kwargs") or {})
    if client_kwargs.get("endpoint_url") is not None:
        where = f"storage_options client_kwargs['endpoint_url'] for {redacted(url)}"
        check_endpoint(client_kwargs["endpoint_url"], where)
    config_kwargs = dict(given.get("config_kwargs") or {})
    retries = config_kwargs.pop("retries", None) or {}
    if not isinstance(retries, Mapping):
        raise TypeError(
            f"storage_options config_kwargs['retries'] for {redacted(url)} must be a dict such as "
            f"{{'max_attempts': 5}}, got {type(retries).__name__}"
        )
    retries = {**_DEFAULT_CONFIG["retries"], **retries}
    session_kwargs = {
        arg: given[name]
        for name, arg in (
            ("key", "aws_access_key_id"),
            ("secret", "aws_secret_access_key"),
            ("token", "aws_session_token"),
            ("profile", "profile_name"),
        )
        if given.get(name) is not None
    }
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    # botocore's max_attempts counts the retries; total_max_attempts (which wins) the first
    # attempt too. The count is named in errors: "after 6 attempt(s)" with the defaults.
    attempts = retries.get("total_max_attempts")
    if attempts is None:
        retried = retries.get("max_attempts")
        attempts = retried + 1 if isinstance(retried, int) and not isinstance(retried, bool) else retried
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(
            f"storage_options config_kwargs['retries'] for {redacted(url)}: max_attempts must be an int >= 0 "
            "(retries), total_max_attempts an int >= 1 (attempts)"
        )
    # Publishing many files at once (epoch commits, sweeps) runs requests in parallel.
    config = {"max_pool_connections": 32, **_DEFAULT_CONFIG, **config_kwargs, "retries": retries}
    return S3Settings(part_size, in_flight, attempts, Redacted(session_kwargs), client_kwargs, config)


def parse_option_pairs(pairs: Sequence[str], *, flag: str = "--storage-option") -> dict[str, Any]:
    """``["endpoint_url=http://...", "client_kwargs.region_name=eu-west-1", "part_size=8388608"]``
    -> a nested dict. A dotted key nests; JSON-looking values (numbers, true/false, {...}) are
    decoded, except for credentials and URLs, which stay strings."""
    options: dict[str, Any] = {}
    for number, pair in enumerate(pairs, 1):
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            # Never echo the argument: it may be a mistyped "secret=...".
            raise ValueError(f"{flag} number {number} is not KEY=VALUE (not shown: it may hold a secret)")
        path = key.strip().split(".")
        value: Any = raw
        if path[-1] not in _STRING_OPTIONS:
            try:
                value = jsondoc.loads(raw)
            except ValueError:
                value = raw
        target = options
        for part in path[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ValueError(f"{flag} {key!r}: {part!r} is both a value and a group")
        target[path[-1]] = value
    return options
