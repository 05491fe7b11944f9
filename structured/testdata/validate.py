#!/usr/bin/python3
"""Checks structured outputs with validators independent of moeserve.

    validate.py FILE.jsonl

Each line: {"kind": "json", "schema": S, "output": TEXT} (TEXT must parse as JSON and validate
against S under JSON Schema 2020-12 with the format checks Debian's python3-jsonschema has), or
{"kind": "regex", "pattern": P, "output": TEXT} (re.fullmatch(P, TEXT)). Prints each failure;
exits 1 if any, else prints the count checked.
"""
import datetime
import json
import re
import sys

import jsonschema

# Draft 2020-12's format checks; Debian's package lacks the optional modules behind time,
# date-time and hostname, so those are checked here with the standard library.
FORMATS = jsonschema.draft202012_format_checker
FORMATS.checks('time', raises=ValueError)(
    lambda s: not isinstance(s, str) or bool(datetime.time.fromisoformat(s)) or True)
FORMATS.checks('date-time', raises=ValueError)(
    lambda s: not isinstance(s, str) or
    (s[10] in 'Tt' and bool(datetime.datetime.fromisoformat(s))))
FORMATS.checks('hostname')(
    lambda s: not isinstance(s, str) or (len(s) <= 253 and all(
        re.fullmatch(r'[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?', p) for p in s.split('.'))))

failures = 0
count = 0
with open(sys.argv[1], encoding='utf-8') as f:
    for line in f:
        case = json.loads(line)
        count += 1
        out = case['output']
        try:
            if case['kind'] == 'json':
                value = json.loads(out)
                jsonschema.Draft202012Validator(
                    case['schema'], format_checker=FORMATS).validate(value)
            elif case['kind'] == 'regex':
                if re.fullmatch(case['pattern'], out) is None:
                    raise ValueError('no fullmatch')
            else:
                raise ValueError('unknown kind')
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures += 1
            print(f'FAIL {case.get("name", "")}: {out!r}: {str(e)[:300]}')
print(f'{count} outputs checked, {failures} failures')
sys.exit(1 if failures else 0)
