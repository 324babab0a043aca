"""Benchmark: memory that fits, on CPU: a rank's peak while loading, and activation checkpointing.

1. **Loading.** A Qwen3-0.6B-shaped model (its published config, `QWEN3_0_6B`; random init) is saved once
   as sharded safetensors in bfloat16, as the released checkpoint is (several files and
   ``model.safetensors.index.json``). Arms, interleaved, each repetition in fresh processes:

   - ``sharded``: 2 gloo ranks (two processes with torchrun's environment), each
     `load_sharded_policy(..., master_dtype=float32)`: a meta model, sharded, each rank reading its rows;
   - ``full``: one process, `load_policy(..., dtype=float32)`, what every rank did before.

   Peak while loading = ``VmHWM`` after the load − ``VmRSS`` just before it: the process baseline
   (interpreter, torch, transformers; for the ranks also the process group) is subtracted from both arms.
   RSS counts the checkpoint pages a process has mapped (safetensors are memory-mapped), as the OS does.
   Target: a rank's peak ≤ 0.6× the full load's.

2. **Activations.** A slice of the same shape (``--layers``, default 4; float32, the CPU compute dtype)
   trains one micro-batch, forward and backward: by default the critic's (`token_values`, `value_loss`; the
   backbone is all of it), or with ``--model policy`` the actor's (`token_logprobs`, whose LM head already
   runs in checkpointed 1024-token chunks: a transient of ~chunk × vocab floats that does not depend on the
   micro-batch size or on this knob). The micro-batch packs trajectories of ``--traj-tokens`` (default
   1024) up to 2k, 4k and 8k tokens; arms with and without activation checkpointing per decoder layer
   (`sao.models.prepare.enable_checkpointing`), interleaved. Each measurement is a fresh process with
   ``MALLOC_MMAP_THRESHOLD_=65536``, so every tensor of 64 KiB or more is its own mapping, returned to the
   OS when freed: RSS follows the live tensors (no heap kept from earlier allocations). In it, a warm-up
   micro-batch of 64 tokens allocates the gradients (a gradient is not an activation: they then exist in
   both arms before the step, as from the second micro-batch of a step on), the peak is reset
   (``/proc/self/clear_refs``), and the step's peak is ``VmHWM`` − ``VmRSS`` before it. The embedding is
   frozen: its gradient is a weight-sized (vocab × hidden) buffer written at the end of backward, the same
   for every length and arm. Printed: the ratio checkpointed / not at each length (target ≤ 0.3× at 8k) and
   a least-squares line of peak against tokens per arm (bytes per token, and the intercept).

Each figure: median and range over ``--reps`` interleaved repetitions (`harness`), and the load average.

    python benchmarks/memory.py                  # both parts, 5 repetitions (~30 min on 2 cores)
    python benchmarks/memory.py --part loading --reps 7
    python benchmarks/memory.py --quick          # a smoke run: a small vocab, 2 layers, short sequences
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import LoadWatch, Spread, interleaved, ratio

# Qwen3-0.6B's published config.json (the fields that shape the model).
QWEN3_0_6B: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
    "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
}  # fmt: skip
QUICK = {"vocab_size": 16384, "num_hidden_layers": 4}  # --quick: the same widths, a smaller model
MIB = 2**20


# ---- measuring in a fresh process ------------------------------------------------------------------------


def _status_kib(*keys: str) -> dict[str, int]:
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"^{k}:\s+(\d+) kB", text, re.M)[1]) for k in keys}  # type: ignore[index]


def rss_bytes() -> int:
    return _status_kib("VmRSS")["VmRSS"] * 1024


def peak_bytes() -> int:
    """The process's peak RSS since it started or since `reset_peak` (``VmHWM``)."""
    return _status_kib("VmHWM")["VmHWM"] * 1024


