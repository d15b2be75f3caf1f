#!/usr/bin/env bash
# Data parallel (mpirun -np 2, native engine, CPU) with sync.offset 0 against 1 (sync.interval 1):
# a random model (hidden 256, 6 layers) on the "every answer is 5" task, 8 steps of 8 prompts × 8
# completions of 48 new tokens; prints the wall time of each run and the mean sample and train
# seconds per step (metrics.jsonl). Extra arguments go to every run (e.g. DAPO:
# --set 'algorithm.preset="dapo"' --set train.dynamic_sampling_max_rounds=1).
# Usage: RLVR=target/debug/rlvr bash bench/dp_offset.sh [--set ...]   (a binary built with --features mpi)
set -euo pipefail
RLVR=${RLVR:-target/release/rlvr}
RLVR=$(realpath "$RLVR")
D=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
chars = "0123456789+-*= #\n"
vocab = {c: i for i, c in enumerate(chars)}
unk = len(chars)
vocab["<unk>"] = unk
vocab["<|endoftext|>"] = unk + 1
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": unk + 1, "content": "<|endoftext|>", "single_word": False,
                         "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
       "normalizer": None,
       "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?s)."}, "behavior": "Isolated", "invert": False},
       "post_processor": None, "decoder": {"type": "Fuse"},
       "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
open(f"{d}/tokenizer.json", "w").write(json.dumps(tok))
rows = [json.dumps({"question": f"{i % 10}+{(i + 3) % 10}=", "answer": "5"}) for i in range(64)]
open(f"{d}/five.jsonl", "w").write("\n".join(rows))
PY
"$RLVR" init --hidden 256 --layers 6 --heads 8 --kv-heads 4 --intermediate 768 \
  --max-position-embeddings 128 --tokenizer "$D/tokenizer.json" --out "$D/model" >/dev/null
for off in 0 1 0 1; do
  rm -rf "$D/run"
  t0=$(date +%s.%N)
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x RAYON_NUM_THREADS=1 \
    "$RLVR" train --no-progress --set model.path="\"$D/model\"" --set output.dir="\"$D/run\"" \
    --set model.device='"cpu"' --set model.dtype='"f32"' --set data.task='"jsonl"' \
    --set data.train="\"$D/five.jsonl\"" --set data.test="\"$D/five.jsonl\"" \
    --set 'data.verifier={ kind = "arithmetic" }' --set eval.limit=4 --set data.prompts_per_step=8 \
    --set rollout.group_size=8 --set rollout.max_new_tokens=48 --set train.lr=1e-3 \
    --set train.steps=8 --set train.eval_every=0 --set train.save_every=0 \
    --set train.micro_batch_size=8 --set sync.interval=1 --set sync.offset=$off "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  python3 - "$D/run/metrics.jsonl" "$off" "$t0" "$t1" <<'PY'
import json, sys
ls = [json.loads(l) for l in open(sys.argv[1])]
ls = [l for l in ls if l.get("step", 0) > 0]
n = len(ls)
print("offset %s: %.1f s; per step: sample %.2f s, train %.2f s (%d steps)" % (
    sys.argv[2], float(sys.argv[4]) - float(sys.argv[3]),
    sum(l["time/sample_s"] for l in ls) / n, sum(l["time/train_s"] for l in ls) / n, n))
PY
done
rm -rf "$D"
