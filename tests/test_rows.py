"""Row -> Arrow conversion: timestamps from pyspark (naive, local time) land as exact UTC instants."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Whatever the worker's zone (TZ), the vectorized conversion must agree with what
# datetime.astimezone makes of pyspark's naive local datetimes, DST edges included.
PROBE = r"""
import datetime as dt, json, sys
import pyarrow as pa
from lakesink.spark.rows import rows_to_batch
plain = [dt.datetime(2026, 1, 1, 12, 0), dt.datetime(2026, 3, 8, 1, 59, 59), dt.datetime(2026, 3, 8, 3, 0),
         dt.datetime(2026, 7, 1, 0, 0, 0, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999), None]
# Wall times that DST repeats (fold=1 is the second one, as datetime.fromtimestamp marks it)
# or skips in New York, Berlin or Lord Howe: these take the exact per-value path.
edges = plain + [dt.datetime(2026, 11, 1, 1, 30), dt.datetime(2026, 11, 1, 1, 30, fold=1),
                 dt.datetime(2026, 10, 25, 2, 30, fold=1), dt.datetime(2026, 3, 29, 2, 30),
                 dt.datetime(2026, 4, 5, 1, 45, fold=1)]
schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
bad = []
for probes in (plain, edges):
    rows = [(i, probes[i % len(probes)]) for i in range(5000)]
    got = rows_to_batch(rows, schema).column(1).to_pylist()
    want = [None if v is None else v.astimezone(dt.timezone.utc) for _, v in rows]
    bad += [(repr(r[1]), str(g), str(w)) for r, g, w in zip(rows, got, want) if g != w]
print(json.dumps(bad[:5]))
"""


@pytest.mark.parametrize(
    "zone", ["UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe", "EST5EDT"]
)
def test_local_timestamps_convert_exactly_in_every_zone(zone: str) -> None:
    env = {**os.environ, "TZ": zone}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
