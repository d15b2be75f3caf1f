#!/usr/bin/env python3
"""compare.py REF_DIR RUN_DIR: compares a resumed run directory with the uninterrupted reference.

Prints one line: `exact` or `differs: FILE ...` (first difference), exit 0 / 1.
Checks: metrics.jsonl (every key but time keys) per step, each step once; eval.jsonl and
rollouts.jsonl line by line; the final checkpoint (checkpoints/latest) names the same step and
every *.safetensors file in it is byte-equal (model.safetensors, or adapter/ for LoRA, plus
trainer_state/optimizer.safetensors and the explorer copy when present).
A note (not counted as a difference) is appended when diagnostics.jsonl differs outside
memory/ and time/ keys.
"""
import json
import os
import sys

TIME_KEYS = {"time/sample_s", "time/train_s", "tokens_per_s"}


def load(path):
    if not os.path.exists(path):
        return None
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                out.append({"__unparsable__": f"line {n}: {e}"})
    return out


def first_key_diff(a, b, skip=()):
    keys = sorted((set(a) | set(b)) - set(skip))
    for k in keys:
        if k not in a or k not in b:
            return k, a.get(k, "<absent>"), b.get(k, "<absent>")
        if a[k] != b[k]:
            return k, a[k], b[k]
    return None


def compare_lines(name, ref, got, skip=()):
    if ref is None and got is None:
        return None
    if ref is None or got is None:
        return f"{name}: present in {'run' if ref is None else 'reference'} only"
    if name in ("metrics.jsonl", "eval.jsonl"):
        steps = [d.get("step") for d in got]
        dups = sorted({s for s in steps if steps.count(s) > 1})
        if dups:
            return f"{name}: steps repeated {dups}"
    for i, (a, b) in enumerate(zip(ref, got)):
        d = first_key_diff(a, b, skip)
        if d:
            k, va, vb = d
            return f"{name}: line {i + 1} (step {a.get('step')}) key {k!r}: ref {va!r} vs run {vb!r}"
    if len(ref) != len(got):
        extra = got[len(ref):] if len(got) > len(ref) else ref[len(got):]
        who = "run" if len(got) > len(ref) else "reference"
        return (f"{name}: {len(got)} lines vs reference {len(ref)}; {who} has more, "
                f"first extra step {extra[0].get('step')}")
    return None


def latest(d):
    p = os.path.join(d, "checkpoints", "latest")
    try:
        return open(p).read().strip()
    except OSError:
        return None


def safetensors_files(ck):
    out = []
    for root, _, files in os.walk(ck):
        for f in files:
            if f.endswith(".safetensors"):
                out.append(os.path.relpath(os.path.join(root, f), ck))
    return sorted(out)


def main():
    ref, run = sys.argv[1], sys.argv[2]
    problems = []
    for name, skip in [("metrics.jsonl", TIME_KEYS), ("eval.jsonl", ()), ("rollouts.jsonl", ())]:
        p = compare_lines(name, load(os.path.join(ref, name)), load(os.path.join(run, name)), skip)
        if p:
            problems.append(p)
    lr, lg = latest(ref), latest(run)
    if lr != lg:
        problems.append(f"checkpoints/latest: ref {lr!r} vs run {lg!r}")
    elif lr:
        a, b = os.path.join(ref, "checkpoints", lr), os.path.join(run, "checkpoints", lr)
        fa, fb = safetensors_files(a), safetensors_files(b)
        if fa != fb:
            problems.append(f"checkpoints/{lr}: safetensors files {fa} vs {fb}")
        else:
            for f in fa:
                if open(os.path.join(a, f), "rb").read() != open(os.path.join(b, f), "rb").read():
                    problems.append(f"checkpoints/{lr}/{f}: bytes differ")
    note = ""
    dr, dg = load(os.path.join(ref, "diagnostics.jsonl")), load(os.path.join(run, "diagnostics.jsonl"))
    if dr is not None and dg is not None:
        skip = {k for d in dr + dg for k in d if k.startswith(("memory/", "time/"))}
        p = compare_lines("diagnostics.jsonl", dr, dg, skip)
        if p:
            note = f" [note: {p}]"
    if problems:
        print("differs: " + " | ".join(problems) + note)
        sys.exit(1)
    print("exact" + note)


if __name__ == "__main__":
    main()
