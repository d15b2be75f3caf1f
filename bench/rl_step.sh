#!/usr/bin/env bash
# RL step, rlvr vs TRL GRPOTrainer, in one invocation on the same checkpoint and prompts.
#
#   bench/rl_step.sh [STEPS] [ROUNDS]     defaults: 3 timed steps, 1 round
#
# Checkpoint: `rlvr init` qwen2, Qwen2.5 tokenizer, vocab 151936, hidden 256, 4 layers, 4 heads / 2 KV
# heads, intermediate 1024, tied, f32 (~43 M parameters, 39 M of them the embedding). Prompts: the
# first 4 GSM8K training questions as plain text (no template, no special tokens), 8 completions each,
# exactly 32 new tokens (min = max new tokens: EOS never ends a completion), T = 1, top-p 1, top-k off.
# Each side runs 1 + STEPS RL steps (the first is a warm-up and not counted) with beta 0 (no reference
# model), one optimizer update per generation, 2 threads. Both sides' prompt token ids are compared.
#
# rlvr does the same work as TRL: train.skip_zero_gradient_rows = false (with random weights every
# reward is 0, every group has zero variance and rlvr would otherwise skip the whole forward/backward;
# the figure with skipping is printed too, as rlvr's default). Sampling tok/s = completion tokens /
# sample_s; training tok/s = (prompt + completion) tokens of the B x K rows / train_s.
#
# Environment: PYTHON (default /tmp/venv/bin/python, with torch, transformers and trl as pinned in
# bench/requirements.txt), DATA (default data), THREADS (default 2), KEEP=1 keeps the work dir,
# RLVR (an rlvr binary to time instead of building this tree's; for before/after comparisons),
# SIDES (default "rlvr rlvr_unshared rlvr_skip trl"; rlvr_unshared sets train.share_prompt = false;
# e.g. SIDES=rlvr to time rlvr alone).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-3}
ROUNDS=${2:-1}
PY=${PYTHON:-/tmp/venv/bin/python}
DATA=${DATA:-data}
THREADS=${THREADS:-2}
W=$(mktemp -d /tmp/rl_step.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT
if [ -z "${RLVR:-}" ]; then
  cargo build --release -q -p rlvr
  RLVR=target/release/rlvr
fi
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
# shellcheck source=bench/workload.sh
source bench/workload.sh
bench_workload_files "$DATA"
# rlvr's prompt token ids, by the same plain encoding the trainer uses (`rlvr generate --out` writes them).
"$PY" -c 'import json,sys; [print(json.dumps({"prompt": json.loads(l)["question"]})) for l in open(sys.argv[1])]' \
  "$W/prompts.jsonl" > "$W/plain_prompts.jsonl"
"$RLVR" generate --model "$W/model" --prompts "$W/plain_prompts.jsonl" -n 1 --max-new-tokens 1 \
  --out "$W/rlvr_prompt_ids.jsonl" >/dev/null
"$PY" -c 'import json,sys; json.dump([json.loads(l)["prompt_ids"] for l in open(sys.argv[1])], open(sys.argv[2], "w"))' \
  "$W/rlvr_prompt_ids.jsonl" "$W/rlvr.prompt_ids.json"

rlvr_run() { # $1 = run dir, $2 = skip_zero_gradient_rows, $3 = train.share_prompt (default true)
  RAYON_NUM_THREADS=$THREADS "$RLVR" train "${BENCH_WORKLOAD_SETS[@]}" --set train.steps=$((STEPS + 1)) \
    --set train.skip_zero_gradient_rows="$2" --set train.share_prompt="${3:-true}" \
    --set output.dir="\"$1\"" >/dev/null 2>"$1.log" \
    || { cat "$1.log"; exit 1; }
  "$PY" - "$1" "$W/rlvr.prompt_ids.json" <<'PY'
import json, sys
run = sys.argv[1]
m = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
p = 8 * sum(len(ids) for ids in json.load(open(sys.argv[2])))  # every step takes all 4 prompts x K = 8
for line in m:
    s, t = line["time/sample_s"], line["time/train_s"]
    c = round(line["completion_len/mean"] * 32)
    print(json.dumps({"impl": "rlvr", "step": line["step"], "step_s": s + t, "sample_s": s, "train_s": t,
                      "completion_tokens": c, "prompt_tokens": p}))
PY
}

OUT="$W/results.jsonl"
SIDES=${SIDES:-rlvr rlvr_unshared rlvr_skip trl}
has() { case " $SIDES " in *" $1 "*) return 0;; *) return 1;; esac; }
for r in $(seq "$ROUNDS"); do
  if has rlvr; then
  echo "round $r rlvr (work-equal) load $(cut -d' ' -f1-3 /proc/loadavg)"
  rlvr_run "$W/rlvr_r$r" false | sed "s/\"rlvr\"/\"rlvr\", \"round\": $r/" | tee -a "$OUT"
  fi
  if has rlvr_unshared; then
  echo "round $r rlvr (work-equal, every row computes its prompt) load $(cut -d' ' -f1-3 /proc/loadavg)"
  rlvr_run "$W/rlvr_unshared_r$r" false false | sed "s/\"rlvr\"/\"rlvr_unshared\", \"round\": $r/" | tee -a "$OUT"
  fi
  if has rlvr_skip; then
  echo "round $r rlvr (default, zero-gradient rows skipped) load $(cut -d' ' -f1-3 /proc/loadavg)"
  rlvr_run "$W/rlvr_skip_r$r" true | sed "s/\"rlvr\"/\"rlvr_skip\", \"round\": $r/" | tee -a "$OUT"
  fi
  has trl || continue
  echo "round $r trl load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PY" bench/trl_grpo_step.py --model "$W/model" --prompts "$W/prompts.jsonl" --steps $((STEPS + 1)) \
    --threads "$THREADS" --prompt-ids-out "$W/trl_r$r.prompt_ids.json" --out-dir "$W/trl_out" 2>"$W/trl.log" \
    | grep '^{"impl"' | sed "s/\"trl\"/\"trl\", \"round\": $r/" | tee -a "$OUT" || { tail -30 "$W/trl.log"; exit 1; }
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$OUT" "$W" <<'PY'
import glob, json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"')]  # TRL also prints its log dicts
ids = {}
for f in glob.glob(f"{sys.argv[2]}/*.prompt_ids.json"):
    ids[f] = sorted(map(tuple, json.load(open(f))))
