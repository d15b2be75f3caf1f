#!/usr/bin/env python3
"""Run reward functions written for TRL's GRPOTrainer, unchanged, as an rlvr persistent verifier.

    verifier = { kind = "external", mode = "persistent",
                 command = ["python3", "examples/trl_rewards.py",
                            "my_rewards.py:accuracy_reward", "my_rewards.py:format_reward",
                            "--weights", "1.0", "0.5"] }

Each FILE.py:NAME names a function with TRL's signature, `fn(prompts, completions, **kwargs)`
returning one float (or None) per completion; the file is loaded once, at start-up. For each batch
the program calls every function once on the whole batch, with:

- `prompts`: per item, the row's prompt column (`--prompt-column`, default "prompt") as the
  dataset holds it (a list of {"role", "content"} messages, or text), as TRL passes it; the
  rendered prompt text when the row has no such column;
- `completions`: per item, [{"role": "assistant", "content": TEXT}] when the prompt is
  conversational (as TRL passes them), else the completion text;
- one keyword argument per column of the rows (all but the prompt column), a list with one value
  per item, each value with its JSON type (lists, booleans, objects, numbers, strings), the
  `reference` (the data's answer field) among them unless a column has that name.

The reward of an item is the weighted sum (`--weights`, default 1 each, as TRL's reward_weights)
of the functions' values; a function returning None for an item does not apply to it (left out of
the sum, as TRL does); when every function returns None for an item its reward is 0 and a warning
goes to stderr. A function that raises, returns the wrong number of values, or a value that is not
a finite number or None stops the run with an error naming the function and the row (its index).
rlvr's correct/accuracy metric counts a reward > 0 as correct.

Protocol: docs/external-verifier.md (persistent mode, version 1). Guide: docs/coming-from-trl.md.
Pure Python 3.8+, no dependencies.
"""
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback

PROTOCOL = 1


