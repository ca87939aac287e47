"""The epoch writer's run, engine-neutral: what one run of a streaming query's writer does
around each batch -- the run's start and its checks, the replays' bound, the tasks, the commit,
the abort, and one post-commit pipeline -- for any engine that calls it (issue 50).

``lakesink.spark`` adapts Spark's two doors to it (``format("lakesink")``'s data source and the
``foreachBatch`` door) and decides nothing about a batch; the simulation (``tests/sim``) drives
the same objects, each Spark call on a fresh one, as Spark makes them.
"""
