"""What a lakesink writer can be told, in one place: the keywords of ``write_stream``, the options
of ``format("lakesink")`` and their checks all derive from the fields here.

Spark hands a data source its options as case-insensitive strings; ``SinkConfig.from_options``
parses them, refuses unknown ones by name, and never echoes a value that may be a secret.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from lakesink.commit.files import DEFAULT_STAGED_AGE, WriteOptions
from lakesink.commit.observer import Observer
from lakesink_reader import jsondoc
from lakesink_reader.format.log import DEFAULT_CHECKPOINT_INTERVAL
from lakesink_reader.redact import redacted
from lakesink_reader.storage import Storage, open_storage
from lakesink_reader.storage.options import check_storage_options

#: The lake formats a writer can create: the current one (format 1/2 lakes are read, and
#: converted by ``lakesink upgrade``).
WRITABLE_FORMATS = (3,)

#: ``driver_write``'s choices, and ``auto``'s default bound: a batch of 20,000 rows of a few
#: columns is a few MiB of Arrow on the driver (issue 52 measured 5,000-row batches).
DRIVER_WRITES = ("auto", "always", "never")
DEFAULT_DRIVER_WRITE_ROWS = 20_000

#: The option that carries storage options: a JSON object (it may hold credentials).
STORAGE_OPTIONS_KEY = "storage_options"
#: The option that carries an observer: a pickled object, base64 (see ``lakesink.commit.observer``).
OBSERVER_KEY = "observer"
#: Options Spark itself passes to a streaming sink: ``.start(path)``, ``checkpointLocation``, and
#: ``.queryName(...)`` (Spark keeps the name among the writer's options and hands it on).
SPARK_KEYS = ("path", "checkpointlocation", "queryname")


@dataclass(frozen=True)
class SinkOptions:
    """The writer settings beyond Parquet layout (epoch mode).

    Parameters
    ----------
    checkpoint_interval
        Epochs between two checkpoint segments of the epoch log.
    staged_cleanup_age
        Seconds after which staged data of an epoch not yet committed counts as a dead task's,
        for the sweep a writer runs after the first commit of each run.
    format_version
        None (the default): a new lake is format 3 (docs/FORMAT.md), an existing format-3 lake is
        written, and a format-1/2 lake is refused with the command that converts it (``lakesink
        upgrade PATH``). 3: the same. Format 2 is no longer written: its writer was removed
        before any release.
    allow_other_queries
        Let this query write to a lake that other streaming queries (other checkpoints) write
        too: each of them exactly once. Only for queries that write *different* rows: a new
        checkpoint over the same input writes every row again. Format-3 lakes only.
    continue_writer
        This query (a new checkpoint) takes over from the lake's writer with this id or tag,
        whose checkpoint was lost: started at the offsets that writer ended at (``lakesink
        offsets``), it is recorded as its continuation, and refused before it writes when its
        start offsets overlap or leave a gap. Format-3 lakes only.
    continue_offsets
        The start offsets of a continuing query whose sources do not record them in the
        checkpoint (Kafka's do): JSON, one entry per source, or one object for one source --
        what ``lakesink offsets`` printed. A list or dict is accepted and turned into JSON.
    delta_log
        Format-3 lakes: keep the Delta Lake view ``_delta_log/`` after each commit (one PUT;
        never fails a commit), so deltalake, polars and DuckDB read exactly the committed rows.
        ``.option("delta_log", "false")`` turns it off.
    spark_metadata
        Format-3 lakes: keep the Spark view ``_spark_metadata/`` after each commit (one PUT; a
        compact batch of every live file each 10 versions and after each compaction; never fails
        a commit), so ``spark.read.parquet(lake)`` reads exactly the committed files.
        ``.option("spark_metadata", "false")`` turns it off.
    iceberg_view
        Format-3 epoch lakes: keep the Apache Iceberg view ``metadata/`` (format version 2)
        after each commit, so that Iceberg readers (pyiceberg's ``StaticTable``, polars
        ``scan_iceberg``) given the lake's path read exactly the committed rows; never fails a
        commit. ``.option("iceberg_view", "true")``. True is remembered in the lake's table.json
        (as ``lakesink config PATH iceberg_view=true`` does): later queries that do not set the
        option keep the view too, and ``lakesink sync-views`` writes it. None (the default): the
        lake's own setting; False: not kept by this query.
    partition_by
        The columns whose values name the folders a new lake's files go in, Hive-style
        (``day=2026-11-22/country=FR/``): readers that filter on them skip the other folders.
        Strings, integers, booleans and dates; at least one column stays in the files. A lake
        keeps the partitioning it was created with: None (the default) writes an existing lake
        as it is (a new one unpartitioned), and other columns than the lake's are refused.
        ``.partitionBy("day", "country")`` on ``format("lakesink")`` sets it (with
        ``lakesink.register``), as does ``.option("partition_by", "day,country")`` (or a JSON
        list). Format-3 lakes.
    merge_schema
        Format-3 epoch lakes: a stream with new columns or wider types (int -> long, float ->
        double) than the lake changes the lake's schema (recorded in its log with the batch)
        instead of being refused. Readers then read older files with nulls in the new columns.
        Other changes (a type narrowed or changed, a column renamed) are still refused, naming
        the columns, before the query writes anything. A stream with fewer or narrower columns
        than the lake (an older writer beside a newer one) needs no option.
    auto_compact
        Format-3 epoch lakes: after a commit that leaves 32 small live files or more (under
        64 MiB), the driver compacts them as ``lakesink compact`` does, reading at most 256 MiB
        (the bound on the delay to the next micro-batch). It never fails the query
        (``lakesink.maintenance.auto_compact`` says what it does, and why it is safe).
        ``.option("auto_compact", "true")``. None (the default): the lake's own default, which
        ``lakesink config PATH auto_compact=true`` sets in its table.json; off when it has none.
    driver_write
        Where the foreachBatch door (``write_stream`` on a classic session) writes a micro-batch's
        files: ``"auto"`` (the default) writes a small batch on the driver -- collected as Arrow
        and written and committed there, with no Python worker -- and a large one in Spark's
        tasks; ``"always"`` collects every batch to the driver (mind its memory); ``"never"``
        always uses tasks. The same protocol either way: the driver is one more place for a
        batch's task to run. The data source door (``format("lakesink")``) always writes in
        tasks, and refuses ``"always"``.
    driver_write_max_rows
        ``driver_write="auto"``'s bound: a batch is written on the driver when the previous one
        had at most this many rows and this one does too (it is collected with a limit of one
        more row, so a larger batch costs a bounded read before its tasks run).
    """

    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    staged_cleanup_age: float = DEFAULT_STAGED_AGE
    format_version: int | None = None
    allow_other_queries: bool = False
    continue_writer: str | None = None
    continue_offsets: str | None = None
    delta_log: bool = True
    spark_metadata: bool = True
    iceberg_view: bool | None = None
    partition_by: tuple[str, ...] | None = None
    merge_schema: bool = False
    auto_compact: bool | None = None
    driver_write: str = "auto"
    driver_write_max_rows: int = DEFAULT_DRIVER_WRITE_ROWS

    def __post_init__(self) -> None:
        if self.driver_write not in DRIVER_WRITES:
            choices = ", ".join(map(repr, DRIVER_WRITES))
            raise ValueError(f"driver_write must be one of {choices}, got {self.driver_write!r}")
        rows = self.driver_write_max_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"driver_write_max_rows must be a whole number >= 0, got {rows!r}")
        if not isinstance(self.merge_schema, bool):
            raise TypeError(f"merge_schema must be True or False, got {self.merge_schema!r}")
        if self.auto_compact is not None and not isinstance(self.auto_compact, bool):
            raise TypeError(f"auto_compact must be True, False or None, got {self.auto_compact!r}")
        if self.partition_by is not None:
            if isinstance(self.partition_by, str) or not all(isinstance(c, str) for c in self.partition_by):
                raise TypeError(f"partition_by must be a list of column names, got {self.partition_by!r}")
            object.__setattr__(self, "partition_by", tuple(self.partition_by))
        if isinstance(self.checkpoint_interval, bool) or not isinstance(self.checkpoint_interval, int):
            raise TypeError(f"checkpoint_interval must be an int, got {self.checkpoint_interval!r}")
        if self.checkpoint_interval < 1:
            raise ValueError(f"checkpoint_interval must be >= 1, got {self.checkpoint_interval}")
        age = self.staged_cleanup_age
        if isinstance(age, bool) or not isinstance(age, int | float) or not age >= 0:
            raise ValueError(f"staged_cleanup_age must be a number of seconds >= 0, got {age!r}")
        if self.continue_offsets is not None and not isinstance(self.continue_offsets, str):
            object.__setattr__(self, "continue_offsets", json.dumps(self.continue_offsets))
        if self.continue_writer is not None and (
            not isinstance(self.continue_writer, str) or not self.continue_writer
        ):
            raise ValueError(f"continue_writer must be a writer's id or tag, got {self.continue_writer!r}")
        if not isinstance(self.delta_log, bool):
            raise TypeError(f"delta_log must be True or False, got {self.delta_log!r}")
        if self.iceberg_view is not None and not isinstance(self.iceberg_view, bool):
            raise TypeError(f"iceberg_view must be True, False or None, got {self.iceberg_view!r}")
        if not isinstance(self.spark_metadata, bool):
            raise TypeError(f"spark_metadata must be True or False, got {self.spark_metadata!r}")
        if not isinstance(self.allow_other_queries, bool):
            raise TypeError(f"allow_other_queries must be True or False, got {self.allow_other_queries!r}")
        if self.format_version is not None and (
            isinstance(self.format_version, bool) or self.format_version not in WRITABLE_FORMATS
        ):
            raise ValueError(
                f"format_version must be 3 (or None, the same), got {self.format_version!r}: lakesink "
                "writes lake format 3 only. Drop the option; `lakesink upgrade PATH` converts a "
                "format-1/2 lake in place."
            )


def _option_types() -> dict[str, Any]:
    hints = {**get_type_hints(WriteOptions), **get_type_hints(SinkOptions)}
    return {f.name: hints[f.name] for cls in (WriteOptions, SinkOptions) for f in fields(cls)}


#: Every tunable option with its type, derived from the dataclasses above.
OPTION_TYPES: dict[str, Any] = _option_types()
#: Every option ``format("lakesink")`` understands (lower case, as Spark passes them).
KNOWN_OPTIONS = tuple(sorted({*SPARK_KEYS, STORAGE_OPTIONS_KEY, OBSERVER_KEY, *OPTION_TYPES}))


@dataclass(frozen=True)
class SinkConfig:
    """The parsed options of one epoch-mode writer; picklable, and its repr shows no storage option."""

    path: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    write: WriteOptions = field(default_factory=WriteOptions)
    sink: SinkOptions = field(default_factory=SinkOptions)
    checkpoint_location: str | None = None
    observer: Observer | None = None

    def __repr__(self) -> str:
        return f"SinkConfig(path={self.path!r}, checkpoint_location={self.checkpoint_location!r})"

    def storage(self) -> Storage:
        return open_storage(self.path, self.storage_options)

    @classmethod
    def from_keywords(
        cls,
        path: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        checkpoint_location: str | None = None,
        observer: Observer | None = None,
        **options: Any,
    ) -> SinkConfig:
        """From ``write_stream``'s keywords; TypeError naming unknown ones."""
        unknown = sorted(set(options) - set(OPTION_TYPES))
        if unknown:
            raise TypeError(f"unknown lakesink option(s) {unknown}; known: {sorted(OPTION_TYPES)}")
        storage_options = check_storage_options(storage_options, path)  # a dict, or an error naming it
        write = {k: v for k, v in options.items() if k in WriteOptions.__dataclass_fields__}
        sink = {k: v for k, v in options.items() if k in SinkOptions.__dataclass_fields__}
        config = cls(
            path,
            storage_options,
            WriteOptions(**write),
            SinkOptions(**sink),
            checkpoint_location,
            observer,
        )
        config.storage()  # bad path or storage options fail here, naming them
        return config

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkConfig:
        """From Spark's (string, case-insensitive) options; errors name the option, never a secret."""
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - set(KNOWN_OPTIONS))
        if unknown:
            # The options a user sets: not Spark's own (path, checkpointLocation, queryName), nor
            # the ones write_stream sets for its keywords (observer).
            settable = sorted({STORAGE_OPTIONS_KEY, *OPTION_TYPES})
            raise ValueError(f'unknown option(s) {unknown} for format("lakesink"); its options: {settable}')
        path = opts.get("path")
        if not path:
            raise ValueError('format("lakesink") needs the table path: .option("path", ...) or .start(path)')
        storage_options: Any = {}
        raw = opts.get(STORAGE_OPTIONS_KEY)
        if raw:
            storage_options = _parse_storage_options(raw)
        parsed = {k: _parse(k, opts[k], OPTION_TYPES[k]) for k in OPTION_TYPES if k in opts}
        return cls.from_keywords(
            path,
            storage_options=storage_options,
            checkpoint_location=opts.get("checkpointlocation") or None,
            observer=_decode_observer(opts[OBSERVER_KEY]) if opts.get(OBSERVER_KEY) else None,
            **parsed,
        )

    def to_options(self) -> dict[str, str]:
        """The Spark options that :meth:`from_options` turns back into this config."""
        options = {"path": self.path}
        if self.storage_options:
            options[STORAGE_OPTIONS_KEY] = json.dumps(dict(self.storage_options))
        for part in (self.write, self.sink):
            for f in fields(part):  # type: ignore[arg-type]
                value = getattr(part, f.name)
                if value != f.default:
                    options[f.name] = (
                        ""
                        if value is None
                        else str(value).lower()
                        if isinstance(value, bool)
                        else json.dumps(list(value))
                        if isinstance(value, tuple)
                        else str(value)
                    )
        if self.observer is not None:
            options[OBSERVER_KEY] = base64.b64encode(pickle.dumps(self.observer)).decode("ascii")
        if self.checkpoint_location:
            options["checkpointLocation"] = self.checkpoint_location
        return options

    def driver_write_refusal(self) -> str:
        """Why ``driver_write="always"`` cannot be on the data source door."""
        return (
            "driver_write='always' needs the foreachBatch door (lakesink.write_stream on a classic session, "
            f"via='foreach_batch' or the default): format('lakesink') writes {redacted(self.path)!r} in "
            "Spark's tasks only. Drop the option, or write through write_stream"
        )

    def replace(self, **changes: Any) -> SinkConfig:
        return dataclasses.replace(self, **changes)


