#!/usr/bin/env bash
# The trainer's RL step with each group's prompt computed once (train.share_prompt = true, the
# default) vs every row computing it (false), in one invocation, alternating, on the same model,
# prompts and completions.
#
#   bench/share_prompt.sh [ROUNDS]        default 1 round (each mode once)
#
# Model: `rlvr init` with Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 / 2 heads, intermediate
# 4864, vocab 151936, tied, rope θ 1e6; random weights), f32 on the CPU. Prompt: the first GSM8K
# training question with the task's instruction in Qwen2.5's chat template (data/tokenizers/qwen2.5:
# its default system message, one user message; the length is printed), K = 8 completions of exactly 64 new tokens (min = max), T = 1; GRPO, STEPS steps (default 3), one
# micro-batch of the whole group (train.micro_batch_size = 8), train.skip_zero_gradient_rows =
# false (random weights score 0 everywhere, and skipping would train nothing). Both modes sample
# the same completions (same seed, same sampler): only the training pass differs.
#
# Prints, per run: time/train_s of each step from metrics.jsonl (the trainer step: forward,
# backward, AdamW) and their mean over the steps after the first (the first also pays one-time
# costs, about 20-26 s at this shape: first-touch page faults of the first update's allocations; the steady state is what a run of many steps sees), the whole
# process's CPU time (user + system: loading, the identical sampling and the steps) and peak RSS
# (GNU time), and the loss (0: random weights
# reward nothing; the equality of the two modes' values is tests/it/shared_prompt.rs's job).
# Environment: STEPS (default 3), RLVR (an rlvr binary; default: this tree's, built in the dev profile at opt-level 3),
# DATA (default data), THREADS (default 2), KEEP=1 keeps the work dir; DEVICE (default cpu) and DTYPE
# (default f32) for a GPU (bench/gpu_check.sh runs DEVICE=cuda:0 DTYPE=bf16), GROUP (K, default 8) and
# NEW (new tokens per completion, default 64), LAYERS (decoder layers, default 24: Qwen2.5-0.5B's). Each
# run also prints, per step, diagnostics.jsonl's memory/rss_mib and memory/heap_mib (resident and
# live heap MiB when the update began) and memory/update_peak_mib (the most live heap above that
# during the update: from step 2 on, the activations and temporaries). Without GNU time the CPU time and peak RSS are null.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
DATA=${DATA:-data}
THREADS=${THREADS:-2}
STEPS=${STEPS:-3}
DEVICE=${DEVICE:-cpu}
DTYPE=${DTYPE:-f32}
GROUP=${GROUP:-8}
NEW=${NEW:-64}
LAYERS=${LAYERS:-24}
W=$(mktemp -d "${TMPDIR:-/tmp}/share_prompt.XXXXXX")
# Killed (Ctrl-C, SIGTERM, SIGHUP) or finished: the rlvr process running then (a session of its
# own, see `own`) is killed with everything it started and waited for before the work dir goes;
# an orphaned `rlvr train` would otherwise go on writing (a checkpoint recreates the directory).
CHILD=
finish() {
  if [ -n "$CHILD" ]; then kill -KILL -- "-$CHILD" 2>/dev/null || true; wait "$CHILD" 2>/dev/null || true; fi
  [ "${KEEP:-0}" = 1 ] || rm -rf "$W"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
# Runs its arguments in a session of their own (so the kill above takes the whole tree, GNU time
# and rlvr alike) and waits for them; a signal to this script interrupts the wait at once.
own() { setsid "$@" & CHILD=$!; local rc=0; wait "$CHILD" || rc=$?; CHILD=; return "$rc"; }
if [ -z "${RLVR:-}" ]; then
  CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo build -q --workspace --locked --bins
  RLVR=target/debug/rlvr
fi
TIMED=(/usr/bin/time -f '%U %S %M' -o)
[ -x /usr/bin/time ] || { echo "no GNU time: CPU time and peak RSS are not measured" >&2; TIMED=(env -u NOTHING); }
# Qwen2.5's own chat template (and special tokens): its tokenizer_config.json beside the tokenizer.
mkdir -p "$W/tok"
cp "$DATA/tokenizers/qwen2.5/tokenizer.json" "$W/tok/"
cp "$DATA/tokenizers/qwen2.5/tokenizer_config.source.json" "$W/tok/tokenizer_config.json"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
own "$RLVR" init --arch qwen2 --hidden 896 --layers "$LAYERS" --heads 14 --kv-heads 2 --intermediate 4864 \
  --vocab-size 151936 --tie-embeddings true --rope-theta 1000000 --max-position-embeddings 32768 \
  --tokenizer "$W/tok/tokenizer.json" --seed 0 --out "$W/model" >/dev/null
head -n 1 "$DATA/gsm8k/train.jsonl" > "$W/prompts.jsonl"
run() { # $1 = share_prompt, $2 = run dir
  [ -x /usr/bin/time ] || : > "$2.rss"
  RAYON_NUM_THREADS=$THREADS own "${TIMED[@]}" $([ -x /usr/bin/time ] && echo "$2.rss") "$RLVR" train \
    --set model.path="\"$W/model\"" --set model.dtype="\"$DTYPE\"" --set model.device="\"$DEVICE\"" \
    --set data.task='"gsm8k"' --set data.train="\"$W/prompts.jsonl\"" --set data.style='"chat"' \
    --set data.prompts_per_step=1 --set data.seed=0 \
    --set rollout.group_size=$GROUP --set rollout.max_new_tokens=$NEW --set rollout.min_new_tokens=$NEW \
    --set rollout.temperature=1.0 --set rollout.top_p=1.0 --set rollout.top_k=0 \
    --set algorithm.preset='"grpo"' --set algorithm.kl_coef=0.0 \
    --set train.steps=$STEPS --set train.lr=1e-6 --set train.eval_every=0 --set train.micro_batch_size=$GROUP \
    --set train.skip_zero_gradient_rows=false --set train.share_prompt="$1" \
    --set output.dir="\"$2\"" --no-progress >/dev/null 2>"$2.log" || { cat "$2.log"; exit 1; }
  # The prompt's token count: its rendered text (rollouts.jsonl) encoded as the trainer encodes it.
  python3 -c 'import json,sys; print(json.dumps({"prompt": json.loads(open(sys.argv[1]).readline())["prompt"]}))' \
    "$2/rollouts.jsonl" > "$2.prompt.jsonl"
  own "$RLVR" generate --model "$W/model" --prompts "$2.prompt.jsonl" -n 1 --max-new-tokens 1 \
    --out "$2.prompt_ids.jsonl" >/dev/null
  python3 - "$1" "$2" <<'PY'
import json, sys
share, run = sys.argv[1], sys.argv[2]
ms = [x for x in (json.loads(l) for l in open(f"{run}/metrics.jsonl")) if "time/train_s" in x]
m = ms[-1]
per_step = [round(x["time/train_s"], 2) for x in ms]
ds = [json.loads(l) for l in open(f"{run}/diagnostics.jsonl")]
mem = lambda k: [None if d.get(k) is None else round(d[k]) for d in ds]
steady = per_step[1:] or per_step
t = open(f"{run}.rss").read().split()[-3:]
rss = int(t[2]) // 1024 if t else None
cpu = round(float(t[0]) + float(t[1]), 1) if t else None
plen = len(json.loads(open(f"{run}.prompt_ids.jsonl").readline())["prompt_ids"])
print(json.dumps({"share_prompt": share == "true", "train_s_per_step": per_step,
                  "train_s_steady": round(sum(steady) / len(steady), 2),
                  "sample_s": round(m["time/sample_s"], 2), "process_cpu_s": cpu, "peak_rss_mb": rss,
                  "rss_before_update_mib": mem("memory/rss_mib"),
                  "heap_before_update_mib": mem("memory/heap_mib"),
                  "update_peak_mib": mem("memory/update_peak_mib"),
                  "loss": m["loss"], "prompt_tokens": plen,
                  "completion_len": m["completion_len/mean"]}))
PY
}
for r in $(seq 1 "$ROUNDS"); do
  run false "$W/unshared-$r"
  run true "$W/shared-$r"
done
