#!/usr/bin/env python3
"""Compiles the C++ examples of a Markdown file, so the docs cannot rot.

All ```cpp blocks form one translation unit that includes the library (one
parse of the libtorch headers instead of one per block). A block that declares
a type at column 0 (struct, class) stays at file scope; every other block gets
a namespace of its own, where its namespace and using lines stay, and its other
lines form the body of a function. #include lines go to the top. Every line
carries a #line directive, so a diagnostic names the Markdown file and line.

Usage: doc_snippets.py FILE.md -- COMPILER FLAGS...
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_cache import run as cached_run  # noqa: E402

TOP = ["#include <iostream>", "#include <ATen/ops/ones.h>", "#include <ATen/ops/randn.h>",
       "#include <tensordict/tensordict.hpp>"]
FILE_SCOPE = re.compile(r"^(namespace |using )")


def blocks_of(doc: str):
    """(first line number, lines) of each ```cpp block."""
    lines = open(doc).read().splitlines()
    blocks, start = [], None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```cpp":
            start = number + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start, lines[start - 1:number - 1]))
            start = None
    return blocks


def translation_unit(doc: str, blocks) -> str:
    def at(number, line):
        return f'#line {number} "{doc}"\n{line}'

    includes, file_scope, wrapped = list(TOP), [], []
    for index, (first, lines) in enumerate(blocks):
        numbered = [(first + i, line) for i, line in enumerate(lines)]
        includes += [at(n, line) for n, line in numbered if line.startswith("#include")]
        rest = [(n, line) for n, line in numbered if not line.startswith("#include")]
        if any(re.match(r"(struct|class) ", line) for _, line in rest):
            file_scope += [at(n, line) for n, line in rest]
            continue
        wrapped.append(f"namespace snippet_{index + 1} {{")
        wrapped += [at(n, line) for n, line in rest if FILE_SCOPE.match(line)]
        wrapped.append("void snippet() {")
        wrapped += [at(n, line) for n, line in rest if not FILE_SCOPE.match(line)]
        wrapped.append("}\n}")
    return "\n".join(includes + file_scope + wrapped) + "\n"


def main() -> int:
    sep = sys.argv.index("--")
    doc, compiler = sys.argv[1], sys.argv[sep + 1:]
    blocks = blocks_of(doc)
    if not blocks:
        print(f"{doc}: no ```cpp block")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "snippets.cpp")
        with open(src, "w") as f:
            f.write(translation_unit(doc, blocks))
        run = cached_run(compiler + ["-fsyntax-only", src], [src])
    if run.returncode != 0:
        print(f"FAIL {doc}: its C++ blocks do not compile:\n{run.stderr}")
        return 1
    print(f"ok {doc}: {len(blocks)} C++ blocks compile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
