"""The GPU check of a real model's training path: `sao train` (the CLI, in this process) on one GPU with a
Qwen3-0.6B-shaped random-init checkpoint, bf16 compute / fp32 master weights, activation checkpointing, the
local engine on CUDA, a few synchronous SAO steps of one ~16k-token micro-batch each (configs/gpu_check.yaml).

It prints, per actor step and overall:

- tokens/s of the trainer step: ``batch/tokens / runtime/train_s`` from the run's metrics.jsonl (the whole
  SAO step: K critic updates, value recompute, one actor update);
- peak GPU memory: ``torch.cuda.max_memory_allocated`` over each trainer step (reset before it; the run
  logs no memory metric, so the step is wrapped here: `sao.train.step.Trainer.train_step`, called as the
  runtime calls it) and over the whole run, against the prediction of `sao plan`'s resource model
  (`sao.plan.resources.resource_plan` on the same config: `sao.plan.memory`) at the planned micro-batch
  (max of trainer.micro_batch_tokens and data.max_total_tokens) and at the step's actual tokens;
- the sdpa kernel torch picks for a trajectory of the run's attention shape, bf16 and fp32
  (`sao.models.attention_kernels.gqa_operands`: native GQA or repeated K/V heads);
- the on-policy DIS ratio: ``dis/ratio_mean`` (mean of π_θ / π_rollout over action tokens) and
  ``dis/logprob_abs_diff``, with ``lag/token_max`` (0: every token on-policy, as a synchronous run is).

    python scripts/gpu_check.py                          # on the GPU machine (writes the checkpoint first)
    python scripts/gpu_check.py --device cpu --tiny      # the same path on the CPU, tiny shape (dry run)

The checkpoint is written here by `scripts/shaped_checkpoint.py` (nothing is downloaded). Exit status 0 when
the run trained every step and the DIS ratio is 1 within ``--ratio-tol``; the memory comparison is reported,
not judged. A JSON summary goes to ``--out``/gpu_check.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3
# --tiny: a dry run on the CPU in well under two minutes on two cores (the same keys, smaller numbers).
_TINY_OVERRIDES = ("engine.max_new_tokens=96", "data.max_total_tokens=256", "trainer.batch_size=4")


def _load_module(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StepProbe:
    """Wraps `Trainer.train_step` (the real one, called by the runtime as usual) to record each step's
    wall time and, on CUDA, its peak allocated memory."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.steps = cuda, []  # type: list[dict[str, float]]
        self.outside_peak = 0.0  # the largest peak between trainer steps (loading, rollouts, pushes)

    def install(self) -> None:
        from sao.train.step import Trainer

        original = Trainer.train_step
        probe = self

        def train_step(trainer: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            if probe.cuda:
                torch.cuda.synchronize()
                probe.outside_peak = max(probe.outside_peak, float(torch.cuda.max_memory_allocated()))
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            metrics = original(trainer, batch, *args, **kwargs)
            if probe.cuda:
                torch.cuda.synchronize()
            record = {"tokens": float(batch.num_tokens), "seconds": time.perf_counter() - start}
            if probe.cuda:
                record["peak_bytes"] = float(torch.cuda.max_memory_allocated())
            probe.steps.append(record)
            return metrics

        Trainer.train_step = train_step  # type: ignore[method-assign]


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )


def _prediction(config: Path, overrides: list[str], tokens: int | None) -> dict[str, Any]:
    """The resource model's trainer peak for the run's config (as on a GPU, whatever the device), at the
    planned micro-batch and at ``tokens``."""
    from sao.config import load_config
    from sao.plan.memory import trainer_memory
    from sao.plan.resources import resource_plan

    plan = resource_plan(load_config(config, [*overrides, "model.device=cuda"]))
    memory = plan.trainer_memory
    assert memory is not None
    terms = {k: v for k, v in vars(memory).items() if isinstance(v, int)}
    out: dict[str, Any] = {
        "planned_tokens": plan.micro_batch_tokens, "planned_peak_bytes": memory.peak, "terms": terms
    }  # fmt: skip
    if tokens:
        at = trainer_memory(
            plan.architecture, tokens, compute=plan.compute_dtype, master=plan.master_dtype,
            checkpointing=plan.gradient_checkpointing, critic_trainable=plan.critic_trainable_params,
            critic_frozen=plan.critic_params - plan.critic_trainable_params,
            engine_weights=memory.engine_weights, engine_kv=memory.engine_kv,
        )  # fmt: skip
        out.update(actual_tokens=tokens, actual_peak_bytes=at.peak)
    return out


