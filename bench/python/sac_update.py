#!/usr/bin/env python3
"""examples/sac's update (`examples/sac --bench N`) in Python, for issue 53's comparison.

The same update on the same shapes: a batch of 256 transitions indexed out of a
buffer of 1000; actor MLP 3-64-64-2 (ReLU) -> NormalParamExtractor (biased
softplus) -> TanhNormal on [-2, 2] (TorchRL's: a safe tanh, log_prob of the
sample through atanh); two critics 4-64-64-1 stacked and called through
torch.func.vmap over functional_call (tensordict's EnsembleModule), online,
detached and target parameters; a learned alpha; torch.optim.Adam on each; the
target parameters moved by a soft update (lerp_, as TorchRL's SoftUpdate).
tensordict and torchrl are not Debian packages: the update is written with
torch alone, which is what Python tensordict's eager update costs at least.

Variants (each timed as the median of 7 rounds, one intra-op thread):
  eager            the update as written
  eager_foreach    Adam(foreach=True) and torch._foreach_lerp_ for the soft update
  compiled         torch.compile of the losses (forward and backward through
                   AOTAutograd), torch.compile of the optimizers' steps and of the
                   soft update (torch >= 2.0, a C++ compiler at run time; compile
                   time not counted); graph breaks are printed

Run with Debian's python3-torch: python3 bench/python/sac_update.py [--no-compile] [--updates N] [--keep-denormal]
Denormals are flushed (torch.set_flush_denormal(True)) as examples/sac flushes them by default;
--keep-denormal leaves them (examples/sac --flush-denormal 0).
Prints one line per variant: `python_sac_update variant=... update_us=...`; give those
numbers to the C++ bench as `examples/sac --bench N --versus EAGER_US,COMPILED_US` for
its vs_python_eager= and vs_compiled= ratios.
"""
import os
import sys
import time

SETTINGS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
if any(os.environ.get(k) != v for k, v in SETTINGS.items()):
    os.environ.update(SETTINGS)
    os.execv(sys.executable, [sys.executable] + sys.argv)

import copy  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

BATCH, BUFFER, HIDDEN = 256, 1000, 64
GAMMA, TAU, LR, TARGET_ENTROPY = 0.99, 0.005, 1e-3, -1.0
LOW, HIGH = -2.0, 2.0


def mlp(n_in, n_out):
    return nn.Sequential(nn.Linear(n_in, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, n_out))


BIAS = math.log(math.expm1(0.99))  # NormalParamExtractor's biased_softplus_1.0


def actor_forward(actor, observation):
    """action and its log-probability: TorchRL's ProbabilisticActor with a TanhNormal, rsample."""
    loc, scale = actor(observation).chunk(2, -1)
    scale = (nn.functional.softplus(scale + BIAS) + 0.01).clamp_min(1e-4)
    lim = 1 - 1e-6  # float32's resolution (SafeTanhTransform)
    x = loc + torch.randn_like(loc) * scale
    y = torch.tanh(x)
    y = y + (y.detach().clamp(-lim, lim) - y.detach())
    half, middle = (HIGH - LOW) / 2, (HIGH + LOW) / 2
    action = y * half + middle
    # log_prob(action), as TransformedDistribution computes it from the value
    u = ((action - middle) / half).clamp(-lim, lim)
    xi = torch.atanh(u)
    log_det = (2 * (math.log(2.0) - xi - nn.functional.softplus(-2 * xi))).sum(-1)
    base = (-((xi - loc) ** 2) / (2 * scale**2) - scale.log() - math.log(math.sqrt(2 * math.pi))).sum(-1)
    return action, base - log_det - loc.shape[-1] * math.log(half)


