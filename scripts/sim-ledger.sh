#!/usr/bin/env bash
# The simulation's ledger on this checkout's product (docs/design/simulation.md, issue 50 item
# 6): `make simulate` 1,000 seeds at a time (both cores) over seeds [FIRST, END), everything
# on (the default switches), skipping the starts the ledger already has clean or failed for the
# product (lakesink/, reader/lakesink_reader/, tests/sim/ at HEAD) and those switches, so that
# a stopped run resumes where it stopped: `scripts/sim-ledger.sh 0 100000 &`. A chunk cut short
# by a stop leaves no line and runs again. Then commit bench/results/simulation-ledger.jsonl and
# sum it: `python -m tests.sim --summary bench/results/simulation-ledger.jsonl`.
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:?FIRST}; end=${2:?END}
ledger=bench/results/simulation-ledger.jsonl
py=.venv/bin/python
product=$(for p in lakesink reader/lakesink_reader tests/sim; do git rev-parse --short=12 "HEAD:$p"; done | paste -sd+)
switches=$($py -c "from tests.sim.run import Config; print(Config.parse('all', 'all', 400, True, 'any', 'local').describe())")
for ((start = first; start < end; start += 1000)); do
    if $py - "$ledger" "$product" "$switches" "$start" <<'PY'
import json, sys
ledger, product, switches, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(ledger) as f:
    lines = [json.loads(line) for line in f if line.strip()]
done = any(
    e.get("product") == product and not e.get("product_dirty") and e.get("switches") == switches
    and e["start"] == start and e["seeds"] == 1000
    for e in lines
)
sys.exit(0 if done else 1)
PY
    then continue; fi
    make simulate SEEDS=1000 START="$start"
done
