"""The lake format: docs/FORMAT.md in code. Writers and readers both depend on it; it depends on
nothing of lakesink but the storage seam and the errors, and never on pyspark.

- ``names``: how data files, staged files and metadata are named and parsed;
- ``table``: ``_lakesink/table.json`` (format version, writer mode, schema);
- ``log``: the epoch log (records, checkpoints) that says which files each epoch committed.
"""
