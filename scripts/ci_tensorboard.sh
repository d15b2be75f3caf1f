#!/usr/bin/env bash
# TensorBoard's own reader on rlvr's event files (issue 32): installs the `tensorboard` package
# into a venv (TB_VENV, default target/tb-venv; reused when present), makes a finished run and a
# SIGKILLed one with the debug binary that `cargo test` built, resumes the killed one, and checks
# with scripts/check_tensorboard.py that each event file holds the scalars of its JSONL files.
# Called by .ci/run after the tests; prints how long the install and the check took.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TB_VENV:-target/tb-venv}
R=${RLVR_BIN:-target/debug/rlvr}
t0=$SECONDS
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "tensorboard==2.21.0"
fi
echo "ci_tensorboard: venv ready in $((SECONDS - t0)) s ($("$VENV/bin/python" -c 'import tensorboard; print(tensorboard.__version__)'))"
t1=$SECONDS
[ -x "$R" ] || cargo build -q --locked --workspace --bins
W=$(mktemp -d)
trap 'kill -9 "${pid:-}" 2>/dev/null || true; rm -rf "$W"' EXIT
"$R" init --arch qwen2 --hidden 16 --layers 1 --heads 2 --kv-heads 1 --intermediate 32 \
  --tokenizer data/tokenizers/qwen2.5/tokenizer.json --out "$W/model" > /dev/null
sets=(--set "model.path=\"$W/model\"" --set 'model.device="cpu"' --set 'model.dtype="f32"'
  --set 'data.task="arithmetic"' --set data.arithmetic.min_digits=1 --set data.arithmetic.max_digits=1 --set data.arithmetic.train_size=64 --set data.arithmetic.test_size=4
  --set data.prompts_per_step=2 --set rollout.group_size=4 --set rollout.max_new_tokens=4
  --set train.lr=1e-2 --set train.steps=5 --set train.eval_every=2 --set train.save_every=2
  --set train.skip_zero_gradient_rows=false)  # every step trains tokens: its ratio histogram has counts
"$R" train --no-progress "${sets[@]}" --set "output.dir=\"$W/done\"" > /dev/null 2> "$W/done.log" || { cat "$W/done.log"; exit 1; }
# Killed after step 3 (the hang hook), then resumed from step 2's checkpoint.
RLVR_DEBUG_HANG_AFTER_STEP=3 "$R" train --no-progress "${sets[@]}" --set "output.dir=\"$W/killed\"" \
  > /dev/null 2> "$W/killed.log" &
pid=$!
for _ in $(seq 600); do
  # metrics.jsonl: the step-0 evaluation line, then one per step.
  if [ -f "$W/killed/metrics.jsonl" ] && [ "$(wc -l < "$W/killed/metrics.jsonl")" -ge 4 ]; then break; fi
  sleep 0.2
done
sleep 0.5
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
cp -r "$W/killed" "$W/killed-before-resume"
rm -f "$W/killed-before-resume/.lock"
"$R" train --no-progress --resume "$W/killed" > /dev/null 2> "$W/resumed.log" || { cat "$W/resumed.log"; exit 1; }
"$VENV/bin/python" scripts/check_tensorboard.py "$W/done" "$W/killed-before-resume" "$W/killed"
grep -q '^step 5/5 ' "$W/done.log" || { echo "ci_tensorboard: no console step line"; cat "$W/done.log"; exit 1; }
echo "ci_tensorboard: runs and check in $((SECONDS - t1)) s"
