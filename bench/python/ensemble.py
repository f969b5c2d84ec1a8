#!/usr/bin/env python3
"""The configs of bench/ensemble in Python: vmap over functional_call,
and, where the tensordict package is importable (it is not a Debian package),
tensordict's way: torch.vmap over TensorDict.to_module of the stacked params.

Run with Debian's python3-torch: python3 bench/python/ensemble.py [--compiled] [threads...]
or: python3 bench/python/ensemble.py --aoti DIR
Prints microseconds per call for a forward and a training step (forward,
backward, SGD on the stacked parameters) at 1 and 2 intra-op threads (or the
ones given); then 8 LSTMs and 8 two-layer transformer encoders, as
bench/ensemble. --compiled (torch >= 2.0, a C++ compiler at run time) adds, for
the MLP configs, torch.compile of the vmapped functional_call (forward and
training step) and a training step compiled as one graph: torch.func.grad of
the loss and the SGD update (the first call of each compiles: seconds, not
counted). ONLY=text in the environment runs the configs whose name contains
text, as bench/ensemble. --aoti DIR (torch >= 2.6, a C++ compiler) times nothing:
it writes an AOTInductor package per MLP config, DIR/a.pt2 (b, c), of the
vmapped functional_call with the stacked params and the input as its inputs
(in named_parameters order, then the input), for bench/ensemble to run from
C++ (AOTI_PACKAGES=DIR build/bench/bench_ensemble). Runs itself again with the
C++ bench's settings (one BLAS thread, glibc keeps freed memory, OpenBLAS's
kernels for this CPU).
"""
import copy
import os
import sys
import time

SETTINGS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296"}


def fallback_core():
    """OPENBLAS_CORETYPE to set where OpenBLAS took this CPU for a Prescott (as bench/blas_settings.hpp)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return None
    try:
        import ctypes
        corename = ctypes.CDLL("libblas.so.3").openblas_get_corename
        corename.restype = ctypes.c_char_p
        if corename() != b"Prescott":
            return None
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, AttributeError, StopIteration):
        return None
    return "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None


CORE = fallback_core()
if CORE:
    SETTINGS["OPENBLAS_CORETYPE"] = CORE
if any(os.environ.get(k) != v for k, v in SETTINGS.items()):
    os.environ.update(SETTINGS)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
try:
    from torch import vmap  # noqa: E402  (torch >= 2.0)
except ImportError:
    from functorch import vmap  # noqa: E402  (torch 1.13)
try:
    from torch.func import functional_call  # noqa: E402  (torch >= 2.0)
except ImportError:
    from torch.nn.utils.stateless import functional_call  # noqa: E402  (torch 1.13)

try:
    from tensordict import TensorDict  # noqa: E402
except ImportError:
    TensorDict = None

CONFIGS = [
    ("a:16x(8-32-32-4)/32", 16, 8, 32, 4, 32),
    ("b:8x(64-256-256-16)/256", 8, 64, 256, 16, 256),
    ("c:128x(16-64-64-4)/64", 128, 16, 64, 4, 64),
]


def per_call(fn, budget=0.5):
    for _ in range(3):
        fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget or calls < 5:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def tensordict_ensemble(nets, pick=lambda out: out):
    """tensordict's seed tutorial: the stacked params swapped into a module on the meta device, under torch.vmap."""
    params = TensorDict.from_modules(*nets).detach().clone().requires_grad_()
    base = copy.deepcopy(nets[0]).to("meta")

    def call(p, inp):
        with p.to_module(base):
            return pick(base(inp))

    return params, list(params.values(True, True)), torch.vmap(call, (0, None))


def time_modes(label, name, fn, trained, target):
    def forward():
        with torch.no_grad():
            fn()

    def train():
        # As bench/ensemble.cpp: MSE, backward, one foreach SGD update, gradients set to none.
        torch.nn.functional.mse_loss(fn(), target).backward()
        with torch.no_grad():
            grads = [t.grad for t in trained]
            for t in trained:
                t.grad = None
            torch._foreach_add_(trained, grads, alpha=-1e-3)
    threads = torch.get_num_threads()
    try:
        print(f"python {label} {name} fwd threads={threads} {per_call(forward) * 1e6:.1f} us")
        print(f"python {label} {name} train threads={threads} {per_call(train) * 1e6:.1f} us")
    except Exception as e:  # noqa: BLE001  (vmap's missing batching rules, a compiler's failure)
        print(f"python {label} {name} threads={threads}: n/a ({str(e).splitlines()[0]})")


COMPILED = "--compiled" in sys.argv[1:]


def compiled_variants(name, base, params, x, target):
    """torch.compile of the vmapped functional_call, and a training step compiled as one graph."""
    if not hasattr(torch, "compile"):
        print(f"python torch.compile {name}: n/a (torch {torch.__version__})")
        return
    ensemble = vmap(lambda p, inp: functional_call(base, p, (inp,)), in_dims=(0, None))
    compiled = torch.compile(ensemble)
    time_modes("torch.compile", name, lambda: compiled(params, x), list(params.values()), target)

    def loss(p):
        return torch.nn.functional.mse_loss(ensemble(p, x), target)

    @torch.compile
    def step(p):
        g = torch.func.grad(loss)(p)
        return {k: p[k] - 1e-3 * g[k] for k in p}

    state = {k: v.detach().clone() for k, v in params.items()}

    def train():
        nonlocal state
        state = step(state)
    threads = torch.get_num_threads()
    try:
        print(f"python compiled-grad-step {name} train threads={threads} {per_call(train) * 1e6:.1f} us")
    except Exception as e:  # noqa: BLE001  (a compiler failure names itself)
        print(f"python compiled-grad-step {name} threads={threads}: n/a ({str(e).splitlines()[0]})")


