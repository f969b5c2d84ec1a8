#!/usr/bin/env python3
"""bench/policy in Python: the 3-module policy (MLP 8-64-64-8 -> NormalParamExtractor ->
Normal with its log-probability, mode) through tensordict's TensorDictSequential where the
tensordict package is importable (it is not a Debian package), and the same modules by hand.

Run with Debian's python3-torch: python3 bench/python/policy.py
Prints the median microseconds per call over interleaved passes, one intra-op thread, as
build/bench/bench_policy does, so the two can be set side by side.
"""
import time

import torch
from torch import nn

torch.set_num_threads(1)


def us_per_call(f, calls):
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls * 1e6


def median(values):
    return sorted(values)[len(values) // 2]


def extract(x):
    # NormalParamExtractor's default: biased_softplus_1.0, at least 1e-4.
    loc, scale = x.chunk(2, -1)
    bias = torch.tensor(0.99).expm1().clamp_min(1e-6).log().item()
    return loc, (nn.functional.softplus(scale + bias) + 0.01).clamp_min(1e-4)


def main():
    net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
    try:
        from tensordict import TensorDict
        from tensordict.nn import (InteractionType, NormalParamExtractor, ProbabilisticTensorDictModule,
                                   TensorDictModule, TensorDictSequential, set_interaction_type)
        policy = TensorDictSequential(
            TensorDictModule(net, ["observation"], ["param"]),
            TensorDictModule(NormalParamExtractor(), ["param"], ["loc", "scale"]),
            ProbabilisticTensorDictModule(["loc", "scale"], ["action"], distribution_class=torch.distributions.Normal,
                                          return_log_prob=True))
    except ImportError:
        policy = None
        print("tensordict is not importable: the modules by hand only")
    for batch in (256, 1):
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                obs = torch.randn(batch, 8)

                def by_hand():
                    loc, scale = extract(net(obs))
                    dist = torch.distributions.Normal(loc, scale)
                    action = dist.mean
                    return dist.log_prob(action)

                calls = 2000 if batch == 1 else 500
                hand, ours = [], []
                for _ in range(7):
                    hand.append(us_per_call(by_hand, calls))
                    if policy is not None:
                        td = TensorDict({"observation": obs}, [batch])
                        with set_interaction_type(InteractionType.MODE):
                            ours.append(us_per_call(lambda: policy(td.clone(False)), calls))
                line = f"batch {batch:3d}, {'autograd recording' if grad else 'inference         '}: by hand {median(hand):.1f} us"
                if ours:
                    line += f", TensorDictSequential {median(ours):.1f} us: {median(ours) / median(hand):.3f}x"
                print(line)


main()
