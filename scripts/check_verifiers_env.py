#!/usr/bin/env python3
"""Drive examples/verifiers_env.py with the real `verifiers` package (the pinned 0.3.1) over rlvr's
environment protocol (docs/DESIGN.md section 14), as a run does, and check the replies against
values worked out by hand from the test environments in crates/rlvr-env/tests/verifiers/envs/.

    python3 -m venv /tmp/vf && /tmp/vf/bin/pip install verifiers==0.3.1
    /tmp/vf/bin/python scripts/check_verifiers_env.py
    python3 -m venv /tmp/vf4 && /tmp/vf4/bin/pip install verifiers==0.4.0
    /tmp/vf4/bin/python scripts/check_verifiers_env.py

With 0.3.1 it runs the classic API's environments (vf-guess, vf-adder); with 0.4.0, whose only
stack is `verifiers.v1`, the v1 taskset vf-guess-v1 and its in-process harness, through
verifiers' own interception server, and, with `uv` on PATH (`pip install uv`), verifiers' own
`null` and `bash` harness programs (uv installs their dependencies from the index once).

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
STANDIN_V1 = os.path.join(ROOT, "crates", "rlvr-env", "tests", "verifiers", "standin_v1")
# `--standin` / `--standin-v1`: the same checks against the tests' stand-in package (0.3.1's
# classic API / 0.4.0's verifiers.v1) instead of the real one.
if "--standin" in sys.argv:
    PATHS = [STANDIN, ENVS]
elif "--standin-v1" in sys.argv:
    PATHS = [STANDIN_V1, ENVS]
else:
    PATHS = [ENVS]


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


# ----- verifiers 0.4.0 (verifiers.v1): the vf-guess-v1 taskset and its in-process harness -----

PROMPT_V1 = [{"role": "system", "content": "Answer with one number."},
             {"role": "user", "content": "Guess my number from 1 to 10."}]


def v1_program(harness=None, env_args=None):
    options = {"env_id": "vf-guess-v1", "paths": PATHS}
    if harness:
        options["env_config"] = {"agent": {"harness": dict({"id": "vf-guess-v1"}, **harness)}}
    if env_args:
        options["env_args"] = env_args
    return Program(options)


def guess_v1(stream=False):
    what = " (server-sent events)" if stream else ""
    env = v1_program({"stream": True} if stream else None)
    check(f"v1 hello{what}", env.hello, {"version": 1})
    r = env.batch("reset", [reset("0:0", {"example_id": "0"}),
                            reset("0:1", {"example_id": "0"}, sample=1),
                            reset("1:0", {"question": "Guess my number from 1 to 10.",
                                          "reference": "3"}),
                            reset("2:0", {"example_id": "1"}),
                            reset("3:0", {"example_id": "1"})])
    check(f"v1 reset: the harness's first call is the prompt{what}", r["0:0"],
          {"id": "0:0", "messages": PROMPT_V1})
    check("v1 reset: the group agrees", r["0:1"]["messages"], PROMPT_V1)
    check("v1 reset: rlvr's row as a task (no system prompt)", r["1:0"]["messages"],
          PROMPT_V1[1:])
    check("v1 reset: task idx 1", r["2:0"]["messages"][1]["content"],
          "Guess my number from 1 to 10 again.")
    s = env.batch("step", [step("0:0", 1, "5"), step("0:1", 1, "7"),
                           step("1:0", 1, "I guess 3."), step("2:0", 1, "9")])
    check("v1 step: a wrong guess gets the harness's user turn", s["0:0"],
          {"id": "0:0", "messages": [{"role": "user", "content": "Higher."}], "done": False})
    check("v1 step: right at turn 1 (correct 1 + 0.5 x quick 1), the task's rewards", s["0:1"],
          {"id": "0:1", "messages": [], "reward": 1.5, "done": True,
           "metrics": {"correct": 1.0, "guesses": 1.0, "quick": 1.0, "reward": 1.5}})
    check("v1 step: rlvr's row, its reference as the task's answer", s["1:0"]["reward"], 1.5)
    check("v1 step: too high", s["2:0"]["messages"], [{"role": "user", "content": "Lower."}])
    s = env.batch("step", [step("0:0", 2, "Then 7.")])
    check("v1 step: right at turn 2 (correct 1 + 0.5 x quick 1/2)", s["0:0"],
          {"id": "0:0", "messages": [], "reward": 1.25, "done": True,
           "metrics": {"correct": 1.0, "guesses": 2.0, "quick": 0.5, "reward": 1.25}})
    f = env.batch("finish", [{"id": "2:0", "reason": "max_turns"},
                             {"id": "3:0", "reason": "error"}])
    check("v1 finish max_turns: the trace stops, scored (correct 0 + 0.5 x quick 1)", f["2:0"],
          {"id": "2:0", "reward": 0.5,
           "metrics": {"correct": 0.0, "guesses": 1.0, "quick": 1.0, "reward": 0.5}})
    check("v1 finish error: closed unscored", f["3:0"], {"id": "3:0"})
    err = env.close()
    lines = [l for l in err.splitlines() if l.startswith("[verifiers] episode ")]
    check("v1 episode lines", sorted(lines), sorted([
        '[verifiers] episode 0:1 reward 1.5 metrics '
        '{"correct": 1.0, "guesses": 1.0, "quick": 1.0} stop agent_completed',
        '[verifiers] episode 1:0 reward 1.5 metrics '
        '{"correct": 1.0, "guesses": 1.0, "quick": 1.0} stop agent_completed',
        '[verifiers] episode 0:0 reward 1.25 metrics '
        '{"correct": 1.0, "guesses": 2.0, "quick": 0.5} stop agent_completed',
        '[verifiers] episode 2:0 reward 0.5 metrics '
        '{"correct": 0.0, "guesses": 1.0, "quick": 1.0} stop rlvr_max_turns']))
    check("v1: the ignored sampling key is said", [
        l for l in err.splitlines() if "ignored" in l],
        ["[verifiers] verifiers environment 'vf-guess-v1': request key 'temperature' (0.3) "
         "ignored: rlvr's own sampling settings make every turn"])


def tools_v1():
    env = v1_program({"tools": True})
    r = env.batch("reset", [reset("0:0", {"example_id": "0"})])
    check("v1 tools: the request's tools", [t["function"]["name"] for t in r["0:0"]["tools"]],
          ["add"])
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    s = env.batch("step", [step("0:0", 1, text, [{"id": "call_0", "name": "add",
                                                   "arguments": {"a": 3, "b": 4}}])])
    check("v1 tools: the harness's tool result", s["0:0"],
          {"id": "0:0", "messages": [{"role": "tool", "content": "7",
                                      "tool_call_id": "call_0"}], "done": False})
    s = env.batch("step", [step("0:0", 2, "7")])
    check("v1 tools: right after a tool call (correct 1 + 0.5 x 1/2)", s["0:0"]["reward"], 1.25)
    env.close()


def errors_v1():
    env = v1_program({"rewrite_history": True})
    env.batch("reset", [reset("0:0", {"example_id": "0"})])
    s = env.batch("step", [step("0:0", 1, "5")])
    e = s["0:0"].get("error", "")
    check("v1: a call that rewrites the history is refused, named",
          ("'vf-guess-v1'" in e, "does not extend the transcript" in e), (True, True))
    env.close()
    env = v1_program(env_args={"broken_reward": True})
    env.batch("reset", [reset("0:0", {"example_id": "0"})])
    s = env.batch("step", [step("0:0", 1, "7")])
    e = s["0:0"].get("error", "")
    check("v1: a raising reward is an episode error naming env and function",
          ("'vf-guess-v1'" in e, "ZeroDivisionError" in e, "in correct (__init__.py:" in e,
           "reward" not in s["0:0"]), (True, True, True, True))
    r = env.batch("reset", [reset("1:0", {"example_id": "9"})])
    check("v1: an idx the taskset lacks", "has no task at idx 9" in r["1:0"].get("error", ""),
          True)
    env.close()
    env = Program({"env_id": "vf-missing-v1", "paths": PATHS})
    e = env.hello.get("error", "")
    check("v1: an unknown taskset is refused at hello, named",
          ("'vf-missing-v1'" in e, "taskset 'vf-missing-v1' not found" in e), (True, True))
    env.close()


def export_v1():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.jsonl")
        args = [sys.executable, ADAPTER, "export", "--env-id", "vf-guess-v1", "--out", out]
        for p in PATHS:
            args += ["--path", p]
        subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
        with open(out) as f:
            rows = [json.loads(line) for line in f]
    check("v1 export: the taskset as rows", rows,
          [{"example_id": 0, "question": "Guess my number from 1 to 10.", "answer": "7"},
           {"example_id": 1, "question": "Guess my number from 1 to 10 again.", "answer": "3"}])


def programs_v1():
    """verifiers' own harness programs (`null`: a chat loop; `bash`: a coding agent with `bash`
    and `edit` tools) on the vf-guess-v1 tasks, in the `subprocess` runtime: PEP 723 scripts that
    verifiers runs with `uv` (which installs their dependencies, openai, mcp, ..., from the
    package index when first run). Skipped without `uv` on PATH, and for the stand-in."""
    import shutil
    if "--standin-v1" in sys.argv or shutil.which("uv") is None:
        print("skip v1 harness programs (null, bash): no uv on PATH, or the stand-in")
        return
    env = Program({"env_id": "vf-guess-v1", "paths": PATHS,
                   "env_config": {"agent": {"harness": {"id": "null"}}}})
    r = env.batch("reset", [reset("0:0", {"example_id": "0"}),
                            reset("0:1", {"example_id": "0"}, sample=1)])
    check("v1 null harness: its first call is the prompt", r["0:0"],
          {"id": "0:0", "messages": PROMPT_V1})
    s = env.batch("step", [step("0:0", 1, "7"), step("0:1", 1, "My guess: 4")])
    check("v1 null harness: one reply, scored (right: 1.5)", s["0:0"],
          {"id": "0:0", "messages": [], "reward": 1.5, "done": True,
           "metrics": {"correct": 1.0, "guesses": 1.0, "quick": 1.0, "reward": 1.5}})
    check("v1 null harness: wrong: 0.5", s["0:1"]["reward"], 0.5)
    err = env.close()
    check("v1 null harness: it streams (the openai SDK's stream_options said, ignored)",
          any("'stream_options'" in l and "ignored" in l for l in err.splitlines()), True)
    env = Program({"env_id": "vf-guess-v1", "paths": PATHS,
                   "env_config": {"agent": {"harness": {"id": "bash"}}}})
    r = env.batch("reset", [reset("0:0", {"example_id": "0"})])
    check("v1 bash harness: its tools", [t["function"]["name"] for t in r["0:0"]["tools"]],
          ["bash", "edit"])
    check("v1 bash harness: its system prompt, then the task's",
          r["0:0"]["messages"][0]["content"].endswith("\n\nAnswer with one number."), True)
    s = env.batch("step", [step("0:0", 1, "<tool_call>...</tool_call>",
                                [{"id": "call_0", "name": "bash",
                                  "arguments": {"command": "expr 3 + 4"}}])])
    check("v1 bash harness: the command's output answers call_0", s["0:0"],
          {"id": "0:0", "messages": [{"role": "tool", "content": "7\n",
                                      "tool_call_id": "call_0"}], "done": False})
    s = env.batch("step", [step("0:0", 2, "7")])
    check("v1 bash harness: right after one command (1.25)", s["0:0"]["reward"], 1.25)
    # rlvr's finish: the interception refuses the waiting call, the program exits non-zero on
    # the refusal, and the stopped trace is scored (no guess: correct 0, quick 1).
    env.batch("reset", [reset("1:0", {"example_id": "0"})])
    f = env.batch("finish", [{"id": "1:0", "reason": "length"}])
    check("v1 bash harness: finish length, scored", f["1:0"],
          {"id": "1:0", "reward": 0.5,
           "metrics": {"correct": 0.0, "guesses": 0.0, "quick": 1.0, "reward": 0.5}})
    err = env.close()
    check("v1 bash harness: stopped as rlvr_length",
          any(l.startswith("[verifiers] episode 1:0 ") and l.endswith("stop rlvr_length")
              for l in err.splitlines()), True)


if __name__ == "__main__":
    if "--standin" in sys.argv or "--standin-v1" in sys.argv:
        print(f"the stand-in package in {PATHS[0]}")
        sys.path.insert(0, PATHS[0])
    import verifiers
    print(f"verifiers {verifiers.__version__} from {os.path.dirname(verifiers.__file__)}")
    if hasattr(verifiers, "load_environment"):
        guess()
        adder()
        errors()
        export()
    else:
        guess_v1()
        guess_v1(stream=True)
        tools_v1()
        errors_v1()
        export_v1()
        programs_v1()
    print("all checks passed")
