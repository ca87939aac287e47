"""Stream a source into a lakesink lake: runs with plain ``python`` (local mode) or ``spark-submit``.

    python jobs/stream_to_lake.py --source rate --rows-per-second 1000 --duration 30 \\
        --lake /tmp/lake --checkpoint /tmp/chk
    spark-submit jobs/stream_to_lake.py --source files --input /data/in --available-now ...
    python jobs/stream_to_lake.py --remote sc://127.0.0.1:15002 ...   # through Spark Connect
    python jobs/stream_to_lake.py --source kafka --bootstrap 127.0.0.1:9092 --topic events \\
        --starting-offsets earliest --max-offsets-per-trigger 10000 --mode epoch ...
    python jobs/stream_to_lake.py --source lake --input /data/lake/raw --mode epoch \\
        --max-files-per-trigger 100 --lake /data/lake/clean --checkpoint /data/chk/clean
        # --lake-read: Spark's Parquet scan where it reaches the lake (local disk, HDFS), else Python

Logs one line per epoch: its rows, committed files and seconds. A failing query ends with one
line naming the cause (``--verbose`` prints Spark's whole error).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("stream_to_lake")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lake", required=True, help="table root: local path, file:// or s3://bucket/prefix")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint location (local path)")
    p.add_argument("--source", choices=("rate", "files", "kafka", "lake"), default="rate")
    p.add_argument(
        "--input",
        help="directory of input files (--source files), or the upstream lake (--source lake: its "
        "appends, exactly once; --storage-option applies to it too)",
    )
    add_kafka_args(p)
    p.add_argument(
        "--input-format",
        choices=("auto", "parquet", "json", "csv"),
        default="auto",
        help="files source: format of the input files (auto: from their extensions)",
    )
    p.add_argument("--rows-per-second", type=int, default=1000, help="rate source speed")
    p.add_argument(
        "--max-files-per-trigger", type=int, default=1, help="files and lake sources: files per epoch"
    )
    p.add_argument(
        "--lake-read",
        choices=("auto", "spark", "python"),
        default="auto",
        help="lake source: how an epoch's files are read. spark: Spark's own Parquet scan in "
        "foreachBatch (lakesink.follow_lake; epoch mode, the foreachBatch door, a lake on local disk "
        "or HDFS without storage options), python: readStream.format('lakesink'), the Python source "
        "(any lake, any mode and door); auto: spark where it applies, else python",
    )
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=float, help="stop after this many seconds")
    stop.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    p.add_argument("--trigger-seconds", type=float, default=2.0, help="micro-batch interval")
    p.add_argument("--mode", choices=("foreach", "epoch"), default="foreach", help="lakesink writer mode")
    p.add_argument(
        "--via",
        choices=("auto", "foreach_batch", "data_source"),
        help="epoch mode: lakesink.write_stream's door (default: write_stream's own, auto: "
        "foreach_batch in a classic session, data_source under Spark Connect); data_source is "
        "format('lakesink')'s, which starts five kinds of Python worker where foreach_batch starts one",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="repartition the stream (0: keep; kafka: by (topic, partition), into 4 in foreach mode)",
    )
    p.add_argument("--master", default=None, help="Spark master when run with plain python (local[2,4])")
    p.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run through a Spark Connect server instead of a local Spark (its Python needs lakesink)",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage option for the lake, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable)",
    )
    p.add_argument("--verbose", action="store_true", help="on failure, print Spark's whole error")
    p.add_argument(
        "--fail-once-after-rows",
        type=int,
        default=0,
        help="inject one failed task attempt: partition 0 raises after this many rows, once",
    )
    args = p.parse_args(argv)
    if args.source in ("files", "lake") and not args.input:
        p.error(f"--source {args.source} needs --input {'DIR' if args.source == 'files' else 'LAKE'}")
    if args.source == "kafka":
        check_kafka_args(p, args)
    if args.via and args.mode != "epoch":
        p.error("--via chooses the door of epoch mode (--mode epoch)")
    if args.lake_read == "spark":
        why = spark_scan_refusal(args)
        if why:
            p.error(f"--lake-read spark: {why}")
    if args.continue_writer and args.source != "kafka":
        p.error("--continue-writer is for --source kafka (continuing from the Kafka offsets a lake records)")
    if args.rows_per_second < 1:
        p.error(f"--rows-per-second must be >= 1, got {args.rows_per_second}")
    if args.source == "files" and args.input_format == "auto":
        try:
            args.input_format = input_format(args.input)
        except ValueError as exc:
            p.error(str(exc))
    from lakesink_reader.storage.options import parse_option_pairs

    try:
        args.storage_options = parse_option_pairs(args.storage_option)
    except ValueError as exc:
        p.error(str(exc))
    return args


def spark_scan_refusal(args: argparse.Namespace) -> str | None:
    """Why ``--source lake`` cannot read through Spark's scan (``lakesink.follow_lake``), or None."""
    from lakesink.spark.scan import file_root

    if args.source != "lake":
        return "it reads --source lake"
    if args.mode != "epoch" or args.via == "data_source" or args.remote:
        return (
            "it writes in epoch mode through the foreachBatch door, in a classic session "
            "(not --mode foreach, --via data_source or --remote)"
        )
    if args.storage_option or file_root(args.input) is None:
        return (
            f"Spark's Hadoop client reaches local disk and HDFS by itself, not {args.input} with "
            "storage options (--lake-read python reads it)"
        )
    return None


