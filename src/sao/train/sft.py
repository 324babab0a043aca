"""Supervised warm start on chat conversations, loss on assistant (action) tokens only.

Data: JSONL, one conversation per line, ``{"messages": [{"role": ..., "content": ...}, ...]}``. Each is
tokenised with :func:`sao.models.chat.render_chat` at the boundaries an RL rollout of it has, so the
tokens and the loss mask are exactly what the RL trainer sees (whatever the chat template does to earlier
turns). ``chat_template`` replaces the checkpoint's template and ``enable_thinking`` is bound into it
(both saved with the result, so evaluation and RL render as SFT did). Weights, gradients and AdamW state
are in ``master_dtype`` (float32), forward and backward in ``dtype`` (bfloat16 on CUDA), as in RL.
Training packs conversations (no padding), takes the token-mean negative log-likelihood over the action
tokens of each optimizer batch, reports a held-out loss periodically, and writes the model and tokenizer
to ``out_dir`` atomically, with ``sft_metrics.jsonl`` beside them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from sao.jsonl import iter_jsonl
from sao.models.chat import ChatTemplateError, render_chat, sft_trajectory
from sao.sinks import JsonlMetricsSink
from sao.types import Batch, Trajectory

from .common import atomic_dir, batches_forever, ready_for_training, set_seed, split_eval
from .step_schedule import actor_lr_factor

__all__ = ["SFTOptions", "load_chat_jsonl", "run_sft", "sft_loss"]

# The lr warms up linearly over warmup_steps, then decays by cosine to this fraction of lr at steps.
SFT_LR_FLOOR = 0.1


@dataclass(frozen=True)
class SFTOptions:
    """Hyper-parameters of :func:`run_sft` (tiny models need lr ~1e-3; real ones ~1e-5)."""

    steps: int = 200
    lr: float = 1e-3
    batch_size: int = 16  # conversations per optimizer step
    micro_batch_tokens: int = 8192
    max_tokens: int = 2048  # per conversation, longer ones are truncated
    eval_frac: float = 0.1
    eval_every: int = 25
    warmup_steps: int = 10
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0
    dtype: str = "auto"  # compute dtype of forward and backward (auto: bfloat16 on CUDA, float32 elsewhere)
    master_dtype: str = "float32"  # weights, gradients and AdamW state
    device: str = "auto"
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool | None = None  # None: on with CUDA
    chat_template: str | None = None  # a .jinja path or a shipped template ("qwen3", "qwen3_coder", "hermes")
    enable_thinking: bool | None = None  # bound into the chat template when not None


def load_chat_jsonl(path: str | Path) -> list[tuple[list[dict[str, Any]], list[Any] | None]]:
    """Read ``(messages, tools)`` conversations (``tools``: the row's optional tool schemas, rendered into
    the prompt by the chat template); a malformed line raises ``ValueError`` naming the file and line."""
    conversations = []
    for lineno, record in iter_jsonl(path):
        messages = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"{path}:{lineno}: expected an object with a non-empty 'messages' list")
        tools = record.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ValueError(f"{path}:{lineno}: 'tools' must be a list of tool schemas (objects)")
        conversations.append((messages, tools or None))
    if not conversations:
        raise ValueError(f"{path}: no conversations")
    return conversations


def sft_loss(model: torch.nn.Module, batch: Batch, micro_batch_tokens: int, backward: bool) -> float:
    """Token-mean NLL over the batch's action tokens, accumulated over micro-batches.

    With ``backward`` the gradients of the batch loss are accumulated into the model.
    Returns the loss value.
    """
    from sao.models.forward import token_logprobs

    device = next(model.parameters()).device
    total_action = max(int(batch.action_mask.sum()), 1)
    loss_sum = 0.0
    for mb in batch.split(micro_batch_tokens):
        mb = mb.to(device)
        with torch.set_grad_enabled(backward):
            logprobs, _ = token_logprobs(model, mb)
            loss = -(logprobs * mb.action_mask).sum() / total_action
        if backward:
            loss.backward()
        loss_sum += float(loss.detach())
    return loss_sum


def _trajectories(
    tokenizer: Any,
    conversations: Sequence[tuple[list[dict[str, Any]], list[Any] | None]],
    max_tokens: int,
) -> list[Trajectory]:
    out = []
    for i, (messages, tools) in enumerate(conversations):
        try:
            rendered = render_chat(tokenizer, messages, tools=tools)
        except ChatTemplateError as err:
            raise ValueError(f"conversation {i}: {err}") from None
        traj = sft_trajectory(rendered, prompt_id=f"sft-{i}", max_tokens=max_tokens)
        if traj.num_action_tokens:
            out.append(traj)
    if not out:
        raise ValueError("no conversation has an assistant token within max_tokens")
    return out


def _eval_loss(model: torch.nn.Module, trajs: list[Trajectory], opts: SFTOptions) -> float | None:
    if not trajs:
        return None
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(trajs), opts.batch_size):
        batch = Batch.from_trajectories(trajs[start : start + opts.batch_size])
        n = int(batch.action_mask.sum())
        total += sft_loss(model, batch, opts.micro_batch_tokens, backward=False) * n
        count += n
    model.train()
    return total / max(count, 1)


def _load_for_sft(model_dir: str | Path, opts: SFTOptions) -> tuple[torch.nn.Module, Any]:
    """The policy of ``model_dir`` ready to train (`ready_for_training`, train mode) and its tokenizer with
    ``opts``' chat template (``enable_thinking`` bound into it, so evaluation and RL render the same)."""
    from sao.models.loading import load_policy, load_tokenizer

    tokenizer = load_tokenizer(model_dir, chat_template=opts.chat_template)
    if opts.enable_thinking is not None:
        from sao.models.templates import bind_template_variables

        tokenizer.chat_template = bind_template_variables(
            tokenizer.chat_template, enable_thinking=opts.enable_thinking
        )
    model = ready_for_training(load_policy(model_dir, dtype=opts.master_dtype, device=opts.device), opts)
    model.train()
    return model, tokenizer


