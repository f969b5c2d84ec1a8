#!/usr/bin/python3
"""Writes tests/data/distributions.pt: what torch.distributions computes for the
cases of tests/test_distributions.cpp that the tensordict 0.4 fixtures
(tests/data/tensordict-v0.4-nn) do not cover: Bernoulli, TanhNormal (as TorchRL
builds it: Independent(Normal) through tanh and an affine map), and the
samples each distribution draws after torch.manual_seed.

Run with Debian 13's python3-torch (inside the root of .ci/debian13):
  python3 tests/data/make_distributions.py
Every value is a float64 or int64 tensor in one flat dict, keys "case.what".
"""
import os

import torch
import torch.distributions as D

torch.set_default_dtype(torch.float64)
out = {}


def put(name, value):
    out[name] = value.detach().clone().contiguous()


# Parameters with known values, no RNG.
loc = torch.linspace(-1.5, 2.0, 12).reshape(3, 4)
scale = torch.linspace(0.2, 1.3, 12).reshape(3, 4)
logits = torch.linspace(-2.0, 1.0, 12).reshape(3, 4).sin() * 2
put("param.loc", loc)
put("param.scale", scale)
put("param.logits", logits)

# Bernoulli from logits and from probs.
bern = D.Bernoulli(logits=logits)
value = (torch.arange(12).reshape(3, 4) % 2).to(torch.float64)
put("bernoulli.value", value)
put("bernoulli.log_prob", bern.log_prob(value))
put("bernoulli.entropy", bern.entropy())
put("bernoulli.mean", bern.mean)
put("bernoulli.mode", bern.mode)
probs = torch.tensor([0.1, 0.5, 0.7, 0.0])
put("bernoulli_probs.probs", probs)
bp = D.Bernoulli(probs=probs)
put("bernoulli_probs.log_prob", bp.log_prob(torch.tensor([0.0, 1.0, 1.0, 1.0])))
put("bernoulli_probs.entropy", bp.entropy())
put("bernoulli_probs.mode", bp.mode)

# TanhNormal, TorchRL's default bounds [-1, 1] and bounds [-2, 3].
for name, low, high in (("tanh_normal", -1.0, 1.0), ("tanh_normal_bounds", -2.0, 3.0)):
    transforms = [D.TanhTransform()]
    if (low, high) != (-1.0, 1.0):
        transforms.append(D.AffineTransform(loc=(high + low) / 2, scale=(high - low) / 2))
    dist = D.TransformedDistribution(D.Independent(D.Normal(loc, scale), 1), transforms)
    y = torch.linspace(-0.9, 0.9, 12).reshape(3, 4) * (high - low) / 2 + (high + low) / 2
    put(name + ".value", y)
    put(name + ".log_prob", dist.log_prob(y))
    m = loc
    for t in transforms:
        m = t(m)
    put(name + ".mode", m)

# Samples after torch.manual_seed(seed): the C++ side seeds a CPU generator alike.
seed = 1234
torch.manual_seed(seed)
put("sample.normal", D.Normal(loc, scale).sample((2,)))
torch.manual_seed(seed)
put("sample.normal_rsample", D.Normal(loc, scale).rsample((2,)))
torch.manual_seed(seed)
put("sample.categorical", D.Categorical(logits=logits).sample((5,)))
torch.manual_seed(seed)
put("sample.one_hot_categorical", D.OneHotCategorical(logits=logits).sample((5,)))
torch.manual_seed(seed)
put("sample.bernoulli", D.Bernoulli(logits=logits).sample((2,)))
torch.manual_seed(seed)
tanh = D.TransformedDistribution(D.Independent(D.Normal(loc, scale), 1), [D.TanhTransform()])
put("sample.tanh_normal", tanh.rsample((2,)))

torch.save(out, os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributions.pt"))
print(f"wrote {len(out)} tensors")
