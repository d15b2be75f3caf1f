#!/usr/bin/env bash
# Type-checks rlvr with `--features cuda` in about a minute on a machine with neither a GPU nor a
# CUDA toolkit, where scripts/cuda-build.sh (a real build) takes ~26 minutes on 2 cores.
#
#   scripts/cuda-check.sh                         # cargo check -p rlvr-kernels --features cuda
#   scripts/cuda-check.sh -p rlvr-model --features cuda    # other cargo check/clippy arguments
#   CARGO_CMD=clippy scripts/cuda-check.sh -p rlvr-kernels --features cuda --all-targets
#
# How: cudarc's build script takes its CUDA version from CUDARC_CUDA_VERSION (13.0, what the GPU
# machines' driver speaks) instead of running nvcc; candle-kernels' build script runs nvcc on its
# .cu files, so a stand-in nvcc (written to target/fake-nvcc/) answers `--version` as 13.0.88 and
# writes empty PTX, objects and archives. `cargo check` never links and never reads those files'
# contents, so everything Rust is type-checked; nothing built this way can run (use
# scripts/cuda-build.sh for that). Seen working 2026-12-06 with candle 0.11.1 / cudarc 0.19.10.
set -euo pipefail
cd "$(dirname "$0")/.."
F=$PWD/target/fake-nvcc
mkdir -p "$F/bin"
cat > "$F/bin/nvcc" <<'NVCC'
#!/usr/bin/env bash
# Stand-in nvcc for scripts/cuda-check.sh: empty outputs, type-checking only.
out=""; outdir="."; lib=0; ptx=0; files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --version) printf 'nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\nBuilt on stand-in\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0\n'; exit 0 ;;
    -o) out="$2"; shift ;;
    --output-directory) outdir="$2"; shift ;;
    --lib) lib=1 ;;
    --ptx) ptx=1 ;;
    *.cu) files+=("$1") ;;
  esac
  shift
done
if [ $ptx = 1 ]; then
  for f in "${files[@]}"; do printf '.version 9.0\n.target sm_90\n.address_size 64\n' > "$outdir/$(basename "$f" .cu).ptx"; done
elif [ $lib = 1 ]; then
  printf '!<arch>\n' > "$out"
elif [ -n "$out" ]; then
  : > "$out"
fi
NVCC
chmod +x "$F/bin/nvcc"
[ $# -gt 0 ] || set -- -p rlvr-kernels --features cuda
PATH=$F/bin:$PATH CUDA_HOME=$F CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} CUDARC_CUDA_VERSION=13000 \
  cargo "${CARGO_CMD:-check}" "$@"
