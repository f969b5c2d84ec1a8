#!/usr/bin/env python3
"""Checks one compile-fail case.

A case is a C++ file with two variants. Compiled as is, it must compile (the
twin that proves the snippet is otherwise right). Compiled with
-DTENSORDICT_COMPILE_FAIL, it must fail, its diagnostics must contain every
text given on an `// expect: ...` line of the file, and they must hold at most
MAX_ERRORS error lines: the library's message, not a page of backtrace.

Usage: check.py CASE.cpp -- COMPILER [FLAGS...]
With TENSORDICT_COMPILE_FAIL_TWINS=0 in the environment the twin is not
compiled (CI's second platform: the twin's code is the same there, and the
unit tests compile the same calls; the failure and its message are checked).
Results are cached by their inputs where TENSORDICT_CHECK_CACHE is set (tests/compile_cache.py).
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compile_cache import run  # noqa: E402

MAX_ERRORS = 2


def main() -> int:
    sep = sys.argv.index("--")
    case, compiler = sys.argv[1], sys.argv[sep + 1:]
    expected = [m.group(1).strip() for m in re.finditer(r"^// expect: (.*)$", open(case).read(), re.M)]
    if not expected:
        print(f"{case}: no '// expect:' line")
        return 1

    twin = run(compiler + [case], [case]) if os.environ.get(
        "TENSORDICT_COMPILE_FAIL_TWINS", "1") != "0" else subprocess.CompletedProcess([], 0, "", "")
    if twin.returncode != 0:
        print(f"FAIL {case}: the must-compile twin does not compile:\n{twin.stderr}")
        return 1

    bad = run(compiler + ["-DTENSORDICT_COMPILE_FAIL", case], [case])
    diagnostics = bad.stderr
    if bad.returncode == 0:
        print(f"FAIL {case}: compiled, but must not")
        return 1
    missing = [e for e in expected if e not in diagnostics]
    errors = [line for line in diagnostics.splitlines() if " error: " in line]
    if missing:
        print(f"FAIL {case}: the diagnostics lack {missing}:\n{diagnostics}")
        return 1
    if len(errors) > MAX_ERRORS:
        print(f"FAIL {case}: {len(errors)} error lines, at most {MAX_ERRORS} allowed:\n" + "\n".join(errors))
        return 1
    print(f"ok {case}: fails with {len(errors)} error line(s), {len(diagnostics.splitlines())} lines in all:")
    print("\n".join(errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
