#!/usr/bin/env python3
"""Old binary against new, alternating, on the three benchmarks a refactor's speed bound is judged by
(new at most 3% slower).

    python3 bench/before_after.py --old DIR --new DIR [--rounds 5]

DIR holds `bench_train_step` (rlvr-model example), `bench_rollout` (rlvr-rollout example) and `rlvr`,
built in release at the commit to time (`cargo build --release --workspace --examples --bins`, then
copy target/release/{rlvr,examples/bench_train_step,examples/bench_rollout} into DIR). Each round
runs both sides, old first in odd rounds and new first in even ones, so that drift in the machine's
load reaches both alike:
- train step: `bench_train_step --steps 5` (the policy-model benchmark's shape, 8 x 128 tokens, 2 threads), the median
  step wall time;
- sampling: `bench_rollout --runs 3` (8 prompts x 1 and 2 prompts x 4, 128 new tokens), tok/s;
- RL step: `bench/rl_step.sh 3 1` with SIDES=rlvr (the 43 M model, 4 x 8 x 32 tokens), the median
  step time of the 3 timed steps.
Prints the load before each run, then per figure the median over rounds of each side and new/old.
Wall-clock figures need an idle machine; the CPU-second figures (the train step's own, and each
benchmark process's total from getrusage) move much less with other load.
Standard library only.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_json(cmd, env):
    """The JSON lines `cmd` prints, and the CPU seconds it (and its children) used."""
    c0 = cpu_children()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")], cpu_children() - c0


def one_side(d, env):
    figs = {}
    e = dict(env, RAYON_NUM_THREADS="2")
    rows, cpu = run_json([os.path.join(d, "bench_train_step"), "--steps", "5"], e)
    figs["train step s (lower is better)"] = rows[0]["step_s_median"]
    figs["train step CPU s/step (lower is better)"] = rows[0]["cpu_s_per_step"]
    rows, cpu = run_json([os.path.join(d, "bench_rollout"), "--runs", "3"], e)
    for r in rows:
        figs[f"sampling tok/s {r['prompts']}x{r['group_size']} (higher is better)"] = r["tok_per_s"]
    figs["sampling, whole process CPU s (lower is better)"] = cpu
    e = dict(env, RLVR=os.path.join(d, "rlvr"), SIDES="rlvr", PYTHON="python3")
    rows, cpu = run_json(["bash", "bench/rl_step.sh", "3", "1"], e)
    steps = [r for r in rows if r.get("step", 0) > 1]
    figs["RL step s (lower is better)"] = statistics.median(r["step_s"] for r in steps)
    figs["RL step script, whole CPU s (lower is better)"] = cpu
    return figs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    env = dict(os.environ)
    res = {"old": [], "new": []}
    loads = []
    for r in range(1, a.rounds + 1):
        order = ["old", "new"] if r % 2 else ["new", "old"]
        for side in order:
            l = load()
            loads.append(l)
            figs = one_side(getattr(a, side), env)
            res[side].append(figs)
            print(json.dumps({"round": r, "side": side, "load": l, **figs}), flush=True)
    print(f"\nmedian of {a.rounds} rounds; load {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'figure':<44}{'old':>10}{'new':>10}{'new/old':>9}")
    for k in res["old"][0]:
        o = statistics.median(x[k] for x in res["old"])
        n = statistics.median(x[k] for x in res["new"])
        print(f"{k:<44}{o:>10.3f}{n:>10.3f}{n / o:>9.3f}")


if __name__ == "__main__":
    main()
