"""The TRL arm of `benchmarks/vs_trl.py`: one `trl.GRPOTrainer` run on one job, one JSON line out.

Runs in TRL's own virtualenv (``.venv-trl``: trl, transformers, torch CPU; no sao), so sao never depends on
TRL. Jobs (``--job``), each the same prompts and reward sao uses, as conversational prompts so the model's
chat template is applied as sao applies it:

- ``charset`` (default): `benchmarks/charset_env.py`, one turn, at most ``--max-new-tokens`` (10) tokens;
- ``calculator``: sao's built-in ``calculator`` env (`benchmarks/calculator_job.py`), multi-turn with
  TRL's tool calling (``tools=[calc]``): at most 3 assistant turns of ``--max-new-tokens`` (64) tokens
  each; needs a model that already makes ``<tool_call>`` calls (SFT on examples/make_tool_chats.py).
  See `tool_settings` for how TRL's loop is set up and where it differs from sao's episode.

Everything is logged to stderr; stdout gets one JSON object at the end::

    {"arm": "trl_grpo", "job", "steps", "wall_s" (train() wall, s), "step_s" (per optimizer step:
     on_step_begin to on_step_end, generation included, s), "gen_s" (per step: generation + reward
     scoring, s), "reward" (per-step batch mean), "completion_len" (per-step mean completion tokens, model
     tokens only), "tool_calls" (calculator: per-step mean tool calls per completion, TRL's
     ``tools/call_frequency``), "tool_failures" (share of calls that raised), "trajectories", "threads",
     "torch_threads" (torch's intra-op count during training), "trl_version", "settings"}

TRL settings chosen to match sao's ``algo=grpo`` preset and trainer defaults (docs in `grpo_settings`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calculator_job
import charset_env

ARM = "trl_grpo"
JOBS = ("charset", "calculator")
DEFAULT_MAX_NEW_TOKENS = {"charset": 10, "calculator": 64}  # calculator: per turn, sao eval's setting
# Prepended to the chat template for the tool job: a top-level set shadows the render variable, so TRL's
# prompts (rendered with tools=[calc]) get no tool-schema system turn, as sao's calculator prompts have none.
NO_TOOL_SCHEMA = "{%- set tools = none -%}\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF model dir (sao init-model --arch qwen3_moe ...).")
    p.add_argument("--steps", type=int, default=60, help="Optimizer steps.")
    p.add_argument("--prompts-per-step", type=int, default=4, help="Prompts per step (GRPO groups).")
    p.add_argument("--generations", type=int, default=8, help="Completions per prompt (group size).")
    p.add_argument("--job", choices=JOBS, default="charset", help="Task and reward (module docstring).")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="Tokens per completion (charset, default 10) or per assistant turn (calculator, default 64).",
    )
    p.add_argument(
        "--tool-result-tokens",
        type=int,
        default=64,
        help="calculator: completion budget per tool message, template tokens included (this byte-level "
        "template: 24 + the result's characters).",
    )
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (constant).")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads.")
    p.add_argument("--seed", type=int, default=0, help="Training and prompt seed.")
    p.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature.")
    p.add_argument("--num-tasks", type=int, default=4096, help="Prompts in the dataset (sao asks 4096).")
    args = p.parse_args(argv)
    if args.max_new_tokens is None:
        args.max_new_tokens = DEFAULT_MAX_NEW_TOKENS[args.job]
    names = ("steps", "prompts_per_step", "generations", "max_new_tokens", "tool_result_tokens", "threads")
    for name in (*names, "num_tasks"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not (Path(args.model) / "config.json").is_file():
        p.error(f"--model {args.model!r} is not a Hugging Face model directory (no config.json)")
    if args.generations < 2:
        p.error("--generations must be >= 2 (GRPO needs a group)")
    return args


def grpo_settings(args: argparse.Namespace, output_dir: str) -> dict[str, Any]:
    """GRPOConfig keyword arguments. Where TRL has a knob, sao's ``algo=grpo`` / trainer default decides:

    - one optimizer step per generation batch: batch = prompts × generations per device step, no gradient
      accumulation, steps_per_generation = 1, num_iterations = 1, so TRL skips the π_old forward and uses
      the current log-probs detached (ratio exactly 1);
    - loss_type "dapo": token sum over the whole batch / its active-token count = sao's ``token-mean``
      (with one micro-batch "bnpo" is the same number);
    - scale_rewards "group": (R − group mean) / (unbiased group std + 1e-4) ≈ sao's normalize_std=True
      (sao adds 1e-6);
    - epsilon 0.2 / epsilon_high 0.28 = sao grpo's clip-higher eps_low / eps_high; beta 0 (no KL, no ref);
    - router_aux_loss_coef 0: TRL otherwise adds the MoE config's load-balancing loss (0.001), sao does not;
    - max_grad_norm 1.0, weight_decay 0.0, constant lr, no warm-up, torch AdamW = sao's trainer defaults;
    - float32, no gradient checkpointing (sao on CPU); temperature 1, top-p 1, no top-k as sao's engine.
    """
    batch = args.prompts_per_step * args.generations
    return {
        "output_dir": output_dir,
        "max_steps": args.steps,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": 1,
        "num_generations": args.generations,
        "num_iterations": 1,
        "max_completion_length": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "beta": 0.0,
        "router_aux_loss_coef": 0.0,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "mask_truncated_completions": False,
        "learning_rate": args.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "bf16": False,
        "gradient_checkpointing": False,
        "use_cpu": True,
        "seed": args.seed,
        "logging_steps": 1,
        "eval_strategy": "no",
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def tool_settings(args: argparse.Namespace) -> dict[str, Any]:
    """GRPOConfig keyword arguments of the calculator job, on top of `grpo_settings`.

    sao's episode (``data.env=calculator``): at most 3 assistant turns of up to ``--max-new-tokens`` each;
    a turn with ``<tool_call>`` gets the tool's ``tool`` message and the episode goes on; a turn without
    one is the answer and ends it. TRL's loop made to match:

    - ``max_tool_calling_iterations`` 2: the first generation plus at most 2 after tool results = 3 turns;
      a 3rd turn that still calls the tool ends the completion there (sao: turn budget spent, reward 0;
      here: the last message has tool_calls, reward 0);
    - ``generation_kwargs.max_new_tokens``: each turn's own cap (TRL otherwise lets every turn generate up
      to ``max_completion_length``);
    - ``max_completion_length``: ONE budget for all turns *and* the tool messages between them (TRL counts
      tool-result tokens, template included, against it; a tool result that would overflow it is dropped
      and the completion ends at the call): 3 turns + 2 tool messages of ``--tool-result-tokens``.
    """
    turns = calculator_job.MAX_TURNS
    return {
        "max_completion_length": turns * args.max_new_tokens + (turns - 1) * args.tool_result_tokens,
        "max_tool_calling_iterations": turns - 1,
        "generation_kwargs": {"max_new_tokens": args.max_new_tokens},
    }


def build_dataset(job: str, n: int, seed: int):
    """In-memory Dataset: conversational ``prompt`` (one user message, as sao's env starts) plus the column
    the job's reward reads (charset: ``allowed``; calculator: ``answer``)."""
    from datasets import Dataset

    if job == "charset":
        rows = [
            {"prompt": [{"role": "user", "content": p["text"]}], "allowed": p["allowed"]}
            for p in charset_env.make_prompts(n, seed)
        ]
    else:
        rows = [
            {"prompt": [{"role": "user", "content": p["text"]}], "answer": p["answer"]}
            for p in calculator_job.make_prompts(n, seed)
        ]
    return Dataset.from_list(rows)


def reward_charset(completions: list[list[dict[str, str]]], allowed: list[str], **_: Any) -> list[float]:
    """TRL reward function: `charset_reward` of each assistant reply against its prompt's set."""
    reward = charset_env.charset_reward
    return [reward(c[-1]["content"] or "", a) for c, a in zip(completions, allowed, strict=True)]


def reward_calculator(completions: list[list[dict[str, Any]]], answer: list[int], **_: Any) -> list[float]:
    """TRL reward function: sao's calculator outcome on each completion's messages (assistant turns and
    the ``tool`` messages TRL appended with `calculator_job.calc`'s results)."""
    reward = calculator_job.calculator_reward
    return [reward(a, c) for c, a in zip(completions, answer, strict=True)]


def prepare_tool_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer for TRL's tool loop: Qwen3's response template (so TRL parses our
    ``<tool_call>{json}</tool_call>`` turns; TRL does not recognise the tiny model's template and sets none),
    and the chat template made to render no tool schema (`NO_TOOL_SCHEMA`)."""
    from trl.chat_template_utils import qwen3_template

    tokenizer.response_template = copy.deepcopy(qwen3_template)
    tokenizer.chat_template = NO_TOOL_SCHEMA + tokenizer.chat_template
    return tokenizer


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        """Per optimizer step: wall from on_step_begin to on_step_end, and the logged reward and length."""

        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.reward: list[float] = []
            self.completion_len: list[float] = []
            self.tool_calls: list[float] = []
            self.tool_failures: list[float] = []
            self.torch_threads: set[int] = set()
            self._t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.torch_threads.add(torch.get_num_threads())
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self._t0)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.reward.append(float(logs["reward"]))
                self.completion_len.append(float(logs.get("completions/mean_length", float("nan"))))
                if "tools/call_frequency" in logs:
                    self.tool_calls.append(float(logs["tools/call_frequency"]))
                    self.tool_failures.append(float(logs.get("tools/failure_frequency", float("nan"))))

    class TimedGRPOTrainer(GRPOTrainer):
        """Records the wall of each generation + scoring call (TRL makes one per optimizer step here)."""

        gen_s: list[float]

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.gen_s.append(time.perf_counter() - t0)
            return out

    t_start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = build_dataset(args.job, args.num_tasks, args.seed)
    timer = StepTimer()
    job: dict[str, Any] = {"reward_funcs": reward_charset}
    if args.job == "calculator":
        tokenizer = prepare_tool_tokenizer(tokenizer)
        job = {"reward_funcs": reward_calculator, "tools": [calculator_job.calc]}
    with tempfile.TemporaryDirectory(prefix="trl_arm_") as out_dir:
        settings = grpo_settings(args, out_dir)
        if args.job == "calculator":
            settings.update(tool_settings(args))
        trainer = TimedGRPOTrainer(
            model=model,
            args=GRPOConfig(**settings),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
            **job,
        )
        trainer.gen_s = []
        torch.set_num_threads(args.threads)  # in case a library reset it while building the trainer
        print(f"[trl_arm] setup {time.perf_counter() - t_start:.1f} s; training", file=sys.stderr)
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
    settings.pop("output_dir")
    result = {
        "arm": ARM,
        "job": args.job,
        "steps": len(timer.step_s),
        "wall_s": wall,
        "step_s": timer.step_s,
        "gen_s": trainer.gen_s,
        "reward": timer.reward,
        "completion_len": timer.completion_len,
        "tool_calls": timer.tool_calls,
        "tool_failures": timer.tool_failures,
        "trajectories": len(timer.step_s) * args.prompts_per_step * args.generations,
        "threads": args.threads,
        "torch_threads": sorted(timer.torch_threads),
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "settings": settings,
    }
    return result


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):  # libraries print progress and logs; stdout is the JSON's
        out = main()
    print(json.dumps(out), flush=True)
