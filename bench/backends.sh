#!/usr/bin/env bash
# RL step time with each rollout backend: the native engine and a vLLM CPU server, same
# checkpoint, prompts and work, in one invocation.
#
#   VENV=/path/to/vllm-venv bench/backends.sh [STEPS]      default 4 steps (the first is a warm-up)
#
# Checkpoint: the 43 M-parameter model of bench/rl_step.sh (qwen2, Qwen2.5 vocabulary, hidden 256, 4
# layers, tied, f32). Work per step: the first 4 GSM8K training questions (plain), 8 completions each,
# exactly 32 new tokens, T = 1, GRPO with beta 0, train.skip_zero_gradient_rows = false (the same
# forward/backward whatever the rewards), sync.interval = 1 (a weight refresh after every step: with
# vLLM a full write + reload + verification). Prints per backend the median over the timed steps of
# sample_s and train_s (metrics.jsonl) and of the sync time (train.log's "sync: version t handed to
# the explorer in X s"), and the step total. Environment: VENV (scripts/vllm_server.sh), RLVR (an rlvr
# binary; default: this tree's release build), THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-4}
THREADS=${THREADS:-2}
if [ -z "${RLVR:-}" ]; then
  cargo build --release -q --locked --workspace --bins
  RLVR=target/release/rlvr
fi
RLVR=$(realpath "$RLVR")
W=$(mktemp -d /tmp/backends.XXXXXX)
export RUN="$W/vllm"
mkdir -p "$RUN"
trap 'scripts/vllm_server.sh stop >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck source=bench/workload.sh
source bench/workload.sh
bench_workload_files data
URL=$(RLVR="$RLVR" scripts/vllm_server.sh start "$W/model")
echo "# vLLM server at $URL"

run() { # $1 = name, then extra --set arguments
  local name=$1; shift
  RAYON_NUM_THREADS=$THREADS "$RLVR" train --no-progress "${BENCH_WORKLOAD_SETS[@]}" \
    --set train.steps="$STEPS" --set train.skip_zero_gradient_rows=false --set sync.interval=1 \
    --set output.dir="\"$W/$name\"" "$@" >/dev/null 2>"$W/$name.log" || { cat "$W/$name.log"; exit 1; }
  python3 - "$W/$name" "$name" <<'PY'
import json, re, statistics, sys
run, name = sys.argv[1], sys.argv[2]
m = [json.loads(l) for l in open(f"{run}/metrics.jsonl")][1:]  # step 1 is the warm-up
sync = [float(x) for x in re.findall(r"sync: version (?:\d+) handed to the explorer in ([0-9.]+) s",
                                     open(f"{run}/train.log").read())][1:]
med = lambda xs: statistics.median(xs) if xs else float("nan")
s, t, y = med([l["time/sample_s"] for l in m]), med([l["time/train_s"] for l in m]), med(sync)
print(f"{name:<8}{s:>10.2f}{t:>10.2f}{y:>10.2f}{s + t + y:>10.2f}   ({len(m)} timed steps)")
PY
}
printf "%-8s%10s%10s%10s%10s\n" backend sample_s train_s sync_s step_s
run native
# vLLM's processed log-probs need min_new_tokens = 0 unless renormalised ones are accepted: exactly 32
# tokens bans the stop ids, as in BENCHMARKS "Native engine vs a vLLM CPU server".
run vllm --set rollout.backend='"vllm"' --set "rollout.servers=[\"$URL\"]" \
  --set rollout.accept_renormalised_logprobs=true
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
