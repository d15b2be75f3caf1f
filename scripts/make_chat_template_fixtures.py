#!/usr/bin/env python3
"""Render chat templates with transformers' `apply_chat_template` for rlvr-model's minijinja parity test.

Run from the repository root:

    /tmp/venv/bin/python scripts/make_chat_template_fixtures.py

Writes crates/rlvr-model/tests/fixtures/chat_templates.json, a list of
`{"name", "template", "bos_token", "eos_token", "messages", "add_generation_prompt", "expected"}`.

Things the Rust renderer has to match (transformers' jinja environment, utils/chat_template_utils.py):
- `trim_blocks=True` and `lstrip_blocks=True` (a block tag eats the newline after it and the blanks before it);
- jinja's default `keep_trailing_newline=False` (one trailing newline of the template text is dropped;
  the Qwen-style template below ends in a newline to exercise this);
- `{%- ... -%}` / `{{- ... }}` whitespace control; filters bind tighter than `+`
  (`'a' + message['content'] | trim + 'b'` trims only the content);
- globals `raise_exception(msg)` and `strftime_now(fmt)`, and special tokens (bos_token, eos_token, ...)
  passed as variables.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedTokenizerFast

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates" / "rlvr-model" / "tests" / "fixtures" / "chat_templates.json"
TOKENIZER = REPO / "data" / "tokenizers" / "qwen2.5" / "tokenizer.json"

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Written for rlvr in the style of Qwen2.5-Instruct's template (tools left out). Ends with a newline.
QWEN25_STYLE = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role != "system" %}
        {{- raise_exception('Unknown role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Meta-Llama-3-Instruct's template (uses bos_token; trims each message's content).
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Zephyr-style: no whitespace control markers at all, so the output is right only with trim_blocks and
# lstrip_blocks on (the indented block tags and the newlines after them must vanish), and eos_token is used.
TRIM_BLOCKS = """{% for message in messages %}
    {% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
    {% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
    {% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
    {% endif %}
    {% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
    {% endif %}
{% endfor %}
"""

# Written for rlvr in the style of Gemma 2's instruction template: the bos token, turns
# `<start_of_turn>ROLE\n…<end_of_turn>\n` with the assistant's role written "model" and each content
# trimmed, roles that must alternate starting with the user, and no system role (it raises).
GEMMA2_STYLE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Written for rlvr in the style of Gemma 3's: a leading system message is folded into the first user
# turn (its content, a blank line, then the user's), later system messages raise.
GEMMA3_STYLE = """{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] | trim + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') -}}
    {{- message['content'] | trim -}}
    {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

# Written for rlvr in the style of Phi-3-mini's: `<|ROLE|>\n…<|end|>\n` for system, user and
# assistant turns, then `<|assistant|>\n` for the generation prompt, or the EOS token without one.
PHI3_STYLE = (
    "{% for message in messages %}"
    "{% if message['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# Written for rlvr in the style of Phi-4-mini-instruct's: the same turns without newlines
# (`<|user|>…<|end|><|assistant|>`), nothing after the last turn without a generation prompt.
PHI4_MINI_STYLE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

TEMPLATES = [
    ("chatml", CHATML, None, "<|im_end|>"),
    ("qwen2.5_style", QWEN25_STYLE, None, "<|im_end|>"),
    ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    ("zephyr_trim_blocks", TRIM_BLOCKS, None, "</s>"),
    ("gemma2_style", GEMMA2_STYLE, "<bos>", "<eos>"),
    ("gemma3_style", GEMMA3_STYLE, "<bos>", "<eos>"),
    ("phi3_style", PHI3_STYLE, None, "<|endoftext|>"),
    ("phi4_mini_style", PHI4_MINI_STYLE, None, "<|endoftext|>"),
]

SYSTEM = {"role": "system", "content": "You are a careful math tutor.\nAnswer with #### N."}
CONVERSATIONS = [
    ("user_only", [{"role": "user", "content": "What is 2+2?"}]),
    ("system_user", [SYSTEM, {"role": "user", "content": "  Natalia sold 48 clips in April.\n\nHow many in May?  \n"}]),
    (
        "multi_turn_system",
        [
            SYSTEM,
            {"role": "user", "content": "Compute 7*6."},
            {"role": "assistant", "content": "7*6 = 42\n#### 42"},
            {"role": "user", "content": "Now divide it by 4 — exactly, please. Résumé: 日本語 ✓"},
        ],
    ),
    (
        "multi_turn_no_system",
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": " Hello. How can I help? "},
            {"role": "user", "content": "Say {{ not a template }} and {% raw %}."},
        ],
    ),
    (
        "ends_with_assistant",
        [
            {"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "1, 2, 3"},
        ],
    ),
]
# Which add_generation_prompt values each conversation is rendered with.
AGP = {
    "user_only": [True, False],
    "system_user": [True, False],
    "multi_turn_system": [True],
    "multi_turn_no_system": [True, False],
    "ends_with_assistant": [False],
}


def main():
    out = []
    for tname, template, bos, eos in TEMPLATES:
        kw = {"eos_token": eos}
        if bos is not None:
            kw["bos_token"] = bos
        tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), **kw)
        tok.chat_template = template
        assert tok.bos_token == bos and tok.eos_token == eos, (tok.bos_token, tok.eos_token)
        for cname, messages in CONVERSATIONS:
            for agp in AGP[cname]:
                # A template that raises (Gemma 2's on a system message): the message transformers
                # reports is the expectation.
                try:
                    text, error = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp), None
                    assert isinstance(text, str), type(text)
                except Exception as e:  # jinja2's TemplateError, raised by raise_exception
                    assert "raise_exception" in template, (tname, cname, e)
                    text, error = None, str(e)
                out.append(
                    {
                        "name": f"{tname}/{cname}/agp={str(agp).lower()}",
                        "template": template,
                        "bos_token": bos,
                        "eos_token": eos,
                        "messages": messages,
                        "add_generation_prompt": agp,
                        "expected": text,
                        "error": error,
                    }
                )
    # Spot checks of the rendering conventions described in the module docstring.
    by = {c["name"]: c["expected"] for c in out}
    assert by["chatml/user_only/agp=true"] == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    q = by["qwen2.5_style/user_only/agp=false"]
    assert q.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.") and q.endswith("<|im_end|>\n"), q
    assert "You are Qwen" not in by["qwen2.5_style/system_user/agp=true"]
    assert by["llama3/system_user/agp=false"].startswith("<|begin_of_text|><|start_header_id|>system")
    assert "\n\nNatalia sold 48 clips in April.\n\nHow many in May?<|eot_id|>" in by["llama3/system_user/agp=false"]
    z = by["zephyr_trim_blocks/user_only/agp=true"]
    assert z == "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n", repr(z)
    g = by["gemma2_style/multi_turn_no_system/agp=true"]
    assert g.startswith("<bos><start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHello.") and g.endswith(
        "<start_of_turn>model\n"
    ), repr(g)
    assert by["gemma2_style/system_user/agp=true"] is None
    g3 = by["gemma3_style/system_user/agp=false"]
    assert g3.startswith("<bos><start_of_turn>user\nYou are a careful math tutor.\nAnswer with #### N.\n\nNatalia"), repr(g3)
    p3 = by["phi3_style/system_user/agp=true"]
    assert p3.startswith("<|system|>\nYou are a careful math tutor.") and p3.endswith("<|end|>\n<|assistant|>\n"), repr(p3)
    assert by["phi3_style/user_only/agp=false"].endswith("<|end|>\n<|endoftext|>")
    p4 = by["phi4_mini_style/multi_turn_no_system/agp=true"]
    assert p4.startswith("<|user|>Hi!<|end|><|assistant|> Hello. How can I help? <|end|><|user|>"), repr(p4)
    assert p4.endswith("<|end|><|assistant|>"), repr(p4)
    meta = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "renderer": "PreTrainedTokenizerFast.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)",
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    (OUT.parent / "chat_templates.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {len(out)} cases to {OUT} (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
