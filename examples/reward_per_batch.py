#!/usr/bin/env python3
"""An rlvr external verifier in the default mode (`mode = "per_batch"`): started once per batch.

    verifier = { kind = "external", command = ["python3", "examples/reward_per_batch.py"] }

stdin: one JSON object per completion, then end of file. Each has "prompt", "completion",
"reference", "index" (the row's index in its split, or null) and "row" (the row's columns as
strings). stdout: one {"reward": ...} object per input line, in order. Protocol:
docs/external-verifier.md.

Reward: 1.0 when the last line of the completion equals the reference, else 0.0; a row with a
"points" column scales that by its value.
"""
import json
import sys


def score(item):
    lines = item["completion"].strip().splitlines() or [""]
    answer = lines[-1].strip()
    ok = answer == item["reference"].strip()
    points = float(item.get("row", {}).get("points", "1"))
    return {"reward": points if ok else 0.0, "correct": ok,
            "extracted": answer, "gold": item["reference"]}


for line in sys.stdin:
    if line.strip():
        print(json.dumps(score(json.loads(line))), flush=True)
