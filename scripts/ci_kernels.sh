#!/usr/bin/env bash
# CI for the Triton kernels (kernels/, issue 44), no GPU needed:
#   1. a venv with the pinned toolchain (kernels/requirements.txt: triton, numpy, pytest) in
#      KERNELS_VENV (default target/kernels-venv), reused while requirements.txt is unchanged;
#   2. the CUDA 13.0.88 ptxas from PyPI's nvidia-cuda-nvcc wheel (hash-checked), cached in
#      target/kernels-ptxas/ (or PTXAS=/path/to/ptxas);
#   3. every kernel under Triton's CPU interpreter against its float64 reference (kernels/tests);
#   4. `kernels/generate.py --check`: the committed kernels/build/ equals a fresh regeneration
#      (PTX, cubins, manifest), no spills, shared memory and threads within each target's limits.
# Prints how long each part took.
#
#   bash scripts/ci_kernels.sh            # all of it
#   bash scripts/ci_kernels.sh install    # 1 and 2 only (.ci/run starts this beside `cargo test`)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KERNELS_VENV:-target/kernels-venv}
PY=$VENV/bin/python
req_sum=$(sha256sum kernels/requirements.txt | cut -d' ' -f1)
t0=$SECONDS
if [ ! -x "$PY" ] || [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" != "$req_sum" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir -r kernels/requirements.txt
  echo "$req_sum" > "$VENV/.requirements.sha256"
fi
echo "ci_kernels: venv ready in $((SECONDS - t0)) s (triton $("$PY" -c 'import triton; print(triton.__version__)'))"
t1=$SECONDS
ptxas=$("$PY" kernels/generate.py --fetch-ptxas)
echo "ci_kernels: ptxas ready in $((SECONDS - t1)) s ($ptxas)"
[ "${1:-}" = install ] && exit 0
if [ -n "${RLVR_KERNEL_RECORD:-}" ]; then
  # CI sets it: the records must be there, or the replay would be skipped and count for nothing.
  n=$(find "$RLVR_KERNEL_RECORD" -name record.json 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "ci_kernels: no launch records in $RLVR_KERNEL_RECORD (rlvr-kernels' tests write them)" >&2; exit 1; }
  echo "ci_kernels: $n launch records to replay from $RLVR_KERNEL_RECORD"
fi
t2=$SECONDS
"$PY" -m pytest -q -p no:cacheprovider kernels/tests
echo "ci_kernels: interpreter tests in $((SECONDS - t2)) s"
t3=$SECONDS
"$PY" kernels/generate.py --check -j "${KERNELS_JOBS:-2}"
echo "ci_kernels: generate.py --check in $((SECONDS - t3)) s; all in $((SECONDS - t0)) s"