def lake_read(args: argparse.Namespace) -> str:
    """``--source lake``'s route: "spark" (Spark's scan in foreachBatch) or "python" (the source)."""
    if args.source != "lake" or args.lake_read == "python":
        return "python"
    return "spark" if spark_scan_refusal(args) is None else "python"


# -- the kafka source ------------------------------------------------------------------------

#: Spark's Kafka connector and the jars it needs beyond Spark's own: ``make kafka-jars`` copies
#: them here from java/kafka/pom.xml (4.2.0: Maven Central serves no 4.3.0; see docs/guide/kafka.md).
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KAFKA_JARS = os.path.join(_CHECKOUT, "java", "kafka", "connector-jars")
_KAFKA_JARS = ("spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients", "commons-pool2")
#: Foreach mode reads Kafka through a repartition by (topic, partition): into this many tasks
#: unless --partitions says otherwise (see build_stream).
KAFKA_FOREACH_PARTITIONS = 4


def add_kafka_args(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("kafka source (--source kafka)")
    k.add_argument("--bootstrap", metavar="HOST:PORT[,...]", help="Kafka bootstrap servers")
    k.add_argument("--topic", help="topic to read (one topic, or several separated by commas)")
    k.add_argument(
        "--starting-offsets",
        default="earliest",
        help="where a new query starts: earliest (default), latest, JSON such as "
        '\'{"ev": {"0": 1200, "1": -2}}\' (-2: earliest, -1: latest), or lake: where the lake\'s '
        "writer ended (`lakesink offsets`), continuing that writer (epoch mode, a format-3 lake; "
        "for a lost or unusable checkpoint). A restart from a checkpoint continues from the "
        "checkpoint instead",
    )
    k.add_argument(
        "--continue-writer",
        metavar="ID",
        help="epoch mode, format-3 lake: the new query continues this writer of the lake (its id or "
        "16-hex tag) and must start where it ended; with JSON --starting-offsets, or with lake to "
        "pick one of several writers",
    )
    k.add_argument("--max-offsets-per-trigger", type=int, default=0, help="records per epoch (0: no limit)")
    k.add_argument(
        "--isolation-level",
        choices=("read_committed", "read_uncommitted"),
        default="read_committed",
        help="records of aborted (and still open) transactions are never read with read_committed (default)",
    )
    k.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another option of Spark's kafka source, e.g. kafka.request.timeout.ms=20000 (repeatable)",
    )
    k.add_argument(
        "--kafka-jars",
        default=os.environ.get("LAKESINK_KAFKA_JARS", KAFKA_JARS),
        metavar="DIR",
        help="folder of Spark's Kafka connector jars (default: the checkout's, filled by `make kafka-jars`)",
    )