same = len({tuple(v) for v in ids.values()}) == 1
if len(ids) < 2:
    same = True  # one side only: nothing to compare
print(f"prompt token ids identical on both sides: {same} ({len(next(iter(ids.values())))} prompts, "
      f"lengths {[len(p) for p in next(iter(ids.values()))]})")
ver = next((r["versions"] for r in rows if "versions" in r), {})
print(f"trl side: {ver}")
timed = [r for r in rows if "step_s" in r and r["step"] > 1]  # step 1 is the warm-up
med = lambda xs: statistics.median(xs)
summary = {}
print(f"{'side':<11}{'step s':>9}{'sample s':>10}{'train s':>9}{'sample tok/s':>14}{'train tok/s':>13}   (median over the timed steps)")
for impl in ("trl", "rlvr", "rlvr_unshared", "rlvr_skip"):
    rs = [r for r in timed if r["impl"] == impl]
    if not rs:
        continue
    st, ss, ts = med([r["step_s"] for r in rs]), med([r["sample_s"] for r in rs]), med([r["train_s"] for r in rs])
    stok = med([r["completion_tokens"] / r["sample_s"] for r in rs])
    ttok = med([(r["completion_tokens"] + r["prompt_tokens"]) / r["train_s"] for r in rs])
    summary[impl] = st
    print(f"{impl:<11}{st:>9.3f}{ss:>10.3f}{ts:>9.3f}{stok:>14.0f}{ttok:>13.0f}")
if "trl" in summary and "rlvr" in summary:
    print(f"speed-up per RL step, TRL / rlvr (same work): {summary['trl'] / summary['rlvr']:.1f}x")
if "trl" in summary and "rlvr_unshared" in summary:
    print(f"speed-up per RL step, TRL / rlvr without the shared prompt (same work): {summary['trl'] / summary['rlvr_unshared']:.1f}x")
if "trl" in summary and "rlvr_skip" in summary:
    print(f"speed-up per RL step, TRL / rlvr default (zero-gradient rows skipped): {summary['trl'] / summary['rlvr_skip']:.1f}x")
if not same:
    sys.exit("prompt token ids differ between the sides")
PY
