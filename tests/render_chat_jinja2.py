#!/usr/bin/python3
"""Renders a chat template as Hugging Face's transformers does (Jinja2's sandbox, trim_blocks,
lstrip_blocks, loopcontrols, tojson without ASCII escapes, raise_exception): an independent
reference for moeserve's own Jinja interpreter and its message preprocessing.

    render_chat_jinja2.py TEMPLATE INPUT.json

INPUT: {"messages": [...], "tools": [...] | null, "add_generation_prompt": bool, "extra": {...}}.
Prints the rendered text.
"""
import json
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters['tojson'] = tojson
env.globals['raise_exception'] = raise_exception
with open(sys.argv[1], encoding='utf-8') as f:
    template = env.from_string(f.read())
with open(sys.argv[2], encoding='utf-8') as f:
    inputs = json.load(f)
sys.stdout.write(template.render(messages=inputs['messages'], tools=inputs['tools'],
                                 add_generation_prompt=inputs['add_generation_prompt'],
                                 **inputs.get('extra', {})))
