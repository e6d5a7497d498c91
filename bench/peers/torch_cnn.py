"""The torch reference of `python -m bench.learner --levers`: the same Nature-CNN PPO step in torch.

Runs inside the Sample Factory benchmark venv (`bench.peers.sample_factory`), whose
torch is what Sample Factory's learner runs on a CPU. It builds the network of
`learners/models/networks.py`'s `NatureCNN` (conv 32 8x8/4, conv 64 4x4/2, conv 64 3x3/1,
dense 512, policy and value heads; uint8 frames scaled to [0, 1] in the forward pass)
and times what srl_jax's PPO update does per minibatch: forward, PPO's clipped
surrogate, clipped value loss and entropy, backward, global-norm clipping and an Adam
step, over `epochs` x `minibatches` minibatches of random frames, with `threads` intra-op
threads. It prints one JSON line: samples/s per repeat (T * B samples through every
epoch count once, as in `bench.learner`).

    <sf-venv>/bin/python -P bench/peers/torch_cnn.py --T 32 --B 8 --epochs 1 --minibatches 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
from torch import nn


class NatureCNN(nn.Module):
    def __init__(self, channels: int, actions: int) -> None:
        super().__init__()
        self.torso = nn.Sequential(
            nn.Conv2d(channels, 32, 8, 4), nn.ReLU(), nn.Conv2d(32, 64, 4, 2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU())
        self.policy, self.value = nn.Linear(512, actions), nn.Linear(512, 1)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.torso(frames.float() * (1.0 / 255.0))
        return self.policy(x), self.value(x)[:, 0]


def ppo_step(net: NatureCNN, optimizer: torch.optim.Optimizer, mb: dict[str, torch.Tensor],
             clip: float = 0.1) -> None:
    logits, values = net(mb["obs"])
    dist = torch.distributions.Categorical(logits=logits)
    ratio = torch.exp(dist.log_prob(mb["actions"]) - mb["logp"])
    adv = (mb["advantages"] - mb["advantages"].mean()) / (mb["advantages"].std() + 1e-8)
    policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
    clipped = mb["values"] + (values - mb["values"]).clamp(-clip, clip)
    value_loss = 0.5 * torch.max((values - mb["returns"]) ** 2,
                                 (clipped - mb["returns"]) ** 2).mean()
    loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), 0.5)
    optimizer.step()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--T", type=int, default=32)
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--actions", type=int, default=6)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.T * args.B
    rng = np.random.default_rng(0)
    data = {
        "obs": torch.from_numpy(rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8)),
        "actions": torch.from_numpy(rng.integers(0, args.actions, n)),
        "logp": torch.full((n,), float(np.log(1 / args.actions))),
        **{k: torch.from_numpy(rng.standard_normal(n).astype(np.float32))
           for k in ("advantages", "values", "returns")},
    }
    net = NatureCNN(4, args.actions)
    optimizer = torch.optim.Adam(net.parameters(), lr=2.5e-4, eps=1e-5)

    def update() -> None:
        for _ in range(args.epochs):
            order = torch.randperm(n)
            for part in order.chunk(args.minibatches):
                ppo_step(net, optimizer, {k: v[part] for k, v in data.items()})

    update()  # warm-up
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.updates):
            update()
        rates.append(n * args.updates / (time.perf_counter() - start))
    print(json.dumps({"torch": torch.__version__, "threads": args.threads,
                      "samples_per_s": statistics.median(rates), "samples_per_s_all": rates}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
