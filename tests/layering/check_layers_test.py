#!/usr/bin/env python3
"""scripts/check_layers.py on small made-up repositories: a clean one passes; a layer that
includes one above it, a folder missing from the table and a two-way tie between modules each
fail with their message."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'scripts', 'check_layers.py')
TABLE = """# Design
## Layers
| folder | holds | may include |
| --- | --- | --- |
| `core/` | basics | — |
| `model/` | the model | `core/` |
| `tests/` | test helpers | `core/`, `model/` |
## Principles
"""


def run(files):
    with tempfile.TemporaryDirectory() as repo:
        files = {'docs/design.md': TABLE, **files}
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(repo, path)), exist_ok=True)
            with open(os.path.join(repo, path), 'w') as f:
                f.write(text)
        r = subprocess.run([sys.executable, SCRIPT, repo], capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    failures = []

    def expect(name, files, code, message):
        got_code, out = run(files)
        if got_code != code or message not in out:
            failures.append(f'{name}: exit {got_code}, output:\n{out}')

    clean = {'core/a.h': '#include <vector>\n#include "hwy/highway.h"\n',
             'model/m.h': '#include "core/a.h"\n', 'model/m.cc': '#include "model/m.h"\n',
             'model/m-inl.h': '#include "model/m.h"\n', 'model/m_test.cc': '#include "tests/t.h"\n', 'tests/t.h': '#include "model/m.h"\n'}
    expect('clean', clean, 0, 'no cycle')
    expect('upward', {**clean, 'core/b.cc': '#include "model/m.h"\n'}, 1,
           'core/b.cc: includes "model/m.h": core/ may not include model/')
    expect('tests from a non-test source', {**clean, 'model/x.cc': '#include "tests/t.h"\n'}, 1,
           'model/ may not include tests/')
    expect('unknown folder', {**clean, 'model/y.cc': '#include "server/s.h"\n',
                              'server/s.h': ''}, 1, 'server/ is in no row of the table')
    expect('two-way tie', {**clean, 'model/p.h': '#include "model/q.h"\n', 'model/q.h': '',
                           'model/q.cc': '#include "model/p.h"\n'}, 1,
           'include cycle: model/p -> model/q -> model/p')
    for f in failures:
        print(f)
    print('FAILED' if failures else 'all cases behave')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
