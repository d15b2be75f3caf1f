#!/usr/bin/env bash
# Same behaviour before and after a restructuring, as one command (issue 43): the runs of
# bench/same_runs.sh (the quickstart --fast, its warm start, 8 steps of configs/quickstart.toml
# on-policy, with sync interval 4 and offset 1, with LoRA, under `mpirun -np 2`, and `rlvr sft`
# in one process and at 2 ranks) and of scripts/compare/run.sh (the quickstart and a two-arm lab),
# each with the binary before and the binary after; then
#   - every JSONL line equal outside timing keys and every checkpoint file byte for byte
#     (bench/same_runs.py; scripts/compare_runs.py for the lab),
#   - the before binary's off-policy run (in-flight buffer included) resumed from its step-4
#     checkpoint by the after binary, compared with the before binary's uninterrupted run.
#
# Usage: scripts/compare/same.sh BEFORE AFTER OUT
#   BEFORE, AFTER  a commit of this repository (its tree is exported with `git archive` to
#                  OUT/src-COMMIT and built there: `cargo build --locked -p rlvr --features mpi`,
#                  profile $PROFILE, default dev; CARGO_TARGET_DIR as set, else OUT/target), or
#                  the path of an rlvr binary built with the `mpi` feature
#   OUT            a folder for the sources, binaries, runs (before/, after/, resumed/, lab/) and
#                  the report (compare.txt)
# Needs Open MPI (scripts/ci_mpi.sh installs it) and python3. Exit 0 when everything is equal,
# 1 when something differs (listed in OUT/compare.txt), 2 on a failed build or run.
# EXPECTED: a file of differences later changes made on purpose (default: scripts/compare/since-C.txt
# for a BEFORE commit C when it exists, e.g. since-977a3a4.txt); they are listed, not failed.
# CARGO: the cargo command (e.g. CARGO="/work/cargo-slot.sh cargo" on a shared machine).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -eq 3 ] || { sed -n '2,23p' "$0" >&2; exit 2; }
mkdir -p "$3"
out=$(cd "$3" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$out/target}
profile=${PROFILE:-dev}
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
read -r -a cargo <<<"${CARGO:-cargo}"

binary() { # COMMIT-OR-PATH -> path of the binary (built when a commit)
  if [ -x "$1" ] && [ -f "$1" ]; then
    realpath "$1"
    return
  fi
  local c
  c=$(git -C "$repo" rev-parse --short=7 "$1^{commit}") || exit 2
  if [ ! -x "$out/bin/rlvr-$c" ]; then
    rm -rf "$out/src-$c" && mkdir -p "$out/src-$c" "$out/bin"
    git -C "$repo" archive "$c" | tar -x -C "$out/src-$c"
    (cd "$out/src-$c" && "${cargo[@]}" build --locked -p rlvr --features mpi --bin rlvr \
      --profile "$profile") >"$out/build-$c.log" 2>&1 ||
      { echo "same: building $c failed (log: $out/build-$c.log)" >&2; exit 2; }
    cp "$CARGO_TARGET_DIR/$dir/rlvr" "$out/bin/rlvr-$c"
  fi
  echo "$out/bin/rlvr-$c"
}

# Each run set once: OUT/NAME.done marks a finished one, so that a rerun after a failure (or with
# another AFTER) reuses what is done; delete OUT to start afresh.
once() { # NAME COMMAND...
  local name=$1
  shift
  [ -e "$out/$name.done" ] && { echo "same: $name already done"; return; }
  "$@" || exit 2
  touch "$out/$name.done"
}

before=$(binary "$1")
after=$(binary "$2")
short=$(git -C "$repo" rev-parse --short=7 "$1^{commit}" 2>/dev/null || true)
expected=${EXPECTED:-}
if [ -z "$expected" ] && [ -n "$short" ] && [ -f "$repo/scripts/compare/since-$short.txt" ]; then
  expected=$repo/scripts/compare/since-$short.txt
fi
[ -n "$expected" ] && echo "same: expected differences from $expected"
echo "same: before $before, after $after"
t0=$SECONDS
once before bash "$repo/bench/same_runs.sh" run "$before" "$out/before"
once lab-before bash "$repo/scripts/compare/run.sh" "$before" "$out/lab" before
rm -f "$out"/after.done "$out"/resume.done "$out"/lab-after.done # AFTER may be new: rerun its sets
once after bash "$repo/bench/same_runs.sh" run "$after" "$out/after"
once resume bash "$repo/bench/same_runs.sh" resume "$after" "$out/before" "$out/resumed"
once lab-after bash "$repo/scripts/compare/run.sh" "$after" "$out/lab" after
echo "same: runs done in $((SECONDS - t0)) s"
rc=0
{
  python3 "$repo/bench/same_runs.py" "$out/before" "$out/after" $expected || rc=1
  python3 "$repo/bench/same_runs.py" "$out/before/offpolicy" "$out/resumed/resume" $expected || rc=1
  echo "resume of the before binary's step-4 checkpoint by the after binary:"
  grep -h -i "resum" "$out/resumed/resume.log" | head -3 || true
  echo "lab (scripts/compare/run.sh: the quickstart and a two-arm lab):"
  python3 "$repo/scripts/compare_runs.py" "$out/lab/before" "$out/lab/after" $expected || rc=1
} >"$out/compare.txt" 2>&1
cat "$out/compare.txt"
exit $rc
