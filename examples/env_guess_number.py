#!/usr/bin/env python3
"""An rlvr environment: guess-the-number, a multi-turn game with user feedback and per-turn rewards.

    [env]
    command = ["python3", "../examples/env_guess_number.py"]
    max_turns = 6
    tool_format = "none"
    options = { low = 1, high = 100 }   # also `prompt` ({low}, {high}) and `system`

Started once per run; one JSON object per line each way (docs/environments.md, docs/DESIGN.md
section 14). Every request carries "version": 1 and "type":

- hello  {"options": {...}}            -> {"version": 1}
- reset  {"episodes": [{"id", "group", "sample", "seed", "row", "prompt"}]}
                                       -> {"episodes": [{"id", "messages", "tools"}]}
- step   {"episodes": [{"id", "turn", "text", "tool_calls", "tool_call_errors"}]}
                                       -> {"episodes": [{"id", "messages", "reward", "done",
                                                         "metrics" (when done)}]}
- finish {"episodes": [{"id", "reason"}]}
                                       -> {"episodes": [{"id", "reward", "metrics"}]}

The secret number comes from the episode's seed, which the K episodes of a group share, so their
reset replies are identical (rlvr checks it). A turn's last integer is its guess: a right guess
ends the episode with reward 1; a wrong one gets "Higher." or "Lower." (reward 0), a turn with no
number "Answer with a number." (reward -0.1, the only per-turn penalty). The episode's last reply
(the right guess's, or `finish`'s) carries its metrics: `found` (1 or 0) and `no_number_turns`
(turns without a number), logged by rlvr as `env/metrics/found/mean` and
`env/metrics/no_number_turns/mean`. Log to stderr; anything on stdout that is not a reply breaks
the protocol.
"""
import json
import random
import re
import sys

PROTOCOL = 1


def main():
    low, high = 1, 100
    prompt = "Guess my number from {low} to {high}. Answer with one number."
    system = None
    secrets = {}
    no_number = {}  # episode id -> turns without a number
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        kind = req.get("type")
        if kind == "hello":
            opts = req.get("options") or {}
            low, high = int(opts.get("low", low)), int(opts.get("high", high))
            prompt = str(opts.get("prompt", prompt))
            system = opts.get("system", system)
            out = {"version": PROTOCOL}
        elif kind == "reset":
            eps = []
            for e in req["episodes"]:
                secrets[e["id"]] = random.Random(e["seed"]).randint(low, high)
                no_number[e["id"]] = 0
                messages = [{"role": "user", "content": prompt.format(low=low, high=high)}]
                if system is not None:
                    messages.insert(0, {"role": "system", "content": str(system)})
                eps.append({"id": e["id"], "messages": messages, "tools": None})
            out = {"episodes": eps}
        elif kind == "step":
            eps = []
            for e in req["episodes"]:
                secret = secrets.get(e["id"])
                if secret is None:
                    eps.append({"id": e["id"], "error": "unknown episode"})
                    continue
                numbers = re.findall(r"-?\d+", e["text"])
                if not numbers:
                    no_number[e["id"]] += 1
                    eps.append({"id": e["id"], "reward": -0.1, "done": False,
                                "messages": [{"role": "user", "content": "Answer with a number."}]})
                    continue
                guess = int(numbers[-1])
                if guess == secret:
                    secrets.pop(e["id"], None)
                    metrics = {"found": 1, "no_number_turns": no_number.pop(e["id"], 0)}
                    eps.append({"id": e["id"], "reward": 1.0, "done": True, "messages": [],
                                "metrics": metrics})
                else:
                    hint = "Higher." if guess < secret else "Lower."
                    eps.append({"id": e["id"], "reward": 0.0, "done": False,
                                "messages": [{"role": "user", "content": hint}]})
            out = {"episodes": eps}
        elif kind == "finish":
            out = {"episodes": [{"id": e["id"], "reward": None,
                                 "metrics": {"found": 0,
                                             "no_number_turns": no_number.get(e["id"], 0)}}
                                for e in req["episodes"]]}
            for e in req["episodes"]:
                secrets.pop(e["id"], None)
                no_number.pop(e["id"], None)
        else:
            out = {"error": f"unknown request type {kind!r}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
