"""Benchmark: skip-observation GAE on the packed layout vs the per-token reference loop.

Workload (defaults): 128 multi-turn trajectories × 16,384 tokens, ~20 % observation tokens, outcome
reward on the last action token, length-adaptive λ per trajectory, γ = 1. The reference is the widely
used formulation: a Python loop over token positions of the right-padded ``(B, L)`` batch, vectorised
over the batch, carrying the next value and the running advantage across observation tokens. Both run in
this process on the same batch; the script checks they agree, then prints both times and the speed-up.
"Ours" on CPU is the compiled (numba) kernel that ``skip_observation_gae`` dispatches to; the blocked
tensor scan used for GPU tensors (and where numba is missing) is timed too, for information.

    python benchmarks/gae.py                      # the issue's workload (target: >= 100x, <= 50 ms)
    python benchmarks/gae.py --trajectories 32 --tokens 4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from harness import LoadWatch
from sao.algos import gae, length_adaptive_lambda, skip_observation_gae


def make_batch(
    num_traj: int, tokens: int, obs_frac: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed ``(rewards, values, action_mask, cu_seqlens)``: prompt, then action/observation turns."""
    gen = torch.Generator().manual_seed(seed)
    masks = []
    for _ in range(num_traj):
        mask = torch.zeros(tokens, dtype=torch.bool)
        pos = int(torch.randint(64, 256, (1,), generator=gen))  # prompt
        while pos < tokens:
            act = int(torch.randint(100, 700, (1,), generator=gen))
            mask[pos : pos + act] = True
            pos += act
            # observation span sized so that ~obs_frac of the response is observation
            obs_mean = act * obs_frac / (1 - obs_frac)
            pos += max(1, int(obs_mean * float(torch.empty(1).uniform_(0.5, 1.5, generator=gen))))
        masks.append(mask)
    action_mask = torch.cat(masks)
    cu_seqlens = torch.arange(0, num_traj * tokens + 1, tokens, dtype=torch.int32)
    rewards = torch.zeros(action_mask.numel())
    ends = cu_seqlens[1:].long()
    last_action = torch.stack(
        [m.nonzero()[-1, 0] + start for m, start in zip(masks, cu_seqlens[:-1].tolist(), strict=True)]
    )
    rewards[last_action] = (torch.rand(num_traj, generator=gen) > 0.5).float()
    values = torch.rand(action_mask.numel(), generator=gen)
    assert int(ends[-1]) == action_mask.numel()
    return rewards, values, action_mask, cu_seqlens


def reference_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: torch.Tensor
) -> torch.Tensor:
    """Per-token loop over a padded ``(B, L)`` batch; observation tokens pass the carry through."""
    batch, length = rewards.shape
    next_value = torch.zeros(batch)
    last_gae = torch.zeros(batch)
    advantages = torch.zeros(batch, length)
    m = mask.float()
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        # On an observation token keep the carries of the next action token unchanged.
        next_value = m[:, t] * values[:, t] + (1 - m[:, t]) * next_value
        last_gae = m[:, t] * gae + (1 - m[:, t]) * last_gae
        advantages[:, t] = m[:, t] * gae
    return advantages


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per trajectory")
    parser.add_argument(
        "--obs-frac", type=float, default=0.2, help="share of response tokens that are observation"
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed runs of ours (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    watch = LoadWatch()

    rewards, values, action_mask, cu = make_batch(args.trajectories, args.tokens, args.obs_frac, args.seed)
    counts = torch.stack([s.sum() for s in action_mask.split(args.tokens)])
    lam = length_adaptive_lambda(counts, alpha=1.5)
    first = torch.stack([s.nonzero()[0, 0] for s in action_mask.split(args.tokens)])
    obs_share = 1 - float(counts.sum()) / float((args.tokens - first).sum())
    print(
        f"batch: {args.trajectories} trajectories x {args.tokens} tokens = {action_mask.numel():,} tokens, "
        f"{obs_share:.1%} of response tokens are observation, torch threads {torch.get_num_threads()}"
    )

    def ours() -> torch.Tensor:
        return skip_observation_gae(rewards, values, action_mask, cu, 1.0, lam)[0]

    def timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
        for _ in range(3):  # warm-up: kernel compilation or cache load, allocator, thread pools
            out = fn()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times), out

    t_ours, adv = timed(ours)
    with_numba = gae.numba_available()
    gae.numba_available = lambda: False  # force the tensor-scan path for the second measurement
    t_scan, adv_scan = timed(ours)

    shape = (args.trajectories, args.tokens)
    padded = [x.view(shape) for x in (rewards, values, action_mask)]
    start = time.perf_counter()
    ref = reference_gae(*padded, 1.0, lam)
    t_ref = time.perf_counter() - start

    torch.testing.assert_close(adv.view(shape), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(adv_scan.view(shape), ref, rtol=1e-4, atol=1e-4)
    path = "numba kernel" if with_numba else "tensor scan: numba unavailable"
    print(f"reference per-token loop (padded):     {t_ref * 1e3:9.1f} ms")
    print(f"sao skip_observation_gae ({path}): {t_ours * 1e3:9.1f} ms  (median of {args.repeats})")
    print(f"sao blocked tensor scan (GPU path):     {t_scan * 1e3:9.1f} ms  (median of {args.repeats})")
    print(f"speed-up: {t_ref / t_ours:.0f}x (tensor scan: {t_ref / t_scan:.0f}x); all outputs agree to 1e-4")

    print(watch.report())


if __name__ == "__main__":
    main()
