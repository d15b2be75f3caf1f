#!/usr/bin/env bash
# Data parallel on one machine: the RL-step workload of bench/workload.sh (43 M-parameter qwen2
# shape, 4 GSM8K prompts × 8 completions × 32 new tokens, GRPO) as
#   A: one process with 2 threads          (RAYON_NUM_THREADS=2 rlvr train)
#   B: two ranks with 1 thread each        (mpirun -np 2 -x RAYON_NUM_THREADS=1 rlvr train)
# run in turn, A B A B ..., ROUNDS times, each 1 + STEPS trainer steps (the first a warm-up, not
# counted). Per step: sample_s and train_s from metrics.jsonl (under mpirun the slowest rank's),
# and under mpirun time/comm_s from diagnostics.jsonl (rank 0's time inside collectives: the
# communication and the wait for the other rank). Then the all-reduce bandwidth at 2 ranks
# (rlvr-dist-check --case bandwidth). Medians are printed. Then memory per rank at 2 ranks with
# ZeRO stage 0, 1 and 2: each rank's peak RSS (/usr/bin/time -f %M around each rank) next to
# `rlvr plan --world-size 2 --zero Z`'s training-step peak for the same config, and the median
# step and training times of those runs' steps 2 and 3.
#
#   bench/data_parallel.sh [STEPS] [ROUNDS]        defaults: 3 timed steps, 3 rounds
#   MEMORY_ONLY=1 bench/data_parallel.sh           the memory part alone
#
# Needs OpenMPI (apt: openmpi-bin libopenmpi-dev libclang-dev) and builds
# `cargo build --release -p rlvr -p rlvr-dist --features rlvr/mpi,rlvr-dist/mpi` unless RLVR (an
# rlvr binary built with the mpi feature) and CHECK (rlvr-dist-check) are given. KEEP=1 keeps the
# work directory. DATA (default data).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-3}
ROUNDS=${2:-3}
DATA=${DATA:-data}
W=$(mktemp -d /tmp/data_parallel.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ -z "${RLVR:-}" ] || [ -z "${CHECK:-}" ]; then
  cargo build --release -q -p rlvr -p rlvr-dist --features rlvr/mpi,rlvr-dist/mpi \
    --bin rlvr --bin rlvr-dist-check
  RLVR=target/release/rlvr
  CHECK=target/release/rlvr-dist-check
fi
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(mpirun --version | head -n 1)"
# shellcheck source=bench/workload.sh
source bench/workload.sh
bench_workload_files "$DATA"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
run() { # $1 = one|dp, $2 = round
  local dir="$W/$1-$2"
  local sets=("${BENCH_WORKLOAD_SETS[@]}" --set train.steps=$((STEPS + 1))
    --set train.skip_zero_gradient_rows=false --set output.dir="\"$dir\"")
  if [ "$1" = one ]; then
    RAYON_NUM_THREADS=2 "$RLVR" train --no-progress "${sets[@]}" >/dev/null 2>"$dir.log" \
      || { cat "$dir.log"; exit 1; }
  else
    "${MPIRUN[@]}" -x RAYON_NUM_THREADS=1 "$RLVR" train --no-progress "${sets[@]}" >/dev/null \
      2>"$dir.log" || { cat "$dir.log"; exit 1; }
  fi
}
if [ "${MEMORY_ONLY:-0}" != 1 ]; then
for r in $(seq 1 "$ROUNDS"); do
  run one "$r"
  run dp "$r"
done
python3 - "$W" "$ROUNDS" <<'PY'
import json, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
def steps(d):
    m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
    g = {json.loads(l)["step"]: json.loads(l) for l in open(f"{d}/diagnostics.jsonl")}
    return [(l["time/sample_s"], l["time/train_s"], g[l["step"]].get("time/comm_s"))
            for l in m if l["step"] >= 2]  # step 1 is the warm-up
for side, label in (("one", "1 process x 2 threads"), ("dp", "2 ranks x 1 thread (mpirun)")):
    rows = [s for r in range(1, rounds + 1) for s in steps(f"{w}/{side}-{r}")]
    med = lambda xs: statistics.median(xs)
    step = [a + b for a, b, _ in rows]
    out = {"side": label, "steps": len(rows), "step_s": round(med(step), 3),
           "sample_s": round(med([a for a, _, _ in rows]), 3),
           "train_s": round(med([b for _, b, _ in rows]), 3)}
    comm = [c for _, _, c in rows if c is not None]
    if comm:
        out["comm_s"] = round(med(comm), 3)
        out["comm_share"] = round(med([c / (a + b) for a, b, c in rows]), 3)
    print(json.dumps(out))
