#!/usr/bin/env python3
"""Renders a chat template over the inputs of chat cases, as Hugging Face transformers'
apply_chat_template does (Jinja2 in an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loopcontrols; tojson = json.dumps(x, ensure_ascii=False); raise_exception),
and prints one JSON line per case that renders: the inputs and "rendered".

    python3 render_cases.py TEMPLATE CASES.jsonl TOKENIZER_CONFIG.json > OUT.jsonl

The context is transformers': messages, tools, documents = None, add_generation_prompt, the
special tokens of tokenizer_config.json (eos_token, pad_token, additional_special_tokens), then
the keys of "extra". Cases whose rendering raises (a template that refuses the input) are left
out, named on stderr. Needs only Debian's python3-jinja2.
"""
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    template_path, cases_path, config_path = sys.argv[1:4]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(template_path, encoding="utf-8") as f:
        template = env.from_string(f.read())
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    special = {k: config[k] for k in ("eos_token", "pad_token", "additional_special_tokens")
               if k in config}
    with open(cases_path, encoding="utf-8") as f:
        for line in f:
            case = json.loads(line)
            context = dict(messages=case["messages"], tools=case["tools"], documents=None,
                           add_generation_prompt=case["add_generation_prompt"], **special)
            context.update(case.get("extra") or {})
            try:
                rendered = template.render(**context)
            except jinja2.exceptions.TemplateError as e:
                print(f"{case['id']}: not rendered: {e}", file=sys.stderr)
                continue
            out = {k: case[k] for k in ("id", "messages", "tools", "add_generation_prompt",
                                        "extra")}
            out["rendered"] = rendered
            print(json.dumps(out, ensure_ascii=False, separators=(",", ":")))


if __name__ == "__main__":
    main()
