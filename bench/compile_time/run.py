#!/usr/bin/env python3
"""Compile time and peak memory of typed TensorDicts of 10 to 1000 leaves.

Compiles the TU of generate.py for each size, and a 5-leaf baseline with the
same includes and operations, then prints seconds and peak memory of each
compile and what the schema adds over the baseline.

Usage: run.py [--sizes 10,100,500,1000] -- COMPILER FLAGS...
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import generate  # noqa: E402


def compile_once(compiler, source, obj):
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        # wait4 gives this child's own peak memory; the log file keeps a long
        # diagnostic from filling a pipe that nobody reads yet.
        # Meson's compiler command may start with ccache: a cached object would time nothing.
        proc = subprocess.Popen(compiler + ["-c", source, "-o", obj], stderr=log, env=dict(os.environ, CCACHE_DISABLE="1"))
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - start
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            sys.exit(f"compile of {source} failed:\n{log.read()[:5000]}")
    return seconds, usage.ru_maxrss / 1024.0  # MiB


def main():
    args = sys.argv[1:]
    sizes = [10, 100, 500, 1000]
    if args and args[0] == "--sizes":
        sizes = [int(s) for s in args[1].split(",")]
        args = args[2:]
    compiler = args[args.index("--") + 1:] if "--" in args else args
    with tempfile.TemporaryDirectory() as tmp:
        def measure(n):
            src = os.path.join(tmp, f"leaves_{n}.cpp")
            with open(src, "w") as f:
                f.write(generate(n))
            return compile_once(compiler, src, os.path.join(tmp, f"leaves_{n}.o"))

        base_s, base_mb = measure(5)
        print(f"baseline (5 leaves, same operations): {base_s:.1f} s, {base_mb:.0f} MiB", flush=True)
        print(f"{'leaves':>7} {'lookups':>8} {'seconds':>8} {'peak MiB':>9} {'+seconds':>9} {'+MiB':>7}")
        for n in sizes:
            s, mb = measure(n)
            print(f"{n:>7} {3 * n:>8} {s:>8.1f} {mb:>9.0f} {s - base_s:>9.1f} {mb - base_mb:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
