"""Value pretraining (docs/models.md): regress a fresh critic on Monte-Carlo returns of the initial policy.

The critic starts from the policy checkpoint (same backbone, new zero head). Targets are the Monte-Carlo
returns on action tokens (skip-observation GAE with λ = 1: the discounted reward-to-go, 0 on observation
tokens). Training stops at ``max_steps`` or when the held-out explained variance has not improved by
``ev_min_delta`` for ``ev_patience`` evaluations. The paper's cold-start fix is a *larger* corpus, so the
corpus size is an explicit option and is logged with the step count, value loss and the EV curve.

Sharded (FSDP) critics: with a `Collective` over W ranks, every rank holds the whole corpus and draws the
same batches, then forwards and backwards only its share of each batch (whole trajectories, token-balanced
by `shard_indices`, as many micro-batches on every rank: `StepShard`). Losses are normalised by the whole
batch's action tokens and gradients are summed over the ranks (`shard_model`'s reduction), so the update is
the single-process one. The held-out values are gathered back into whole-batch order, so the explained
variance, and with it early stopping, is the same on every rank.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from sao.algos import explained_variance, skip_observation_gae, value_loss
from sao.sinks import JsonlMetricsSink
from sao.types import Batch, Trajectory, load_jsonl

from .collective import Collective, LocalCollective
from .common import atomic_dir, batches_forever, ready_for_training, set_seed, split_eval
from .split import shard_indices
from .step_shard import StepShard

__all__ = [
    "ValuePretrainOptions",
    "ValuePretrainResult",
    "mc_returns",
    "pretrain_value",
    "run_value_pretrain",
]


@dataclass(frozen=True)
class ValuePretrainOptions:
    """Options of :func:`pretrain_value`; the first four mirror ``sao.config.ValuePretrainConfig``."""

    corpus_size: int = 1024
    max_steps: int = 200
    ev_patience: int = 10
    ev_min_delta: float = 0.01
    lr: float = 5e-6
    batch_size: int = 32  # trajectories per critic step
    micro_batch_tokens: int = 8192
    eval_frac: float = 0.1
    eval_every: int = 5
    gamma: float = 1.0
    freeze: str | list[str] = "none"  # our reading: the whole critic trains before RL; RL freezes attention
    grad_clip: float = 1.0
    seed: int = 0
    dtype: str = "auto"  # compute dtype of forward and backward (auto: bfloat16 on CUDA, float32 elsewhere)
    master_dtype: str = "float32"  # weights, gradients and AdamW state
    device: str = "auto"
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool | None = None  # None: on with CUDA


@dataclass
class ValuePretrainResult:
    corpus_size: int
    steps: int
    stop_reason: str
    ev_curve: list[tuple[int, float]] = field(default_factory=list)
    best_ev: float = float("nan")
    final_value_loss: float = float("nan")


def mc_returns(batch: Batch, gamma: float = 1.0) -> torch.Tensor:
    """``(T,)`` discounted reward-to-go on action tokens (0 elsewhere): GAE returns with λ = 1, V = 0."""
    zeros = torch.zeros_like(batch.token_rewards)
    return skip_observation_gae(batch.token_rewards, zeros, batch.action_mask, batch.cu_seqlens, gamma, 1.0)[
        1
    ]


def _rank_share(batch: Batch, opts: ValuePretrainOptions, collective: Collective) -> StepShard:
    """This rank's micro-batches of ``batch`` (on the critic's device): all of them in one process; with
    W ranks its token-balanced share of whole trajectories, padded to the same micro-batch count on every
    rank. Value pretraining has no groups, so trajectories are balanced one by one."""
    indices = None
    if collective.world_size > 1:
        lengths = batch.seq_lengths.tolist()
        indices = shard_indices([None] * len(lengths), lengths, collective.world_size)[collective.rank]
    return StepShard.build(batch, indices, opts.micro_batch_tokens, collective)


def _grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip in place; the total norm before clipping, over every rank's shards for a sharded critic."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    full_tensor = getattr(norm, "full_tensor", None)  # FSDP's norm: a replicated DTensor
    return float(full_tensor() if full_tensor is not None else norm)


def _evaluate(
    critic: Any, trajs: list[Trajectory], opts: ValuePretrainOptions, collective: Collective
) -> float:
    """Explained variance of the critic's values against MC returns on ``trajs`` (the whole held-out set
    on every rank; each rank forwards its share)."""
    from sao.models.forward import token_values

    device = next(critic.parameters()).device
    critic.eval()
    values, returns, masks = [], [], []
    with torch.no_grad():
        for start in range(0, len(trajs), opts.batch_size):
            batch = Batch.from_trajectories(trajs[start : start + opts.batch_size]).to(device)
            share = _rank_share(batch, opts, collective)
            local = torch.cat([token_values(critic, part).float() for part in share.parts])
            values.append(share.gather(local))
            returns.append(mc_returns(batch, opts.gamma).float())
            masks.append(batch.action_mask)
    critic.train()
    return explained_variance(torch.cat(values), torch.cat(returns), torch.cat(masks))


def pretrain_value(
    critic: torch.nn.Module,
    trajectories: list[Trajectory],
    opts: ValuePretrainOptions,
    sink: JsonlMetricsSink | None = None,
    console: Console | None = None,
    *,
    collective: Collective | None = None,
) -> ValuePretrainResult:
    """Train ``critic`` in place on MC returns of ``trajectories`` (already limited to the corpus size).

    ``collective``: the ranks of a sharded critic (module docstring; every rank calls this with the same
    corpus and options); default one process. The result is the same on every rank."""
    from sao.models.freezing import trainable_parameters

    collective = collective if collective is not None else LocalCollective()
    console = console or Console(stderr=True)
    device = next(critic.parameters()).device
    train, held_out = split_eval(trajectories, opts.eval_frac, opts.seed)
    held_out = held_out or train  # tiny corpora: evaluate on the training set rather than not at all
    params = trainable_parameters(critic)
    optim = torch.optim.AdamW(params, lr=opts.lr)
    result = ValuePretrainResult(corpus_size=len(trajectories), steps=0, stop_reason="max_steps")
    stopper = _EarlyStop(opts.ev_min_delta)
    batches = batches_forever(train, opts.batch_size, opts.seed)
    critic.train()
    with _progress_bar(console) as bar:
        task = bar.add_task("pretrain", total=opts.max_steps, loss=float("nan"), ev=float("nan"))
        for step in range(1, opts.max_steps + 1):
            batch = Batch.from_trajectories(next(batches)).to(device)
            loss_value = _critic_step(critic, optim, batch, opts, collective)
            grad_norm = _grad_norm(params, opts.grad_clip)
            optim.step()
            result.steps, result.final_value_loss = step, loss_value
            metrics: dict[str, Any] = {
                "value_pretrain/loss": loss_value,
                "value_pretrain/grad_norm": grad_norm,
                "value_pretrain/corpus_size": len(trajectories),
            }
            if step % opts.eval_every == 0 or step == opts.max_steps:
                ev = _evaluate(critic, held_out, opts, collective)
                metrics["value_pretrain/explained_variance"] = ev
                result.ev_curve.append((step, ev))
                stopper.observe(ev)
                if not result.best_ev >= ev:  # also replaces the initial NaN
                    result.best_ev = ev
                bar.update(task, ev=ev)
            if sink is not None:
                sink.log(step, metrics)
            bar.update(task, advance=1, loss=loss_value)
            if stopper.since_best >= opts.ev_patience:
                result.stop_reason = f"explained variance plateaued ({opts.ev_patience} evaluations)"
                break
    return result


def _progress_bar(console: Console) -> Progress:
    """The step bar: ``completed/total``, the last loss and the last held-out EV."""
    columns = (
        TextColumn("value pretrain"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}  EV {task.fields[ev]:.3f}"),
    )
    return Progress(*columns, console=console)


def _critic_step(
    critic: Any,
    optim: torch.optim.Optimizer,
    batch: Batch,
    opts: ValuePretrainOptions,
    collective: Collective,
) -> float:
    """Zero the gradients, then forward and backward this rank's share of ``batch`` (the loss normalised by
    the whole batch's action tokens); returns the batch's value loss summed over the ranks. The caller
    clips and steps."""
    from sao.models.forward import token_values

    n_action = max(int(batch.action_mask.sum()), 1)  # the whole batch's: the ranks' losses add up
    optim.zero_grad(set_to_none=True)
    loss_value = 0.0
    for part in _rank_share(batch, opts, collective).parts:
        returns = mc_returns(part, opts.gamma)
        values = token_values(critic, part)
        loss, _ = value_loss(values, returns, part.action_mask, denominator=n_action, with_metrics=False)
        loss.backward()
        loss_value += float(loss.detach())
    return collective.sum(loss_value)


class _EarlyStop:
    """Held-out evaluations since the explained variance last improved by more than ``min_delta``."""

    def __init__(self, min_delta: float) -> None:
        self.min_delta = min_delta
        self.best, self.since_best = float("-inf"), 0

    def observe(self, ev: float) -> None:
        if ev > self.best + self.min_delta:
            self.best, self.since_best = ev, 0
        else:
            self.since_best += 1


def run_value_pretrain(
    policy_dir: str | Path,
    corpus_path: str | Path,
    out_dir: str | Path,
    opts: ValuePretrainOptions = ValuePretrainOptions(),
    console: Console | None = None,
) -> ValuePretrainResult:
    """Build a critic from ``policy_dir``, pretrain it on ``corpus_path`` (JSONL of Trajectory), save it."""
    from sao.models.critic import load_critic

    console = console or Console(stderr=True)
    set_seed(opts.seed)
    corpus = load_jsonl(corpus_path)
    if len(corpus) > opts.corpus_size:
        corpus = random.Random(opts.seed).sample(corpus, opts.corpus_size)
    elif len(corpus) < opts.corpus_size:
        console.print(
            f"value pretrain: corpus has {len(corpus)} trajectories (< corpus_size {opts.corpus_size})"
        )
    critic = load_critic(policy_dir, freeze=opts.freeze, dtype=opts.master_dtype, device=opts.device)
    ready_for_training(critic, opts)
    report = critic.freeze_report
    console.print(
        f"value pretrain: {len(corpus)} trajectories, up to {opts.max_steps} steps; critic parameters "
        f"{report.trainable:,} trainable / {report.frozen:,} frozen (freeze={opts.freeze!r})"
    )
    with atomic_dir(out_dir) as stage, JsonlMetricsSink(stage / "value_pretrain_metrics.jsonl") as sink:
        sink.log(0, {"critic/trainable_params": report.trainable, "critic/frozen_params": report.frozen})
        result = pretrain_value(critic, corpus, opts, sink, console)
        critic.save_pretrained(stage)
        summary = {**asdict(result), "options": asdict(opts)}
        (stage / "value_pretrain_summary.json").write_text(json.dumps(summary, indent=2))
    console.print(
        f"value pretrain: {result.steps} steps, stop: {result.stop_reason}, best EV {result.best_ev:.3f}; "
        f"saved to {out_dir}"
    )
    return result
