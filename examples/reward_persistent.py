#!/usr/bin/env python3
"""An rlvr external verifier in persistent mode: started once per run, one line per batch.

    verifier = { kind = "external", mode = "persistent",
                 command = ["python3", "examples/reward_persistent.py"] }

Each batch arrives as one line {"version": 1, "items": [ITEM, ...]}, where an ITEM has "prompt",
"completion", "reference", "index" (the row's index in its split, or null) and "row" (the row's
columns as strings). Reply with one line {"rewards": [...]}, one entry per item in order: a number
or {"reward": ..., "correct": ..., "extracted": ..., "gold": ...}. Reply {"error": "..."} to stop
the run with a message. Anything printed to stdout that is not a reply breaks the protocol: log to
stderr. Protocol: docs/external-verifier.md.

The expensive set-up (loading a model, a tokenizer, a test harness) happens once, before the loop.
Reward: as examples/reward_per_batch.py (the last line equals the reference, scaled by a "points"
column when the row has one).
"""
import json
import sys

PROTOCOL = 1


def score(item):
    lines = item["completion"].strip().splitlines() or [""]
    answer = lines[-1].strip()
    ok = answer == item["reference"].strip()
    points = float(item.get("row", {}).get("points", "1"))
    return {"reward": points if ok else 0.0, "correct": ok,
            "extracted": answer, "gold": item["reference"]}


def main():
    batches = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("version") != PROTOCOL:
            reply = {"error": f"this program speaks protocol {PROTOCOL}, got {request.get('version')}"}
        else:
            reply = {"rewards": [score(item) for item in request["items"]]}
        print(json.dumps(reply), flush=True)
        batches += 1
    print(f"reward_persistent.py: scored {batches} batches", file=sys.stderr)


if __name__ == "__main__":
    main()
