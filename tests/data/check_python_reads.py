#!/usr/bin/python3
"""Python reads what tensordict::save, save_safetensors and memmap_like write.

Usage: check_python_reads.py UNIT_TESTS_BINARY
Runs the hidden "[.python_interop]" test case to write the files, then loads
them with torch: with torch.load's default (weights_only=True from torch 2.6
on), and with weights_only=True and weights_only=False spelled out; and the
.safetensors file with safetensors.torch.load_file where that module is
installed (Debian 13: python3-safetensors). Exits 77 (skipped) when this Python has no torch: the test
suite never needs Python, this check runs where python3-torch is installed.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

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


def read_memmap(directory):
    """A memmap directory's leaves as nested dicts: tensordict's load_memmap
    where tensordict is importable, else the raw files through meta.json."""
    try:
        from tensordict import TensorDict
    except ImportError:
        pass
    else:
        return TensorDict.load_memmap(directory).to_dict()
    with open(os.path.join(directory, "meta.json")) as f:
        meta = json.load(f)
    out = {}
    for key, entry in meta.items():
        if key in ("shape", "device", "_type"):
            continue
        if entry.get("type") == "TensorDict":
            out[key] = read_memmap(os.path.join(directory, key))
            continue
        n = 1
        for s in entry["shape"]:
            n *= s
        dtype = getattr(torch, entry["dtype"].split(".")[1])
        out[key] = torch.from_file(os.path.join(directory, key + ".memmap"), shared=False, size=n,
                                   dtype=dtype).reshape(entry["shape"])
    return out


def batch_rows(n, start):
    """test_storage.cpp's any_batch(n, start)."""
    obs = (torch.arange(n * 4, dtype=torch.float32) + start).reshape(n, 4)
    return {"obs": obs, "action": torch.arange(n) + 10, "reward": torch.arange(n, dtype=torch.float32) + start,
            "next": {"obs": obs + 100}}


def check_rows(loaded, rows, expected):
    for key, want in expected.items():
        if isinstance(want, dict):
            check_rows(loaded[key], rows, want)
        else:
            assert torch.equal(loaded[key][rows], want), (key, loaded[key][rows], want)


# A memmap buffer that tensordict::memmap_like made and index_put_ fills,
# read while the writing process still runs (after its first half), then whole.
with tempfile.TemporaryDirectory() as out:
    writer = subprocess.Popen([sys.argv[1], "[.python_memmap_fill]"], env=dict(os.environ, TENSORDICT_OUT=out),
                              stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "half_written")):
        assert writer.poll() is None, "the writer ended before writing the first half"
        assert time.monotonic() < deadline, "no first half after 120 s"
        time.sleep(0.02)
    half = read_memmap(os.path.join(out, "buffer"))
    check_rows(half, slice(0, 4), batch_rows(4, 1))
    check_rows(half, slice(4, 8), {"obs": torch.zeros(4, 4), "reward": torch.zeros(4)})
    open(os.path.join(out, "half_read"), "w").close()
    assert writer.wait(timeout=120) == 0, "the writer failed"
    whole = read_memmap(os.path.join(out, "buffer"))
    check_rows(whole, slice(0, 4), batch_rows(4, 1))
    check_rows(whole, slice(4, 8), batch_rows(4, 5))
    print("Python reads a tensordict::memmap_like buffer while index_put_ fills it, and after")