def usage(msg):
    print(f"trl_rewards.py: {msg}\n"
          "usage: trl_rewards.py FILE.py:FUNCTION [FILE.py:FUNCTION ...] "
          "[--weights W ...] [--prompt-column NAME]", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    specs, weights, prompt_column = [], None, "prompt"
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--weights":
            weights = []
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                try:
                    w = float(argv[i])
                except ValueError:
                    usage(f"--weights: {argv[i]!r} is not a number")
                if not math.isfinite(w):
                    usage(f"--weights: {argv[i]!r} is not finite")
                weights.append(w)
                i += 1
            continue
        if a == "--prompt-column":
            if i + 1 >= len(argv):
                usage("--prompt-column needs a name")
            prompt_column = argv[i + 1]
            i += 2
            continue
        if a.startswith("--"):
            usage(f"unknown option {a}")
        specs.append(a)
        i += 1
    if not specs:
        usage("no reward function given")
    if weights is None:
        weights = [1.0] * len(specs)
    if len(weights) != len(specs):
        usage(f"{len(weights)} weights for {len(specs)} functions (one weight each)")
    return specs, weights, prompt_column


def load(spec):
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        usage(f"{spec!r} is not FILE.py:FUNCTION")
    if not os.path.isfile(path):
        usage(f"{spec}: no file {path!r} (relative to {os.getcwd()})")
    mod_name = "trl_reward_" + os.path.splitext(os.path.basename(path))[0]
    loaded = sys.modules.get(mod_name)
    if loaded is None or getattr(loaded, "__file__", None) != os.path.abspath(path):
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        m = importlib.util.spec_from_file_location(mod_name, os.path.abspath(path))
        loaded = importlib.util.module_from_spec(m)
        sys.modules[mod_name] = loaded
        m.loader.exec_module(loaded)
    fn = getattr(loaded, name, None)
    if fn is None or not callable(fn):
        usage(f"{spec}: {path} defines no function {name!r}")
    return fn


class Failure(Exception):
    pass


def is_messages(v):
    return isinstance(v, list) and all(isinstance(m, dict) and "content" in m for m in v) and v


def call(name, fn, prompts, completions, kwargs, items):
    """The function's values for the batch: one float or None per item."""
    n = len(items)
    # A column the function names that no row of this batch has is None for every row, as a
    # Hugging Face dataset fills a missing value.
    kwargs = dict(kwargs)
    for p in named_parameters(fn):
        if p not in kwargs and p not in ("prompts", "completions"):
            kwargs[p] = [None] * n
    try:
        out = fn(prompts=prompts, completions=completions, **kwargs)
    except Exception:
        # Find the row that fails: call the function on each item alone.
        for k in range(n):
            try:
                fn(prompts=prompts[k:k + 1], completions=completions[k:k + 1],
                   **{c: v[k:k + 1] for c, v in kwargs.items()})
            except Exception:
                # This exception alone: raised while the batch's was handled, it would otherwise
                # print the batch's traceback too ("During handling of the above exception").
                raise Failure(f"reward function {name} raised on row {row_name(items[k])}: "
                              f"{last_traceback()}") from None
        raise Failure(f"reward function {name} raised on the batch of {n} (no row alone "
                      f"raises): {last_traceback()}") from None
    try:
        out = list(out)
    except TypeError:
        raise Failure(f"reward function {name} returned {type(out).__name__}, "
                      f"not a list of {n} floats")
    if len(out) != n:
        raise Failure(f"reward function {name} returned {len(out)} values for {n} completions")
    values = []
    for k, v in enumerate(out):
        if v is None:
            values.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise Failure(f"reward function {name} returned {v!r} for row {row_name(items[k])} "
                          f"(a number or None expected)")
        x = float(v)
        if not math.isfinite(x):
            raise Failure(f"reward function {name} returned {x} for row {row_name(items[k])} "
                          f"(a finite number or None expected)")
        values.append(x)
    return values


def last_traceback():
    """The exception being handled, its last two frames, without the exceptions it chains."""
    return "".join(traceback.format_exception(*sys.exc_info(), limit=-2, chain=False)).strip()


def named_parameters(fn):
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def row_name(item):
    i = item.get("index")
    return f"{i}" if i is not None else f"with prompt {item.get('prompt', '')[:60]!r}"


def batch_inputs(items, prompt_column):
    prompts, completions = [], []
    for it in items:
        cols = it.get("columns") or it.get("row") or {}
        p = cols.get(prompt_column)
        if is_messages(p):
            prompts.append(p)
            completions.append([{"role": "assistant", "content": it["completion"]}])
        else:
            # TRL passes the dataset's prompt as it is; without a prompt column, the rendered one.
            prompts.append(p if isinstance(p, str) else it["prompt"])
            completions.append(it["completion"])
    names = []
    for it in items:
        for c in (it.get("columns") or it.get("row") or {}):
            if c != prompt_column and c not in names:
                names.append(c)
    kwargs = {c: [(it.get("columns") or it.get("row") or {}).get(c) for it in items]
              for c in names}
    if "reference" not in kwargs:
        kwargs["reference"] = [it.get("reference") for it in items]
    return prompts, completions, kwargs


def score(funcs, weights, prompt_column, items, warned):
    prompts, completions, kwargs = batch_inputs(items, prompt_column)
    per_func = [call(name, fn, prompts, completions, kwargs, items) for name, fn in funcs]
    rewards = []
    for k, it in enumerate(items):
        vals = [(w, f[k]) for w, f in zip(weights, per_func) if f[k] is not None]
        if not vals:
            if not warned:
                print(f"trl_rewards.py: warning: every reward function returned None for row "
                      f"{row_name(it)}; its reward is 0 (further such rows not reported)",
                      file=sys.stderr)
                warned.append(True)
            rewards.append(0.0)
        else:
            rewards.append(sum(w * v for w, v in vals))
    return rewards


def main():
    specs, weights, prompt_column = parse_args(sys.argv[1:])
    funcs = []
    for s in specs:
        fn = load(s)
        funcs.append((f"{getattr(fn, '__name__', s)} ({s})", fn))
    warned = []
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("version") != PROTOCOL:
            reply = {"error": f"trl_rewards.py speaks protocol {PROTOCOL}, "
                              f"got {request.get('version')}"}
        else:
            try:
                reply = {"rewards": score(funcs, weights, prompt_column, request["items"], warned)}
            except Failure as e:
                reply = {"error": str(e)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