def _attention_kernels(device: str, arch: str, length: int) -> list[str]:
    """The sdpa kernel torch picks for one trajectory of ``length`` tokens of ``arch``'s attention on
    ``device``, per dtype, after `sao.models.attention_kernels.gqa_operands` (repeated K/V heads or native
    GQA)."""
    import torch
    from torch.nn.attention import SDPBackend

    from sao.models.attention_kernels import gqa_operands
    from sao.plan.architecture import Architecture, known_config

    known = known_config(arch)
    assert known is not None
    a = Architecture.from_hf_config(known[1])
    lines = []
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.zeros(1, a.num_heads, length, a.head_dim, dtype=dtype, device=device)
        kv = torch.zeros(1, a.num_kv_heads, length, a.head_dim, dtype=dtype, device=device)
        key, value, gqa = gqa_operands(q, kv, kv)
        choice = torch._fused_sdp_choice(q, key, value, None, 0.0, True, enable_gqa=gqa)
        how = "native GQA" if gqa else ("K/V heads repeated" if key.shape[1] != kv.shape[1] else "no GQA")
        lines.append(f"{str(dtype).removeprefix('torch.')}: {SDPBackend(choice).name} ({how})")
    return lines


def _run_train(config: Path, overrides: list[str]) -> int:
    import sao.cli  # registers the commands on the app

    code = sao.cli.app(args=["train", str(config), *overrides], standalone_mode=False)
    return int(code or 0)


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same family (dry runs)")
    parser.add_argument("--arch", default="qwen3-0.6b")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers: a slice of the model")
    parser.add_argument("--steps", type=int, default=3, help="actor steps")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "gpu_check.yaml")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu_check", help="checkpoint, run dir")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs" / "gpu_check")
    )
    parser.add_argument("--ratio-tol", type=float, default=0.02, help="|dis/ratio_mean - 1| allowed (bf16)")
    parser.add_argument("overrides", nargs="*", help="extra KEY=VALUE config overrides")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cuda = args.device == "cuda"

    import torch

    from sao.config import load_config

    if cuda and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0) if cuda else 'cpu'}", flush=True)

    name = args.arch + ("-tiny" if args.tiny else "") + (f"-{args.layers}l" if args.layers else "")
    checkpoint = args.work / name
    run_dir = args.work / ("run-tiny" if args.tiny else "run")
    t0 = time.perf_counter()
    if not (checkpoint / "config.json").is_file():
        shaped = _load_module("shaped_checkpoint")
        written = shaped.write_shaped_checkpoint(
            checkpoint, args.arch, tiny=args.tiny, layers=args.layers, device=args.device
        )
        print(f"checkpoint: {written['parameters']:,} parameters in {len(written['files'])} file(s), "
              f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time
    overrides = [
        f"model.path={checkpoint}", f"logging.run_dir={run_dir}", f"model.device={args.device}",
        f"trainer.total_steps={args.steps}", *(_TINY_OVERRIDES if args.tiny else ()), *args.overrides,
    ]  # fmt: skip
    length = load_config(args.config, overrides).data.max_total_tokens
    print(f"sdpa kernel per trajectory ({length} tokens): " + "; ".join(
        _attention_kernels(args.device, args.arch, length)), flush=True)  # fmt: skip
    probe = StepProbe(cuda)
    probe.install()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    code = _run_train(args.config, overrides)
    run_s = time.perf_counter() - t1
    run_peak = None
    if cuda:  # between steps, after the last one, and in the steps
        since_last = float(torch.cuda.max_memory_allocated())
        run_peak = max([probe.outside_peak, since_last, *(s.get("peak_bytes", 0.0) for s in probe.steps)])

    metrics = _read_metrics(run_dir)
    steps = [m for m in metrics if "runtime/train_s" in m]
    largest = int(max((s["tokens"] for s in probe.steps), default=0))
    prediction = _prediction(args.config, overrides, largest or None)
    rows = []
    print(f"\nsao train exit {code} after {run_s:.1f} s; {len(steps)} of {args.steps} steps logged")
    print(f"{'step':>4} {'tokens':>7} {'train_s':>8} {'tok/s':>8} {'peak':>10} {'dis ratio':>10} "
          f"{'|Δlogp|':>9} {'lag max':>7}")  # fmt: skip
    for m, s in zip(steps, probe.steps, strict=False):
        tokens, train_s = m.get("batch/tokens", float("nan")), m["runtime/train_s"]
        row = {
            "step": m.get("step"), "tokens": tokens, "train_s": train_s, "tokens_per_s": tokens / train_s,
            "peak_bytes": s.get("peak_bytes"), "dis_ratio_mean": m.get("dis/ratio_mean"),
            "dis_logprob_abs_diff": m.get("dis/logprob_abs_diff"), "lag_token_max": m.get("lag/token_max"),
        }  # fmt: skip
        rows.append(row)
        print(f"{row['step']!s:>4} {tokens:>7.0f} {train_s:>8.2f} {row['tokens_per_s']:>8.0f} "
              f"{_gib(row['peak_bytes']):>10} {row['dis_ratio_mean'] or float('nan'):>10.5f} "
              f"{row['dis_logprob_abs_diff'] or float('nan'):>9.2e} "
              f"{row['lag_token_max'] or 0:>7.0f}")  # fmt: skip

    step_peak = max((r["peak_bytes"] or 0 for r in rows), default=0) or None
    print(f"\npredicted trainer peak (sao plan): {_gib(prediction['planned_peak_bytes'])} at "
          f"{prediction['planned_tokens']:,} tokens; {_gib(prediction.get('actual_peak_bytes'))} at the "
          f"largest step's {largest:,} tokens")  # fmt: skip
    print(f"measured: {_gib(step_peak)} over trainer steps, {_gib(run_peak)} over the whole run")
    if step_peak and prediction.get("actual_peak_bytes"):
        print(f"measured / predicted (same tokens): {step_peak / prediction['actual_peak_bytes']:.3f}")
    terms = ", ".join(f"{k} {_gib(v)}" for k, v in prediction["terms"].items() if k != "tokens")
    print(f"predicted terms: {terms}")

    ratios = [r["dis_ratio_mean"] for r in rows if r["dis_ratio_mean"] is not None]
    ratio_ok = bool(ratios) and all(abs(r - 1) <= args.ratio_tol for r in ratios)
    on_policy = all((r["lag_token_max"] or 0) == 0 for r in rows)
    trained = code == 0 and len(steps) == args.steps
    summary = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "tiny": args.tiny, "exit": code,
        "run_s": run_s, "steps": rows, "prediction": prediction, "step_peak_bytes": step_peak,
        "run_peak_bytes": run_peak, "trained_all_steps": trained, "dis_ratio_ok": ratio_ok,
        "on_policy": on_policy,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=float))
    if (run_dir / "metrics.jsonl").is_file():
        shutil.copy(run_dir / "metrics.jsonl", args.out / "gpu_check_metrics.jsonl")
    mean_tps = [r["tokens_per_s"] for r in rows if not math.isnan(r["tokens_per_s"])]
    print(f"\ntrainer tokens/s: {', '.join(f'{t:.0f}' for t in mean_tps) or 'n/a'} (per step)")
    print(f"verdict: trained all steps {trained}; DIS ratio within {args.ratio_tol} of 1: {ratio_ok}; "
          f"on-policy (lag 0): {on_policy}")  # fmt: skip
    return 0 if trained and ratio_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
