#!/usr/bin/python3
"""Every public header is compiled alone by some self_contained test.

Usage: header_chains.py INCLUDE_DIR HEADER...
The self_contained tests compile the listed headers, each alone. A header
whose first #include is another library header compiles that one alone too
(nothing comes before it), and so on down the chain, so a header needs no test
of its own when it starts a listed header's chain. This check fails, naming the
fix, when a public header (include/tensordict/*.hpp, modules/*.hpp) is in no chain.
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
    top = pathlib.Path(sys.argv[1]).resolve()
    public = {p.resolve() for p in list(top.glob('*.hpp')) + list(top.glob('modules/*.hpp'))}
    covered = {}
    for name in sys.argv[2:]:
        head = (top / name).resolve()
        if head not in public:
            sys.exit(f'header_chains.py: {name} is listed but is not a public header under {top}')
        node = head
        while node is not None and node in public and node not in covered:
            covered[node] = name
            node = first_include(node)
    missing = sorted(str(p.relative_to(top)) for p in public - covered.keys())
    if missing:
        sys.exit('header_chains.py: no self_contained test compiles ' + ', '.join(missing) +
                 ' alone: add each to the list in tests/meson.build, or make it the first #include of a listed header')
    for p in sorted(covered, key=str):
        test = covered[p].split('.')[0].replace('/', '_')
        print(f'{p.relative_to(top)}: compiled alone by self_contained_{test}')


main()
