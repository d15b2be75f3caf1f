#!/usr/bin/env bash
# Rollout benchmark: rlvr's Sampler vs a PyTorch KV-cache decode loop, same model shape
# (the policy-model benchmark's: vocab 32000, hidden 256, intermediate 704, 4 layers, 8/2 heads, tied, f32), 8 prompts x 1
# and 2 prompts x 4, prompt 32, 128 new tokens, EOS disabled, same sampling parameters, 2 threads.
#
#   bench/rollout.sh [--runs 3] [--temperature 1] [--top-p 0.9] [--top-k 0]
#
# Extra arguments go to both sides. PYTHON defaults to /tmp/venv/bin/python (torch + transformers).
# RLVR: a `bench_rollout` example binary to time instead of building this tree's (for before/after
# comparisons: build it at the other commit with `cargo build --release -p rlvr-rollout --example
# bench_rollout` and copy target/release/examples/bench_rollout out). SIDES (default "rlvr torch");
# SIDES=rlvr times rlvr alone (the summary then runs under python3 when PYTHON is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/tmp/venv/bin/python}
THREADS=${THREADS:-2}
SIDES=${SIDES:-rlvr torch}
has() { case " $SIDES " in *" $1 "*) return 0;; *) return 1;; esac; }
if [ -z "${RLVR:-}" ]; then
  cargo build --release -q -p rlvr-rollout --example bench_rollout
  RLVR=target/release/examples/bench_rollout
fi
SUMMARY_PY=$PYTHON
[ -x "$PYTHON" ] || SUMMARY_PY=python3
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -m) nproc=$(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
rust_out=""
torch_out=""
has rlvr && rust_out=$(RAYON_NUM_THREADS=$THREADS "$RLVR" "$@")
has torch && torch_out=$("$PYTHON" bench/rollout_torch.py --threads "$THREADS" "$@")
echo "$rust_out"
echo "$torch_out"
"$SUMMARY_PY" - "$rust_out" "$torch_out" <<'PY'
import json, sys
rows = [json.loads(l) for part in sys.argv[1:] for l in part.splitlines() if l.strip()]
key = lambda r: (r["prompts"], r["group_size"])
rl = {key(r): r for r in rows if r["impl"] == "rlvr"}
pt = {key(r): r for r in rows if r["impl"] == "pytorch"}
print("tok/s = generated tokens / wall time of the whole call, median (best) of the timed runs")
print(f"{'scenario':<16}{'rlvr':>14}{'pytorch':>14}{'ratio':>8}")
cell = lambda r: f"{r['tok_per_s']:.0f} ({r['tok_per_s_best']:.0f})" if r else "-"
for k in sorted(set(rl) | set(pt), reverse=True):
    a, b = rl.get(k), pt.get(k)
    ratio = f"{a['tok_per_s'] / b['tok_per_s']:.2f}" if a and b else "-"
    print(f"{k[0]} prompts x {k[1]:<4}{cell(a):>14}{cell(b):>14}{ratio:>8}")
PY
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
