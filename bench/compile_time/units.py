#!/usr/bin/env python3
"""Compile time and peak memory of a user's translation units, against libtorch alone.

Compiles each TU of units/ (torch_only.cpp: <torch/torch.h> alone;
torch_loop.cpp: an MLP ensemble as a loop over libtorch modules;
tensordict_only.cpp: <tensordict/tensordict.hpp> alone;
mlp_functional_vmap.cpp: a typed MLP, from_modules, functional_call and a
lowered functional_vmap, header-only; mlp_separate.cpp: the same with the
headers it uses, compiled with -DTENSORDICT_SEPARATE_COMPILATION;
separate_definitions.cpp: that program's one TU of the library's definitions)
`--repeat` times, interleaved, and prints the fastest time of each (a shared
machine only ever slows a compile down), its peak memory, and its ratio to
torch_only.

Usage: units.py [--repeat 3] -- COMPILER FLAGS...
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import compile_once  # noqa: E402

# Each unit and the flags it adds.
SEPARATE = ["-DTENSORDICT_SEPARATE_COMPILATION"]
UNITS = {"torch_only": [], "torch_loop": [], "tensordict_only": [], "mlp_functional_vmap": [], "mlp_separate": SEPARATE,
         "separate_definitions": SEPARATE}


def main():
    args = sys.argv[1:]
    repeat = 3
    if args and args[0] == "--repeat":
        repeat = int(args[1])
        args = args[2:]
    compiler = args[args.index("--") + 1:] if "--" in args else args
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "units")
    best = {u: (float("inf"), 0.0) for u in UNITS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for u in UNITS:
                seconds, mib = compile_once(compiler + UNITS[u], os.path.join(here, u + ".cpp"), os.path.join(tmp, u + ".o"))
                if seconds < best[u][0]:
                    best[u] = (seconds, mib)
    base = best["torch_only"][0]
    for u in UNITS:
        seconds, mib = best[u]
        print(f"compile_time unit={u} seconds={seconds:.1f} peak_mib={mib:.0f} vs_torch_h={seconds / base:.2f}")


if __name__ == "__main__":
    main()
