"""The lake format: docs/FORMAT.md in code. Writers and readers both depend on it; it depends on
nothing but the storage seam, the names and JSON rules, and the errors of this distribution,
and never on pyspark.

- how data files, staged files and metadata are named and parsed is ``lakesink_reader.names``,
  and how every JSON document of a lake is read is ``lakesink_reader.jsondoc``: the storage
  backends apply them too, so they sit below both (an import circle otherwise);
- ``table``: ``_lakesink/table.json`` (format version, writer mode, schema, partitioning);
- ``log``: the format-2 epoch log (records, checkpoints) that says which files each epoch committed;
- ``v3``: the format-3 versioned log (commits, the state, checkpoints);
- ``partitions``: partition folders; ``schemas``: schema evolution.

The derived views (``_delta_log/``, ``_spark_metadata/``) are the writers' (``lakesink.views``).
"""
