#!/usr/bin/env python3
"""An rlvr environment: arithmetic word problems with a calculator tool (Hermes tool calls).

    [env]
    command = ["python3", "../examples/env_calculator.py"]
    max_turns = 4
    tool_format = "hermes"          # Qwen2.5 / Qwen3: <tool_call>{"name": ..., "arguments": ...}</tool_call>
    options = { max_expression_chars = 200 }

The dataset row needs the question and its answer: `question`/`answer` (GSM8K's columns: the answer
after its last "####"), else `prompt`/`reference`. `reset` replaces the prompt by a system message
and the question, and gives the `calculator` tool's schema (rendered by the chat template's
`tools`). Each turn:

- tool calls (rlvr parsed them from the turn, `env.tool_format = "hermes"`): one `tool` message per
  call with the value of its `expression`, or `error: ...`; reward 0, the episode goes on;
- calls that did not parse (`tool_call_errors`): one `user` message naming what went wrong;
- neither: the turn is the final answer; its last number is compared with the reference: reward 1
  when equal (as numbers), else 0; the episode ends.

`finish` (rlvr ended the episode: turns, tokens) gives reward 0. The calculator evaluates numbers,
+ - * / // % ** and parentheses only, by walking Python's syntax tree (never eval), with bounded
operands and exponents, so a hostile expression costs microseconds. Protocol: docs/environments.md
and docs/DESIGN.md section 14; log to stderr only.
"""
import ast
import json
import math
import operator
import re
import sys

PROTOCOL = 1
TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (48 + 24) * 3"}},
            "required": ["expression"],
        },
    },
}
SYSTEM = ("Solve the problem. You may call the calculator tool; when you know the answer, "
          "reply with the final number and no tool call.")
BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
LIMIT = 1e15       # largest operand or result magnitude
MAX_EXPONENT = 64  # largest |exponent| of **


class CalcError(Exception):
    pass


def calc(node):
    """The value of an expression node; CalcError for anything but arithmetic on numbers."""
    if isinstance(node, ast.Expression):
        return calc(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        v = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = calc(node.operand)
        v = -v if isinstance(node.op, ast.USub) else v
    elif isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        a, b = calc(node.left), calc(node.right)
        if isinstance(node.op, ast.Pow) and abs(b) > MAX_EXPONENT:
            raise CalcError(f"exponent {b} is too large (at most {MAX_EXPONENT})")
        try:
            v = BINARY[type(node.op)](a, b)
        except ZeroDivisionError:
            raise CalcError("division by zero")
        except OverflowError:
            raise CalcError("the value is too large")
        if isinstance(v, complex):
            raise CalcError("the result is not a real number")
    else:
        raise CalcError(f"unsupported syntax: {type(node).__name__}")
    if (isinstance(v, float) and not math.isfinite(v)) or abs(v) > LIMIT:
        raise CalcError("the value is too large")
    return v


def evaluate(expression, max_chars):
    """The calculator's answer to one call: the value as text, or 'error: ...'."""
    if not isinstance(expression, str):
        return "error: `expression` must be a string"
    if len(expression) > max_chars:
        return f"error: the expression is longer than {max_chars} characters"
    try:
        v = calc(ast.parse(expression, mode="eval"))
    except SyntaxError:
        return "error: the expression does not parse"
    except CalcError as e:
        return f"error: {e}"
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return repr(round(v, 10)) if isinstance(v, float) else str(v)


def number(text):
    """The last number in text (commas inside it dropped), or None."""
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def reference_of(row):
    """The row's answer: GSM8K's text after its last ####, else `reference`."""
    answer = row.get("answer")
    if isinstance(answer, str) and "####" in answer:
        return answer.rsplit("####", 1)[1].strip()
    return str(answer if answer is not None else row.get("reference", ""))


def main():
    max_chars = 200
    refs = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        kind = req.get("type")
        if kind == "hello":
            opts = req.get("options") or {}
            max_chars = int(opts.get("max_expression_chars", max_chars))
            out = {"version": PROTOCOL}
        elif kind == "reset":
            eps = []
            for e in req["episodes"]:
                row = e.get("row") or {}
                question = row.get("question", row.get("prompt", ""))
                refs[e["id"]] = number(reference_of(row))
                eps.append({"id": e["id"],
                            "messages": [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": question}],
                            "tools": [TOOL]})
            out = {"episodes": eps}
        elif kind == "step":
            eps = []
            for e in req["episodes"]:
                if e["id"] not in refs:
                    eps.append({"id": e["id"], "error": "unknown episode"})
                    continue
                calls, errors = e.get("tool_calls") or [], e.get("tool_call_errors") or []
                if calls or errors:
                    msgs = []
                    for c in calls:
                        if c.get("name") != "calculator":
                            content = f"error: no tool named {c.get('name')!r}; the tool is calculator"
                        else:
                            content = evaluate((c.get("arguments") or {}).get("expression"), max_chars)
                        msgs.append({"role": "tool", "tool_call_id": c.get("id"),
                                     "name": c.get("name"), "content": content})
                    for err in errors:
                        msgs.append({"role": "user", "content": f"Your tool call did not parse: {err}"})
                    eps.append({"id": e["id"], "messages": msgs, "reward": 0.0, "done": False})
                else:
                    got, want = number(e["text"]), refs[e["id"]]
                    right = got is not None and want is not None and abs(got - want) < 1e-6
                    eps.append({"id": e["id"], "messages": [], "reward": 1.0 if right else 0.0,
                                "done": True})
            out = {"episodes": eps}
        elif kind == "finish":
            out = {"episodes": [{"id": e["id"], "reward": 0.0} for e in req["episodes"]]}
        else:
            out = {"error": f"unknown request type {kind!r}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
