#!/usr/bin/env python3
"""Drive examples/verifiers_env.py with the real `verifiers` package (the pinned 0.3.1) over rlvr's
environment protocol (docs/DESIGN.md section 14), as a run does, and check the replies against
values worked out by hand from the test environments in crates/rlvr-env/tests/verifiers/envs/.

    python3 -m venv /tmp/vf && /tmp/vf/bin/pip install verifiers==0.3.1
    /tmp/vf/bin/python scripts/check_verifiers_env.py

The Rust test `verifiers_env` (crates/rlvr-env/tests/it/verifiers_env.rs) runs the same episodes
with the stand-in package (crates/rlvr-env/tests/verifiers/standin/), which CI can install for
free; this script is the check that the stand-in's API shape is the real one's. It prints one
line per check and exits 1 on the first failure. Results: docs/coming-from-prime-rl.md.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
ADAPTER = os.path.join(ROOT, "examples", "verifiers_env.py")
ENVS = os.path.join(ROOT, "crates", "rlvr-env", "tests", "verifiers", "envs")
STANDIN = os.path.join(ROOT, "crates", "rlvr-env", "tests", "verifiers", "standin")
# `--standin`: the same checks against the tests' stand-in package instead of the real one.
PATHS = [STANDIN, ENVS] if "--standin" in sys.argv else [ENVS]


class Program:
    def __init__(self, options):
        self.p = subprocess.Popen([sys.executable, ADAPTER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=ROOT)
        self.hello = self.ask({"version": 1, "type": "hello", "options": options})

    def ask(self, req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit(f"no reply; stderr:\n{self.p.stderr.read()[-4000:]}")
        return json.loads(line)

    def batch(self, kind, episodes):
        reply = self.ask({"version": 1, "type": kind, "episodes": episodes})
        return {e["id"]: e for e in reply["episodes"]}

    def close(self):
        self.p.stdin.close()
        err = self.p.stderr.read()
        self.p.wait(timeout=30)
        return err


def check(name, got, want):
    if got != want:
        print(f"FAIL {name}: got {got!r}, want {want!r}")
        sys.exit(1)
    print(f"ok   {name}: {got!r}")


def reset(eid, row, seed=5, sample=0):
    return {"id": eid, "group": eid.split(":")[0], "sample": sample, "seed": seed, "row": row,
            "prompt": None}


def step(eid, turn, text, calls=()):
    return {"id": eid, "turn": turn, "text": text, "tool_calls": list(calls),
            "tool_call_errors": []}


def guess():
    env = Program({"env_id": "vf-guess", "paths": PATHS})
    check("guess hello", env.hello, {"version": 1})
    r = env.batch("reset", [reset("0:0", {"example_id": "0"}),
                            reset("0:1", {"example_id": "0"}, sample=1),
                            reset("1:0", {"question": "Guess my number from 1 to 10.",
                                          "reference": "3"}),
                            reset("2:0", {"example_id": "1"}),
                            reset("3:0", {"example_id": "1"})])
    prompt = [{"role": "system", "content": "Answer with one number."},
              {"role": "user", "content": "Guess my number from 1 to 10."}]
    check("reset messages (env dataset row 0)", r["0:0"], {"id": "0:0", "messages": prompt})
    check("reset: the group agrees", r["0:1"]["messages"], prompt)
    check("reset messages (rlvr's row)", r["1:0"]["messages"], prompt)
    check("reset messages (env dataset row 1)", r["2:0"]["messages"][1]["content"],
          "Guess my number from 1 to 10 again.")
    s = env.batch("step", [step("0:0", 1, "5"), step("0:1", 1, "7"),
                           step("1:0", 1, "I guess 3."), step("2:0", 1, "9")])
    check("step: a wrong guess gets a user turn", s["0:0"],
          {"id": "0:0", "messages": [{"role": "user", "content": "Higher."}], "done": False})
    check("step: right at turn 1 (correct 1 + 0.5 x quick 1)", s["0:1"],
          {"id": "0:1", "messages": [], "reward": 1.5, "done": True,
           "metrics": {"correct": 1.0, "num_turns": 1.0, "quick": 1.0, "reward": 1.5}})
    check("step: rlvr's row, right at turn 1", s["1:0"]["reward"], 1.5)
    check("step: too high", s["2:0"]["messages"], [{"role": "user", "content": "Lower."}])
    s = env.batch("step", [step("0:0", 2, "Then 7.")])
    check("step: right at turn 2 (correct 1 + 0.5 x quick 1/2)", s["0:0"],
          {"id": "0:0", "messages": [], "reward": 1.25, "done": True,
           "metrics": {"correct": 1.0, "num_turns": 2.0, "quick": 0.5, "reward": 1.25}})
    f = env.batch("finish", [{"id": "2:0", "reason": "max_turns"},
                             {"id": "3:0", "reason": "error"}])
    check("finish max_turns: scored (correct 0 + 0.5 x quick 1)", f["2:0"],
          {"id": "2:0", "reward": 0.5,
           "metrics": {"correct": 0.0, "num_turns": 1.0, "quick": 1.0, "reward": 0.5}})
    check("finish error: closed unscored", f["3:0"], {"id": "3:0"})
    err = env.close()
    lines = [l for l in err.splitlines() if l.startswith("[verifiers] episode 0:0 ")]
    check("metrics line of 0:0", lines,
          ['[verifiers] episode 0:0 reward 1.25 metrics '
           '{"correct": 1.0, "num_turns": 2.0, "quick": 0.5}'])


def adder():
    env = Program({"env_id": "vf-adder", "paths": PATHS})
    check("adder hello", env.hello, {"version": 1})
    r = env.batch("reset", [reset("0:0", {"example_id": "0"})])
    check("adder reset messages", r["0:0"]["messages"],
          [{"role": "system", "content": "Use the tools."},
           {"role": "user", "content": "What is 17 + 25? Use the add tool."}])
    tools = r["0:0"]["tools"]
    check("adder tool name", [t["function"]["name"] for t in tools], ["add"])
    check("adder tool type", tools[0]["type"], "function")
    params = tools[0]["function"]["parameters"]
    check("adder tool parameters", (sorted(params["properties"]), sorted(params["required"]),
                                    params["properties"]["a"]["type"]),
          (["a", "b"], ["a", "b"], "integer"))
    text = ('<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>')
    s = env.batch("step", [step("0:0", 1, text,
                                [{"id": "call_0", "name": "add",
                                  "arguments": {"a": 17, "b": 25}}])])
    check("adder: the tool's result", s["0:0"],
          {"id": "0:0", "messages": [{"role": "tool", "content": "42",
                                      "tool_call_id": "call_0"}], "done": False})
    s = env.batch("step", [step("0:0", 2, "The sum is 42.")])
    check("adder: a turn without a call ends it, scored", s["0:0"],
          {"id": "0:0", "messages": [], "reward": 1.0, "done": True,
           "metrics": {"add_calls": 1.0, "correct": 1.0, "num_turns": 2.0,
                       "total_tool_calls": 1.0, "reward": 1.0}})
    err = env.close()
    line = [l for l in err.splitlines() if l.startswith("[verifiers] episode 0:0 ")]
    check("adder metrics", json.loads(line[0].split(" metrics ", 1)[1]),
          {"add_calls": 1.0, "correct": 1.0, "num_turns": 2.0, "total_tool_calls": 1.0})


def errors():
    env = Program({"env_id": "vf-guess", "paths": PATHS, "env_args": {"broken_reward": True}})
    env.batch("reset", [reset("0:0", {"example_id": "0"})])
    s = env.batch("step", [step("0:0", 1, "7")])
    e = s["0:0"].get("error", "")
    check("a raising reward function is an episode error naming env and function",
          ("'vf-guess'" in e, "broken" in e, "reward" not in s["0:0"]), (True, True, True))
    env.close()
    env = Program({"env_id": "vf-guess", "paths": PATHS, "env_args": {"broken_hint": True}})
    env.batch("reset", [reset("0:0", {"example_id": "0"})])
    s = env.batch("step", [step("0:0", 1, "5")])
    e = s["0:0"].get("error", "")
    check("an exception in env_response is an episode error naming env and function",
          ("'vf-guess'" in e, "ValueError: no hint for 5" in e, "in env_response (vf_guess.py:" in e),
          (True, True, True))
    env.close()
    env = Program({"env_id": "vf-missing", "paths": PATHS})
    e = env.hello.get("error", "")
    check("an unknown environment is refused at hello, named",
          ("'vf-missing'" in e, "load_environment" in e), (True, True))
    env.close()


def export():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.jsonl")
        args = [sys.executable, ADAPTER, "export", "--env-id", "vf-guess", "--out", out]
        for p in PATHS:
            args += ["--path", p]
        subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
        with open(out) as f:
            rows = [json.loads(line) for line in f]
    check("export: the environment's dataset as rows", rows,
          [{"example_id": 0, "question": "Guess my number from 1 to 10.", "answer": "7"},
           {"example_id": 1, "question": "Guess my number from 1 to 10 again.", "answer": "3"}])


if __name__ == "__main__":
    if "--standin" in sys.argv:
        print(f"the stand-in package in {STANDIN}")
    else:
        import verifiers
        print(f"verifiers {verifiers.__version__} from {os.path.dirname(verifiers.__file__)}")
    guess()
    adder()
    errors()
    export()
    print("all checks passed")
