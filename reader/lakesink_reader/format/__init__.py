"""The lake format: docs/FORMAT.md in code. Writers and readers both depend on it; it depends on
nothing but the storage seam and the errors of this distribution, and never on pyspark.

- ``names``: how data files, staged files and metadata are named and parsed;
- ``table``: ``_lakesink/table.json`` (format version, writer mode, schema, partitioning);
- ``log``: the format-2 epoch log (records, checkpoints) that says which files each epoch committed;
- ``v3``: the format-3 versioned log (commits, the state, checkpoints);
- ``partitions``: partition folders; ``schemas``: schema evolution.

The derived views (``_delta_log/``, ``_spark_metadata/``) are the writers' (``lakesink.views``).
"""
