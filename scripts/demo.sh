#!/usr/bin/env bash
# A 30-second tour of the lower-level commands (`rlvr quickstart` is the end-to-end demo): builds rlvr, writes a tiny random
# Qwen2-shaped checkpoint with the Qwen2.5 tokenizer from data/, samples a group of
# completions with behaviour log-probs, re-scores them with the trainer's forward, and scores a GSM8K
# answer. No downloads, no GPU. Output goes to runs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
TOK=${TOKENIZER:-data/tokenizers/qwen2.5/tokenizer.json}
# RLVR_BIN: an rlvr binary to use instead of building one (the build goes to $CARGO_TARGET_DIR, else target/).
R=${RLVR_BIN:-${CARGO_TARGET_DIR:-target}/release/rlvr}
[ -n "${RLVR_BIN:-}" ] || cargo build --release -q --locked -p rlvr
OUT=runs/demo
rm -rf "$OUT"; mkdir -p "$OUT"
$R init --arch qwen2 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 256 \
  --tokenizer "$TOK" --out "$OUT/model"
$R generate --model "$OUT/model" --prompt "What is 7 times 6?" --chat -n 4 --max-new-tokens 16 \
  --seed 0 --out "$OUT/experiences.jsonl" > "$OUT/generate.jsonl"
echo "sampled $(wc -l < "$OUT/generate.jsonl") completions -> $OUT/generate.jsonl"
$R logprobs --model "$OUT/model" --prompt "What is 7 times 6?" --completion " 42<|im_end|>" --chat
$R reward --completion "7 times 6 is **42**." --reference "#### 42"
$R algorithms | head -12
