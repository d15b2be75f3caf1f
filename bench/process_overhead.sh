#!/usr/bin/env bash
# The cost of rlvr's process supervision (issue 49): starting a program through the guard
# (`rlvr __rlvr-guard`) against starting it directly, and one chat-template rendering round trip
# through the template worker (`rlvr __rlvr-render`) with Qwen2.5's template and a GSM8K-sized
# prompt. Prints ms per start and µs per rendering.
#
#   RLVR=target/debug/rlvr N=200 bash bench/process_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
R=${RLVR:-target/debug/rlvr}
N=${N:-200}
t0=$(date +%s.%N)
for _ in $(seq "$N"); do "$R" __rlvr-guard $$ /bin/true; done
t1=$(date +%s.%N)
for _ in $(seq "$N"); do /bin/true; done
t2=$(date +%s.%N)
python3 - "$t0" "$t1" "$t2" "$N" <<'PY'
import sys
t0, t1, t2, n = map(float, sys.argv[1:])
print(f"guard: {(t1 - t0) / n * 1e3:.2f} ms per start through the guard, "
      f"{(t2 - t1) / n * 1e3:.2f} ms direct: {((t1 - t0) - (t2 - t1)) / n * 1e3:.2f} ms added")
PY
python3 - "$R" "$N" <<'PY'
import json, os, subprocess, sys, time
exe, n = sys.argv[1], int(sys.argv[2]) * 10
cases = json.load(open("crates/rlvr-model/tests/fixtures/chat_templates.json"))
tpl = next(c["template"] for c in cases if "im_start" in c["template"])
w = subprocess.Popen([exe, "__rlvr-render", str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
req = (json.dumps({"template": tpl, "messages": [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"}],
    "add_generation_prompt": True, "bos_token": None, "eos_token": "<|im_end|>"}) + "\n").encode()
t = time.time()
for _ in range(n):
    w.stdin.write(req); w.stdin.flush()
    assert "text" in json.loads(w.stdout.readline())
print(f"template worker: {(time.time() - t) / n * 1e6:.1f} us per rendering round trip ({n}, driven from Python)")
w.stdin.close(); w.wait()
PY
