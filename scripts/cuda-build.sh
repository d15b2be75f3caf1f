#!/usr/bin/env bash
# Builds rlvr with `--features cuda` on a machine that has neither a GPU nor a CUDA toolkit, from
# PyPI wheels of CUDA 13.0. 13.0 and not newer: the GPU machine's driver (580) speaks CUDA 13.0, and
# a newer nvcc emits PTX that driver cannot load.
#
#   scripts/cuda-build.sh [extra cargo args]        e.g. scripts/cuda-build.sh --bin rlvr
#   scripts/cuda-build.sh --bin rlvr --features nccl    (NCCL collectives; also needs libnccl.so.2 at run time)
#
# Output: target-cuda/release/ (CARGO_TARGET_DIR overrides it). To run the binary elsewhere, carry it
# (strip and gzip it first: bench/gpu.sh shows how) and on the GPU machine put the CUDA 13 runtime
# libraries on the library path, e.g. those of a torch venv:
#   export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:$LD_LIBRARY_PATH
# Environment: CUDA_WHEELS (download dir, default /tmp/cuda13-wheels), CUDA_ROOT (unpacked toolkit,
# default /tmp/cuda13), CUDA_COMPUTE_CAP (default 90, Hopper), CUDAFORGE_THREADS (default 2).
# With `nccl` among the arguments, PyPI's nvidia-nccl-cu13 wheel (NCCL_VERSION, default 2.27.7) is
# unpacked too and linked: the binary then needs libnccl.so.2 at start (the GPU machine's torch venv
# has it in site-packages/nvidia/nccl/lib); build a second binary without it as a fallback.
# Needs python3 with pip (for the download), unzip and gcc. Seen working 2026-11-30: a candle 0.11
# binary built this way trained and sampled on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${CUDA_WHEELS:-/tmp/cuda13-wheels}; C=${CUDA_ROOT:-/tmp/cuda13}
T=$C/nvidia/cu13; L=$C/linkdir
if [ ! -x "$T/bin/nvcc" ]; then
  mkdir -p "$W" "$C"
  python3 -m pip download -q --no-deps -d "$W" nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 \
    nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 \
    nvidia-cuda-nvrtc==13.0.88 nvidia-curand==10.4.0.35 nvidia-cublas==13.0.2.14
  for w in "$W"/*.whl; do unzip -q -o "$w" -d "$C"; done
fi
# cudarc links -lcuda -lnvrtc -lcurand -lcublas -lcublasLt and candle-kernels -lcudart; the wheels ship
# versioned .so files only and no libcuda, so make unversioned links and a stub libcuda.so.1 whose
# symbols are every cu* entry point cudarc binds (the driver's real libcuda.so.1 is used at run time).
mkdir -p "$L"
if [ ! -f "$L/libcuda.so" ]; then
  R=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.*/ 2>/dev/null | sort -V | tail -1)
  [ -n "$R" ] || { echo "cuda-build.sh: run 'cargo fetch' first so that cudarc's sources are on disk" >&2; exit 2; }
  grep -hoE "pub unsafe fn (cu[A-Za-z0-9_]+)\(" "$R"/src/driver/sys/*.rs | \
    sed -E 's/pub unsafe fn (cu[A-Za-z0-9_]+)\(/int \1(void){return 999;}/' | sort -u > "$L/cuda_stub.c"
  gcc -shared -fPIC -o "$L/libcuda.so" "$L/cuda_stub.c" -Wl,-soname,libcuda.so.1
fi
for l in cublas cublasLt cudart nvrtc; do ln -sf "$T/lib/lib$l.so.13" "$L/lib$l.so"; done
ln -sf "$T/lib/libcurand.so.10" "$L/libcurand.so"
case " $* " in *nccl*)
  N=$C/nccl
  if [ ! -f "$N/nvidia/nccl/lib/libnccl.so.2" ]; then
    mkdir -p "$N"
    python3 -m pip download -q --no-deps -d "$W" "nvidia-nccl-cu13==${NCCL_VERSION:-2.27.7}"
    unzip -q -o "$W"/nvidia_nccl_cu13-*.whl -d "$N"
  fi
  ln -sf "$N/nvidia/nccl/lib/libnccl.so.2" "$L/libnccl.so" ;;
esac
mkdir -p "$C/root"; ln -sfn "$L" "$C/root/lib"; ln -sfn "$T/include" "$C/root/include"; ln -sfn "$T/bin" "$C/root/bin"
export PATH=$T/bin:$PATH CUDA_HOME=$C/root CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-2}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-cuda}
cargo build --release --features cuda "$@"
