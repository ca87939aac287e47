"""The downstream job of tests/test_lake_source.py's kill test: lake A streamed into lake B
(``spark.readStream.format("lakesink")`` into ``lakesink.write_stream``), run until killed
(``--until-killed``: a micro-batch a second) or until it has read what A holds (availableNow).

    python tests/lake_follower.py --source A --sink B --checkpoint DIR --max-files 2 [--until-killed]
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--source", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--max-files", type=int, default=2)
    p.add_argument("--until-killed", action="store_true")
    args = p.parse_args(argv)

    import lakesink
    from devtools.spark import local_session

    spark = local_session("lakesink-follower", master="local[2]")
    lakesink.register(spark)
    df = spark.readStream.format("lakesink").option("maxFilesPerTrigger", args.max_files).load(args.source)
    # A deterministic transform, as a cleaning stage would make.
    df = df.selectExpr("id", "upper(label) AS label")
    trigger = {"processingTime": "1 second"} if args.until_killed else {"availableNow": True}
    query = lakesink.write_stream(df, args.sink, checkpoint_location=args.checkpoint, trigger=trigger)
    try:
        query.awaitTermination()
    except Exception as exc:  # noqa: BLE001 - reported below
        print(f"follower failed: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
