#!/usr/bin/env python3
"""Checks compile-fail cases, several per compiler run.

A case is a C++ file with two variants. Compiled as is, it must compile (the
twin that proves the snippet is otherwise right). Compiled with
-DTENSORDICT_COMPILE_FAIL, it must fail, its diagnostics must contain every
text given on an `// expect: ...` line of the file, and they must hold at most
MAX_ERRORS error lines: the library's message, not a page of backtrace.

The cases given are compiled together, one translation unit per variant: their
#include lines go to the top, each case's code follows in a namespace of its
own (at file scope where it specializes a template: TENSORDICT_MODULE,
`template <>`), with #line directives, so a diagnostic names the case
("compile_fail/NAME.cpp", the same in every checkout: a stored result from
another checkout still names its cases) and the line. An error belongs to the case named last in it or in the context
lines before it ("required from here"), or, with no context of its own, to the error before it. Parsing libtorch and the library once
instead of once per case is most of the saving. A case that fails in the
batch (no error of its own, too many, a missing text, or a twin that does not
compile) is compiled alone before it is reported, so that one case's errors
can never fail another.

Usage: check.py CASE.cpp [CASE.cpp...] -- COMPILER [FLAGS...]
With TENSORDICT_COMPILE_FAIL_TWINS=0 in the environment the twins are not
compiled (CI's second platform: the twin's code is the same there, and the
unit tests compile the same calls; the failure and its message are checked).
Results are cached by their inputs where TENSORDICT_CHECK_CACHE is set (tests/compile_cache.py).
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compile_cache import run  # noqa: E402

MAX_ERRORS = 2
# A line that opens a diagnostic's context: an error after one belongs to the case that context names.
CONTEXT = re.compile(r": In |required from|In file included from")
FILE_SCOPE = re.compile(r"^\s*(TENSORDICT_MODULE\(|template\s*<>)", re.M)
LOCATION = re.compile(r"^(?:In file included from |\s*from )?([^:\s][^:]*):\d+")


def expected_texts(case):
    return [m.group(1).strip() for m in re.finditer(r"^// expect: (.*)$", open(case).read(), re.M)]


def line_name(case):
    """The name a case's lines carry in a batch: the same in every checkout, so that a stored result still names it."""
    return "compile_fail/" + os.path.basename(case)


def translation_unit(cases):
    """One file: every case's #include lines, then each case's code under #line directives."""
    includes, bodies = [], []
    for index, case in enumerate(cases):
        lines = open(case).read().splitlines()
        includes += [line for line in lines if line.startswith("#include") and line not in includes]
        code = [("" if line.startswith("#include") else line) for line in lines]
        body = [f'#line 1 "{line_name(case)}"'] + code
        if not FILE_SCOPE.search("\n".join(code)):
            body = [f"namespace compile_fail_case_{index} {{"] + body + ["}"]
        bodies += body
    return "\n".join(includes + bodies) + "\n"


def compile_cases(cases, compiler, fail):
    """(status, diagnostics) of the cases compiled together (or one alone, as it is)."""
    flags = ["-DTENSORDICT_COMPILE_FAIL"] if fail else []
    if len(cases) == 1:
        result = run(compiler + flags + [cases[0]], [cases[0]])
        return result.returncode, result.stderr
    with tempfile.TemporaryDirectory(prefix="compile_fail_") as folder:
        tu = os.path.join(folder, "batch.cpp")  # one name: the result cache keys on it
        with open(tu, "w") as f:
            f.write(translation_unit(cases))
        result = run(compiler + flags + [tu], [tu])
    return result.returncode, result.stderr


def errors_by_case(cases, diagnostics):
    """{case: (error lines, diagnostic lines)} and the error lines that name no case."""
    names = {line_name(c): c for c in cases}
    owned = {c: ([], []) for c in cases}
    unowned, context, current = [], [], None

    def case_named(line):
        m = LOCATION.match(line.strip()) or re.search(r"([^\s:]+\.cpp):\d+", line)
        return names.get(m.group(1)) if m else None

    for line in diagnostics.splitlines():
        context.append(line)
        if " error: " not in line:
            if current is not None:
                owned[current][1].append(line)
            continue
        named = [c for c in map(case_named, context) if c is not None]
        # An error with no context of its own goes on the one before (g++'s second error in one instantiation).
        continues = current is not None and not any(CONTEXT.search(line) for line in context)
        current = named[-1] if named else (current if continues else None)
        if current is None:
            unowned.append(line)
        else:
            owned[current][0].append(line)
            owned[current][1].extend(context)
        context = []
    return owned, unowned


def verdict(case, status, errors, diagnostics):
    """None when the failing variant of one case is as it must be, else why not."""
    if status == 0 or not errors:
        return "compiled, but must not"
    missing = [e for e in expected_texts(case) if e not in diagnostics]
    if missing:
        return f"the diagnostics lack {missing}:\n{diagnostics}"
    if len(errors) > MAX_ERRORS:
        return f"{len(errors)} error lines, at most {MAX_ERRORS} allowed:\n" + "\n".join(errors)
    return None


def check_alone(case, compiler, twins):
    """The case compiled on its own: None when it passes, else why not."""
    if twins:
        status, diagnostics = compile_cases([case], compiler, fail=False)
        if status != 0:
            return f"the must-compile twin does not compile:\n{diagnostics}"
    status, diagnostics = compile_cases([case], compiler, fail=True)
    errors = [line for line in diagnostics.splitlines() if " error: " in line]
    return verdict(case, status, errors, diagnostics)


def main() -> int:
    sep = sys.argv.index("--")
    cases, compiler = sys.argv[1:sep], sys.argv[sep + 1:]
    twins = os.environ.get("TENSORDICT_COMPILE_FAIL_TWINS", "1") != "0"
    for case in cases:
        if not expected_texts(case):
            print(f"FAIL {case}: no '// expect:' line")
            return 1

    suspects = set()
    if twins:
        status, diagnostics = compile_cases(cases, compiler, fail=False)
        if status != 0:
            owned, unowned = errors_by_case(cases, diagnostics)
            suspects = {c for c in cases if owned[c][0]}
            if unowned or not suspects:
                suspects = set(cases)
    status, diagnostics = compile_cases(cases, compiler, fail=True)
    owned, unowned = errors_by_case(cases, diagnostics)
    if unowned:
        print("errors that name no case (each case is compiled alone):\n" + "\n".join(unowned))
        suspects = set(cases)

    failed = 0
    for case in cases:
        errors, lines = owned[case]
        why = None if case in suspects else verdict(case, status, errors, "\n".join(lines))
        if case in suspects or why is not None:
            why = check_alone(case, compiler, twins)
            errors = None
        if why is not None:
            print(f"FAIL {case}: {why}")
            failed += 1
            continue
        shown = errors if errors is not None else ["(compiled alone)"]
        print(f"ok {case}: fails with {len(errors) if errors is not None else 'its'} error line(s):")
        print("\n".join(shown))
    print(f"{len(cases) - failed} of {len(cases)} cases as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
