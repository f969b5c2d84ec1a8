#!/usr/bin/python3
"""Every public header is compiled alone by some self_contained test.

Usage: header_chains.py [--uncovered | --pch] INCLUDE_DIR HEADER...
The self_contained tests compile the listed headers, each alone. A header
whose first #include is another library header compiles that one alone too
(nothing comes before it), and so on down the chain, so a header needs no test
of its own when it starts a listed header's chain. This check fails, naming the
fix, when a public header (any under include/tensordict/ outside a detail/ folder) is in no chain.
With --uncovered it prints those headers instead, one a line (tests/meson.build
adds a self_contained test for each: a new module family's header needs no
edit there).

With --pch it prints, one a line, "HEADER KIND": whether the libtorch headers
of tests/pch/self_contained_module.hpp may be precompiled and put before each
listed header's test (module) or not (none). A header is checked alone only if
nothing it does not include itself comes first, so a header's test takes them
only if every header of its chain above the first one that does not include
them (through library headers) does; that one (vmap.hpp, any_tensordict.hpp) is listed
too, with none, and its own test covers the rest of the chain.
"""
import pathlib
import re
import sys


def includes(path):
    """(delimiter, name) of each #include line of `path`, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', path.read_text(), re.M)]


def first_include(path):
    found = includes(path)
    return (path.parent / found[0][1]).resolve() if found and found[0][0] == '"' else None


def outside_includes(path, top, seen=None):
    """The non-library headers that `path` includes, directly or through library headers."""
    seen = set() if seen is None else seen
    if path in seen:
        return set()
    seen.add(path)
    out = set()
    for kind, name in includes(path):
        inside = path.parent / name if kind == '"' else top.parent / name if name.startswith('tensordict/') else None
        out |= outside_includes(inside.resolve(), top, seen) if inside else {name}
    return out


PRECOMPILED = {name for _, name in includes(pathlib.Path(__file__).resolve().parent / 'pch/self_contained_module.hpp')}


def print_pch_kinds(top, names):
    alone = {}
    for name in names:
        head = node = (top / name).resolve()
        while node is not None and node.is_relative_to(top) and PRECOMPILED <= outside_includes(node, top):
            node = first_include(node)
        if node == head:
            print(name, 'none')
            continue
        print(name, 'module')
        if node is not None and node.is_relative_to(top) and str(node.relative_to(top)) not in names:
            alone.setdefault(str(node.relative_to(top)), None)
    for name in alone:
        print(name, 'none')


def main():
    args = sys.argv[1:]
    list_uncovered = args[:1] == ['--uncovered']
    list_pch = args[:1] == ['--pch']
    if list_uncovered or list_pch:
        args = args[1:]
    top = pathlib.Path(args[0]).resolve()
    if list_pch:
        print_pch_kinds(top, args[1:])
        return
    public = {p.resolve() for p in top.rglob('*.hpp') if 'detail' not in p.relative_to(top).parts}
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
