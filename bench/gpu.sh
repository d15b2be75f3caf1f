#!/usr/bin/env bash
# GPU benchmark, rlvr vs PyTorch/transformers, in one invocation (DESIGN.md section 9).
#
# Model: `rlvr init` Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4864,
# vocab 151936, tied), random bf16 weights; both sides load the same directory.
#   sampling: batch 64 and 256, 128-token random prompts, 256 new tokens, EOS disabled (min = max new
#             tokens), T = 1, top-p 1; tok/s and, for rlvr, the per-decode-step breakdown.
#   training: 16 x 512 tokens and 4 x 4096 (a reasoning length, where attention's T^2 part dominates),
#             forward + backward + AdamW; rlvr with the candle composition (`--fused none`) and with
#             every fused kernel (`--fused all`, issue 44) against PyTorch eager; tok/s, TFLOP/s
#             (6 x parameters x tok/s), the GPU's peak memory while each ran (nvidia-smi's memory.used
#             polled every 50 ms, less its value before; the same for both sides) and, for rlvr,
#             `rlvr plan`'s estimate of the same step (`plan_peak_mib`); PyTorch's own
#             max_memory_allocated too.
#
# Build here (no GPU needed), carry the binary, run on the GPU machine:
#   scripts/cuda-build.sh --bin rlvr && strip -o /tmp/rlvr-cuda target-cuda/release/rlvr \
#     && gzip -c /tmp/rlvr-cuda > bench/rlvr-cuda.gz         (17 MB; git ignores it: carry it)
#   bench/gpu.sh                      (on the GPU machine, from the repository root)
# Environment: STEP_TIMEOUT (seconds per measurement, default 300), RLVR (binary; default target-cuda/release/rlvr, else bench/rlvr-cuda.gz unpacked to /tmp),
# PYTHON (default /opt/torch/.venv/bin/python), DEVICE (cuda:0), DTYPE (bf16), RUNS (timed sampling runs,
# default 1, after a warm-up), TOKENIZER (a tokenizer.json; default the Qwen2.5 one in data/, else a
# stand-in written with the `tokenizers` package: only the ids matter here), SMALL=1 (a tiny shape on the CPU
# to check the script itself: DEVICE=cpu DTYPE=f32 SMALL=1 bench/gpu.sh), TRAIN (the training shapes,
# ROWSxSEQ, default "16x512 4x4096"), FUSED (the rlvr variants, default "none all"; each a
# `--fused` list), LONG_NONE=1 (also `--fused none` at sequences over 1024 tokens: skipped by
# default, its materialised [heads, T, T] scores take minutes or the GPU's memory at 4 x 4096),
# SAMPLE=0 (no sampling rows: bench/gpu_check.sh's sampling part measures them).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda:0}
DTYPE=${DTYPE:-bf16}
RUNS=${RUNS:-1}
PY=${PYTHON:-/opt/torch/.venv/bin/python}
W=$(mktemp -d /tmp/gpu_bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
for CU in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$CU" ] && export LD_LIBRARY_PATH=$CU${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
if [ -z "${RLVR:-}" ]; then
  if [ -x target-cuda/release/rlvr ]; then RLVR=target-cuda/release/rlvr
  elif [ -f bench/rlvr-cuda.gz ]; then gunzip -c bench/rlvr-cuda.gz > "$W/rlvr" && chmod +x "$W/rlvr" && RLVR=$W/rlvr
  else echo "no rlvr binary: set RLVR or build with scripts/cuda-build.sh" >&2; exit 2; fi
fi
if [ "${SMALL:-0}" = 1 ]; then
  SHAPE=(--hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 --vocab-size 4096)
  BATCHES=(--batch 4 --batch 8); PLEN=16; NEW=16; TRAIN=${TRAIN:-"2x64 1x256"}
else
  SHAPE=(--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864 --vocab-size 151936)
  BATCHES=(--batch 64 --batch 256); PLEN=128; NEW=256; TRAIN=${TRAIN:-"16x512 4x4096"}
fi
FUSED=${FUSED:-"none all"}
TOK=${TOKENIZER:-data/tokenizers/qwen2.5/tokenizer.json}
# SMALL's vocabulary is smaller than Qwen2.5's tokenizer: the stand-in below, unless one is given.
[ "${SMALL:-0}" = 1 ] && [ -z "${TOKENIZER:-}" ] && TOK=$W/tokenizer.json
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
# (`--foreground`: under bench/gpu_check.sh's part limit, a killed part takes its steps along.)
step() { echo "## $1" >&2; shift; timeout --foreground -k 5 "${STEP_TIMEOUT:-300}" "$@" | tee -a "$OUT" || echo "## failed (rc $?): $*" >&2; }
TDEV=${DEVICE/cuda:*/cuda}
if [ "${SAMPLE:-1}" != 0 ]; then
  step "rlvr sampling" "$RLVR" bench sample "${M[@]}" "${BATCHES[@]}" --prompt-len $PLEN --new-tokens $NEW --runs "$RUNS"
  step "transformers generate" "$PY" bench/gpu_torch.py --model "$W/model" --device "$TDEV" --dtype "$DTYPE" \
    sample "${BATCHES[@]}" --prompt-len $PLEN --new-tokens $NEW --runs "$RUNS"
fi
# The GPU's memory in use (MiB) on DEVICE's index, or nothing without nvidia-smi.
GPU_INDEX=${DEVICE#cuda:}; [ "$GPU_INDEX" = "$DEVICE" ] && GPU_INDEX=0
gpu_used() { command -v nvidia-smi >/dev/null && [ "${DEVICE%%:*}" != cpu ] &&
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" | head -1; }
# mstep LABEL CMD...: as step, with the GPU's peak memory while CMD ran (less the memory in use
# before it) added to CMD's JSON line as "gpu_peak_mib" (null without nvidia-smi or on the CPU).
mstep() {
  local label=$1; shift
  echo "## $label" >&2
  local base poll="" peak=null
  base=$(gpu_used || true)
  if [ -n "$base" ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" -lms 50 > "$W/poll" &
    poll=$!
  fi
  local rc=0
  timeout --foreground -k 5 "${STEP_TIMEOUT:-300}" "$@" > "$W/line" || rc=$?
  if [ -n "$poll" ]; then
    kill "$poll" 2>/dev/null || true; wait "$poll" 2>/dev/null || true
    peak=$(sort -n "$W/poll" | tail -1 | awk -v b="$base" '{print $1 - b}')
  fi
  [ "$rc" = 0 ] || echo "## failed (rc $rc): $*" >&2
  { grep '^{' "$W/line" || true; } | tail -1 | sed "s/}\$/, \"gpu_peak_mib\": ${peak:-null}}/" | tee -a "$OUT"
}
for shape in $TRAIN; do
  rows=${shape%x*}; seq=${shape#*x}
  for f in $FUSED; do
    if [ "$f" = none ] && [ "$seq" -gt 1024 ] && [ "${LONG_NONE:-0}" != 1 ]; then
      echo "## skipped: rlvr --fused none at ${rows}x$seq (LONG_NONE=1 runs it)" >&2; continue
    fi
    mstep "rlvr training step ${rows}x$seq --fused $f" "$RLVR" bench train "${M[@]}" --rows "$rows" \
      --seq-len "$seq" --steps 3 --fused "$f"
  done
  mstep "pytorch training step ${rows}x$seq" "$PY" bench/gpu_torch.py --model "$W/model" --device "$TDEV" \
    --dtype "$DTYPE" train --rows "$rows" --seq-len "$seq" --steps 3
done
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
# Training: one block per shape; rlvr's variants by the kernels that ran (`kernels` names the
# switches; `attention` what the plan counted), each against PyTorch eager.
mib = lambda r, k: f"{r[k]:.0f}" if r and r.get(k) is not None else "-"
for shape in dict.fromkeys((r["rows"], r["seq_len"]) for r in rows if r["what"] == "train"):
    n, t = shape
    p = get("pytorch", "train", rows=n, seq_len=t)
    ours = [r for r in rows if r["impl"] == "rlvr" and r["what"] == "train" and (r["rows"], r["seq_len"]) == shape]
    print(f"training {n} x {t}: pytorch {p['tok_per_s']:.0f} tok/s, {p['tflop_per_s']:.1f} TFLOP/s, peak {mib(p, 'gpu_peak_mib')} MiB"
          f" (torch max allocated {mib(p, 'max_allocated_mib')})" if p else f"training {n} x {t}: pytorch -")
    for a in ours:
        on = [kv.split("=")[0] for kv in a.get("kernels", "").split() if kv.endswith("=on")]
        on = [k for k in on if k not in ("decode", "cuda_graphs")]
        fused = "--fused " + ("none" if not on else "all" if len(on) == 6 else ",".join(on))
        ratio = f"{a['tok_per_s'] / p['tok_per_s']:.2f}x" if p else "-"
        mem = f"{a['gpu_peak_mib'] / p['gpu_peak_mib']:.2f}x" if p and a.get("gpu_peak_mib") and p.get("gpu_peak_mib") else "-"
        print(f"  rlvr {fused:<10} {a['tok_per_s']:>9.0f} tok/s ({ratio} pytorch; target >= 0.8x at 16 x 512)"
              f", {a['tflop_per_s']:.1f} TFLOP/s, peak {mib(a, 'gpu_peak_mib')} MiB ({mem} pytorch)"
              f", plan {mib(a, 'plan_peak_mib')} MiB ({a.get('attention', '-')} attention)")
        if p:
            print(f"    s: forward {a['forward_s']:.3f} / {p['forward_s']:.3f}, backward {a['backward_s']:.3f} / {p['backward_s']:.3f},"
                  f" optimizer {a['optimizer_s']:.3f} / {p['optimizer_s']:.3f} (rlvr / pytorch)")
PY