PY
echo "# all-reduce, f32 SUM in place, 2 ranks (rlvr-dist MpiComm over $(mpirun --version | head -n 1))"
"${MPIRUN[@]}" "$CHECK" --case bandwidth
fi

echo "# memory per rank at 2 ranks, ZeRO-0, 1 and 2: peak RSS of each rank (GNU time), and rlvr plan's peaks"
printf '' > "$W/empty.toml"
# Two models: the workload's (39 M of its 43 M parameters are the tied embedding, one tensor,
# which whole-parameter sharding cannot split), and one whose parameters sit in its layers
# (hidden 1024, 8 layers, a character vocabulary: 134 M parameters, the embedding 0.07 M).
python3 - "$W/char.json" <<'PY'
import json, sys
chars = "0123456789+-*= #\n"
vocab = {c: i for i, c in enumerate(chars)}
vocab["<unk>"] = len(chars); vocab["<|endoftext|>"] = len(chars) + 1
json.dump({"version": "1.0", "truncation": None, "padding": None,
  "added_tokens": [{"id": len(chars) + 1, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                    "rstrip": False, "normalized": False, "special": True}],
  "normalizer": None, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?s)."}, "behavior": "Isolated", "invert": False},
  "post_processor": None, "decoder": {"type": "Fuse"},
  "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}, open(sys.argv[1], "w"))
PY
"$RLVR" init --arch qwen2 --hidden 1024 --layers 8 --heads 8 --kv-heads 8 --intermediate 4096 \
  --max-position-embeddings 256 --tokenizer "$W/char.json" --seed 0 --out "$W/layers" >/dev/null
LAYER_SETS=(--set model.path="\"$W/layers\"" --set model.dtype='"f32"' --set model.device='"cpu"'
  --set data.task='"arithmetic"' --set data.prompts_per_step=4 --set rollout.group_size=8
  --set rollout.max_new_tokens=16 --set train.lr=1e-6 --set train.eval_every=0)
for m in embedding layers; do
for z in 0 1 2; do
  dir="$W/$m-zero$z"
  if [ $m = embedding ]; then sets=("${BENCH_WORKLOAD_SETS[@]}"); else sets=("${LAYER_SETS[@]}"); fi
  "${MPIRUN[@]}" -x RAYON_NUM_THREADS=1 /usr/bin/time -f "rank peak RSS kB %M" \
    "$RLVR" train --no-progress "${sets[@]}" --set train.steps=3 \
    --set train.skip_zero_gradient_rows=false --set distributed.zero=$z --set output.dir="\"$dir\"" \
    >/dev/null 2>"$dir.log" || { cat "$dir.log"; exit 1; }
  plan=$("$RLVR" plan --config "$W/empty.toml" "${sets[@]}" --world-size 2 --zero $z --json | tail -n 1)
  python3 - "$dir.log" "$z" "$plan" "$m" "$dir" <<'PY'
import json, re, statistics, sys
rss = [int(x) * 1024 for x in re.findall(r"rank peak RSS kB (\d+)", open(sys.argv[1]).read())]
p = json.loads(sys.argv[3])
mib = lambda b: round(b / 2**20, 1)
m = [json.loads(l) for l in open(f"{sys.argv[5]}/metrics.jsonl")]
later = [l for l in m if l["step"] >= 2]  # step 1 is the warm-up
med = lambda k: round(statistics.median(l[k] for l in later), 3)
print(json.dumps({"model": sys.argv[4], "zero": int(sys.argv[2]), "peak_rss_mib_per_rank": [mib(x) for x in rss],
                  "step_s": round(statistics.median(l["time/sample_s"] + l["time/train_s"] for l in later), 3),
                  "train_s": med("time/train_s"),
                  "plan_train_peak_mib": mib(p["train_peak"]), "plan_sampling_peak_mib": mib(p["rollout_peak"]),
                  "plan_moments_mib": mib(p["adamw_moments"]), "plan_reduction_buffer_mib": mib(p["reduction_buffer"])}))
PY
done
done
