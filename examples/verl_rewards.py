#!/usr/bin/env python3
"""Run a reward function written for verl (`custom_reward_function`), unchanged, as an rlvr
persistent verifier.

    verifier = { kind = "verl", function = "my_reward.py:compute_score" }

is the shorthand of

    verifier = { kind = "external", mode = "persistent",
                 command = ["python3", "examples/verl_rewards.py", "my_reward.py:compute_score",
                            "--data-source", "TASK"] }

and `kwargs = { format_score = 0.1 }` in the verifier's table adds `--kwargs '{"format_score": 0.1}'`.

FILE.py[:NAME] names a function with verl's signature, `compute_score(data_source, solution_str,
ground_truth, extra_info=None)` (NAME defaults to `compute_score`, as verl's
`custom_reward_function.name` does); the file is loaded once, at start-up. Each completion of a
batch is scored by one call, with keyword arguments, as verl's reward manager calls it:

- `data_source`: the row's `data_source` column when it has one, else `--data-source` (rlvr
  passes the task's name, `data.task`);
- `solution_str`: the completion text (verl passes the decoded response);
- `ground_truth`: the row's `reward_model.ground_truth` with its JSON type (a string, a number, a
  list, an object) when the row has a `reward_model` object holding one, as verl's Parquet rows
  do; else the row's reference (rlvr's `data.answer_field`) as text;
- `extra_info`: the row's `extra_info` column (with its JSON type) when it has one, else None;
  left out of the call when the function takes no `extra_info` and no `**kwargs` (verl's older
  signature);
- and each entry of `--kwargs JSON` (a JSON object: the verifier's `kwargs`, verl's
  `custom_reward_function.reward_kwargs`), on every call.

The function returns a number (a bool counts as 1 or 0) or a dict whose `score` key holds it, as
verl reads them. From a dict, `acc` (a bool or a number, true when > 0) is the item's correctness
and `pred` its extracted answer, as verl's math scorers return them. Every key but `score` whose
value is a number (a bool as 1 or 0; a numpy or torch scalar through float()) that is finite goes
into the reply's `extra` object, which rlvr logs per step as `reward/<component>/<key>/mean` (verl
logs the dict's keys as `reward_extra_info`); other values (`pred`'s text, lists, None, NaN) are
left out. Without `acc`, rlvr's correct/accuracy metric counts a score > 0 as correct. A function that
raises, or returns something else (a dict without `score`, a score that is not a finite number),
stops the run with an error naming the function, its file and the row (its index).

Protocol: docs/external-verifier.md (persistent mode, version 1). Guide: docs/coming-from-verl.md.
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
DEFAULT_NAME = "compute_score"


def usage(msg):
    print(f"verl_rewards.py: {msg}\n"
          "usage: verl_rewards.py FILE.py[:FUNCTION] [--data-source NAME] [--kwargs JSON]",
          file=sys.stderr)
    sys.exit(2)


PASSED = ("data_source", "solution_str", "ground_truth", "extra_info")


def parse_kwargs(text):
    """The keyword arguments of `--kwargs`: a JSON object whose keys are not verl's four."""
    try:
        kwargs = json.loads(text)
    except ValueError as e:
        usage(f"--kwargs {text!r} is not JSON: {e}")
    if not isinstance(kwargs, dict):
        usage(f"--kwargs {text!r} is not a JSON object")
    for k in PASSED:
        if k in kwargs:
            usage(f"--kwargs names {k!r}, which the adapter passes itself")
    return kwargs


def parse_args(argv):
    spec, data_source, kwargs = None, None, {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--data-source", "--kwargs"):
            if i + 1 >= len(argv):
                usage(f"{a} needs a value")
            if a == "--data-source":
                data_source = argv[i + 1]
            else:
                kwargs = parse_kwargs(argv[i + 1])
            i += 2
            continue
        if a.startswith("--"):
            usage(f"unknown option {a}")
        if spec is not None:
            usage(f"one reward function, got {spec!r} and {a!r} (verl calls one compute_score)")
        spec = a
        i += 1
    if spec is None:
        usage("no reward function given")
    return spec, data_source, kwargs


def split_spec(spec):
    """(path, name): `FILE.py:NAME`, or `FILE.py` alone for verl's default name."""
    path, sep, name = spec.rpartition(":")
    if not sep or "/" in name or os.path.isfile(spec):
        return spec, DEFAULT_NAME
    if not path or not name:
        usage(f"{spec!r} is not FILE.py or FILE.py:FUNCTION")
    return path, name


def load(spec):
    path, name = split_spec(spec)
    if not os.path.isfile(path):
        usage(f"{spec}: no file {path!r} (relative to {os.getcwd()})")
    full = os.path.abspath(path)
    # verl loads the file as a module named `custom_module`; a name of our own keeps it apart.
    mod_name = "verl_reward_" + os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(full))
    m = importlib.util.spec_from_file_location(mod_name, full)
    module = importlib.util.module_from_spec(m)
    sys.modules[mod_name] = module
    m.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        usage(f"{spec}: {path} defines no function {name!r}")
    return fn, f"{name} ({path})"