def aoti_packages(directory):
    """An AOTInductor package of each MLP config's vmapped functional_call. torch.export of the vmapped
    call fails on torch 2.6 (strict: dynamo's "Tensor.requires_grad_() inside of a function being
    transformed by a functorch transform"; non-strict: vmap's "NYI: querying is_contiguous"), so
    make_fx traces it to ATen ops first and torch.export takes that graph."""
    from torch.fx.experimental.proxy_tensor import make_fx
    os.makedirs(directory, exist_ok=True)
    for name, members, n_in, hidden, n_out, batch in CONFIGS:
        if ONLY not in name:
            continue
        nets = [mlp(n_in, hidden, n_out) for _ in range(members)]
        base = copy.deepcopy(nets[0])
        keys = [k for k, _ in base.named_parameters()]
        ensemble = vmap(lambda p, inp: functional_call(base, p, (inp,)), in_dims=(0, None))

        def flat(*tensors):
            return ensemble(dict(zip(keys, tensors[:-1])), tensors[-1])
        inputs = tuple(torch.stack([dict(n.named_parameters())[k].detach() for n in nets]) for k in keys)
        inputs += (torch.randn(batch, n_in),)
        with torch.no_grad():
            program = torch.export.export(make_fx(flat)(*inputs), inputs)
            path = os.path.join(directory, name.split(":")[0] + ".pt2")
            start = time.perf_counter()
            torch._inductor.aoti_compile_and_package(program, package_path=path)
            check = torch._inductor.aoti_load_package(path)(*inputs)
            if isinstance(check, (list, tuple)):
                check = check[0]
            assert torch.allclose(check, flat(*inputs), rtol=1e-4, atol=1e-5), f"{name}: the package disagrees"
        print(f"aoti {name}: {path} ({time.perf_counter() - start:.1f} s to build and load)")


def mlp(n_in, hidden, n_out):
    return torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, n_out))


def mm_gflops():
    """at::mm 512x512's rate on one thread, as bench/ensemble prints it. Also the process's first GEMM:
    OpenBLAS 0.3.29 (Debian 13) ran every later 256^3 sgemm at a third of its speed (3.4 ms, not 1.0)
    where the first GEMM of the process was a small one, as here it would otherwise be."""
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    seconds = per_call(lambda: torch.mm(a, b), budget=0.3)
    return 2 * 512 ** 3 / seconds / 1e9


def main():
    print(f"torch {torch.__version__}, tensordict {'not importable' if TensorDict is None else 'importable'}")
    if "--aoti" in sys.argv[1:]:
        aoti_packages(sys.argv[sys.argv.index("--aoti") + 1])
        return
    print(f"torch.mm 512x512: {mm_gflops():.1f} GFLOP/s on 1 thread")
    for threads in [int(t) for t in sys.argv[1:] if t != "--compiled"] or [1, 2]:
        torch.set_num_threads(threads)
        run_configs()


ONLY = os.environ.get("ONLY", "")


def run_configs():
    for name, members, n_in, hidden, n_out, batch in CONFIGS:
        if ONLY not in name:
            continue
        nets = [mlp(n_in, hidden, n_out) for _ in range(members)]
        params = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets]).requires_grad_()
                  for k, _ in nets[0].named_parameters()}
        base = copy.deepcopy(nets[0])
        x = torch.randn(batch, n_in)
        target = torch.randn(members, batch, n_out)

        def call(p, inp):
            return functional_call(base, p, (inp,))

        ensemble = vmap(call, in_dims=(0, None))
        time_modes("vmap", name, lambda: ensemble(params, x), list(params.values()), target)
        time_modes("loop", name, lambda: torch.stack([n(x) for n in nets]),
                   [t for n in nets for t in n.parameters()], target)
        if TensorDict is not None:
            td_params, td_trained, td_ensemble = tensordict_ensemble(nets)
            time_modes("tensordict", name, lambda: td_ensemble(td_params, x), td_trained, target)
        if COMPILED:
            compiled_variants(name, base, params, x, target)

    # The LSTM and transformer configs: vmap over functional_call, and the
    # members' own forwards for reference.
    lstms = [torch.nn.LSTM(32, 128, num_layers=2) for _ in range(8)]
    encoders = [torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, dropout=0.0), 2,
                                            enable_nested_tensor=False) for _ in range(8)]
    for name, nets, x, target, pick in [
            ("lstm:8x(32-128x2)/50x32", lstms, torch.randn(50, 32, 32), torch.randn(8, 50, 32, 128), lambda out: out[0]),
            ("transformer:8x(64,4h,2l)/32x16", encoders, torch.randn(32, 16, 64), torch.randn(8, 32, 16, 64),
             lambda out: out)]:
        if ONLY not in name:
            continue
        params = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets]).requires_grad_()
                  for k, _ in nets[0].named_parameters()}
        base = copy.deepcopy(nets[0])
        ensemble = vmap(lambda p, inp: pick(functional_call(base, p, (inp,))), in_dims=(0, None))
        time_modes("vmap", name, lambda: ensemble(params, x), list(params.values()), target)
        time_modes("loop", name, lambda: torch.stack([pick(n(x)) for n in nets]),
                   [t for n in nets for t in n.parameters()], target)
        if TensorDict is not None:
            td_params, td_trained, td_ensemble = tensordict_ensemble(nets, pick)
            time_modes("tensordict", name, lambda: td_ensemble(td_params, x), td_trained, target)


if __name__ == "__main__":
    main()
