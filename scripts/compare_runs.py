#!/usr/bin/env python3
# Usage: python3 scripts/compare_runs.py BEFORE AFTER [EXPECTED] (trees written by scripts/compare/run.sh).
"""Compares two output trees: every *.jsonl line by line (timing keys and paths aside), every
checkpoint file byte for byte, and other JSON files outside timing/path keys. EXPECTED lists
differences made on purpose (the format of bench/same_runs.py's): matching paths are not counted."""
import json, os, sys, filecmp, fnmatch
A, B = sys.argv[1], sys.argv[2]
ALLOW = [l.split(" ", 1)[0] for l in (open(sys.argv[3]) if len(sys.argv) > 3 else [])
         if l.strip() and not l.startswith("#")]
TIMING = {"loadavg", "wall_s_total", "time/sample_s", "time/train_s", "tokens_per_s", "time/env_s", "wall_s", "elapsed_s",
          "start_time", "resumed_at", "end_time", "time_s", "seconds", "started", "finished"}
def scrub(v):
    if isinstance(v, dict):
        return {k: scrub(x) for k, x in v.items() if k not in TIMING and not k.startswith("time") and not k.startswith("memory/")}
    if isinstance(v, list):
        return [scrub(x) for x in v]
    if isinstance(v, str):
        return v.replace(A, "ROOT").replace(B, "ROOT")
    return v
n_lines = n_bytes = n_json = 0; bad = []
for root, _, files in os.walk(A):
    for f in files:
        pa = os.path.join(root, f); rel = os.path.relpath(pa, A); pb = os.path.join(B, rel)
        if "tensorboard" in rel:  # event file names carry the wall-clock time
            continue
        if not os.path.exists(pb):
            bad.append((rel, f"missing in after: {rel}")); continue
        if f.endswith(".jsonl"):
            la = open(pa).read().splitlines(); lb = open(pb).read().splitlines()
            if len(la) != len(lb): bad.append((rel, f"{rel}: {len(la)} vs {len(lb)} lines"))
            for i, (x, y) in enumerate(zip(la, lb)):
                if scrub(json.loads(x)) != scrub(json.loads(y)): bad.append((rel, f"{rel}:{i+1} differs"))
                n_lines += 1
        elif f == "manifest.json":  # names the absolute input paths: compared with them replaced
            x = open(pa).read().replace(A, "ROOT"); y = open(pb).read().replace(B, "ROOT")
            if x != y: bad.append((rel, f"{rel}: differs outside the root path"))
            n_bytes += 1
        elif "checkpoint" in rel or f.endswith(".safetensors") or f.endswith(".bin"):
            if not filecmp.cmp(pa, pb, shallow=False): bad.append((rel, f"{rel}: bytes differ"))
            n_bytes += 1
        elif f.endswith(".json") and f not in ("run.json",):
            if scrub(json.load(open(pa))) != scrub(json.load(open(pb))): bad.append((rel, f"{rel}: json differs"))
            n_json += 1
known = [r for r, _ in bad if any(fnmatch.fnmatch(r, g) for g in ALLOW)]
bad = [m for r, m in bad if not any(fnmatch.fnmatch(r, g) for g in ALLOW)]
print(f"{n_lines} JSONL lines, {n_bytes} checkpoint/weight files, {n_json} JSON files compared; "
      + (f"{len(known)} expected differences; " if ALLOW else "") + f"{len(bad)} differences")
for b in bad[:30]: print("  ", b)
sys.exit(1 if bad else 0)
