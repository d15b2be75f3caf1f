#!/usr/bin/env bash
# Policy-model train step, rlvr vs PyTorch eager, in one invocation on the same work:
# vocab 32000, hidden 256, intermediate 704, 4 layers, 8 heads / 2 KV heads, tied, f32, 2 threads,
# forward + backward + AdamW on 8 x 128 tokens, log-probs at all 127 positions in both.
#   bench/model_step.sh [STEPS] [ROUNDS]    (PYTHON defaults to /tmp/venv/bin/python)
# The two sides alternate for ROUNDS rounds (default 3) of STEPS timed steps (default 5), so that a
# machine shared with other work loads both alike; the summary gives each side's best and median
# per-round median and their ratio, with the load average before each run. Extra environment
# (e.g. CANDLE_NUM_THREADS=1, which keeps candle's element-wise ops on the calling thread) is
# passed to the rlvr side as given.
#
# Environment: PYTHON (torch side; default /tmp/venv/bin/python), RLVR (a `bench_train_step` example
# binary to time instead of building this tree's: for before/after comparisons, build it at the other
# commit with `cargo build --release -p rlvr-model --example bench_train_step` and copy
# target/release/examples/bench_train_step out), SIDES (default "rlvr torch"; SIDES=rlvr times rlvr
# alone, and the summary then runs under python3 when PYTHON is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
ROUNDS=${2:-3}
PY=${PYTHON:-/tmp/venv/bin/python}
SIDES=${SIDES:-rlvr torch}
has() { case " $SIDES " in *" $1 "*) return 0;; *) return 1;; esac; }
if [ -z "${RLVR:-}" ]; then
  cargo build --release -q -p rlvr-model --example bench_train_step
  RLVR=target/release/examples/bench_train_step
fi
SUMMARY_PY=$PY
[ -x "$PY" ] || SUMMARY_PY=python3
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq "$ROUNDS"); do
  if has rlvr; then
  echo "round $r rlvr  load $(cut -d' ' -f1-3 /proc/loadavg)"
  RAYON_NUM_THREADS=2 "$RLVR" --steps "$STEPS" | tee -a "$OUT"
  fi
  has torch || continue
  echo "round $r torch load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" bench/torch_model_step.py --steps "$STEPS" --threads 2 | tee -a "$OUT"
done
"$SUMMARY_PY" - "$OUT" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = {k: [r["step_s_median"] for r in runs if r["impl"] == k] for k in ("rlvr", "pytorch")}
med = {k: v for k, v in med.items() if v}
rss = {k: max(r["peak_rss_mb"] for r in runs if r["impl"] == k) for k in med}
for k, v in med.items():
    print(f"{k:8s} step s: best {min(v):.3f}  median {statistics.median(v):.3f}  (rounds {', '.join(f'{x:.3f}' for x in v)})  peak RSS {rss[k]:.0f} MB")
if len(med) == 2:
    print(f"ratio rlvr/pytorch: best {min(med['rlvr']) / min(med['pytorch']):.2f}  median {statistics.median(med['rlvr']) / statistics.median(med['pytorch']):.2f}")
PYEOF