def takes_extra_info(fn):
    """Whether `fn` accepts an `extra_info` keyword (by name or through **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind == p.VAR_KEYWORD or
               (p.name == "extra_info" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
               for p in params)


class Failure(Exception):
    pass


def row_name(item):
    i = item.get("index")
    return f"row {i}" if i is not None else f"the row with prompt {item.get('prompt', '')[:60]!r}"


def arguments(item, default_source):
    """verl's keyword arguments for one item (see the module docs)."""
    cols = item.get("columns") or item.get("row") or {}
    source = cols.get("data_source")
    rm = cols.get("reward_model")
    if isinstance(rm, dict) and "ground_truth" in rm:
        truth = rm["ground_truth"]
    else:
        truth = item.get("reference")
    return {
        "data_source": source if source is not None else default_source,
        "solution_str": item["completion"],
        "ground_truth": truth,
        "extra_info": cols.get("extra_info"),
    }


def number(name, item, what, v):
    """`v` (the value of `what`: "" for the result itself, "score", "acc") as a finite float
    (a bool as 1 or 0), or a Failure naming the function and the row."""
    what = f"{what} " if what else ""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise Failure(f"reward function {name} returned {what}{v!r} for {row_name(item)} "
                      f"(a number, or a dict with a number under 'score', expected)")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise Failure(f"reward function {name} returned {what}{v!r} for {row_name(item)} "
                      f"(a number expected)") from None
    if not math.isfinite(x):
        raise Failure(f"reward function {name} returned {what}{x} for {row_name(item)} "
                      f"(a finite number expected)")
    return x


def extra_numbers(out):
    """The finite numbers of a result dict besides `score` (a bool as 1 or 0), by key."""
    extra = {}
    for k, v in out.items():
        if k == "score" or isinstance(v, (str, bytes)):
            continue
        if isinstance(v, bool):
            x = 1.0 if v else 0.0
        else:
            try:
                x = float(v)
            except (TypeError, ValueError):
                continue
        if math.isfinite(x):
            extra[str(k)] = x
    return extra


def score_one(name, fn, extra, item, default_source, reward_kwargs):
    kwargs = arguments(item, default_source)
    if not extra:
        del kwargs["extra_info"]
    try:
        out = fn(**kwargs, **reward_kwargs)
    except Exception:
        raise Failure(f"reward function {name} raised on {row_name(item)} "
                      f"(data_source {kwargs['data_source']!r}): "
                      f"{traceback.format_exc(limit=-2).strip()}") from None
    if isinstance(out, dict):
        if "score" not in out:
            raise Failure(f"reward function {name} returned a dict without 'score' for "
                          f"{row_name(item)} (its keys: {sorted(map(str, out))})")
        reward = number(name, item, "score", out["score"])
        reply = {"reward": reward}
        if "acc" in out and out["acc"] is not None:
            reply["correct"] = number(name, item, "acc", out["acc"]) > 0
        if "pred" in out and out["pred"] is not None:
            reply["extracted"] = str(out["pred"])
        numbers = extra_numbers(out)
        if numbers:
            reply["extra"] = numbers
        return reply
    return number(name, item, "", out)


def main():
    spec, default_source, reward_kwargs = parse_args(sys.argv[1:])
    fn, name = load(spec)
    extra = takes_extra_info(fn)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request.get("version") != PROTOCOL:
            reply = {"error": f"verl_rewards.py speaks protocol {PROTOCOL}, "
                              f"got {request.get('version')}"}
        else:
            try:
                reply = {"rewards": [score_one(name, fn, extra, it, default_source, reward_kwargs)
                                     for it in request["items"]]}
            except Failure as e:
                reply = {"error": str(e)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
