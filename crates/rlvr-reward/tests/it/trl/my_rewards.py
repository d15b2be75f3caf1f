"""Reward functions in the shape of TRL's GRPOTrainer docs examples (written for rlvr's tests):
fn(prompts, completions, **kwargs) -> list[float | None]."""
import re


def text(c):
    # Conversational completions are lists of messages; standard ones are strings.
    return c[0]["content"] if isinstance(c, list) else c


def accuracy_reward(completions, solution, **kwargs):
    """1.0 when the completion contains the solution; None (not applicable) without one."""
    return [None if s is None else (1.0 if str(s) in text(c) else 0.0)
            for c, s in zip(completions, solution)]


def format_reward(completions, **kwargs):
    pattern = r"^<think>.*?</think>\s*<answer>.*?</answer>$"
    return [1.0 if re.match(pattern, text(c), re.DOTALL) else 0.0 for c in completions]


def length_penalty(completions, allowed_lengths, strict, **kwargs):
    """-1 per character outside [lo, hi] (a list column), doubled when `strict` (a boolean)."""
    out = []
    for c, (lo, hi), st in zip(completions, allowed_lengths, strict):
        n = len(text(c))
        over = max(0, lo - n, n - hi)
        out.append(-float(over) * (2 if st is True else 1))
    return out


def shapes(prompts, completions, meta, **kwargs):
    """Checks what reaches a function: 1 conversational completion and prompt, 10 a string
    prompt and completion; + meta["level"] (a nested object)."""
    out = []
    for p, c, m in zip(prompts, completions, meta):
        conv = (isinstance(c, list) and c[0]["role"] == "assistant"
                and isinstance(p, list) and p[-1]["role"] == "user")
        out.append((1.0 if conv else 10.0 if isinstance(p, str) and isinstance(c, str) else 0.0)
                   + m["level"])
    return out


def prompt_length(prompts, **kwargs):
    """The prompt's length in characters (a string prompt only)."""
    return [float(len(p)) if isinstance(p, str) else None for p in prompts]


def explode(completions, **kwargs):
    out = []
    for c in completions:
        if "boom" in text(c):
            raise ValueError("cannot score this one")
        out.append(0.0)
    return out


def nan_reward(completions, **kwargs):
    return [float("nan") for _ in completions]
