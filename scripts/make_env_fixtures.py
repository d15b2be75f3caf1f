#!/usr/bin/env python3
"""Render multi-turn, tool-using conversations with transformers for rlvr-env's bridge tests.

Run from the repository root (never at test time):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
    /tmp/venv/bin/python scripts/make_env_fixtures.py

Writes crates/rlvr-env/tests/fixtures/conversations.json, a list of cases
`{"name", "template", "tokenizer", "vars", "end_of_turn", "tools", "messages", "prompt_messages",
"turns", "prompt_text", "full_text", "full_ids"}`:
- `template`: a file of data/chat_templates/ (official templates vendored from TRL's
  `trl/chat_templates/`, see data/chat_templates/README.md);
- `tokenizer`: `qwen2.5` (data/tokenizers/qwen2.5/tokenizer.json), or `qwen2.5+llama3` (the same with
  Llama 3's header, end-of-turn and python-tag tokens added as special tokens, in the order of
  LLAMA3_SPECIALS: there is no Llama 3 tokenizer in data/, so the Llama 3.1 template runs with this
  one; token ids differ from Meta's, the token boundaries at special tokens do not);
- `prompt_text`: transformers' `apply_chat_template(prompt_messages, tools=tools,
  add_generation_prompt=True, **vars)`;
- `full_text`: `apply_chat_template(messages, tools=tools, **vars)` (no generation prompt), and
  `full_ids` its encoding without added special tokens;
- `turns`: each assistant turn's text as the model writes it after the generation prompt (the
  template's rendering of that message between its header and its end-of-turn token), so that the
  prompt, the turns with their end-of-turn ids and the bridges rebuild `full_ids` exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import transformers
from tokenizers import AddedToken, Tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates" / "rlvr-env" / "tests" / "fixtures" / "conversations.json"
TEMPLATES = REPO / "data" / "chat_templates"
QWEN = REPO / "data" / "tokenizers" / "qwen2.5" / "tokenizer.json"
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 3*7 (<, > and & are literal).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression, e.g. \"2+2\"."}},
            "required": ["expression"],
        },
    },
}


def call(i, expr):
    return {"id": f"call_{i}", "type": "function", "function": {"name": "calculator", "arguments": {"expression": expr}}}


def tool(i, content):
    return {"role": "tool", "tool_call_id": f"call_{i}", "name": "calculator", "content": content}


def tokenizer(name):
    t = Tokenizer.from_file(str(QWEN))
    if name == "qwen2.5+llama3":
        t.add_special_tokens([AddedToken(s, special=True) for s in LLAMA3_SPECIALS])
    return t


def qwen_tool_text(exprs):
    # Qwen2.5 writes `\n` before each call and Qwen3 before all but a contentless turn's first; the
    # generation prompt `<|im_start|>assistant\n` already holds the first one, so both read the same.
    return "\n".join(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + e + '"}}\n</tool_call>' for e in exprs
    )


USER = {"role": "user", "content": "What are 3*7 and 2+2? Use the calculator."}
TWO_CALLS = {"role": "assistant", "content": "", "tool_calls": [call(0, "3*7"), call(1, "2+2")]}
ANSWER = "3*7 = 21 and 2+2 = 4 (é, <ok>)."

CASES = [
    {
        # Two tool calls in one turn, two tool messages grouped into one user turn by the template.
        "name": "qwen2.5_tools",
        "template": "qwen2_5.jinja",
        "tokenizer": "qwen2.5",
        "vars": {"bos_token": None, "eos_token": "<|im_end|>"},
        "end_of_turn": "<|im_end|>",
        "tools": [CALCULATOR],
        "messages": [USER, TWO_CALLS, tool(0, "21"), tool(1, "4"), {"role": "assistant", "content": ANSWER}],
        "turns": [qwen_tool_text(["3*7", "2+2"]), ANSWER],
    },
    {
        # Qwen3 renders the last assistant turn after the last user query with an empty think block.
        "name": "qwen3_tools",
        "template": "qwen3.jinja",
        "tokenizer": "qwen2.5",
        "vars": {"bos_token": None, "eos_token": "<|im_end|>"},
        "end_of_turn": "<|im_end|>",
        "tools": [CALCULATOR],
        "messages": [USER, TWO_CALLS, tool(0, "21"), tool(1, "4"), {"role": "assistant", "content": ANSWER}],
        "turns": [qwen_tool_text(["3*7", "2+2"]), "<think>\n\n</think>\n\n" + ANSWER],
    },
    {
        # User feedback (the retry environment's shape), no tools.
        "name": "qwen2.5_retry",
        "template": "qwen2_5.jinja",
        "tokenizer": "qwen2.5",
        "vars": {"bos_token": None, "eos_token": "<|im_end|>"},
        "end_of_turn": "<|im_end|>",
        "tools": None,
        "messages": [
            {"role": "system", "content": "Answer with a number."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "That is not correct. Please try again."},
            {"role": "assistant", "content": "4"},
        ],
        "turns": ["5", "4"],
    },
    {
        # One tool call per turn (the template refuses more), tools in the first user message,
        # tool results printed through tojson.
        "name": "llama3.1_tools",
        "template": "llama3_1.jinja",
        "tokenizer": "qwen2.5+llama3",
        "vars": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "date_string": "26 Jul 2024"},
        "end_of_turn": "<|eot_id|>",
        "tools": [CALCULATOR],
        "messages": [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call(0, "3*7")]},
            tool(0, "21"),
            {"role": "assistant", "content": "", "tool_calls": [call(1, "2+2")]},
            tool(1, "4"),
            {"role": "assistant", "content": ANSWER},
        ],
        "turns": [
            '{"name": "calculator", "parameters": {"expression": "3*7"}}',
            '{"name": "calculator", "parameters": {"expression": "2+2"}}',
            ANSWER,
        ],
    },
]


def render(case, messages, add_generation_prompt):
    source = (TEMPLATES / case["template"]).read_text()
    vars_ = {k: v for k, v in case["vars"].items() if v is not None}
    text, _ = render_jinja_template(
        conversations=[messages],
        tools=case["tools"],
        chat_template=source,
        add_generation_prompt=add_generation_prompt,
        **vars_,
    )
    return text[0]


def main():
    out = []
    for case in CASES:
        msgs = case["messages"]
        first_assistant = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        prompt_messages = msgs[:first_assistant]
        full_text = render(case, msgs, False)
        tok = tokenizer(case["tokenizer"])
        out.append(
            {
                **case,
                "prompt_messages": prompt_messages,
                "prompt_text": render(case, prompt_messages, True),
                "full_text": full_text,
                "full_ids": tok.encode(full_text, add_special_tokens=False).ids,
            }
        )
    meta = {
        "made_by": "scripts/make_env_fixtures.py",
        "transformers": transformers.__version__,
        "llama3_specials": LLAMA3_SPECIALS,
        "cases": out,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(out)} cases)")


if __name__ == "__main__":
    main()
