#!/usr/bin/python3
"""Writes the torch.save fixtures that tests/test_files.cpp reads.

Run with Debian's python3-torch: /usr/bin/python3 tests/data/make_fixtures.py
Torch 1.x (Debian 12) writes into tests/data, torch 2.x (Debian 13, inside
the root of .ci/debian13) into tests/data/torch-<major>.<minor>.
The tensors hold values that the C++ tests can compute without Python:
value(shape, scale) = arange(numel).reshape(shape) * scale.
"""
import os

import torch

major, minor = (int(part) for part in torch.__version__.split(".")[:2])
here = os.path.dirname(os.path.abspath(__file__))
if major >= 2:
    here = os.path.join(here, f"torch-{major}.{minor}")
    os.makedirs(here, exist_ok=True)


def value(shape, scale=0.5, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) * scale).reshape(shape).to(dtype)


def save(obj, name, **kwargs):
    torch.save(obj, os.path.join(here, name), **kwargs)


def model():
    # Sequential(Linear(3, 4), ReLU(), Linear(4, 2)) with known values.
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for scale, p in enumerate(net.parameters(), start=1):
            p.copy_(value(p.shape, 0.1 * scale))
    return net


net = model()
# An OrderedDict with _metadata: what torch::pickle_load rejects ("Expected GenericDict but got None").
save(net.state_dict(), "state_dict.pt")
# A one-entry dict: pickled with SETITEM, which torch::pickle_load rejects ("Unknown opcode 0x73").
save({"weight": value((2, 3))}, "one_entry.pt")
# Nested dicts and several dtypes.
save({
    "0": {"weight": value((4, 3)), "bias": value((4,), 1.0, torch.float64)},
    "counts": {"steps": torch.tensor(7, dtype=torch.int64), "mask": torch.tensor([True, False, True])},
    "half": value((2, 2), 0.25, torch.float16),
}, "nested.pt")
# nn.Parameters (requires_grad) through torch._utils._rebuild_parameter.
save(dict(net.named_parameters()), "parameters.pt")
# Tensors that share one storage: a tied weight, a view, a transposed view.
base = value((3, 4))
save({"a": base, "tied": base, "row": base[1], "t": base.t()}, "shared.pt")
# A checkpoint with a value that is not a tensor.
save({"model": net.state_dict(), "epoch": 3}, "checkpoint.pt")
# BatchNorm's buffers: an int64 0-dim num_batches_tracked.
bn = torch.nn.BatchNorm1d(3)
save(bn.state_dict(), "batchnorm.pt")
# The floating and integer dtypes, bfloat16 among them.
save({
    "bf16": value((2, 3), 0.5, torch.bfloat16),
    "f16": value((3,), 0.25, torch.float16),
    "f64": value((2, 2), 0.1, torch.float64),
    "i8": value((4,), 1.0, torch.int8),
    "u8": value((4,), 2.0, torch.uint8),
    "i32": value((2,), 3.0, torch.int32),
    "b": torch.tensor([True, False]),
}, "dtypes.pt")
# The legacy format, which the loader refuses with a clear error.
save({"weight": value((2,))}, "legacy.pt", _use_new_zipfile_serialization=False)
print("fixtures written to", here)

# Numeric parity: 3 differently initialised Sequential(Linear(3, 4), Tanh(), Linear(4, 2)) run
# with functorch.vmap over their stacked parameters (the reference's ensemble recipe;
# torch.func in 2.x).
if major >= 2:
    from torch.func import functional_call, vmap
else:
    from functorch import vmap
    from torch.nn.utils.stateless import functional_call

nets = []
for seed in range(3):
    torch.manual_seed(seed)
    nets.append(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)))
names = [name for name, _ in nets[0].named_parameters()]
stacked = {name: torch.stack([dict(n.named_parameters())[name].detach() for n in nets]) for name in names}
torch.manual_seed(10)
x = torch.randn(5, 3)


def call(params, inputs):
    return functional_call(nets[0], params, (inputs,))


y = vmap(call, in_dims=(0, None))(stacked, x)
save({"stacked": stacked, "x": x, "y": y.detach()}, "ensemble_parity.pt")

# Pickle protocol 4 (FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL), as torch.save(..., pickle_protocol=4) writes.
save(net.state_dict(), "state_dict_protocol4.pt", pickle_protocol=4)

# safetensors, as Python's safetensors writes it (Debian 13: python3-safetensors), into
# tests/data/safetensors whatever the torch version: the format does not depend on it.
try:
    from safetensors.torch import save_file
except ImportError:
    print("no safetensors module: safetensors/python.safetensors not written")
else:
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors"), exist_ok=True)
    save_file({
        "layers.0.weight": value((4, 3)),
        "layers.0.bias": value((4,), 1.0, torch.float64),
        "bf16": value((2, 3), 0.5, torch.bfloat16),
        "f16": value((3,), 0.25, torch.float16),
        "i64": value((2,), 3.0, torch.int64),
        "u8": value((4,), 2.0, torch.uint8),
        "b": torch.tensor([True, False]),
    }, os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors", "python.safetensors"), metadata={"format": "pt"})
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1; libtorch 1.13 refuses this file, naming the dtype
        save_file({
            "e4m3": torch.tensor([0.5, 1.0, -2.0, 448.0]).to(torch.float8_e4m3fn),
            "e5m2": torch.tensor([0.5, 1.0, -2.0, 57344.0]).to(torch.float8_e5m2),
        }, os.path.join(os.path.dirname(os.path.abspath(__file__)), "safetensors", "python_float8.safetensors"))