def check_kafka_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import json

    if not args.bootstrap or not args.topic:
        p.error("--source kafka needs --bootstrap HOST:PORT and --topic T")
    if (args.starting_offsets == "lake" or args.continue_writer) and args.mode != "epoch":
        p.error(
            "--starting-offsets lake and --continue-writer continue a writer of a format-3 epoch-mode "
            "lake (--mode epoch): a foreach lake records no offsets"
        )
    if args.continue_writer and args.starting_offsets in ("earliest", "latest"):
        p.error(
            "--continue-writer needs the offsets where that writer ended: --starting-offsets lake, or "
            "the JSON `lakesink offsets` prints"
        )
    if args.starting_offsets not in ("earliest", "latest", "lake"):
        try:
            parsed = json.loads(args.starting_offsets)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            p.error(
                f"--starting-offsets must be earliest, latest, lake or a JSON object of "
                f"{{topic: {{partition: offset}}}}, got {args.starting_offsets!r}"
            )
    if args.max_offsets_per_trigger < 0:
        p.error(f"--max-offsets-per-trigger must be >= 0, got {args.max_offsets_per_trigger}")
    options = {}
    for pair in args.kafka_option:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            p.error(f"--kafka-option takes KEY=VALUE, got {pair!r}")
        options[key] = value
    args.kafka_options = options


def lake_start(args: argparse.Namespace) -> None:
    """``--starting-offsets lake``: start where the lake's writer ended, continuing that writer.

    For a query whose checkpoint is lost or unusable (docs/guide/kafka.md): sets
    ``args.starting_offsets`` to the offsets the lake recorded at the end of the writer's last
    batch (what ``lakesink offsets`` prints) and ``args.continue_writer`` to that writer, whose
    continuation lakesink then checks before anything is written. A checkpoint whose query is
    already a writer of the lake is a plain restart: it continues from its checkpoint, and the
    lake's offsets are not used. ValueError (the job exits 2) when the lake has none to give or
    the checkpoint cannot be read.
    """
    import json

    from lakesink.spark import checkpoints
    from lakesink_reader import Lake, NotALakeError, TableNotFoundError

    checkpoint = checkpoints.open_checkpoint(args.checkpoint, args.storage_options)
    query = None
    if checkpoint.exists("metadata"):
        query = checkpoints.query_id(checkpoint)
        if query is None:
            raise ValueError(
                f"the checkpoint at {args.checkpoint} has a metadata file that names no query (damaged, "
                "or written by another Spark): move the checkpoint away, or delete it, to start a new query "
                "from the lake's offsets"
            )
    try:
        lake = Lake(args.lake, args.storage_options)
    except (TableNotFoundError, NotALakeError) as exc:
        raise ValueError(
            f"--starting-offsets lake: {exc}; there are no offsets to continue from (start with earliest, "
            "latest or JSON offsets)"
        ) from None
    if not lake.metadata.has_log:
        raise ValueError(
            f"--starting-offsets lake needs a format-3 epoch-mode lake, and {args.lake} is a format-"
            f"{lake.metadata.format_version} {lake.mode}-mode lake: it records no writers' offsets "
            "(`lakesink upgrade` converts a format-2 epoch-mode lake)"
        )
    writers = lake.writers()
    own = next((w for w in writers if w.id == query), None)
    if own is not None:
        # Its checkpoint must hold the batch the lake last recorded for it, with the same offsets:
        # one that lost its offset log would start again at batch 0, which the lake takes for replays.
        held = checkpoints.batch_end_offsets(checkpoint, own.last_batch)
        if own.offsets is not None and held != own.offsets:
            raise ValueError(
                f"the checkpoint at {args.checkpoint} belongs to writer {own.id} of the lake, but does not "
                f"hold the offsets the lake recorded for its batch {own.last_batch} (damaged, or not "
                "readable after a Spark upgrade): move the checkpoint away, or delete it, to continue the "
                "writer from the lake's offsets"
            )
        log.info("the checkpoint's query %s is a writer of the lake: it restarts from its checkpoint", query)
        args.starting_offsets, args.continue_writer = "earliest", None  # the checkpoint has its offsets
        return
    name = args.continue_writer
    if name:
        chosen = [w for w in writers if name in (w.id, w.tag)]
        if not chosen:
            raise ValueError(
                f"--continue-writer {name} is not a writer of {args.lake} (its writers: "
                f"{'; '.join(w.describe() for w in writers) or 'none'})"
            )
    else:
        chosen = [w for w in writers if not w.retired]
        if len(chosen) != 1:
            raise ValueError(
                f"--starting-offsets lake: {args.lake} has {len(chosen)} writers that are not retired"
                + (f" ({'; '.join(w.describe() for w in chosen)})" if chosen else "")
                + ": name the one to continue with --continue-writer"
            )
    writer = chosen[0]
    offsets = writer.offsets
    if not offsets or offsets[0] is None:
        raise ValueError(
            f"writer {writer.id} of {args.lake} recorded no source offsets (its checkpoint location was "
            "not readable by lakesink when it committed): there is nothing to continue from"
        )
    if len(offsets) != 1 or not isinstance(offsets[0], dict):
        raise ValueError(
            f"writer {writer.id} of {args.lake} read {len(offsets)} source(s) ({json.dumps(offsets)}); this "
            "job reads one Kafka source: start your own query with those offsets (docs/guide/kafka.md)"
        )
    topics = {t.strip() for t in args.topic.split(",")}
    if set(offsets[0]) != topics:
        raise ValueError(
            f"writer {writer.id} of {args.lake} read the topics {sorted(offsets[0])}, and --topic names "
            f"{sorted(topics)}: a continuation reads the same topics"
        )
    args.starting_offsets, args.continue_writer = json.dumps(offsets[0]), writer.id
    log.info(
        "continuing writer %s of the lake (last batch %d, version %d) from its offsets %s",
        writer.id, writer.last_batch, writer.last_version, args.starting_offsets,
    )  # fmt: skip


