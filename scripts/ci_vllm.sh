#!/usr/bin/env bash
# CI for the vLLM rollout backend: install the pinned vLLM CPU build (venv reused when
# present), make two small random Qwen2 checkpoints, start two servers on 127.0.0.1 at once, and run
# the live tests against them in two parallel lanes:
#   lane T, a server on the TIED model: crates/rlvr-vllm/tests/it/live_server.rs, then
#     crates/rlvr-train/tests/it/live_data_parallel.rs (two data-parallel ranks on the server equal one
#     process), then crates/rlvr-reward/tests/it/live_judge.rs (the LLM judge, its answer constrained
#     to its labels), then crates/rlvr-vllm/tests/it/live_killed.rs (which kills that server
#     mid-call); then, on the same core, a third server with --runner pooling on a small random
#     reward model (scripts/make_reward_model.py, which also writes transformers' scores) for
#     crates/rlvr-reward/tests/it/live_reward_model.rs; then, on the same core, a fourth server with
#     LoRA on (LORA_RANK=8) on a small random Phi-3 model laid out as Phi-4-mini is (fused qkv_proj and
#     gate_up_proj in its file, partial rotary 0.75, LongRoPE; --max-model-len 256, its
#     original_max_position_embeddings) for crates/rlvr-vllm/tests/it/live_arch.rs (the architecture
#     whose refresh names differ most from its files: every kind of weight pushed alone reaches the
#     server, adapters by name);
#   lane U, a server on the UNTIED model with LoRA on (LORA_RANK=8: --enable-lora --max-lora-rank 8
#     --max-loras 3) and prefix caching on (PREFIX_CACHING=1 BLOCK_SIZE=32, so that the short
#     episodes' later turns reuse blocks; every live_train and live_lora check then holds with the
#     cache on and rlvr's per-version salt): crates/rlvr-vllm/tests/it/live_train.rs (`rlvr train` with rollout.backend = "vllm":
#     schedule, seed, a server killed mid-run and restarted on the same port for --resume; full-weight
#     refreshes on a LoRA-enabled server), then crates/rlvr-vllm/tests/it/live_lora.rs (LoRA adapters
#     loaded by name: log-probs, a LoRA `rlvr train` on vLLM);
# and stop whatever is left of the servers by their PIDs.
#
#   bash scripts/ci_vllm.sh
#
# Why two lanes: a server start is ~2 minutes of single-threaded Python imports (three processes,
# each importing vllm and torch: vLLM's CPU platform forces `spawn`), and the tests mostly wait on a
# one-thread engine. On a 2-core machine the two starts, and live_train's restart beside lane T's
# tests, overlap almost for free: 461 s one lane after the other, see crates/rlvr-vllm/README.md.
# Each server's engine is pinned to its own core (CPU_BIND), not both to vLLM's "auto" core.
#
# Runs on any x86-64 machine with AVX2: the wheel picks its AVX-512 or AVX2 kernels at import
# (scripts/vllm_server.sh; VLLM_ISA=avx2 forces the AVX2 ones on an AVX-512 machine).
# Fails (non-zero) when the machine lacks AVX2, the install or a server fails, any live test
# fails, or fewer live tests passed than the files hold. The live tests are #[ignore]d in a plain
# `cargo test` (whose count then says they did not run); here they run with --include-ignored,
# and a live test run without its server fails. Prints the time of each phase.
# Environment: as scripts/vllm_server.sh (VENV, ...); RUN: the state directory (default: a new one
# under /tmp), which keeps the servers' and the tests' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
S=scripts/vllm_server.sh
t0=$SECONDS
isa=avx512
if [ "${VLLM_ISA:-}" = avx2 ] || ! grep -q -m1 -w avx512f /proc/cpuinfo; then isa=avx2; fi
echo "ci_vllm: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); vLLM's $isa kernels"
RUN=${RUN:-$(mktemp -d /tmp/rlvr-ci-vllm.XXXXXX)}
RUN_T="$RUN/tied" RUN_U="$RUN/untied"
mkdir -p "$RUN_T" "$RUN_U"
"$S" install
echo "ci_vllm: install/reuse of the venv took $((SECONDS - t0)) s"
t1=$SECONDS
# `cargo test --workspace` (run before this script in .ci/run) has built target/debug/rlvr and the
# test executables; a `cargo build -p rlvr` would resolve features for one package and rebuild most
# dependencies, hence --workspace here too (nothing is recompiled).
export RLVR=${RLVR:-$(pwd)/target/debug/rlvr}
[ -x "$RLVR" ] || cargo build -q --locked --workspace --bin rlvr
# The live tests, run directly from their crate's test executable (`it`: one per crate, each
# live_*.rs file a module of it), not through `cargo test`, which holds the build directory's lock
# while its tests run, so two lanes would run one after the other. The executables' paths come
# from the README's test command with --no-run, all targets as .ci/run built them: with
# `--test ...` filters cargo resolves dev-dependency features otherwise and rebuilt rlvr-kernels,
# -model, -rollout, -vllm and the tests (5 min 20 s on a fresh CI clone).
declare -A EXE
while IFS=' ' read -r crate exe; do EXE[$crate]=$exe; done < <(
  cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "it":
        # crates/NAME/tests/it/main.rs -> crates/NAME
        print(os.path.relpath(m["target"]["src_path"].rsplit("/tests/it/", 1)[0]), m["executable"])')
# The crate directory of a live test module, crates/NAME/tests/it/FILE.rs -> crates/NAME.
crate_of() { local src; src=$(ls crates/*/tests/it/"$1".rs | head -n 1); echo "${src%/tests/it/*}"; }
for f in live_server live_data_parallel live_judge live_killed live_reward_model live_arch live_train live_lora; do
  [ -x "${EXE[$(crate_of "$f")]:-}" ] || { echo "ci_vllm: FAIL: no test executable for $f (cargo test --no-run)" >&2; exit 1; }
done
MODEL="$RUN/model" UNTIED="$RUN/model-untied" RM="$RUN/reward-model-dir"
VENV_PY=${VENV:-$(pwd)/.venv-vllm}/bin/python
rm -rf "$MODEL" "$UNTIED"
"$S" model "$MODEL" --tied true >/dev/null
"$S" model "$UNTIED" --tied false >/dev/null
# Phi-3 as Phi-4-mini lays it out: partial rotary 0.75 and LongRoPE (factors per rotated pair, 12 here),
# whose switch (original_max_position_embeddings 256) the server's --max-model-len must not pass.
PHI3="$RUN/model-phi3"
rm -rf "$PHI3"
"$S" model "$PHI3" --tied false --arch phi3 >/dev/null
python3 - "$PHI3/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(partial_rotary_factor=0.75, original_max_position_embeddings=256, rope_scaling={
    "rope_type": "longrope", "original_max_position_embeddings": 256,
    "short_factor": [1.0 + 0.1 * i for i in range(12)], "long_factor": [1.0 + 0.5 * i for i in range(12)]})
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
# One core each for the two engines where there are two.
BIND_T=auto BIND_U=auto
if [ "$(nproc)" -ge 2 ]; then BIND_T=0 BIND_U=1; fi
RUN_R="$RUN/reward-model"
mkdir -p "$RUN_R"
RUN_P="$RUN/phi3"
mkdir -p "$RUN_P"
trap 'RUN=$RUN_T "$S" stop; RUN=$RUN_U "$S" stop; RUN=$RUN_R "$S" stop; RUN=$RUN_P "$S" stop' EXIT
RUN=$RUN_T CPU_BIND=$BIND_T "$S" start "$MODEL" > "$RUN_T/url" &
start_t=$!
# LoRA and prefix caching on for the untied server (and for live_train.rs's restart of it, which
# inherits LORA_RANK, PREFIX_CACHING and BLOCK_SIZE).
RUN=$RUN_U CPU_BIND=$BIND_U LORA_RANK=8 MAX_LORAS=3 PREFIX_CACHING=1 BLOCK_SIZE=32 "$S" start "$UNTIED" > "$RUN_U/url" &
start_u=$!
wait "$start_t" || { echo "ci_vllm: FAIL: the tied-model server did not start (log: $RUN_T/vllm.log)" >&2; exit 1; }
wait "$start_u" || { echo "ci_vllm: FAIL: the untied-model server did not start (log: $RUN_U/vllm.log)" >&2; exit 1; }
URL_T=$(cat "$RUN_T/url") URL_U=$(cat "$RUN_U/url")
echo "ci_vllm: servers at $URL_T (tied) and $URL_U (untied, LoRA rank ≤ 8, prefix caching on), $((SECONDS - t1)) s after the install"
t2=$SECONDS

# Runs one live test file's tests (the module FILE:: of its crate's test executable, from the
# crate's directory, as cargo would) with the given environment; its output goes to $RUN/FILE.log.
# Fails unless all of the file's tests passed.
live() {
  local file=$1; shift
  local expected log status src crate
  crate=$(crate_of "$file")
  src="$crate/tests/it/$file.rs"
  expected=$(grep -c '^#\[test\]' "$src")
  log="$RUN/$file.log"
  set +e
  (cd "$crate" && env "$@" "${EXE[$crate]}" "$file::" --include-ignored --test-threads 1 --nocapture) > "$log" 2>&1
  status=$?
  set -e
  [ "$status" = 0 ] || { echo "ci_vllm: FAIL: live vLLM tests $file failed (exit $status; log $log)" >&2; return 1; }
  grep -q "test result: ok. $expected passed" "$log" \
    || { echo "ci_vllm: FAIL: expected $expected live vLLM tests in $file to pass; $log says otherwise" >&2; return 1; }
  echo "ci_vllm: $expected live vLLM tests of $file passed ($(grep -o 'finished in [0-9.]*s' "$log"))"
}
lane_t() {
  live live_server RLVR_VLLM_URL="$URL_T" RLVR_VLLM_MODEL="$MODEL" &&
    live live_data_parallel RLVR_VLLM_URL="$URL_T" RLVR_VLLM_MODEL="$MODEL" &&
    live live_judge RLVR_VLLM_URL="$URL_T" RLVR_VLLM_MODEL="$MODEL" &&
    live live_killed RLVR_VLLM_URL="$URL_T" RLVR_VLLM_MODEL="$MODEL" RLVR_VLLM_PID="$(cat "$RUN_T/vllm.pid")" &&
    lane_r
}
# The reward model, after lane T's server is gone, on its core: a pooling server.
lane_r() {
  local t=$SECONDS url
  "$VENV_PY" scripts/make_reward_model.py "$RM" > /dev/null || { echo "ci_vllm: FAIL: make_reward_model.py" >&2; return 1; }
  url=$(RUN=$RUN_R CPU_BIND=$BIND_T RUNNER=pooling SERVED_NAME=rlvr-rm "$S" start "$RM") ||
    { echo "ci_vllm: FAIL: the reward-model server did not start (log: $RUN_R/vllm.log)" >&2; return 1; }
  echo "ci_vllm: reward-model server at $url after $((SECONDS - t)) s"
  live live_reward_model RLVR_RM_URL="$url" RLVR_RM_DIR="$RM" RLVR_RM_NAME=rlvr-rm
  local ok=$?
  RUN=$RUN_R "$S" stop || true
  [ "$ok" = 0 ] && lane_p
}
# Phi-3 (LongRoPE, partial rotary), after the reward model's server is gone, on its core, LoRA on.
lane_p() {
  local t=$SECONDS url
  url=$(RUN=$RUN_P CPU_BIND=$BIND_T LORA_RANK=8 MAX_LORAS=3 MAX_MODEL_LEN=256 "$S" start "$PHI3") ||
    { echo "ci_vllm: FAIL: the Phi-3 server did not start (log: $RUN_P/vllm.log)" >&2; return 1; }
  echo "ci_vllm: Phi-3 server at $url after $((SECONDS - t)) s"
  live live_arch RLVR_VLLM_URL="$url" RLVR_VLLM_MODEL="$PHI3" RLVR_VLLM_LORA_RANK=8
  local ok=$?
  RUN=$RUN_P "$S" stop || true
  echo "ci_vllm: Phi-3 lane took $((SECONDS - t)) s"
  return $ok
}
lane_u() {
  # live_train.rs restarts the server itself (scripts/vllm_server.sh start, same port, RUN,
  # CPU_BIND, LORA_RANK, PREFIX_CACHING and BLOCK_SIZE from here) after killing it.
  live live_train RLVR_VLLM_URL="$URL_U" RLVR_VLLM_MODEL="$UNTIED" RLVR_VLLM_PID="$(cat "$RUN_U/vllm.pid")" \
    RLVR="$RLVR" RUN="$RUN_U" CPU_BIND="$BIND_U" LORA_RANK=8 MAX_LORAS=3 PREFIX_CACHING=1 BLOCK_SIZE=32 &&
    live live_lora RLVR_VLLM_URL="$URL_U" RLVR_VLLM_MODEL="$UNTIED" RLVR_VLLM_LORA_RANK=8 RLVR="$RLVR"
}
lane_t > "$RUN/lane_t.out" 2>&1 &
lt=$!
lane_u > "$RUN/lane_u.out" 2>&1 &
lu=$!
ok=1
wait "$lt" || ok=0
wait "$lu" || ok=0
for f in live_server live_data_parallel live_judge live_killed live_reward_model live_arch live_train live_lora; do
  [ -f "$RUN/$f.log" ] && { echo "--- $f"; cat "$RUN/$f.log"; }
done
cat "$RUN/lane_t.out" "$RUN/lane_u.out"
[ "$ok" = 1 ] || { echo "ci_vllm: FAIL (server logs: $RUN_T/vllm.log, $RUN_U/vllm.log)" >&2; exit 1; }
rm -rf "$MODEL" "$UNTIED" "$RM" "$PHI3" # the logs stay in $RUN
echo "ci_vllm: live tests took $((SECONDS - t2)) s; whole script $((SECONDS - t0)) s"
