#!/usr/bin/env bash
# Policy-model train step, rlvr vs PyTorch eager, in one invocation on the same work (issue 2):
# vocab 32000, hidden 256, intermediate 704, 4 layers, 8 heads / 2 KV heads, tied, f32, 2 threads,
# forward + backward + AdamW on 8 x 128 tokens, log-probs at all 127 positions in both.
#   bench/model_step.sh [STEPS]        (PYTHON defaults to /tmp/venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-5}
PY=${PYTHON:-/tmp/venv/bin/python}
cargo build --release -q -p rlvr-model --example bench_train_step
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
RAYON_NUM_THREADS=2 target/release/examples/bench_train_step --steps "$STEPS"
"$PY" bench/torch_model_step.py --steps "$STEPS" --threads 2