def kafka_jars(folder: str) -> list[str]:
    """The connector's jars in ``folder``; ValueError naming ``make kafka-jars`` when one is missing."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    found = [os.path.join(folder, n) for n in names if n.endswith(".jar")]
    missing = [j for j in _KAFKA_JARS if not any(n.startswith(j) for n in names)]
    if missing:
        raise ValueError(
            f"Spark's Kafka connector jars are not in {folder} "
            f"(missing {', '.join(m.rstrip('-_') for m in missing)}): "
            "run `make kafka-jars` in the checkout (Maven copies them from java/kafka/pom.xml), "
            "or point --kafka-jars at a folder with the ones matching your Spark"
        )
    return found


def kafka_stream(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("kafka.isolation.level", args.isolation_level)
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    for key, value in args.kafka_options.items():
        reader = reader.option(key, value)
    return reader.load().select(
        "topic",
        "partition",
        "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").alias("value"),
        "timestamp",
    )


_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}


def input_format(folder: str) -> str:
    """The format of the files in ``folder``, from their extensions; ValueError if none or mixed."""
    try:
        names = os.listdir(folder)
    except OSError as exc:
        raise ValueError(f"--input {folder!r} cannot be listed: {exc.strerror}") from None
    found = {_FORMATS[ext] for name in names if (ext := os.path.splitext(name)[1].lower()) in _FORMATS}
    if len(found) != 1:
        what = f"files of several formats {sorted(found)}" if found else "no .parquet, .json or .csv files"
        raise ValueError(f"--input {folder!r} has {what}: pass --input-format")
    return found.pop()


def build_stream(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    if args.source == "rate":
        df = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.rows_per_second)
            .load()
            .select(
                F.col("value").alias("id"),
                F.col("timestamp").alias("ts"),
                F.format_string("event-%014d", F.col("value")).alias("label"),
                (F.col("value") * 0.5).alias("amount"),
            )
        )
    elif args.source == "kafka":
        df = kafka_stream(spark, args)
    elif args.source == "lake":
        # The upstream lake's appends (compactions are no new data), maxFilesPerTrigger files a
        # micro-batch: docs/guide/reading.md, "A lake as a stream".
        df = (
            spark.readStream.format("lakesink")
            .option("maxFilesPerTrigger", args.max_files_per_trigger)
            .option("storage_options", json.dumps(args.storage_options))
            .load(args.input)
        )
    else:
        reader = spark.read.format(args.input_format)
        if args.input_format == "csv":
            reader = reader.option("header", True).option("inferSchema", True)
        schema = reader.load(args.input).schema
        df = (
            spark.readStream.format(args.input_format)
            .option("header", args.input_format == "csv")
            .schema(schema)
            .option("maxFilesPerTrigger", args.max_files_per_trigger)
            .load(args.input)
        )
    df = shaped(df, args)
    if args.source == "kafka" and (args.mode == "foreach" or args.partitions):
        # Which Spark partition reads which Kafka partition is not kept across a restart (it
        # follows the order in which the source lists the offsets: live from the broker, or
        # parsed from the checkpoint), and a foreach writer needs a replayed epoch to bring the
        # same rows under the same partition id. A hash of the record's Kafka partition does.
        df = df.repartition(args.partitions or KAFKA_FOREACH_PARTITIONS, "topic", "partition")
    return df


def shaped(df: Any, args: argparse.Namespace) -> Any:
    """``--partitions`` and ``--fail-once-after-rows`` applied to ``df`` (a stream, or a batch of
    ``--lake-read spark``'s, which applies them to each micro-batch's scan)."""
    if args.partitions and args.source != "kafka":
        df = df.repartition(args.partitions)
    if args.fail_once_after_rows:
        df = inject_one_failure(
            df, args.fail_once_after_rows, os.path.join(args.checkpoint, "_fault_injected")
        )
    return df


def follow_query(spark: Any, args: argparse.Namespace, options: dict[str, Any]) -> Any:
    """``--source lake --lake-read spark``: the upstream lake's files read with Spark's own
    Parquet scan in ``foreachBatch`` (``lakesink.follow_lake``): the same offsets and files per
    epoch as the Python source, none of its per-row cost (docs/design/performance.md, issue 52)."""
    from lakesink import follow_lake

    # Through the foreachBatch door whatever --via says (auto or foreach_batch: lake_read checked it).
    return follow_lake(
        spark,
        args.input,
        args.lake,
        checkpoint_location=args.checkpoint,
        transform=lambda df: shaped(df, args),
        source_options={"maxFilesPerTrigger": args.max_files_per_trigger},
        storage_options=options,
        trigger=trigger_of(args),
    )


def inject_one_failure(df: Any, after_rows: int, marker: str) -> Any:
    """Make the first attempt of partition 0 raise mid-partition, once per checkpoint.

    The failure happens upstream of the sink, as a real bug or lost executor would: the writer
    has already staged rows of that partition and must discard them; Spark retries the task.
    """

    def fail_once(batches: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        armed = ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        seen = 0
        for batch in batches:
            seen += batch.num_rows
            if armed and seen > after_rows and not os.path.exists(marker):
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                with open(marker, "w") as f:
                    f.write(f"failed partition 0 in the Arrow batch that took it past {after_rows} rows\n")
                raise RuntimeError(f"injected task failure past {after_rows} rows (demo)")
            yield batch

    return df.mapInArrow(fail_once, df.schema)


class EpochLogger:
    """One log line per epoch: rows (from Spark's progress), files committed, seconds.

    ``follow``: the query is ``follow_lake``'s, whose input rows are the upstream lake's files:
    the line says those, and takes the rows from the version the epoch committed."""

    def __init__(self, lake: str, options: dict[str, Any], *, follow: bool = False) -> None:
        self.lake, self.options, self.follow = lake, options, follow
        self.logged: set[int] = set()
        self.query_id: str | None = None

    def log_new(self, query: Any) -> None:
        """Log the epochs of ``query.recentProgress`` not logged yet."""
        self.query_id = self.query_id or str(query.id)
        for progress in query.recentProgress:
            if progress["batchId"] not in self.logged:
                self.logged.add(progress["batchId"])
                self.log(progress)

    def files_of(self, epoch: int) -> int | str:
        """Files committed in ``epoch``: its record in epoch mode (one read, however long the
        job has run); in foreach mode, a listing of the lake."""
        from lakesink_reader import Lake, NotALakeError, TableNotFoundError
        from lakesink_reader.format.log import EpochLog
        from lakesink_reader.storage import open_storage

        try:
            lake = Lake(self.lake, self.options)
            if lake.version is not None:  # format 3: the version of this query's batch
                found = (
                    v.add_files
                    for v in reversed(lake.versions())
                    if (v.writer, v.batch) == (self.query_id, epoch)
                )
                return next(found, 0)
            if lake.mode == "epoch":
                record = EpochLog(open_storage(self.lake, self.options)).record(epoch)
                return len(record.files) if record is not None else 0
            return sum(1 for f in lake.files() if f.epoch == epoch)
        except (TableNotFoundError, NotALakeError):
            return 0  # nothing committed yet: the table is created with its first rows
        except Exception as exc:  # noqa: BLE001 - a log line must not kill the job
            return f"? ({type(exc).__name__})"

    def rows_of(self, epoch: int) -> int | str:
        """Rows committed in ``epoch`` (format 3: its version's; 0 for a replay or none yet)."""
        from lakesink_reader import Lake, NotALakeError, TableNotFoundError

        try:
            found = (v.add_rows for v in reversed(Lake(self.lake, self.options).versions())
                     if (v.writer, v.batch) == (self.query_id, epoch))  # fmt: skip
            return next(found, 0)
        except (TableNotFoundError, NotALakeError):
            return 0
        except Exception as exc:  # noqa: BLE001 - a log line must not kill the job
            return f"? ({type(exc).__name__})"

    def log(self, progress: Any) -> None:
        # A Connect client's progress object has the row count as an attribute only.
        rows = getattr(progress, "numInputRows", None)
        rows = progress["numInputRows"] if rows is None else rows
        epoch = progress["batchId"]
        seconds = progress["durationMs"].get("triggerExecution", 0) / 1000
        if self.follow:
            log.info(
                "epoch %s: rows=%s files=%s seconds=%.2f (read %s upstream files)",
                epoch, self.rows_of(epoch), self.files_of(epoch), seconds, rows,
            )  # fmt: skip
            return
        log.info("epoch %s: rows=%s files=%s seconds=%.2f", epoch, rows, self.files_of(epoch), seconds)


class FirstEpochWait:
    """Lines while a query waits for its first epoch, which takes longer than the next ones: Spark
    starts its Python workers and plans the query (~4 s on an idle machine, 25-46 s measured on 2
    busy cores). Spark's own status message each time it changes, and every ``every`` seconds while
    a micro-batch runs; none once the first epoch is logged."""

    def __init__(self, every: float = 10.0) -> None:
        self.started = time.monotonic()
        self.every = every
        self.next = self.started + every
        self.said: str | None = None

    def tick(self, query: Any, epochs: EpochLogger) -> None:
        if epochs.logged:
            return
        try:
            status = query.status
            message, running = str(status["message"]), bool(status["isTriggerActive"])
        except Exception:  # noqa: BLE001 - a progress line must not kill the job
            return
        now = time.monotonic()
        if message != self.said or (running and now >= self.next):
            self.said, self.next = message, now + self.every
            log.info("waiting for the first epoch, %.0f s after start: %s", now - self.started, message)


def trigger_of(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of ``DataStreamWriter.trigger`` the arguments ask for."""
    if args.available_now:
        return {"availableNow": True}
    return {"processingTime": f"{args.trigger_seconds} seconds"}


def start_query(df: Any, args: argparse.Namespace, options: dict[str, Any]) -> Any:
    trigger = trigger_of(args)
    if args.mode == "epoch":
        from lakesink import write_stream

        sink: dict[str, Any] = {}
        if getattr(args, "continue_writer", None):
            sink["continue_writer"] = args.continue_writer
        if args.via:  # else write_stream's default door
            sink["via"] = args.via
        return write_stream(
            df,
            args.lake,
            checkpoint_location=args.checkpoint,
            storage_options=options,
            trigger=trigger,
            **sink,
        )
    from lakesink import LakeForeachWriter

    writer = LakeForeachWriter(args.lake, schema=df.schema, storage_options=options)
    return (
        df.writeStream.foreach(writer)
        .option("checkpointLocation", args.checkpoint)
        .trigger(**trigger)
        .start()
    )


def stop_between_epochs(query: Any, patience: float = 60.0) -> None:
    """Stop when no micro-batch is running, so the last epoch commits instead of aborting."""
    give_up = time.monotonic() + patience
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < give_up:
        time.sleep(0.05)
    query.stop()


def session(args: argparse.Namespace) -> Any:
    """The SparkSession: spark-submit's, a Connect client's, or a plain local one, as a user builds it."""
    from pyspark.sql import SparkSession

    if args.remote:
        # A Spark Connect client: the server runs the query, its workers and its logging.
        return SparkSession.builder.appName("stream_to_lake").remote(args.remote).getOrCreate()
    if os.environ.get("PYSPARK_GATEWAY_PORT") and not args.master:
        # Under spark-submit the JVM is already up and configured (master, confs): join it.
        spark = SparkSession.builder.appName("stream_to_lake").getOrCreate()
        if args.source == "kafka" and "spark-sql-kafka" not in spark.conf.get("spark.jars", ""):
            raise ValueError(
                "--source kafka under spark-submit needs Spark's Kafka connector on its classpath: "
                f"pass --jars with the jars in {args.kafka_jars} (comma-separated; `make kafka-jars`)"
            )
        return spark
    # Spark's Python workers run python3 from PATH unless told otherwise: this interpreter
    # is the one that has lakesink and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # local[2,4]: two task threads, and up to four attempts per task (plain local[2] gives up
    # on the first task failure, so no failed task would ever be retried).
    builder = (
        SparkSession.builder.appName("stream_to_lake")
        .master(args.master or "local[2,4]")
        .config("spark.ui.showConsoleProgress", "false")  # this job logs a line per epoch instead
    )
    if args.source == "kafka":
        # The connector from the cache a pom fills (not --packages: no resolving at run time).
        builder = builder.config("spark.jars", ",".join(kafka_jars(args.kafka_jars)))
    spark = builder.getOrCreate()
    # Spark logs every failed task attempt with its traceback, and a failed query with its
    # plan; this job says what failed in one line, and --verbose shows Spark's own account.
    spark.sparkContext.setLogLevel("WARN" if args.verbose else "OFF")
    return spark


def cause(error: BaseException) -> str:
    """The line of a Spark error that names its cause: the innermost Python exception, if any."""
    lines = [line.strip() for line in str(error).splitlines()]
    named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): \S", line)]
    if named:
        return named[-1]
    return next((line for line in lines if line), type(error).__name__)


def run(args: argparse.Namespace, start: Callable[..., Any] | None = None) -> int:
    """The job: the session, the stream, ``start(df, args, storage_options)``, a line per epoch.

    ``start`` is the query's sink (None: :func:`start_query`, looked up when the job runs, so
    tests/cluster_job.py can replace it): bench/parquet_job.py passes Spark's parquet sink, to
    time Spark's own sink in this same job (launch to exit, like with like).
    """
    # --lake-read spark's query is follow_lake's, not a sink over build_stream's stream: only where
    # the sink is this job's own (a caller's start, such as the bench's Spark sink, keeps its stream).
    follow = start is None and lake_read(args) == "spark"
    start = start or start_query
    options = args.storage_options
    if args.source == "kafka" and args.starting_offsets == "lake":
        lake_start(args)  # before Spark starts: a lake with no offsets to give is one line
    spark = session(args)
    data_source_door = args.mode == "epoch" and args.via == "data_source"
    if data_source_door or args.source == "lake":
        import lakesink

        # Before the input is set up. A lake read as a stream needs it in either mode: with
        # lakesink shipped by --py-files, load() finds no "lakesink" source without it
        # (DATA_SOURCE_NOT_FOUND), nor would Spark's streaming-source worker find lakesink
        # (lakesink.spark.pyfiles). The data source door's driver-side workers start meanwhile
        # (the warm-up). Not for the foreachBatch door alone (write_stream's default, auto, in a
        # classic session; or --via foreach_batch): it uses no data source, and registering one
        # starts Spark's lookup worker, which that door spares (nor the warm-up, whose workers
        # are the data source door's). Under Spark Connect the default door is the data
        # source's, and write_stream registers by itself.
        lakesink.register(spark, warm_up=data_source_door)
    query = follow_query(spark, args, options) if follow else start(build_stream(spark, args), args, options)
    if args.source == "lake":
        log.info("--source lake: read %s", "with Spark's Parquet scan" if follow else "by the Python source")
    log.info(
        "query %s started; its first epoch takes longer than the next ones (Spark starts its Python "
        "workers and plans the query: seconds on an idle machine, up to a minute on a busy one)",
        query.id,
    )
    epochs = EpochLogger(args.lake, options, follow=follow)
    waiting = FirstEpochWait()
    deadline = time.monotonic() + args.duration if args.duration else None
    try:
        while query.isActive:
            try:
                query.awaitTermination(0.5)
            except Exception:  # noqa: BLE001 - it failed: query.exception() below says how
                break
            epochs.log_new(query)
            waiting.tick(query, epochs)
            if deadline is not None and time.monotonic() >= deadline:
                stop_between_epochs(query)
        epochs.log_new(query)  # the epochs that finished as the query stopped
        error = query.exception()
        if error is not None:
            if args.verbose:
                log.error("query failed: %s", error)
            hint = "" if args.verbose else " (--verbose prints Spark's whole error)"
            log.error("query failed: %s%s", cause(error), hint)
            return 1
        return 0
    finally:
        if query.isActive:
            query.stop()
        # What comes after this line is Spark's shutdown: the time a job takes to exit once done.
        log.info("stopping Spark")
        spark.stop()


#: pyarrow's allocator for this job when its environment names none: glibc's. pyarrow reads
#: the variable once, when it loads (lakesink imports it, pyspark with the session), so it is
#: set before either. Measured (docs/design/performance.md, "Issue 52, item 4"): the driver's
#: and Spark's Python workers' memory 24 and 71 MiB less over 600 micro-batches than with
#: pyarrow's default (mimalloc keeps freed pages resident), and no throughput lost.
ARROW_POOL = ("ARROW_DEFAULT_MEMORY_POOL", "system")


def main(argv: list[str] | None = None) -> int:
    # With plain python, the JVM this job starts and Spark's local Python workers inherit it;
    # under spark-submit the JVM is up already: executors need
    # --conf spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL=system (README, the job).
    os.environ.setdefault(*ARROW_POOL)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per py4j connection otherwise
    args = parse_args(argv)
    from lakesink import LakeSinkError

    try:
        return run(args)
    except (LakeSinkError, ValueError, TypeError, OSError) as exc:  # refused before the query started
        if args.verbose:
            raise
        log.error("cannot start: %s: %s (--verbose prints the traceback)", type(exc).__name__, exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