def reset_peak() -> None:
    """``VmHWM`` := the current RSS (Linux: writing 5 to ``/proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")


def qwen3_config(overrides: dict[str, Any]):
    from transformers import AutoConfig

    fields = {**QWEN3_0_6B, **overrides}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


# ---- 1. loading -----------------------------------------------------------------------------------------


def write_checkpoint(directory: Path, overrides: dict[str, Any], shard_size: str) -> int:
    """Random-init the model in bfloat16 and save it sharded; returns its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config(overrides), dtype=torch.bfloat16)
    model.save_pretrained(directory, max_shard_size=shard_size)
    return sum(p.numel() for p in model.parameters())


def child_load(arm: str, directory: str) -> dict[str, Any]:
    """One process of a loading arm (``full``, or ``sharded`` with torchrun's environment)."""
    import torch
    import torch.distributed as dist

    from sao.models.loading import load_policy
    from sao.models.sharded_loading import load_sharded_policy

    torch.set_num_threads(1)
    sharded = arm == "sharded"
    if sharded:
        dist.init_process_group("gloo")
    reset_peak()
    before = rss_bytes()
    start = time.perf_counter()
    if sharded:
        model = load_sharded_policy(directory, device="cpu", master_dtype=torch.float32)
    else:
        model = load_policy(directory, dtype="float32", device="cpu")
    seconds = time.perf_counter() - start
    peak = peak_bytes() - before
    local = sum((p.to_local() if sharded else p).nbytes for p in model.parameters())
    if sharded:
        dist.barrier()
        dist.destroy_process_group()
    return {"peak": peak, "baseline": before, "local": local, "seconds": seconds}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(argv: list[str], envs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Run this file's ``--child`` mode once per environment, concurrently; each one's JSON result."""
    procs = [
        subprocess.Popen([sys.executable, __file__, "--child", *argv], env={**os.environ, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for env in envs
    ]  # fmt: skip
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"child {argv} failed ({proc.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run_loading(args: argparse.Namespace, overrides: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="sao-memory-") as tmp:
        ckpt = Path(tmp) / "qwen3-0.6b-shape"
        params = write_checkpoint(ckpt, overrides, args.shard_size)
        files = sorted(p.name for p in ckpt.glob("*.safetensors"))
        print(f"checkpoint: {params / 1e6:.0f}M parameters, bfloat16, {len(files)} safetensors files + index")

        def sharded(_: int) -> list[dict[str, Any]]:
            port = str(_free_port())
            envs = [{"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": port} for r in range(2)]  # fmt: skip
            return _children(["load", "sharded", str(ckpt)], envs)

        def full(_: int) -> list[dict[str, Any]]:
            return _children(["load", "full", str(ckpt)], [{}])

        def show(arm: str, rep: int, result: list[dict[str, Any]]) -> None:
            peaks = ", ".join(f"{r['peak'] / MIB:,.0f}" for r in result)
            print(f"  rep {rep} {arm:<7} peak MiB {peaks}  ({result[0]['seconds']:.1f} s)", flush=True)

        watch = LoadWatch()
        got = interleaved({"sharded": sharded, "full": full}, args.reps, show)
    full_peak = [r[0]["peak"] for r in got["full"]]
    rank_peak = [max(r["peak"] for r in ranks) for ranks in got["sharded"]]
    model_bytes = got["full"][0][0]["local"]
    print(f"\nLOADING: peak RSS while loading, minus the process baseline (RSS before the load), MiB; "
          f"{args.reps} repetitions, median [range]")  # fmt: skip
    print(f"  model in float32: {model_bytes / MIB:,.0f} MiB")
    print(f"  full   (load_policy, 1 process)  peak {Spread(tuple(x / MIB for x in full_peak)).fmt(',.0f')}"
          f"  baseline {got['full'][0][0]['baseline'] / MIB:,.0f}")  # fmt: skip
    for rank in range(2):
        peaks = tuple(ranks[rank]["peak"] / MIB for ranks in got["sharded"])
        shard = got["sharded"][0][rank]["local"] / MIB
        print(f"  sharded rank {rank} (load_sharded_policy) peak {Spread(peaks).fmt(',.0f')}  its shards "
              f"{shard:,.0f}  baseline {got['sharded'][0][rank]['baseline'] / MIB:,.0f}")  # fmt: skip
    med, spread = ratio(rank_peak, full_peak)
    print(
        f"  per-rank peak (the larger rank) / full: {med:.3f}x (per repetition {spread.fmt('.3f')}); "
        "target <= 0.6x"
    )
    print(f"  {watch.report()}")


# ---- 2. activations -------------------------------------------------------------------------------------


def make_batch(tokens: int, traj_tokens: int, vocab: int, seed: int):
    """A packed micro-batch of ``tokens`` tokens: trajectories of ``traj_tokens`` (the last one shorter),
    a quarter prompt, the rest action tokens."""
    import torch

    from sao.types import Batch, Trajectory

    gen = torch.Generator().manual_seed(seed)
    lengths = [traj_tokens] * (tokens // traj_tokens) + (
        [tokens % traj_tokens] if tokens % traj_tokens else []
    )
    trajs = []
    for i, n in enumerate(lengths):
        prompt = max(1, n // 4)
        action = [0] * prompt + [1] * (n - prompt)
        trajs.append(Trajectory(
            prompt_id=f"p{i}", token_ids=torch.randint(0, vocab, (n,), generator=gen).tolist(),
            action_mask=action, rollout_logprobs=[-1.0 * a for a in action],
            versions=[0 if a else -1 for a in action], turn_ids=[-1] * prompt + [0] * (n - prompt),
            rewards=[float(i % 2)],
        ))  # fmt: skip
    return Batch.from_trajectories(trajs)


def child_step(kind: str, ckpt: bool, tokens: int, traj_tokens: int, overrides: dict[str, Any]) -> dict:
    """One micro-batch's forward and backward; the peak over it above the RSS just before it."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from sao.algos import value_loss
    from sao.models.attention import enable_packed_attention
    from sao.models.critic import CriticModel
    from sao.models.forward import token_logprobs, token_values
    from sao.models.prepare import enable_checkpointing

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = qwen3_config(overrides)
    if kind == "critic":
        config.num_labels, config.classifier_dropout = 1, 0.0
        inner = AutoModelForTokenClassification.from_config(config, dtype=torch.float32)
        model: torch.nn.Module = CriticModel(inner)
    else:
        inner = model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    enable_packed_attention(inner)
    if ckpt:
        enable_checkpointing(inner)
    inner.get_input_embeddings().weight.requires_grad_(False)  # module docstring: a gradient, not activations
    model.eval()  # as the trainer holds it (dropout off); checkpointing does not depend on the mode

    def step(batch) -> None:
        mask = batch.action_mask
        if kind == "critic":
            values = token_values(model, batch)
            loss, _ = value_loss(values, torch.rand(values.shape), mask, denominator=int(mask.sum()))
        else:
            logprobs, _ = token_logprobs(model, batch)
            loss = -(logprobs * mask).sum() / mask.sum()
        loss.backward()

    step(make_batch(64, 64, config.vocab_size, seed=1))  # allocates the gradients
    batch = make_batch(tokens, traj_tokens, config.vocab_size, seed=2)
    gc.collect()
    reset_peak()
    before = rss_bytes()
    start = time.perf_counter()
    step(batch)
    return {"peak": peak_bytes() - before, "seconds": time.perf_counter() - start}


def run_activations(args: argparse.Namespace, overrides: dict[str, Any]) -> None:
    import numpy as np

    layers = {**overrides, "num_hidden_layers": args.layers}
    env = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # module docstring: RSS follows the live tensors

    def arm(ckpt: bool, tokens: int):
        argv = ["step", args.model, str(int(ckpt)), str(tokens), str(args.traj_tokens), json.dumps(layers)]
        return lambda _: _children(argv, [env])[0]

    arms = {f"{'ckpt' if c else 'no-ckpt'} {t}": arm(c, t) for t in args.tokens for c in (False, True)}

    def show(name: str, rep: int, result: dict[str, Any]) -> None:
        print(f"  rep {rep} {name:<13} peak {result['peak'] / MIB:8,.0f} MiB  ({result['seconds']:.1f} s)",
              flush=True)  # fmt: skip

    watch = LoadWatch()
    got = interleaved(arms, args.reps, show)
    print(
        f"\nACTIVATIONS: {args.model} micro-batch, forward + backward, {args.layers} layers of the 0.6B "
        f"shape (vocab {layers.get('vocab_size', QWEN3_0_6B['vocab_size'])}), float32, trajectories of "
        f"{args.traj_tokens} tokens; peak RSS over the step minus RSS before it (gradients allocated "
        f"before, embedding frozen), MiB, {args.reps} repetitions, median [range]; checkpointing: "
        "sao.models.prepare.enable_checkpointing (per decoder layer)"
    )
    for tokens in args.tokens:
        off = [r["peak"] for r in got[f"no-ckpt {tokens}"]]
        on = [r["peak"] for r in got[f"ckpt {tokens}"]]
        med, spread = ratio(on, off)
        print(f"  {tokens:>6} tokens: no-ckpt {Spread(tuple(x / MIB for x in off)).fmt(',.0f')}  ckpt "
              f"{Spread(tuple(x / MIB for x in on)).fmt(',.0f')}  ckpt/no-ckpt {med:.3f}x "
              f"(per repetition {spread.fmt('.3f')})")  # fmt: skip
    print(f"  target at {max(args.tokens)} tokens: <= 0.3x")
    for label in ("no-ckpt", "ckpt") if len(args.tokens) > 1 else ():
        xs = [t for t in args.tokens for _ in got[f"{label} {t}"]]
        ys = [r["peak"] for t in args.tokens for r in got[f"{label} {t}"]]
        slope, intercept = np.polyfit(xs, ys, 1)
        # without checkpointing every layer holds its activations; with it, one layer's plus every input
        per_layer = f" ({slope / args.layers:,.0f} per token per layer)" if label == "no-ckpt" else ""
        print(f"  fit {label:<7}: {slope:,.0f} bytes/token{per_layer} + {intercept / MIB:,.0f} MiB")
    print(f"  {watch.report()}")


# ---- entry points ---------------------------------------------------------------------------------------


def child_main(argv: list[str]) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if argv[0] == "load":
        result = child_load(argv[1], argv[2])
    else:
        kind, ckpt, tokens, traj, overrides = argv[1:]
        result = child_step(kind, ckpt == "1", int(tokens), int(traj), json.loads(overrides))
    print(json.dumps(result))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["loading", "activations", "both"], default="both")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (>= 5 for a figure)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the activation slice")
    parser.add_argument("--tokens", default="2048,4096,8192", help="micro-batch sizes, comma-separated")
    parser.add_argument("--traj-tokens", type=int, default=1024, help="tokens per packed trajectory")
    parser.add_argument("--model", choices=["critic", "policy"], default="critic", help="whose micro-batch")
    parser.add_argument("--shard-size", default="300MB", help="safetensors file size of the checkpoint")
    parser.add_argument("--quick", action="store_true", help="smoke run: small vocab, 2 reps, short batches")
    args = parser.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    overrides: dict[str, Any] = {}
    if args.quick:
        overrides = dict(QUICK)
        args.reps, args.layers, args.tokens, args.traj_tokens = 2, 2, [256, 512, 1024], 256
        args.shard_size = "20MB"
    if args.part in ("loading", "both"):
        run_loading(args, overrides)
    if args.part in ("activations", "both"):
        run_activations(args, overrides)
    print("reproduce: HF_HUB_OFFLINE=1 .venv/bin/python " + " ".join(["benchmarks/memory.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
