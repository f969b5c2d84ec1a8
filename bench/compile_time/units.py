#!/usr/bin/env python3
"""Compile time and peak memory of a user's translation units, against libtorch alone.

Each unit of units/ is compiled the two ways a consumer can build it:
  default      links libtensordict (Meson's dependency, tensordict.pc, tensordict::tensordict):
               the library's non-template functions are only declared in the TU;
  header_only  -DTENSORDICT_HEADER_ONLY (tensordict-header-only, tensordict::header_only):
               the TU compiles what it calls.
The units: torch_only.cpp (<torch/torch.h> alone, the baseline); torch_loop.cpp
(an MLP ensemble as a loop over libtorch modules); tensordict_only.cpp (the
umbrella header alone); mlp_functional_vmap.cpp (a typed MLP ensemble through
functional_vmap, umbrella header) and mlp_headers.cpp (the same with the
headers it uses); sac_agent.cpp (a SAC-like agent in one file: typed
TensorDicts, a tensordict.nn actor with TanhNormal, stacked critics through
functional_vmap, a memmap buffer, a checkpoint); ../../examples/policy.cpp; and
library.cpp, libtensordict's own TU (compiled when the package is built).
Each is compiled `--repeat` times, interleaved, and the fastest time is kept (a
shared machine only ever slows a compile down), with its peak memory and its
ratio to torch_only. --time-report adds g++'s -ftime-report of sac_agent.cpp
both ways: the phases where the seconds go.

Usage: units.py [--repeat 3] [--time-report] -- COMPILER FLAGS...
"""
import os
import re
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
    ("tensordict_only", "units/tensordict_only.cpp", ["default", "header_only"]),
    ("mlp_functional_vmap", "units/mlp_functional_vmap.cpp", ["default", "header_only"]),
    ("mlp_headers", "units/mlp_headers.cpp", ["default", "header_only"]),
    ("sac_agent", "units/sac_agent.cpp", ["default", "header_only"]),
    ("policy", "../../examples/policy.cpp", ["default", "header_only"]),
    ("library", "units/library.cpp", ["library"]),
]


def time_report(compiler, source, obj):
    """The largest phases of g++'s -ftime-report (wall seconds), as 'phase seconds' pairs."""
    proc = subprocess.run(compiler + ["-ftime-report", "-c", source, "-o", obj], capture_output=True, text=True)
    phases = []
    for line in proc.stderr.splitlines():
        m = re.match(r"\s*(.+?)\s*:.*?wall\s*(\d+\.\d+)\s*\(\s*(\d+)%\)", line)
        if m and not m.group(1).startswith("TOTAL"):
            phases.append((float(m.group(2)), m.group(1)))
    phases.sort(reverse=True)
    return phases[:8]


def main():
    args = sys.argv[1:]
    repeat = 3
    report = False
    while args and args[0].startswith("--") and args[0] != "--":
        if args[0] == "--repeat":
            repeat = int(args[1])
            args = args[2:]
        elif args[0] == "--time-report":
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
            print(f"compile_time unit={name} way={way} seconds={seconds:.1f} peak_mib={mib:.0f} vs_torch_h={seconds / base:.2f}")
        if report:
            source = os.path.join(HERE, "units/sac_agent.cpp")
            for way, flags in (("default", []), ("header_only", HEADER_ONLY)):
                phases = time_report(compiler + flags, source, os.path.join(tmp, "report.o"))
                print(f"time_report unit=sac_agent way={way}: " + "; ".join(f"{p} {s:.1f} s" for s, p in phases))


if __name__ == "__main__":
    main()
