#!/usr/bin/env python3
"""Persistent rlvr verifier for the kill audit: reward = fraction of completion characters that
are digits (deterministic, gives reward variance on a random model). correct = reward == 1."""
import json, sys
for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    out = []
    for it in req["items"]:
        c = it["completion"]
        r = (sum(ch.isdigit() for ch in c) / len(c)) if c else 0.0
        out.append({"reward": r, "correct": r == 1.0})
    print(json.dumps({"rewards": out}), flush=True)
