#!/usr/bin/env python3
"""Compiles the C++ examples of a Markdown file, so the docs cannot rot.

Each ```cpp block becomes one translation unit that includes the library. A
block that declares a type at column 0 (struct, class) is all file scope;
in the others, #include, namespace and using lines stay at file scope and
the other lines form the body of a function.

Usage: doc_snippets.py FILE.md -- COMPILER FLAGS...
"""
import os
import re
import subprocess
import sys
import tempfile

FILE_SCOPE = re.compile(r"^(#include|namespace |using )")


def translation_unit(block: str) -> str:
    top = ["#include <iostream>", "#include <ATen/ops/ones.h>", "#include <ATen/ops/randn.h>",
           "#include <tensordict/tensordict.hpp>"]
    if re.search(r"^(struct|class) ", block, re.M):
        return "\n".join(top) + "\n" + block
    body = []
    for line in block.splitlines():
        (top if FILE_SCOPE.match(line) else body).append(line)
    return "\n".join(top) + "\n\nvoid snippet() {\n" + "\n".join(body) + "\n}\n"


def main() -> int:
    sep = sys.argv.index("--")
    doc, compiler = sys.argv[1], sys.argv[sep + 1:]
    blocks = re.findall(r"```cpp\n(.*?)```", open(doc).read(), re.S)
    if not blocks:
        print(f"{doc}: no ```cpp block")
        return 1
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, block in enumerate(blocks):
            src = os.path.join(tmp, f"snippet_{i}.cpp")
            with open(src, "w") as f:
                f.write(translation_unit(block))
            run = subprocess.run(compiler + ["-fsyntax-only", src], capture_output=True, text=True)
            status = "ok" if run.returncode == 0 else "FAIL"
            print(f"{status} {doc} block {i + 1}")
            if run.returncode != 0:
                failed += 1
                print(translation_unit(block) + run.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
