#!/bin/bash
# Same-behaviour check of a restructuring (issue 43): runs the quickstart (--fast) and a small lab
# (scripts/compare/sweep.toml: GRPO v=1 and off-policy GRPO v=4 o=1) with binary BIN into OUT/TAG.
# Run it with the binary before and after the change, then
#   python3 scripts/compare_runs.py OUT/before OUT/after
# Usage: scripts/compare/run.sh BIN OUT TAG
set -euo pipefail
BIN=$1; D=$2/$3
SWEEP=$(cd "$(dirname "$0")" && pwd)/sweep.toml
rm -rf "$D"; mkdir -p "$D"; cd "$D"
"$BIN" quickstart --fast --seed 0 --out "$D/qs" > qs.log 2>&1
"$BIN" lab "$SWEEP" --out "$D/lab" > lab.log 2>&1
echo "$D: done"
