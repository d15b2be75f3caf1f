#!/usr/bin/env bash
# rlvr-dist's MPI tests with real processes. Installs OpenMPI and libclang from Debian's
# packages when they are missing (rsmpi's mpi-sys runs bindgen, which needs libclang, and finds MPI
# through mpicc / pkg-config), builds rlvr-dist and the rlvr binary with the `mpi` feature and runs
# rlvr-dist's tests and crates/rlvr/tests/mpi_train.rs (rlvr train / sft under mpirun). rlvr-dist's:
# the unit tests again with the feature on, and tests/mpi.rs, which starts check/mpi_check.rs under
# `mpirun --allow-run-as-root --oversubscribe -np 2` and `-np 3` (collectives, the NaN flag, a
# layout mismatch, a rank that hangs, exits or finalises early).
# Usage: bash scripts/ci_mpi.sh   (from anywhere; as root, or with sudo for the install)
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
packages=(libopenmpi-dev openmpi-bin libclang-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "ci_mpi: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  echo "ci_mpi: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "ci_mpi: $(mpirun --version | head -n 1); packages ready after $((SECONDS - t0)) s"
# OpenMPI refuses root without these (the tests also pass --allow-run-as-root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t1=$SECONDS
cargo test -p rlvr-dist --features mpi --locked --no-run
cargo test -p rlvr --features mpi --locked --test mpi_train --no-run
echo "ci_mpi: built in $((SECONDS - t1)) s"
t2=$SECONDS
# Each test run under a limit far above its time here (~1 min and ~3 min warm), so that a hang
# fails CI with its output instead of holding it: the tests also bound each mpirun themselves
# (rlvr_dist::watch; Open MPI 4.1.4's mpirun can outlive its ranks after an abort).
timeout -k 10 900 cargo test -p rlvr-dist --features mpi --locked -- --test-threads=1
echo "ci_mpi: rlvr-dist's tests ran in $((SECONDS - t2)) s"
# rlvr train and rlvr sft under mpirun -np 2 and 3 against one process, a rerun, a kill and
# resume, a rank that dies (crates/rlvr/tests/mpi_train.rs).
t3=$SECONDS
timeout -k 10 1500 cargo test -p rlvr --features mpi --locked --test mpi_train -- --test-threads=1
echo "ci_mpi: rlvr's mpirun tests ran in $((SECONDS - t3)) s; $((SECONDS - t0)) s in all"
