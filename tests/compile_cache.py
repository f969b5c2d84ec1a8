"""A result cache for the compile checks that ccache cannot cache (-fsyntax-only).

A check's result (exit status and diagnostics) is a function of the compiler,
its flags, the file compiled and every header it can reach: the library's
include/ (all of it, hashed), the precompiled headers' sources, and the system
headers, which change only with their packages (the compiler's and libtorch's
versions are hashed). With TENSORDICT_CHECK_CACHE set to a folder, run()
returns a stored result for the same inputs instead of compiling again; CI
sets it (.ci/run), so a rerun of an unchanged tree skips these compilations.
Unset, every check compiles.
"""
import hashlib
import os
import subprocess

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_tree_digest = None


def _tree() -> str:
    """The library's headers and the test headers a check may include, hashed once per process."""
    global _tree_digest
    if _tree_digest is None:
        h = hashlib.sha256()
        for top in (os.path.join(_ROOT, "include"), os.path.join(_HERE, "compile_fail"), os.path.join(_HERE, "pch")):
            for folder, dirs, files in os.walk(top):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(folder, name)
                    h.update(os.path.relpath(path, _ROOT).encode() + b"\0")
                    with open(path, "rb") as f:
                        h.update(f.read())
        _tree_digest = h.hexdigest()
    return _tree_digest


def _versions(compiler) -> str:
    """The compiler's version and the libtorch headers' version, read where the flags point."""
    out = subprocess.run([c for c in compiler if not c.endswith("ccache")][:1] + ["--version"], capture_output=True,
                         text=True).stdout
    for i, flag in enumerate(compiler):
        folder = compiler[i + 1] if flag == "-isystem" and i + 1 < len(compiler) else flag[2:] if flag.startswith("-I") else None
        for candidate in ([os.path.join(folder, "torch/version.h"), os.path.join(folder, "../../../../torch/version.h")]
                          if folder else []):
            if os.path.isfile(candidate):
                with open(candidate) as f:
                    out += f.read()
    return out


def run(command, source_files):
    """subprocess.run(command) as CompletedProcess (text), or the stored result of the same inputs."""
    folder = os.environ.get("TENSORDICT_CHECK_CACHE")
    if not folder:
        return subprocess.run(command, capture_output=True, text=True)
    h = hashlib.sha256()
    # Contents, not places: the checkout's folder and a temporary file's name are left out of the key.
    h.update(repr([os.path.basename(c) if c in source_files else c.replace(_ROOT, "<root>") for c in command]).encode())
    h.update(_versions(command).encode())
    h.update(_tree().encode())
    for path in source_files:
        with open(path, "rb") as f:
            h.update(f.read().replace(_ROOT.encode(), b"<root>"))  # a generated file may name the checkout (#line)
    entry = os.path.join(folder, h.hexdigest())
    if os.path.isfile(entry):
        with open(entry) as f:
            status, _, output = f.read().partition("\n")
        return subprocess.CompletedProcess(command, int(status), "", output)
    result = subprocess.run(command, capture_output=True, text=True)
    os.makedirs(folder, exist_ok=True)
    with open(entry + ".partial", "w") as f:
        f.write(f"{result.returncode}\n{result.stderr}")
    os.replace(entry + ".partial", entry)
    return result


if __name__ == "__main__":
    # compile_cache.py -- COMMAND...: runs it (or takes its stored result), prints its diagnostics, exits with its status.
    import sys

    result = run(sys.argv[sys.argv.index("--") + 1:], [])
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)
