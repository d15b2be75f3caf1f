"""Reward functions in the shape of verl's custom_reward_function (written for rlvr's tests):
compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict."""
import json
import re


def last_number(text):
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the completion's last number is the ground truth, else 0.0 (verl's gsm8k shape)."""
    return 1.0 if last_number(solution_str) == str(ground_truth) else 0.0


def with_details(data_source, solution_str, ground_truth, extra_info=None):
    """A dict as verl's math_dapo returns: score 1 or -1 times extra_info's `scale` (default 1),
    `acc` and `pred`, and one more number (`length`), which verl logs as reward_extra_info."""
    pred = last_number(solution_str)
    acc = pred == str(ground_truth)
    scale = (extra_info or {}).get("scale", 1)
    return {"score": (1.0 if acc else -1.0) * scale, "acc": acc, "pred": pred, "length": 7}


def echo(data_source, solution_str, ground_truth, extra_info=None):
    """Reports its arguments, as JSON, in `pred` (the extracted answer rlvr keeps)."""
    return {"score": 0.5, "pred": json.dumps([data_source, solution_str, ground_truth, extra_info])}


def older(data_source, solution_str, ground_truth):
    """verl's older signature, without extra_info: True when the ground truth appears."""
    return str(ground_truth) in solution_str


def explode(data_source, solution_str, ground_truth, extra_info=None):
    if "boom" in solution_str:
        raise ValueError("cannot score this one")
    return 0.0


def nan_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float("nan")}


def no_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": True}


def text_score(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"


def with_kwargs(data_source, solution_str, ground_truth, extra_info=None, scale=1, **kw):
    """verl's reward_kwargs: `scale` (a named parameter with a default) times 1.0, and in `pred`
    every other keyword argument with its Python type name, as JSON."""
    got = sorted([k, type(v).__name__, v] for k, v in kw.items())
    return {"score": 1.0 * scale, "pred": json.dumps(got)}


def changing_extras(data_source, solution_str, ground_truth, extra_info=None):
    """Extra keys that differ between rows: `hits` on every row, `bonus` only on rows whose
    completion holds "+", and values rlvr leaves out (text, a list, None, NaN, infinity)."""
    out = {"score": 0.0, "hits": len(solution_str), "note": "text", "parts": [1, 2],
           "none": None, "nan": float("nan"), "inf": float("inf")}
    if "+" in solution_str:
        out["bonus"] = 0.5
    return out
