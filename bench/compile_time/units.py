#!/usr/bin/env python3
"""Compile time and peak memory of a user's translation units, against libtorch alone.

Each unit of units/ is compiled the two ways a consumer can build it:
  default      links libtensordict (Meson's dependency, tensordict.pc, tensordict::tensordict):
               the library's non-template functions are only declared in the TU;
  header_only  -DTENSORDICT_HEADER_ONLY (tensordict-header-only, tensordict::header_only):
               the TU compiles what it calls.
The units: torch_only.cpp (<torch/torch.h> alone, the baseline); torch_loop.cpp
(an MLP ensemble as a loop over libtorch modules); sac_torch.cpp (sac_agent.cpp's
program with libtorch alone: what a one-file program of its size pays for
libtorch's own templates); tensordict_only.cpp (the umbrella header alone);
mlp_functional_vmap.cpp (a typed MLP ensemble through functional_vmap, umbrella
header) and mlp_headers.cpp (the same with the headers it uses); sac_agent.cpp
(a SAC-like agent in one file: typed TensorDicts, a tensordict.nn actor with
TanhNormal, stacked critics through functional_vmap, a memmap buffer, a
checkpoint); ../../examples/policy.cpp; and library.cpp, libtensordict's own TU
(compiled when the package is built).
Each is compiled `--repeat` times, interleaved, and the fastest time is kept (a
shared machine only ever slows a compile down), with its peak memory and its
ratio to torch_only (and sac_agent's to sac_torch). --phases adds where the
seconds of torch_only, sac_torch, sac_agent and mlp_headers go (preprocessing,
parse and instantiation, code generation) and their objects' text.

Usage: units.py [--repeat 3] [--phases] -- COMPILER FLAGS...
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import compile_once  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER_ONLY = ["-DTENSORDICT_HEADER_ONLY"]
# (name, source, the ways it is compiled)
UNITS = [
    ("torch_only", "units/torch_only.cpp", ["-"]),
    ("torch_loop", "units/torch_loop.cpp", ["-"]),
    ("sac_torch", "units/sac_torch.cpp", ["-"]),
    ("tensordict_only", "units/tensordict_only.cpp", ["default", "header_only"]),
    ("mlp_functional_vmap", "units/mlp_functional_vmap.cpp", ["default", "header_only"]),
    ("mlp_headers", "units/mlp_headers.cpp", ["default", "header_only"]),
    ("sac_agent", "units/sac_agent.cpp", ["default", "header_only"]),
    ("policy", "../../examples/policy.cpp", ["default", "header_only"]),
    ("library", "units/library.cpp", ["library"]),
]


def phases(compiler, source, obj):
    """Where a unit's seconds go: preprocessing (-E), the front end's parse and template
    instantiation (-fsyntax-only less -E) and code generation (the full compile less
    -fsyntax-only), each the fastest of `repeat`, and the object's text in KB.
    g++ 12's own -ftime-report stops with an internal compiler error on these units
    (timevar.cc:453, nested timers in template instantiation), so the phases are timed
    apart."""
    preprocess = compile_once(compiler + ["-E"], source, obj + ".ii")[0]
    front = compile_once(compiler + ["-fsyntax-only"], source, obj)[0]
    full = compile_once(compiler, source, obj)[0]
    size = subprocess.run(["size", obj], capture_output=True, text=True).stdout.splitlines()
    text_kb = int(size[1].split()[0]) / 1000 if len(size) > 1 else float("nan")
    return preprocess, front, full, text_kb


def main():
    args = sys.argv[1:]
    repeat = 3
    report = False
    while args and args[0].startswith("--") and args[0] != "--":
        if args[0] == "--repeat":
            repeat = int(args[1])
            args = args[2:]
        elif args[0] == "--phases":
            report = True
            args = args[1:]
        else:
            sys.exit(f"units.py: unknown option {args[0]}")
    compiler = args[args.index("--") + 1:] if "--" in args else args
    runs = [(name, way, os.path.join(HERE, source)) for name, source, ways in UNITS for way in ways]
    best = {(name, way): (float("inf"), 0.0) for name, way, _ in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for name, way, source in runs:
                flags = HEADER_ONLY if way == "header_only" else []
                seconds, mib = compile_once(compiler + flags, source, os.path.join(tmp, name + ".o"))
                if seconds < best[(name, way)][0]:
                    best[(name, way)] = (seconds, mib)
        base = best[("torch_only", "-")][0]
        for name, way, _ in runs:
            seconds, mib = best[(name, way)]
            versus = f" vs_sac_torch={seconds / best[('sac_torch', '-')][0]:.2f}" if name == "sac_agent" else ""
            print(f"compile_time unit={name} way={way} seconds={seconds:.1f} peak_mib={mib:.0f} vs_torch_h={seconds / base:.2f}{versus}")
        if report:
            for name, source, ways in UNITS:
                if name not in ("torch_only", "sac_torch", "sac_agent", "mlp_headers"):
                    continue
                for way in ways:
                    flags = HEADER_ONLY if way == "header_only" else []
                    best_phases = None
                    for _ in range(repeat):
                        measured = phases(compiler + flags, os.path.join(HERE, source), os.path.join(tmp, "phases.o"))
                        best_phases = measured if best_phases is None else tuple(map(min, best_phases, measured))
                    preprocess, front, full, text_kb = best_phases
                    print(f"phases unit={name} way={way} preprocess_s={preprocess:.1f} parse_instantiate_s={front - preprocess:.1f}"
                          f" codegen_s={full - front:.1f} text_kb={text_kb:.0f}")

if __name__ == "__main__":
    main()
