#!/usr/bin/env bash
# Same runs, two binaries: the proof that a restructuring changed no behaviour (issue 43).
#
#   bench/same_runs.sh run BIN OUT      runs the set below with rlvr binary BIN into OUT/
#   bench/same_runs.sh resume BIN OLD OUT
#                                       copies OLD/offpolicy (written by another binary) to
#                                       OUT/resume, drops its last checkpoint and resumes it
#                                       with BIN (a checkpoint written by OLD's binary, in-flight
#                                       buffer included); compare OUT/resume with OLD/offpolicy
#   bench/same_runs.sh compare A B      every JSONL line of A and B equal outside timing keys,
#                                       every checkpoint file byte-identical (bench/same_runs.py);
#                                       after `resume`: compare OLD/offpolicy OUT/resume
#
# The set (about a minute on 2 CPU cores; BIN needs the `mpi` feature for `dp2`):
#   qs/          `rlvr quickstart --fast` (init, SFT warm start, on- and off-policy train, eval)
#   warm/        `rlvr quickstart --warm-start-only`: the quickstart's real SFT warm start (~11%
#                held-out accuracy, so that the RL runs below have rewards that differ in a group,
#                hence gradients), the start of every run below
#   quick/       configs/quickstart.toml (as warm/ wrote it) for 8 steps, eval and save every 4
#   offpolicy/   the same, sync.interval = 4, sync.offset = 1 (explorer thread, in-flight buffer)
#   lora/        the same on-policy with model.lora_rank = 4
#   dp2/         the quick run under `mpirun -np 2` (two ranks, one thread each)
#   sft/         `rlvr sft` of warm/'s initial model on its SFT pairs, 12 steps, eval every 6
#   sft-dp2/     the same under `mpirun -np 2` (without --save-every)
# Typical use, before and after a change:
#   bench/same_runs.sh run /work/before/rlvr /tmp/same-before
#   bench/same_runs.sh run target/release/rlvr /tmp/same-after
#   bench/same_runs.sh resume target/release/rlvr /tmp/same-before /tmp/same-after
#   bench/same_runs.sh compare /tmp/same-before /tmp/same-after
#   bench/same_runs.sh compare /tmp/same-before/offpolicy /tmp/same-after/resume
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One thread per process: the same reductions whatever the machine (the kernels are
# thread-count independent anyway, ARCHITECTURE.md).
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-1}
STEPS=8
common=(--no-progress --set train.steps=$STEPS --set train.eval_every=4 --set train.save_every=4
  --set train.keep_last=3 --set data.prompts_per_step=16)

train() { # BIN OUT NAME [args...]
  local bin=$1 out=$2 name=$3
  shift 3
  "$bin" train --config "$out/warm/quickstart.toml" "${common[@]}" \
    --set "output.dir=$out/$name" "$@" >"$out/$name.log" 2>&1 ||
    { echo "same_runs: $name failed (log: $out/$name.log)" >&2; tail -20 "$out/$name.log" >&2; exit 1; }
}

case "${1:-}" in
run)
  bin=$(realpath "$2") out=$3
  rm -rf "$out" && mkdir -p "$out"
  out=$(realpath "$out")
  t0=$SECONDS
  "$bin" quickstart --fast --seed 0 --out "$out/qs" >"$out/qs.log" 2>&1 ||
    { echo "same_runs: quickstart failed" >&2; tail -20 "$out/qs.log" >&2; exit 1; }
  "$bin" quickstart --warm-start-only --seed 0 --out "$out/warm" >"$out/warm.log" 2>&1 ||
    { echo "same_runs: warm start failed" >&2; tail -20 "$out/warm.log" >&2; exit 1; }
  train "$bin" "$out" quick
  train "$bin" "$out" offpolicy --set sync.interval=4 --set sync.offset=1 \
    --set algorithm.preset=off_policy_grpo
  train "$bin" "$out" lora --set model.lora_rank=4
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x RAYON_NUM_THREADS=1 \
    "$bin" train --config "$out/warm/quickstart.toml" "${common[@]}" --set "output.dir=$out/dp2" \
    >"$out/dp2.log" 2>&1 ||
    { echo "same_runs: dp2 failed" >&2; tail -20 "$out/dp2.log" >&2; exit 1; }
  "$bin" sft --model "$out/warm/init" --data "$out/warm/data/sft.jsonl" --config "$out/warm/quickstart.toml" --no-progress \
    --steps 12 --batch-size 8 --micro-batch-size 4 --lr 1e-3 --eval-every 6 --save-every 6 \
    --out "$out/sft" >"$out/sft.log" 2>&1 ||
    { echo "same_runs: sft failed" >&2; tail -20 "$out/sft.log" >&2; exit 1; }
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x RAYON_NUM_THREADS=1 \
    "$bin" sft --model "$out/warm/init" --data "$out/warm/data/sft.jsonl" \
    --config "$out/warm/quickstart.toml" --no-progress --steps 12 --batch-size 8 \
    --micro-batch-size 4 --lr 1e-3 --eval-every 6 --out "$out/sft-dp2" >"$out/sft-dp2.log" 2>&1 ||
    { echo "same_runs: sft-dp2 failed" >&2; tail -20 "$out/sft-dp2.log" >&2; exit 1; }
  echo "same_runs: $bin -> $out in $((SECONDS - t0)) s"
  ;;
resume)
  bin=$(realpath "$2") old=$(realpath "$3") out=$4
  mkdir -p "$out" && out=$(realpath "$out")
  rm -rf "$out/resume" && cp -a "$old/offpolicy" "$out/resume"
  rm -rf "$out/resume/checkpoints/step-$STEPS"
  # The config the run directory recorded (RUN_DIR/config.toml), writing into the copy.
  "$bin" train --resume "$out/resume" --no-progress --set "output.dir=$out/resume" \
    >"$out/resume.log" 2>&1 ||
    { echo "same_runs: resume failed" >&2; tail -20 "$out/resume.log" >&2; exit 1; }
  grep -h "resume" "$out/resume.log" | head -5 || true
  echo "same_runs: $bin resumed $old/offpolicy at its step-$((STEPS / 2)) checkpoint into $out/resume"
  ;;
compare)
  python3 "$here/same_runs.py" "$2" "$3"
  ;;
*)
  sed -n '2,25p' "$0" >&2
  exit 2
  ;;
esac
