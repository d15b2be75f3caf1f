"""A verifiers tool environment (`vf-adder`) written against verifiers 0.3.1's classic API: a
`ToolEnv` with one tool, `add`, and a rubric; the rollout ends at the first turn without a tool
call (ToolEnv's own stop condition). Run by rlvr's tests with the stand-in package and by
scripts/check_verifiers_env.py with the real one.
"""
import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def correct(completion, answer) -> float:
    """1 when the last assistant message contains the answer."""
    last = [m for m in completion if m.role == "assistant"][-1]
    return 1.0 if str(answer) in (last.content or "") else 0.0


def load_environment(**kwargs):
    ds = Dataset.from_list([
        {"question": "What is 17 + 25? Use the add tool.", "answer": "42"},
    ])
    return vf.ToolEnv(dataset=ds, tools=[add], max_turns=3,
                      system_prompt="Use the tools.", rubric=vf.Rubric(funcs=[correct]),
                      **kwargs)