def _progress_bar(console: Console) -> Progress:
    columns = (
        TextColumn("sft"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.3f} eval {task.fields[eval]}"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=console)


def run_sft(
    model_dir: str | Path,
    data_path: str | Path,
    out_dir: str | Path,
    opts: SFTOptions = SFTOptions(),
    console: Console | None = None,
) -> dict[str, float | None]:
    """Fine-tune the checkpoint in ``model_dir`` on the conversations in ``data_path``; save to ``out_dir``.

    Returns ``{"train_loss", "eval_loss_start", "eval_loss", "steps"}``.
    """
    console = console or Console(stderr=True)
    set_seed(opts.seed)
    model, tokenizer = _load_for_sft(model_dir, opts)
    trajs = _trajectories(tokenizer, load_chat_jsonl(data_path), opts.max_tokens)
    train, held_out = split_eval(trajs, opts.eval_frac, opts.seed)
    console.print(f"sft: {len(train)} train / {len(held_out)} eval conversations, {opts.steps} steps")

    optim = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    lr_factor = actor_lr_factor("cosine", opts.warmup_steps, opts.steps, floor=SFT_LR_FLOOR)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_factor)
    eval_start = _eval_loss(model, held_out, opts)
    result: dict[str, float | None] = {"eval_loss_start": eval_start, "eval_loss": eval_start}
    batches = batches_forever(train, opts.batch_size, opts.seed)
    started = time.monotonic()
    with (
        atomic_dir(out_dir) as stage,
        JsonlMetricsSink(stage / "sft_metrics.jsonl") as sink,
        _progress_bar(console) as bar,
    ):
        task = bar.add_task("sft", total=opts.steps, loss=float("nan"), eval=_fmt(eval_start))
        for step in range(opts.steps):
            optim.zero_grad(set_to_none=True)
            loss = sft_loss(model, Batch.from_trajectories(next(batches)), opts.micro_batch_tokens, True)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip))
            optim.step()
            sched.step()
            metrics: dict[str, Any] = {
                "sft/loss": loss,
                "sft/grad_norm": grad_norm,
                "sft/lr": sched.get_last_lr()[0],
            }
            if (step + 1) % opts.eval_every == 0 or step + 1 == opts.steps:
                result["eval_loss"] = metrics["sft/eval_loss"] = _eval_loss(model, held_out, opts)
                if not console.is_terminal:  # no live bar in a log file: one plain line per evaluation
                    console.print(
                        f"sft step {step + 1}/{opts.steps} | loss {loss:.3f} "
                        f"| eval {_fmt(result['eval_loss'])} | {time.monotonic() - started:.0f} s"
                    )
            sink.log(step + 1, metrics)
            result["train_loss"] = loss
            bar.update(task, advance=1, loss=loss, eval=_fmt(result["eval_loss"]))
        model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
    result["steps"] = opts.steps
    console.print(f"sft: saved to {out_dir} (eval loss {_fmt(eval_start)} -> {_fmt(result['eval_loss'])})")
    return result


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