def _parse(key: str, value: str, kind: Any) -> Any:
    text = value.strip()
    if kind == bool | None:  # auto_compact: empty or "none" is the lake's default
        if text.lower() in ("", "none"):
            return None
        kind = bool
    if kind is bool:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"option {key!r} must be true or false, got {value!r}")
    if kind == int | None and text.lower() in ("", "none"):
        return None  # compression_level, max_records_per_file: the default, or no limit
    if key == "partition_by":
        return parse_columns(key, text)
    base = int if kind in (int, "int", int | None) else float if kind in (float, "float") else str
    try:
        return base(text)
    except ValueError:
        raise ValueError(f"option {key!r} must be {base.__name__}, got {value!r}") from None


def parse_columns(key: str, text: str) -> tuple[str, ...]:
    """A list of column names: a JSON list, or names separated by commas."""
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(c, str) for c in parsed):
            raise ValueError(
                f"option {key!r} must be a JSON list of column names, or names separated by commas, "
                f"got {text!r}"
            )
        return tuple(parsed)
    names = tuple(c.strip() for c in text.split(","))
    if not all(names):
        raise ValueError(f"option {key!r} has an empty column name: {text!r}")
    return names


def _parse_storage_options(text: str) -> dict[str, Any]:
    """The ``storage_options`` option: a JSON object, or the ``str()`` of a Python dict.

    pyspark turns a non-string option value into ``str(value)`` before Spark sees it, so
    ``.option("storage_options", {...})`` arrives as a dict's repr; a literal is parsed back
    (``ast.literal_eval`` evaluates no code), anything else is refused.
    """
    parsed: Any = None
    if len(text) <= jsondoc.MAX_BYTES:
        try:
            parsed = jsondoc.loads(text)
        except ValueError:
            try:
                parsed = ast.literal_eval(text)
            # Any malformed literal: "{[1]: 'x'}" is a TypeError, deep nesting a RecursionError
            # or MemoryError. All get the one message below, which never shows the value.
            except Exception:  # noqa: BLE001
                parsed = None
            if parsed is not None and jsondoc.depth(parsed, jsondoc.MAX_DEPTH) > jsondoc.MAX_DEPTH:
                parsed = None
    if not isinstance(parsed, dict):
        # The value is not shown: it may hold credentials.
        raise ValueError(
            f"option {STORAGE_OPTIONS_KEY!r} must be a JSON object such as json.dumps(opts), or a dict "
            "(value not shown)"
        )
    return parsed


def _decode_observer(text: str) -> Observer:
    try:
        observer = pickle.loads(base64.b64decode(text))
    except Exception as exc:
        raise ValueError(f"option {OBSERVER_KEY!r} is not a pickled observer: {exc}") from exc
    if not callable(observer):
        raise ValueError(f"option {OBSERVER_KEY!r} must hold a callable, got {type(observer).__name__}")
    return observer  # type: ignore[no-any-return]