class Agent:
    def __init__(self, foreach):
        torch.manual_seed(0)
        self.actor = mlp(3, 2)
        critics = [mlp(4, 1) for _ in range(2)]
        params, _ = torch.func.stack_module_state(critics)
        self.critic_params = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
        self.target_params = {k: v.detach().clone() for k, v in self.critic_params.items()}
        self.base = copy.deepcopy(critics[0]).to("meta")
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.actor_adam = torch.optim.Adam(self.actor.parameters(), lr=LR, foreach=foreach)
        self.critic_adam = torch.optim.Adam(self.critic_params.values(), lr=LR, foreach=foreach)
        self.alpha_adam = torch.optim.Adam([self.log_alpha], lr=LR, foreach=foreach)
        self.foreach = foreach
        self.buffer = {
            "observation": torch.randn(BUFFER, 3), "action": torch.rand(BUFFER, 1) * 4 - 2,
            "next_observation": torch.randn(BUFFER, 3), "reward": -torch.rand(BUFFER, 1) * 16,
            "terminated": torch.zeros(BUFFER, 1, dtype=torch.bool)}

    def q_values(self, params, observation, action):
        x = torch.cat([observation, action], -1)
        call = lambda p: torch.func.functional_call(self.base, p, (x,))  # noqa: E731
        return torch.vmap(call)(params)

    def losses(self, observation, action, next_observation, reward, terminated):
        alpha = self.log_alpha.exp()
        with torch.no_grad():
            next_action, next_log_prob = actor_forward(self.actor, next_observation)
            next_q = self.q_values(self.target_params, next_observation, next_action).min(0).values
            target = reward + GAMMA * (1 - terminated.float()) * (next_q - alpha * next_log_prob.unsqueeze(-1))
        critic_loss = 0.5 * (self.q_values(self.critic_params, observation, action) - target).pow(2).mean((1, 2)).sum()
        new_action, log_prob = actor_forward(self.actor, observation)
        log_prob = log_prob.unsqueeze(-1)
        detached = {k: v.detach() for k, v in self.critic_params.items()}
        q = self.q_values(detached, observation, new_action).min(0).values
        actor_loss = (alpha.detach() * log_prob - q).mean()
        alpha_loss = -(self.log_alpha * (log_prob.detach() + TARGET_ENTROPY)).mean()
        return critic_loss + actor_loss + alpha_loss

    def soft_update(self):
        with torch.no_grad():
            targets, sources = list(self.target_params.values()), list(self.critic_params.values())
            if self.foreach:
                torch._foreach_lerp_(targets, sources, TAU)
            else:
                for t, s in zip(targets, sources):
                    t.lerp_(s, TAU)

    def steps(self):
        self.critic_adam.step()
        self.actor_adam.step()
        self.alpha_adam.step()


def make_update(agent, losses, steps, soft_update):
    def update():
        index = torch.randint(BUFFER, (BATCH,))
        batch = [agent.buffer[k][index] for k in ("observation", "action", "next_observation", "reward", "terminated")]
        for opt in (agent.actor_adam, agent.critic_adam, agent.alpha_adam):
            opt.zero_grad()
        losses(*batch).backward()
        steps()
        soft_update()
    return update


def median_us(update, calls):
    rounds = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            update()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(rounds)[3]


def main():
    torch.set_num_threads(1)
    flush_denormal = "--keep-denormal" not in sys.argv and torch.set_flush_denormal(True)
    updates = int(sys.argv[sys.argv.index("--updates") + 1]) if "--updates" in sys.argv else 1400
    calls = max(updates // 7, 1)
    variants = {}
    for name, foreach in (("eager", False), ("eager_foreach", True)):
        agent = Agent(foreach)
        variants[name] = make_update(agent, agent.losses, agent.steps, agent.soft_update)
    if "--no-compile" not in sys.argv and hasattr(torch, "compile"):
        agent = Agent(True)
        try:
            import torch._dynamo as dynamo
            explained = dynamo.explain(agent.losses)(*[agent.buffer[k][:BATCH] for k in (
                "observation", "action", "next_observation", "reward", "terminated")])
            print(f"compiled: losses: {explained.graph_count} graphs, {explained.graph_break_count} graph breaks"
                  + "".join(f"\n  break: {b.reason}" for b in explained.break_reasons))
            dynamo.reset()
            variants["compiled"] = make_update(agent, torch.compile(agent.losses), torch.compile(agent.steps),
                                               torch.compile(agent.soft_update))
            start = time.perf_counter()
            for _ in range(3):
                variants["compiled"]()
            print(f"compiled: first calls (compiling) {time.perf_counter() - start:.1f} s")
        except Exception as e:  # noqa: BLE001  (report what fails, time the rest)
            variants.pop("compiled", None)
            print(f"compiled: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    for update in variants.values():  # warm up
        for _ in range(50):
            update()
    for name, update in variants.items():
        print(f"python_sac_update variant={name} torch={torch.__version__} batch={BATCH} threads={torch.get_num_threads()} "
              f"flush_denormal={int(bool(flush_denormal))} update_us={median_us(update, calls):.1f}", flush=True)


main()
