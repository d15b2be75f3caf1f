"""A verifiers environment (`vf-guess`) written against verifiers 0.3.1's classic API, as a
prime-rl user writes one: guess a number from 1 to 10, "Higher."/"Lower." user turns, a custom
stop condition, and a rubric of two weighted reward functions. rlvr's tests run it through
examples/verifiers_env.py with the stand-in package (crates/rlvr-env/tests/verifiers/standin) and
scripts/check_verifiers_env.py runs it with the real package.
"""
import re

import verifiers as vf
from datasets import Dataset


def last_number(text):
    nums = re.findall(r"-?\d+", text or "")
    return int(nums[-1]) if nums else None


def last_guess(messages):
    for m in reversed(messages or []):
        if m.role == "assistant":
            return last_number(m.content)
    return None


def correct(completion, answer) -> float:
    """1 when the last guess is the number."""
    return 1.0 if last_guess(completion) == int(answer) else 0.0


def quick(state) -> float:
    """1 / the number of turns taken."""
    return 1.0 / max(1, len(state["trajectory"]))


def broken(completion) -> float:
    """A reward function with a bug."""
    return 1.0 / 0


class GuessEnv(vf.MultiTurnEnv):
    broken_hint = False

    async def setup_state(self, state):
        state["hints"] = 0
        return state

    @vf.stop
    async def guessed(self, state) -> bool:
        if not state["trajectory"]:
            return False
        return last_guess(state["trajectory"][-1]["completion"]) == int(state["answer"])

    async def env_response(self, messages, state, **kwargs):
        guess = last_guess(messages)
        state["hints"] += 1
        if self.broken_hint:
            raise ValueError(f"no hint for {guess}")
        if guess is None:
            return [vf.UserMessage(content="Answer with a number.")]
        target = int(state["answer"])
        return [vf.UserMessage(content="Higher." if guess < target else "Lower.")]


def load_environment(max_turns: int = 4, broken_reward: bool = False, broken_hint: bool = False,
                     **kwargs):
    ds = Dataset.from_list([
        {"question": "Guess my number from 1 to 10.", "answer": "7"},
        {"question": "Guess my number from 1 to 10 again.", "answer": "3"},
    ])
    funcs, weights = [correct, quick], [1.0, 0.5]
    if broken_reward:
        funcs, weights = funcs + [broken], weights + [1.0]
    rubric = vf.Rubric(funcs=funcs, weights=weights)
    env = GuessEnv(dataset=ds, system_prompt="Answer with one number.", rubric=rubric,
                   max_turns=max_turns, **kwargs)
    env.broken_hint = broken_hint
    return env
