#!/usr/bin/env bash
# GPU benchmark, rlvr vs PyTorch/transformers, in one invocation (DESIGN.md section 9).
#
# Model: `rlvr init` Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4864,
# vocab 151936, tied), random bf16 weights; both sides load the same directory.
#   sampling: batch 64 and 256, 128-token random prompts, 256 new tokens, EOS disabled (min = max new
#             tokens), T = 1, top-p 1; tok/s and, for rlvr, the per-decode-step breakdown.
#   training: 16 x 512 tokens, forward + backward + AdamW; tok/s and TFLOP/s (6 x parameters x tok/s).
#
# Build here (no GPU needed), carry the binary, run on the GPU machine:
#   scripts/cuda-build.sh --bin rlvr && strip -o /tmp/rlvr-cuda target-cuda/release/rlvr \
#     && gzip -c /tmp/rlvr-cuda > bench/rlvr-cuda.gz         (17 MB; git ignores it: carry it)
#   bench/gpu.sh                      (on the GPU machine, from the repository root)
# Environment: STEP_TIMEOUT (seconds per measurement, default 300), RLVR (binary; default target-cuda/release/rlvr, else bench/rlvr-cuda.gz unpacked to /tmp),
# PYTHON (default /opt/torch/.venv/bin/python), DEVICE (cuda:0), DTYPE (bf16), RUNS (timed sampling runs,
# default 1, after a warm-up), TOKENIZER (a tokenizer.json; default the Qwen2.5 one in data/, else a
# stand-in written with the `tokenizers` package: only the ids matter here), SMALL=1 (a tiny shape on the CPU
# to check the script itself: DEVICE=cpu DTYPE=f32 SMALL=1 bench/gpu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda:0}
DTYPE=${DTYPE:-bf16}
RUNS=${RUNS:-1}
PY=${PYTHON:-/opt/torch/.venv/bin/python}
W=$(mktemp -d /tmp/gpu_bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
CU=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
[ -d "$CU" ] && export LD_LIBRARY_PATH=$CU:${LD_LIBRARY_PATH:-}
if [ -z "${RLVR:-}" ]; then
  if [ -x target-cuda/release/rlvr ]; then RLVR=target-cuda/release/rlvr
  elif [ -f bench/rlvr-cuda.gz ]; then gunzip -c bench/rlvr-cuda.gz > "$W/rlvr" && chmod +x "$W/rlvr" && RLVR=$W/rlvr
  else echo "no rlvr binary: set RLVR or build with scripts/cuda-build.sh" >&2; exit 2; fi
fi
if [ "${SMALL:-0}" = 1 ]; then
  SHAPE=(--hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 --vocab-size 4096)
  BATCHES=(--batch 4 --batch 8); PLEN=16; NEW=16; ROWS=2; SEQ=64
else
  SHAPE=(--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --vocab-size 151936)
  BATCHES=(--batch 64 --batch 256); PLEN=128; NEW=256; ROWS=16; SEQ=512
fi
TOK=${TOKENIZER:-data/tokenizers/qwen2.5/tokenizer.json}
if [ ! -f "$TOK" ]; then
  TOK=$W/tokenizer.json
  "$PY" - "$TOK" <<'PY'
import sys
from tokenizers import Tokenizer, models
Tokenizer(models.WordLevel({"<unk>": 0, "<|endoftext|>": 1}, unk_token="<unk>")).save(sys.argv[1])
PY
fi
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n) device=$DEVICE dtype=$DTYPE"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$RLVR" init --arch qwen2 "${SHAPE[@]}" --tie-embeddings true --tokenizer "$TOK" --dtype "$DTYPE" \
  --seed 0 --out "$W/model" >/dev/null
OUT=$W/results.jsonl
M=(--model "$W/model" --device "$DEVICE" --dtype "$DTYPE")
step() { echo "## $1" >&2; shift; timeout "${STEP_TIMEOUT:-300}" "$@" | tee -a "$OUT" || echo "## failed (rc $?): $*" >&2; }
TDEV=${DEVICE/cuda:*/cuda}
step "rlvr sampling" "$RLVR" bench sample "${M[@]}" "${BATCHES[@]}" --prompt-len $PLEN --new-tokens $NEW --runs "$RUNS"
step "transformers generate" "$PY" bench/gpu_torch.py --model "$W/model" --device "$TDEV" --dtype "$DTYPE" \
  sample "${BATCHES[@]}" --prompt-len $PLEN --new-tokens $NEW --runs "$RUNS"
step "rlvr training step" "$RLVR" bench train "${M[@]}" --rows $ROWS --seq-len $SEQ --steps 3
step "pytorch training step" "$PY" bench/gpu_torch.py --model "$W/model" --device "$TDEV" --dtype "$DTYPE" \
  train --rows $ROWS --seq-len $SEQ --steps 3
"$PY" - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
get = lambda impl, what, **k: next((r for r in rows if r["impl"] == impl and r["what"] == what
                                    and all(r.get(a) == b for a, b in k.items())), None)
print(f"{'measurement':<28}{'rlvr':>12}{'pytorch':>12}{'rlvr/pt':>9}   target")
for b in sorted({r["batch"] for r in rows if r["what"] == "sample"}):
    a, p = get("rlvr", "sample", batch=b), get("pytorch", "sample", batch=b)
    ra = f"{a['tok_per_s']:.0f}" if a else "-"; rp = f"{p['tok_per_s']:.0f}" if p else "-"
    ratio = f"{a['tok_per_s'] / p['tok_per_s']:.2f}" if a and p else "-"
    print(f"{'sampling tok/s, batch ' + str(b):<28}{ra:>12}{rp:>12}{ratio:>9}   {'>= 3x at the largest batch' if b >= 256 else ''}")
    if a:
        s = a["step_ms"]
        print(f"  rlvr ms/step: total {s['total']:.2f} = forward {s['forward']:.2f} + logits to host {s['to_host']:.2f}"
              f" + select {s['select']:.2f} + compact {s['compact']:.2f}; prefill {a['prefill_s']:.3f} s")
    if p:
        print(f"  pytorch ms/step (whole generate / new tokens): {p['step_ms']['total']:.2f}")
a, p = get("rlvr", "train"), get("pytorch", "train")
for key, label in (("tok_per_s", "training tok/s"), ("tflop_per_s", "training TFLOP/s")):
    ra = f"{a[key]:.1f}" if a else "-"; rp = f"{p[key]:.1f}" if p else "-"
    ratio = f"{a[key] / p[key]:.2f}" if a and p else "-"
    print(f"{label:<28}{ra:>12}{rp:>12}{ratio:>9}   {'>= 0.5x' if key == 'tok_per_s' else ''}")
if a and p:
    print(f"  forward s: rlvr {a['forward_s']:.3f}, pytorch {p['forward_s']:.3f}; step s: rlvr {a['step_s']:.3f}, pytorch {p['step_s']:.3f}")
    if "backward_s" in a and "backward_s" in p:
        print(f"  backward s: rlvr {a['backward_s']:.3f}, pytorch {p['backward_s']:.3f}; optimizer s: rlvr {a['optimizer_s']:.3f}, pytorch {p['optimizer_s']:.3f}")
PY
