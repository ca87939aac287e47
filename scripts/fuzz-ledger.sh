#!/usr/bin/env bash
# The fuzzer's ledger on this checkout's product (docs/design/trust.md, "What remains"): `make
# fuzz` 500 cases at a time over seeds [FIRST, END), skipping the starts the ledger already has
# for the product (lakesink/, reader/lakesink_reader/, tests/fuzz/ at HEAD), so that a stopped
# run resumes where it stopped. One loop per core: `scripts/fuzz-ledger.sh 0 50000 &` and
# `scripts/fuzz-ledger.sh 50000 100000 &`. Then commit bench/results/fuzz-ledger.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:?FIRST}; end=${2:?END}
ledger=bench/results/fuzz-ledger.jsonl
product=$(for p in lakesink reader/lakesink_reader tests/fuzz; do git rev-parse --short=12 "HEAD:$p"; done | paste -sd+)
for ((start = first; start < end; start += 500)); do
    if python3 - "$ledger" "$product" "$start" <<'PY'
import json, sys
ledger, product, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(ledger) as f:
    lines = [json.loads(line) for line in f if line.strip()]
done = any(e.get("product") == product and e["start"] == start and e["cases"] == 500 for e in lines)
sys.exit(0 if done else 1)
PY
    then continue; fi
    make fuzz CASES=500 FUZZ_SEED="$start"
done
