"""The commit protocol: how rows become visible Parquet files, and batches become committed. No Spark.

    stage   -> rows stream into an invisible staged file (".uncommitted" / open multipart upload)
    seal    -> every byte durable, still invisible
    publish -> atomic, no-clobber: the file appears whole under its name, or not at all
    discard -> on any error, the staged bytes go away; the error that caused it propagates
    commit  -> (epoch mode) one create-if-absent version of the lake's log makes a batch's
               published files committed

``files.FileWriter`` does the first four for one file, in both modes (``partitioned`` for a task
that meets several partition folders; ``tasks.write_task`` for an epoch-mode task's output);
``batches.BatchCommitter`` does the last for a whole batch, through ``versions``
(``VersionedLogWriter``: the commit at the next version, for writers and maintenance alike) and
``checkpoints`` (writing the log's checkpoints). ``start`` is what a run reads of the lake once
(the schema change, the last batch a replay skips to, the continuation), ``continuation`` the
rules of continuing a writer; ``stats`` and ``observer`` serve the rest. The Spark adapters
(``lakesink.spark``) map Spark's hooks onto these and nothing else decides when data becomes
visible.
"""

from lakesink.commit.batches import BatchCommitter
from lakesink.commit.files import FileWriter, Published, WriteOptions
from lakesink.commit.observer import Observer, notify

__all__ = ["BatchCommitter", "FileWriter", "Observer", "Published", "WriteOptions", "notify"]
