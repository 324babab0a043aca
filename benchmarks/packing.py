"""Benchmark: forward + backward of per-token log-probs, packed (``sao_varlen``) vs padded (stock sdpa).

Workload (defaults): the "small" tiny Qwen3-MoE (hidden 128, 3 layers, 8 experts top-2), 32 trajectories
with long-tailed lengths (lognormal quantiles, median 128 tokens, longest = 8 x median). Both paths compute
the same (T,) log-probs and backpropagate the same loss through the whole model, in this process, on the
same data, alternating runs:

- packed: `sao.models.forward.token_logprobs` on the ``(1, T)`` packed row (per-trajectory causal attention);
- padded: the ``(B, L_max)`` right-padded batch with an attention mask through stock ``sdpa``, then the
  LM head and log-softmax on the real tokens only (so only the backbone differs);
- for information, packed-stock: the packed row through stock ``sdpa``, i.e. transformers' dense
  ``(1, 1, T, T)`` block-diagonal mask (what packing costs without ``sao_varlen``).

Throughput counts useful tokens only: real tokens / seconds of forward + backward. Memory is the bytes
autograd saves for backward (device-independent), and the CUDA peak when run on a GPU.

    python benchmarks/packing.py                  # the issue's workload (target: packed >= 2x padded)
    python benchmarks/packing.py --trajectories 64 --median 256 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.autograd.graph import saved_tensors_hooks

from harness import LoadWatch
from sao.models.attention import enable_packed_attention
from sao.models.forward import token_logprobs
from sao.models.tiny import build_tiny_model
from sao.types import Batch, Trajectory
from workloads import long_tailed_lengths


def make_batch(lengths: list[int], vocab: int, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i, n in enumerate(lengths):
        prompt = max(1, n // 4)
        action = [0] * prompt + [1] * (n - prompt)
        trajs.append(
            Trajectory(
                prompt_id=f"p{i}",
                token_ids=torch.randint(0, vocab, (n,), generator=gen).tolist(),
                action_mask=action,
                rollout_logprobs=[-1.0 * a for a in action],
                versions=[0 if a else -1 for a in action],
                turn_ids=[-1] * prompt + [0] * (n - prompt),
                rewards=[1.0],
            )
        )
    return Batch.from_trajectories(trajs)


def padded_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """``(T,)`` log-probs, aligned as `token_logprobs`, from the ``(B, L)`` padded batch with stock sdpa."""
    padded = batch.to_padded()
    hidden = model.model(padded.input_ids, attention_mask=padded.attention_mask, use_cache=False)
    rows = batch.unpad(hidden.last_hidden_state)  # (T, H): real tokens only
    targets = (batch.position_ids > 0).nonzero().squeeze(-1)
    logp = torch.log_softmax(model.lm_head(rows[targets - 1]).float(), dim=-1)
    picked = logp.gather(-1, batch.token_ids[targets, None]).squeeze(-1)
    return picked.new_zeros(batch.num_tokens).index_copy(0, targets, picked)


def packed_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    return token_logprobs(model, batch)[0]


def packed_stock_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The packed row through stock sdpa: transformers' dense (1, 1, T, T) block-diagonal mask."""
    model.set_attn_implementation("sdpa")
    try:
        return token_logprobs(model, batch)[0]
    finally:
        enable_packed_attention(model)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step(model: torch.nn.Module, batch: Batch, fn: Callable) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    logprobs = fn(model, batch)
    (logprobs * batch.action_mask).sum().backward()
    return logprobs.detach()


def saved_bytes(model: torch.nn.Module, batch: Batch, fn: Callable) -> int:
    """Bytes of the tensors autograd keeps for backward during one forward (activations, masks)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if not isinstance(t, torch.nn.Parameter):
            total += t.numel() * t.element_size()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn(model, batch)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--median", type=int, default=128)
    parser.add_argument("--tail", type=float, default=8.0, help="longest / median length")
    parser.add_argument("--arch", default="qwen3_moe", choices=["qwen3_moe", "qwen3"])
    parser.add_argument("--size", default="small", choices=["test", "small"])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    watch = LoadWatch()

    device = torch.device(args.device)
    model = enable_packed_attention(build_tiny_model(args.arch, args.size, seed=args.seed)).to(device).train()
    lengths = long_tailed_lengths(args.trajectories, args.median, args.tail, args.seed, minimum=2)
    batch = make_batch(lengths, model.config.vocab_size, args.seed).to(device)
    real, padded_tokens = batch.num_tokens, batch.num_sequences * batch.max_seqlen
    print(
        f"{args.arch}/{args.size} on {device}: {batch.num_sequences} trajectories, {real} tokens, "
        f"median {int(statistics.median(lengths))}, max {max(lengths)}; padded (B, L) = "
        f"({batch.num_sequences}, {batch.max_seqlen}) = {padded_tokens} slots ({padded_tokens / real:.1f}x)"
    )

    paths = {"packed": packed_logprobs, "padded": padded_logprobs, "packed-stock": packed_stock_logprobs}
    results = {name: step(model, batch, fn) for name, fn in paths.items()}  # warm-up
    diff = max((results["packed"] - other).abs().max().item() for other in results.values())
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.iters):
        for name, fn in paths.items():
            sync(device)
            start = time.perf_counter()
            step(model, batch, fn)
            sync(device)
            times[name].append(time.perf_counter() - start)

    throughput = {}
    for name, fn in paths.items():
        best = min(times[name])
        throughput[name] = real / best
        memory = f"autograd-saved {saved_bytes(model, batch, fn) / 2**20:7.1f} MiB"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            step(model, batch, fn)
            memory += f", CUDA peak {torch.cuda.max_memory_allocated(device) / 2**20:7.1f} MiB"
        timing = f"best of {args.iters}: {best * 1e3:7.1f} ms"
        print(f"{name:>12}: {throughput[name]:9.0f} useful tokens/s ({timing})  {memory}")
    ratio = throughput["packed"] / throughput["padded"]
    print(f"packed / padded throughput: {ratio:.2f}x (target >= 2x); max |log-prob difference| {diff:.1e}")

    print(watch.report())


if __name__ == "__main__":
    main()
