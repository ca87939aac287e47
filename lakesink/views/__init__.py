"""The derived views of a format-3 epoch lake (docs/FORMAT.md, "Derived views"): what the
writers and the maintenance commands keep beside the lake's log so that engines that do not
read it read exactly the committed rows.

- ``derived``: the hook a committer runs after each commit (``derived_views``);
- ``delta`` / ``delta_view``: the Delta Lake view ``_delta_log/`` (the derivation, and keeping it);
- ``spark_metadata_view``: the Spark view ``_spark_metadata/``;
- ``memo``: what the views remember per lake within a process.

Readers never need them (they read the lake's log), so they live with the writers, not in the
lakesink-reader distribution.
"""
