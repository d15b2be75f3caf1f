#!/bin/bash
# Same-behaviour check of the algorithm-config restructuring (issue 43 item 3): with binary BIN,
# one SFT warm start (quickstart --warm-start-only: 11.6% held-out, so that groups have reward variance), then 3 steps of `rlvr train` for every
# preset `rlvr algorithms` lists and for a few regimes (sync interval 4 offset 1, dual-clip, a
# truncated-IS cap, the regularisers, a mismatch correction, a REC ring), a checkpoint at step 3;
# plus the text of `rlvr algorithms`, some `--help`s, `--print-config`s and the errors of bad
# configs (stdout, stderr and exit status). Run it with the binary before and after, then
#   python3 scripts/compare_runs.py OUT/before/runs OUT/after/runs   (JSONL lines, checkpoints)
#   diff -r OUT/before/text OUT/after/text                            (text outputs, byte for byte)
# Usage: scripts/compare/presets.sh BIN OUT TAG
set -euo pipefail
BIN=$1; D=$2/$3
rm -rf "$D"; mkdir -p "$D/runs" "$D/text"; cd "$D"
"$BIN" quickstart --seed 0 --warm-start-only --out "$D/runs/ws" > ws.log 2>&1
CFG="$D/runs/ws/quickstart.toml"
SMALL=(--set data.prompts_per_step=8 --set rollout.group_size=8 --set train.steps=3
       --set train.save_every=3 --set train.eval_every=0 --set train.micro_batch_size=8)
run() { # NAME, then --set pairs
  local name=$1; shift
  "$BIN" train --config "$CFG" --no-progress "${SMALL[@]}" --set output.dir="$D/runs/$name" "$@" \
    > "$D/text/train_$name.out" 2> "$D/text/train_$name.err" || echo "exit $?" >> "$D/text/train_$name.err"
  # The progress text names timings: keep only its exit status and the lines without numbers of seconds.
  grep -v -E '[0-9.]+ ?(s|ms|min)\b|/s\b|elapsed|ETA' "$D/text/train_$name.out" > "$D/text/train_$name.kept" || true
  rm "$D/text/train_$name.out"; grep -v -E '[0-9.]+ ?(s|ms|min)\b|/s\b' "$D/text/train_$name.err" > "$D/text/train_$name.errkept" || true
  rm "$D/text/train_$name.err"
}
for p in $("$BIN" algorithms | grep -E '^[a-z_0-9]+$'); do run "$p" --set algorithm.preset="$p"; done
run off_v4_o1 --set algorithm.preset=off_policy_grpo --set sync.interval=4 --set sync.offset=1
run dual_clip --set algorithm.dual_clip=3.0
run is_cap --set algorithm.is_cap=1.5 --set sync.interval=2
run opmd_tau --set algorithm.preset=opmd --set algorithm.tau=0.3
run asymre_v2 --set algorithm.preset=asymre --set sync.interval=2
run rec_ring --set algorithm.preset=rec_ring_is --set algorithm.clip_low_prime=0.7
run mismatch --set algorithm.mismatch_correction='"token-mask"' --set algorithm.mismatch_low=0.5
run kl --set algorithm.kl_coef=0.01 --set algorithm.kl_estimator='"k2"'
run cosine --set train.schedule='"cosine"' --set train.min_lr=1e-5
# Text outputs: listings, helps, resolved configs, and the errors of bad configs.
t() { local name=$1; shift; { "$BIN" "$@" || echo "exit $?"; } > "$D/text/$name" 2>&1; }
t algorithms algorithms
for c in train sft lab eval plan; do t "help_$c" "$c" --help; done
t print_default train --config "$CFG" --print-config
t print_rec train --config "$CFG" --print-config --set algorithm.preset=rec_ring_is
t print_cispo train --config "$CFG" --print-config --set algorithm.loss='"cispo"'
t print_vllm train --config "$CFG" --print-config --set rollout.backend='"vllm"' --set 'rollout.servers=["http://127.0.0.1:1"]'
i=0
for bad in 'algorithm.tau=0.2' 'algorithm.keep_mask="ring"' 'algorithm.clip_low=2.0' 'algorithm.bogus=1' \
           'algorithm.mismatch_cap=3.0' 'algorithm.mismatch_low=0.5' 'algorithm.dual_clip=0.5' \
           'algorithm.lme_temperature=2.0' 'algorithm.red_drop_rule="bernoulli"' 'model.lora_alpha=4.0' \
           'rollout.servers=["x"]' 'train.min_lr=1e-6' 'algorithm.loss="nope"' 'algorithm.preset="nope"' \
           'algorithm.kl_estimator="k1"' 'algorithm.std_level="batch"' 'algorithm.clip_low_prime=0.7' \
           'algorithm.adv_temperature=2.0' 'algorithm.overlong_buffer_frac=0.5' 'train.dynamic_sampling_max_rounds=2' \
           'algorithm.mismatch_correction="sequence-k3-mask"' 'algorithm.opsm_delta=-1.0' 'algorithm.is_cap=0.0'; do
  i=$((i + 1)); t "bad_$i" train --config "$CFG" --print-config --set "$bad"
done
printf '[algorithm]\nloss = "rec"\ndual_clip = 3.0\n' > "$D/bad_file.toml"
t bad_file train --config "$D/bad_file.toml" --print-config
sed -i "s#$D#ROOT#g" "$D"/text/* 2>/dev/null || true
echo "$D: done"
