#!/usr/bin/env bash
# CI lane of the wheel (issue 48, item 3): builds the `rlvr` wheel with maturin (pyproject.toml,
# `bindings = "bin"`: the binary alone, as ruff and uv ship theirs), installs it with pip into a
# fresh venv, and runs `rlvr quickstart --fast` with the installed binary, outside the repository.
#   WHEEL_PROFILE  cargo profile (default wheel-ci: release with opt-level 1, no debug info, no
#                  LTO; Cargo.toml says why); `release` builds what a release would publish.
#   WHEEL_WORK     working directory (default target/wheel-ci; its venvs and wheel are removed at
#                  the end unless WHEEL_KEEP=1).
# Called by .ci/run after the tests; prints each part's time. The wheel's own target directory is
# cargo's usual one (target/), in its own profile directory (target/wheel-ci/).
# Measured 2026-12-06 on the 2-core machine beside another cargo build (load ~4): wheel-ci build
# 474 s from nothing, install 5 s, quickstart --fast 0.3 s; a release-profile build 13.5 min
# (docs/coming-from-trl.md, "Installing with pip").
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${WHEEL_PROFILE:-wheel-ci}
W=${WHEEL_WORK:-target/wheel-work}
mkdir -p "$W"
W=$(cd "$W" && pwd)
rm -rf "$W/dist" "$W/venv" "$W/run"
t0=$SECONDS
if [ ! -x "$W/maturin-venv/bin/maturin" ]; then
  python3 -m venv "$W/maturin-venv"
  "$W/maturin-venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir "maturin>=1.9,<2"
fi
echo "ci_wheel: maturin $("$W/maturin-venv/bin/maturin" --version | cut -d' ' -f2) ready in $((SECONDS - t0)) s"
t=$SECONDS
# `--compatibility linux`: a wheel for this machine, which pip installs here; a release builds in
# a manylinux container instead (docs/coming-from-trl.md).
"$W/maturin-venv/bin/maturin" build --locked --profile "$PROFILE" --compatibility linux --out "$W/dist"
whl=$(ls "$W"/dist/rlvr-*.whl)
echo "ci_wheel: built $(basename "$whl") ($(du -h "$whl" | cut -f1)) with profile $PROFILE in $((SECONDS - t)) s"
t=$SECONDS
python3 -m venv "$W/venv"
"$W/venv/bin/pip" install --quiet --disable-pip-version-check --no-index "$whl"
[ -x "$W/venv/bin/rlvr" ] || { echo "ci_wheel: the wheel put no rlvr on the venv's PATH" >&2; exit 1; }
echo "ci_wheel: installed into a fresh venv in $((SECONDS - t)) s: $("$W/venv/bin/rlvr" --version)"
t=$SECONDS
# Outside the repository, with the venv's bin/ first on PATH, as a pip user runs it.
(cd "$W" && PATH="$W/venv/bin:$PATH" rlvr quickstart --fast --out run > quickstart.out 2> quickstart.log) \
  || { cat "$W/quickstart.log"; exit 1; }
python3 - "$W/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s.get("fast") is True and s.get("rl_steps", 0) > 0, f"not a finished --fast quickstart: {s!r}"
for k in ("on_policy_accuracy", "off_policy_accuracy", "sft_accuracy"):
    assert 0.0 <= s[k] <= 1.0, f"{k} = {s[k]!r}"
print(f"ci_wheel: summary.json: {s['rl_steps']} RL steps, accuracies on {s['on_policy_accuracy']} off {s['off_policy_accuracy']}")
PY
echo "ci_wheel: the installed rlvr ran quickstart --fast in $((SECONDS - t)) s; the lane $((SECONDS - t0)) s"
if [ "${WHEEL_KEEP:-0}" != 1 ]; then
  rm -rf "$W/venv" "$W/run" "$W/dist"
  # The profile's build directory (~GBs), which nothing after this uses.
  [ "$PROFILE" = release ] || rm -rf "${CARGO_TARGET_DIR:-target}/$PROFILE"
fi
