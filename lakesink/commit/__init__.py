"""The commit protocol: how rows become visible Parquet files, and epochs become committed. No Spark.

    stage   -> rows stream into an invisible staged file (".uncommitted" / open multipart upload)
    seal    -> every byte durable, still invisible
    publish -> atomic, no-clobber: the file appears whole under its name, or not at all
    discard -> on any error, the staged bytes go away; the error that caused it propagates
    record  -> (epoch mode) one create-if-absent record makes an epoch's published files committed

``files.FileWriter`` does the first four for one file, in both modes; ``epochs.EpochCommitter``
does the last for a whole epoch. The Spark adapters (``lakesink.spark``) map Spark's hooks
onto these two and nothing else decides when data becomes visible.
"""

from lakesink.commit.epochs import CommitOutcome, EpochCommitter
from lakesink.commit.files import FileWriter, Published, WriteOptions
from lakesink.commit.observer import Observer, notify

__all__ = ["CommitOutcome", "EpochCommitter", "FileWriter", "Observer", "Published", "WriteOptions", "notify"]
