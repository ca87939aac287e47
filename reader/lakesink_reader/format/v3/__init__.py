"""Lake format v3 (docs/design/format-v3.md, issue 20): one versioned log that several writers
and maintenance ops share. The reader reads format-3 lakes (``lakesink_reader.v3``); lakes are
written as format v2 until the design's landing step 5.

- ``commits``: one commit -- a header and file actions -- and its canonical JSON-lines bytes;
- ``state``: the fold of commits into the table's state, and the rules a new commit must pass
  against it (appends, compactions), as pure functions;
- ``vlog``: the log on a ``Storage``: reading it, and committing at the next version, exactly
  once under lost answers and races;
- ``checkpoint``: the state at a version in two objects (a small part, a Parquet file list),
  written after a commit at a multiple of the interval, found by the hint, probes or a listing.
"""
