#!/usr/bin/python3
"""Every public header is compiled alone by some self_contained test.

Usage: header_chains.py [--uncovered] INCLUDE_DIR HEADER...
The self_contained tests compile the listed headers, each alone. A header
whose first #include is another library header compiles that one alone too
(nothing comes before it), and so on down the chain, so a header needs no test
of its own when it starts a listed header's chain. This check fails, naming the
fix, when a public header (include/tensordict/*.hpp, modules/*.hpp) is in no chain.
With --uncovered it prints those headers instead, one a line (tests/meson.build
adds a self_contained test for each: a new module family's header needs no
edit there).
"""
import pathlib
import re
import sys


def first_include(path):
    for line in path.read_text().splitlines():
        m = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
        if m:
            return (path.parent / m.group(2)).resolve() if m.group(1) == '"' else None
    return None


def main():
    args = sys.argv[1:]
    list_uncovered = args[:1] == ['--uncovered']
    if list_uncovered:
        args = args[1:]
    top = pathlib.Path(args[0]).resolve()
    public = {p.resolve() for p in list(top.glob('*.hpp')) + list(top.glob('modules/*.hpp'))}
    covered = {}
    for name in args[1:]:
        head = (top / name).resolve()
        if head not in public:
            sys.exit(f'header_chains.py: {name} is listed but is not a public header under {top}')
        node = head
        while node is not None and node in public and node not in covered:
            covered[node] = name
            node = first_include(node)
    missing = sorted(str(p.relative_to(top)) for p in public - covered.keys())
    if list_uncovered:
        print('\n'.join(missing))
        return
    if missing:
        sys.exit('header_chains.py: no self_contained test compiles ' + ', '.join(missing) +
                 ' alone: add each to the list in tests/meson.build, or make it the first #include of a listed header')
    for p in sorted(covered, key=str):
        test = covered[p].split('.')[0].replace('/', '_')
        print(f'{p.relative_to(top)}: compiled alone by self_contained_{test}')


main()
