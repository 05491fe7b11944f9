#!/usr/bin/env python3
"""Fails when the code's include graph leaves the layers of docs/design.md.

    check_layers.py [REPO_DIR]

Reads the table under "## Layers" in REPO_DIR/docs/design.md (rows: | `folder/` | holds |
`a/`, `b/` or — |), then checks every C++ file under those folders:

  - a file includes only its own folder and the folders its row allows; test and benchmark
    sources (a name holding `_test` or `_benchmark`) may also include `tests/`;
  - no modules include each other in a cycle (A includes B includes ... A), a module being a
    header and its source (x.h with x.cc, and its private parts x-inl.h, x_impl.h), so
    chat_page.h -> http_server.h with http_server.cc -> chat_page.h is a two-way tie.

Only quoted includes whose first component is a folder of this repository count; third-party
headers are not layers. Prints every violation and exits 1, or prints a summary and exits 0.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SOURCE_SUFFIXES = ('.h', '.cc')


def read_layers(design_md):
    """{folder: set(allowed folders)} from the "## Layers" table."""
    with open(design_md, encoding='utf-8') as f:
        text = f.read()
    section = re.search(r'^## Layers\s*$(.*?)(?=^## |\Z)', text, re.MULTILINE | re.DOTALL)
    if not section:
        sys.exit(f'{design_md}: no "## Layers" section')
    layers = {}
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) < 3 or not cells[0].startswith('`'):
            continue
        folder = cells[0].strip('`').rstrip('/')
        allowed = set(re.findall(r'`([a-z_]+)/`', cells[-1]))
        layers[folder] = allowed
    if not layers:
        sys.exit(f'{design_md}: the "## Layers" table has no rows')
    return layers


def source_files(repo, folder):
    for root, _, files in os.walk(os.path.join(repo, folder)):
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.relpath(os.path.join(root, name), repo)


def module_of(path):
    """kernels/matmul-inl.h -> kernels/matmul; tokenizer/tokenizer_impl.h -> tokenizer/tokenizer."""
    return re.sub(r'(-inl|_impl)$', '', os.path.splitext(path)[0])


def is_test_source(path):
    name = os.path.basename(path)
    return '_test' in name or '_benchmark' in name


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), '..'))
    layers = read_layers(os.path.join(repo, 'docs', 'design.md'))
    repo_folders = {e for e in os.listdir(repo) if os.path.isdir(os.path.join(repo, e))}
    problems = []
    graph = {}  # module (path without its extension) -> modules of this repository it includes
    for folder in sorted(layers):
        for path in source_files(repo, folder):
            with open(os.path.join(repo, path), encoding='utf-8') as f:
                includes = INCLUDE.findall(f.read())
            module = module_of(path)
            graph.setdefault(module, [])
            for inc in includes:
                top = inc.split('/')[0]
                if top not in repo_folders:
                    continue  # a third-party header (hwy/..., nlohmann/... are not folders here)
                if top not in layers:
                    problems.append(f'{path}: includes "{inc}": {top}/ is in no row of the table')
                    continue
                allowed = top == folder or top in layers[folder] or (
                    top == 'tests' and is_test_source(path))
                if not allowed:
                    problems.append(f'{path}: includes "{inc}": {folder}/ may not include {top}/')
                included = module_of(inc)
                if os.path.isfile(os.path.join(repo, inc)) and included != module:
                    graph[module].append(included)
    problems += [f'include cycle: {" -> ".join(c + [c[0]])}' for c in cycles(graph)]
    for p in problems:
        print(p)
    if problems:
        print(f'{len(problems)} layering problem(s); the table is in docs/design.md')
        return 1
    print(f'{len(graph)} modules in {len(layers)} layers: every include is allowed, no cycle')
    return 0


def cycles(graph):
    """The strongly connected components of more than one module, each as a list of modules
    (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, [])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


if __name__ == '__main__':
    sys.exit(main())
