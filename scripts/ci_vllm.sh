#!/usr/bin/env bash
# CI for the vLLM rollout backend (issue 15): install the pinned vLLM CPU build (venv reused when
# present), make a small random tied Qwen2 checkpoint, start a server on 127.0.0.1, run
# crates/rlvr-vllm/tests/live_server.rs against it, stop the server by its PID.
#
#   scripts/ci_vllm.sh
#
# Fails (non-zero) when the machine lacks AVX-512, the install or the server fails, any live test
# fails, or fewer live tests ran than the file holds (they must not skip silently:
# RLVR_VLLM_REQUIRED=1 turns a missing server into a failure). Environment: as scripts/vllm_server.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUN=${RUN:-$(mktemp -d /tmp/rlvr-ci-vllm.XXXXXX)}
S=scripts/vllm_server.sh
t0=$SECONDS
"$S" install
echo "ci_vllm: install/reuse took $((SECONDS - t0)) s"
cargo build -q -p rlvr
export RLVR=$(pwd)/target/debug/rlvr
MODEL="$RUN/model"
rm -rf "$MODEL"
"$S" model "$MODEL" --tied true >/dev/null
trap '"$S" stop' EXIT
URL=$("$S" start "$MODEL")
echo "ci_vllm: server at $URL after $((SECONDS - t0)) s"
expected=$(grep -c '^#\[test\]' crates/rlvr-vllm/tests/live_server.rs)
LOG="$RUN/live_tests.log"
set +e
RLVR_VLLM_URL="$URL" RLVR_VLLM_MODEL="$MODEL" RLVR_VLLM_REQUIRED=1 \
  cargo test -p rlvr-vllm --test live_server -- --test-threads 1 --nocapture 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
set -e
[ "$status" = 0 ] || { echo "ci_vllm: live vLLM tests failed (server log: $RUN/vllm.log)"; exit 1; }
grep -q "test result: ok. $expected passed" "$LOG" \
  || { echo "ci_vllm: expected $expected live vLLM tests to pass, the log says otherwise"; exit 1; }
echo "ci_vllm: $expected live vLLM tests passed in $((SECONDS - t0)) s"
