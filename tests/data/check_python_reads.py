#!/usr/bin/python3
"""Python's torch.load reads what tensordict::save writes.

Usage: check_python_reads.py UNIT_TESTS_BINARY
Runs the hidden "[.python_interop]" test case to write the files, then loads
them with torch: with torch.load's default (weights_only=True from torch 2.6
on), and with weights_only=True and weights_only=False spelled out; and the
.safetensors file with safetensors.torch.load_file where that module is
installed (Debian 13: python3-safetensors). Exits 77 (skipped) when this Python has no torch: the test
suite never needs Python, this check runs where python3-torch is installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("skipped: this python3 has no torch (apt-get install python3-torch)")
    sys.exit(77)


def value(shape, scale=0.5, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) * scale).reshape(shape).to(dtype)


def check(out, **load_options):
    nested = torch.load(os.path.join(out, "nested.pt"), **load_options)
    assert type(nested) is dict, type(nested)
    assert list(nested) == ["0", "steps", "t", "tied", "one"], list(nested)
    assert torch.equal(nested["0"]["weight"], value((4, 3)))
    assert nested["0"]["bias"].dtype == torch.float64 and torch.equal(nested["0"]["bias"], value((4,), 1.0, torch.float64))
    assert nested["steps"].item() == 7 and nested["steps"].dtype == torch.int64
    assert torch.equal(nested["t"], value((3, 5)).t()) and nested["t"].stride() == (1, 5)
    assert nested["tied"].data_ptr() == nested["0"]["weight"].data_ptr(), "shared storage is kept"
    assert torch.equal(nested["one"]["entry"], value((2,)))

    flat = torch.load(os.path.join(out, "flat.pt"), **load_options)
    assert list(flat) == ["0.weight", "0.bias", "steps", "t", "tied", "one.entry"], list(flat)
    # A flat file is a state_dict: a Linear(3, 4) takes the "0." entries.
    linear = torch.nn.Linear(3, 4)
    linear.load_state_dict({"weight": flat["0.weight"], "bias": flat["0.bias"].float()})
    assert torch.equal(linear.weight.detach(), value((4, 3)))


with tempfile.TemporaryDirectory() as out:
    subprocess.run([sys.argv[1], "[.python_interop]"], check=True, env=dict(os.environ, TENSORDICT_OUT=out),
                   stdout=subprocess.DEVNULL)
    check(out)
    check(out, weights_only=True)
    check(out, weights_only=False)
    print("torch", torch.__version__, "reads tensordict::save files (default, weights_only=True and False):",
          "nested and flat layouts, dtypes, strides, shared storage")
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError:
        print("no safetensors module: tensordict::save_safetensors files not checked")
    else:
        path = os.path.join(out, "cpp.safetensors")
        loaded = load_file(path)
        assert sorted(loaded) == ["0.bias", "0.weight", "b", "bf16", "one.entry", "t"], sorted(loaded)
        assert torch.equal(loaded["0.weight"], value((4, 3)))
        assert loaded["0.bias"].dtype == torch.float64 and torch.equal(loaded["0.bias"], value((4,), 1.0, torch.float64))
        assert torch.equal(loaded["t"], value((3, 5)).t())
        assert loaded["bf16"].dtype == torch.bfloat16 and torch.equal(loaded["bf16"], value((2, 3), 0.5, torch.bfloat16))
        assert torch.equal(loaded["b"], torch.tensor([True, False]))
        with safe_open(path, framework="pt") as f:
            assert f.metadata() == {"format": "pt", "by": "tensordict-cpp"}, f.metadata()
        print("safetensors reads tensordict::save_safetensors files: dtypes, strides, dotted names, metadata")
