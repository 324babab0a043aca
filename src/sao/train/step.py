"""The RL training step: K critic updates on fixed targets, then one actor update (docs/algorithms.md).

Owns: the actor and critic AdamW optimizers (trainable parameters only), their lr schedules, the critic
warm-up, gradient clipping, micro-batching with whole-batch normalisation, and the advantage estimator's
persistent state; `Trainer.state_dict` covers all of these (not the model weights, which the checkpoint
module saves). Does not own: rollouts, weight sync to the engine, checkpoints on disk, metric sinks.

One `Trainer.train_step` on a batch:

1. critic values V (no grad; with a single micro-batch, taken from the first critic step's forward) and
   critic targets with λ_critic (`critic_targets`: one GAE pass);
2. ``algo.k_critic`` critic optimizer steps on that batch, targets fixed;
3. V recomputed with the updated critic (``critic.recompute_values``);
4. policy advantages by the preset's estimator (`estimate_advantages`, pure: one GAE pass with the
   policy λ, length-adaptive, or a baseline read from the estimator's state before this batch);
5. one actor optimizer step: ``dis`` against the rollout log-probs, or ``ppo_clip`` against π_old; plus
   ``nll_coef`` × the positive-example NLL (VAPO);
6. the estimator's state records the batch (`update_advantage_state`; running-mean history, SPO tracker).

Critic-free presets skip 1–3. During the first ``critic.warmup_steps`` steps only 1–3 run.

π_old without a second forward: the actor takes exactly one optimizer step per batch, so π_old (the policy
before this batch's update) has the weights the training forward runs with. When that forward is
deterministic (`sao.models.forward.stochastic_forward` false: no active dropout or router jitter) the
``ppo_clip`` reference is the training forward's own log-probs, detached: the same numbers a no-grad forward
would give, so the update is bitwise the one the extra forward gives (tests/train/test_step_reference.py),
at one forward less per step. A stochastic forward keeps the no-grad π_old forward (``old_logprobs=
"forward"`` forces it). ``actor/old_logprob_forward`` says which ran (1: the extra forward).

An estimator that ``needs_divergence`` (SPO) gets D per trajectory in step 6 (our reading): mean
|log π_θ − log π_rollout| over its action tokens, with π_θ the policy *before* this update, i.e. π_old:
from the old-log-prob forward when the loss needs one, else from the actor's own training forward (which
runs before the update), so no extra forward runs.

Non-finite steps: an optimizer step (actor, or any of the K critic steps) whose loss or total gradient norm
(before clipping) is NaN or Inf is skipped: no ``optimizer.step``, the gradients are freed, the weights and
the optimizer's moments stay as they were, and a skipped actor step leaves the estimator's state alone (a
NaN reward would poison a running baseline for good). The step still counts: ``Trainer.step`` advances and
so do both lr schedules (they follow the step budget), ``actor_steps`` / ``critic_steps`` count applied
optimizer steps only, and ``skipped_steps`` / ``critic_skipped_steps`` the skipped ones (all in
`Trainer.state_dict`). After more than ``trainer.max_consecutive_skips`` skipped actor steps in a row the
next `train_step` raises `TrainingDiverged` before it touches anything: the trainer is as the last step
left it (that step returned its metrics normally, so a run has logged it and may checkpoint it).

Sharded (FSDP) training: with a `Collective` over W ranks, every rank gets the whole batch and the indices
of its own trajectories (``train_step(..., shard=)``; `sao.train.step_shard`). Forwards and backwards run
on the rank's micro-batches, as many on every rank (padded with zero-weight ones); the per-token model
outputs (V, π_old, the fresh log-probs SPO reads) are gathered into whole-batch order, so critic targets,
advantages, loss denominators, the estimator's state and the metrics are the whole batch's, identical on
every rank. Gradients must be *summed* over ranks (`sao.models.sharding` sets FSDP so): each rank's loss
is its share of the whole-batch loss. The skip decision uses the summed loss and the global gradient norm,
so it is the same on every rank. With `LocalCollective` (the default) the step is the single-process one.

Gradient reduction once per optimizer step (``gradient_sync="step"``, the default): on FSDP2 models the
backward of every micro-batch but the last skips the reduce-scatter (``set_requires_gradient_sync``) and
adds its gradients to the rank's *unsharded* sum; the last one reduce-scatters that sum once (the actor's
step, and each of the K critic steps, is one such step). FSDP2 keeps that sum in the policy's reduce dtype
(float32 with `sao.models.precision.fsdp_policy`: each micro-batch's compute-dtype gradient is upcast before
it is added), so accumulation is as exact as with a reduce-scatter per micro-batch. The price is memory: from
the first backward to the step, every rank holds a full unsharded gradient in the reduce dtype (4 bytes per
parameter in float32: 32 GB for an 8B model, 122 GB for Qwen3-30B-A3B), where per-micro-batch reduction
holds one unit's unsharded gradient at a time. ``gradient_sync="micro_batch"`` is that trade the other way.
A rank with one micro-batch reduces once either way; one process is unaffected.

The trainer is built from its own config sections (``algo``, ``critic``, ``trainer``) and the sampling
temperature; `sao.runtime.build.build_trainer` picks them out of a run config.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal

import torch
from torch import Tensor, nn

from sao.algos import (
    AdvantageInputs,
    AdvantageParams,
    critic_targets,
    estimate_advantages,
    explained_variance,
    get_advantage_estimator,
    get_policy_loss,
    make_advantage_state,
    positive_nll_loss,
    prompt_sampling_weights,
    update_advantage_state,
    value_loss,
)
from sao.algos.mismatch import lag0_mismatch_metrics
from sao.algos.packed import segment_count, segment_sum
from sao.config import AlgoConfig, CriticConfig, TrainerConfig
from sao.models.forward import stochastic_forward, token_logprobs, token_values
from sao.models.freezing import apply_freeze, trainable_parameters
from sao.types import Batch

from .capture import StepCapture
from .collective import Collective, LocalCollective
from .step_metrics import batch_metrics
from .step_schedule import actor_lr_factor, critic_lr_factor
from .step_shard import StepShard

__all__ = ["Trainer", "TrainingDiverged", "finite_update"]


class TrainingDiverged(RuntimeError):  # noqa: N818 (the name the runner catches)
    """More than ``trainer.max_consecutive_skips`` (``limit``) actor steps in a row were skipped for a
    non-finite loss or gradient norm (``skips`` of them). Raised by `Trainer.train_step` on the call after
    the step that exceeded the limit, before that call changes anything."""

    def __init__(self, skips: int, limit: int) -> None:
        super().__init__(
            f"training diverged: {skips} consecutive actor steps skipped for a non-finite loss or gradient "
            f"norm (more than trainer.max_consecutive_skips={limit})"
        )
        self.skips, self.limit = skips, limit


def finite_update(loss: Tensor, grad_norm: Tensor) -> bool:
    """Whether an optimizer step may be taken: the 0-d ``loss`` and total ``grad_norm`` are both finite
    (one host sync)."""
    return bool(torch.isfinite(loss) & torch.isfinite(grad_norm))


def _clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> Tensor:
    """Clip the gradients in place to total norm ``max_norm``; returns the 0-d total norm before clipping
    (over all ranks for sharded parameters: FSDP's norm is a replicated DTensor, returned as a tensor)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)
    full_tensor = getattr(norm, "full_tensor", None)  # a DTensor's (not imported: no distributed needed)
    return full_tensor() if full_tensor is not None else norm


def _advance(sched: torch.optim.lr_scheduler.LRScheduler, skipped: bool) -> None:
    """``sched.step()``; after a skipped optimizer step without torch's warning that no optimizer step
    preceded it (the skip is deliberate)."""
    if not skipped:
        sched.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        sched.step()


class _Accumulator:
    """Weighted means of 0-d metric tensors over micro-batches (weights: action tokens)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict[str, Tensor], weight: float) -> None:
        for name, value in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight

    def means(self, collective: Collective) -> dict[str, float]:
        """The means over every rank's micro-batches (every rank has the same metric names)."""
        sums, weights = self.sums, self.weights
        if collective.world_size > 1:
            names = sorted(sums)
            total = collective.sum_floats([sums[k] for k in names] + [weights[k] for k in names])
            n = len(names)
            sums = dict(zip(names, total[:n], strict=True))
            weights = dict(zip(names, total[n:], strict=True))
        return {k: sums[k] / weights[k] if weights[k] else 0.0 for k in sums}


def _host(x: Tensor) -> Tensor:
    """A detached float32 CPU copy (the captured quantities)."""
    return x.detach().float().cpu()


def _token_slices(parts: list[Batch]) -> list[slice]:
    """The packed token range of each micro-batch (`Batch.split` keeps whole trajectories, in order)."""
    slices, start = [], 0
    for part in parts:
        slices.append(slice(start, start + part.num_tokens))
        start += part.num_tokens
    return slices


class Trainer:
    """Actor (+ critic) optimization; see the module docstring for the step.

    Args:
        actor, critic: the models (``critic`` may be None only for critic-free presets). The critic's
            freezing rule is (re)applied from ``critic_cfg.freeze`` (a value-pretrained critic may have
            trained all parameters).
        algo: estimator, loss and critic schedule. critic_cfg: critic optimizer, clip, warm-ups.
        optim: the actor optimizer, schedule and micro-batching (``trainer`` section).
        temperature: the engine's sampling temperature (log-probs are taken at it; 0 means greedy → 1).
        collective: the reductions over the trainer's ranks (default `LocalCollective`: one process). With
            more than one rank the models are FSDP-sharded with summed gradients (`sao.models.sharding`)
            and every ``train_step`` passes the rank's ``shard``.
        gradient_sync: FSDP2 models only: ``"step"`` reduce-scatters once per optimizer step (the rank
            holds its unsharded gradient sum across micro-batches, module docstring), ``"micro_batch"``
            after every micro-batch's backward (sharded gradients only, one reduce-scatter per micro-batch).
        old_logprobs: where a ``ppo_clip`` loss gets π_old: ``"auto"`` the training forward's detached
            log-probs when the actor's forward is deterministic, else a no-grad forward before the update;
            ``"forward"`` always that forward (module docstring).
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module | None,
        algo: AlgoConfig,
        critic_cfg: CriticConfig,
        optim: TrainerConfig,
        *,
        temperature: float = 1.0,
        collective: Collective | None = None,
        gradient_sync: Literal["step", "micro_batch"] = "step",
        old_logprobs: Literal["auto", "forward"] = "auto",
    ) -> None:
        if algo.uses_critic and critic is None:
            raise ValueError(f"algo.advantage={algo.advantage!r} needs a critic, got None")
        if gradient_sync not in ("step", "micro_batch"):
            raise ValueError(f"gradient_sync must be 'step' or 'micro_batch', got {gradient_sync!r}")
        if old_logprobs not in ("auto", "forward"):
            raise ValueError(f"old_logprobs must be 'auto' or 'forward', got {old_logprobs!r}")
        self.actor, self.critic = actor, critic
        self.algo, self.critic_cfg, self.optim = algo, critic_cfg, optim
        self.gradient_sync = gradient_sync
        self.device = next(actor.parameters()).device
        self.collective: Collective = collective if collective is not None else LocalCollective()
        self.temperature = temperature if temperature > 0 else 1.0
        self.params = AdvantageParams.from_config(algo)
        self.estimator = get_advantage_estimator(algo.advantage)
        self.adv_state = make_advantage_state(algo.advantage, self.params)
        self.loss = get_policy_loss(algo.policy_loss)
        # π_old by a no-grad forward, or the training forward's log-probs detached (module docstring)
        self.old_logprob_forward = algo.needs_old_logprobs and (
            old_logprobs == "forward" or stochastic_forward(actor)
        )
        self.uses_critic = algo.uses_critic
        self.actor_params = trainable_parameters(actor)
        self.actor_optim = torch.optim.AdamW(self.actor_params, lr=optim.lr, weight_decay=optim.weight_decay)
        self.actor_sched = torch.optim.lr_scheduler.LambdaLR(
            self.actor_optim, actor_lr_factor(optim.lr_schedule, optim.warmup_steps, optim.total_steps)
        )
        self.critic_params: list[nn.Parameter] = []
        self.critic_optim = self.critic_sched = None
        if self.uses_critic:
            assert critic is not None
            apply_freeze(getattr(critic, "model", critic), critic_cfg.freeze)
            self.critic_params = trainable_parameters(critic)
            self.critic_optim = torch.optim.AdamW(
                self.critic_params, lr=critic_cfg.lr, weight_decay=optim.weight_decay
            )
            self.critic_sched = torch.optim.lr_scheduler.LambdaLR(
                self.critic_optim, critic_lr_factor(critic_cfg.lr_warmup_steps)
            )
        self.step = 0  # train_step calls
        self.actor_steps = 0
        self.critic_steps = 0
        self.old_logprob_forwards = 0
        self.trained_tokens = 0
        self.skipped_steps = 0  # actor steps skipped for a non-finite loss / grad norm
        self.critic_skipped_steps = 0
        self.consecutive_skips = 0  # skipped actor steps since the last applied one
        self.last_capture: StepCapture | None = None  # the last step's, when it was asked to capture
        self._capture: StepCapture | None = None  # filled during a capturing step

    @property
    def prioritizes_prompts(self) -> bool:
        """Whether the estimator's state gives prompt priorities (`sampling_weights`)."""
        return self.estimator.sampling_weights is not None

    def sampling_weights(self, prompt_ids: list[str]) -> list[float] | None:
        """Prompt priorities from the estimator's state (SPO's √(p̂(1−p̂)) + floor), None without them."""
        weights = prompt_sampling_weights(self.algo.advantage, self.adv_state, prompt_ids)
        return None if weights is None else weights.tolist()

    # ---- state -------------------------------------------------------------------------------------

    def state_dict(self, optimizers: bool = True) -> dict[str, Any]:
        """Optimizers, schedulers, counters and the advantage-estimator state (not the model weights).

        ``optimizers=False`` leaves the optimizer states out (``actor_optim`` / ``critic_optim`` absent): a
        sharded trainer's are saved with the weights (`sao.train.dcp`); the rest is the same on every rank."""
        state = {
            "step": self.step,
            "actor_steps": self.actor_steps,
            "critic_steps": self.critic_steps,
            "trained_tokens": self.trained_tokens,
            "skipped_steps": self.skipped_steps,
            "critic_skipped_steps": self.critic_skipped_steps,
            "consecutive_skips": self.consecutive_skips,
            "actor_sched": self.actor_sched.state_dict(),
            "critic_sched": self.critic_sched.state_dict() if self.critic_sched else None,
            "adv_state": copy.deepcopy(self.adv_state.state_dict()) if self.adv_state is not None else None,
        }
        if optimizers:
            state["actor_optim"] = self.actor_optim.state_dict()
            state["critic_optim"] = self.critic_optim.state_dict() if self.critic_optim else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s output; without ``actor_optim`` (``optimizers=False``) the optimizers are
        left as they are (load them with the weights)."""
        if (state["critic_sched"] is None) != (self.critic_sched is None):
            raise ValueError("trainer state and this trainer disagree on whether there is a critic")
        self.step, self.actor_steps = state["step"], state["actor_steps"]
        self.critic_steps, self.trained_tokens = state["critic_steps"], state["trained_tokens"]
        # absent from checkpoints written before skipped steps were counted
        self.skipped_steps = state.get("skipped_steps", 0)
        self.critic_skipped_steps = state.get("critic_skipped_steps", 0)
        self.consecutive_skips = state.get("consecutive_skips", 0)
        with_optimizers = "actor_optim" in state
        if with_optimizers:
            self.actor_optim.load_state_dict(state["actor_optim"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if self.critic_optim is not None and self.critic_sched is not None:
            if with_optimizers:
                self.critic_optim.load_state_dict(state["critic_optim"])
            self.critic_sched.load_state_dict(state["critic_sched"])
        if self.adv_state is not None:
            self.adv_state.load_state_dict(copy.deepcopy(state["adv_state"]))

    @property
    def critic_warming_up(self) -> bool:
        """True while the actor waits for the critic (``critic.warmup_steps`` trainer steps)."""
        return self.uses_critic and self.step < self.critic_cfg.warmup_steps

    # ---- the step ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reduce_on_last(self, model: nn.Module | None, count: int) -> Iterator[Callable[[int], None]]:
        """Yields ``before_backward(i)``, to call before the backward of micro-batch ``i`` of ``count``: on an
        FSDP2 model with ``gradient_sync="step"`` it turns the reduce-scatter off for all but the last one
        (FSDP2 reads the switch in backward); the switch is back on afterwards, whatever happens."""
        setter = getattr(model, "set_requires_gradient_sync", None)
        if setter is None or self.gradient_sync != "step":
            yield lambda i: None
            return
        try:
            yield lambda i: setter(i == count - 1)
        finally:
            setter(True)

    def train_step(
        self,
        batch: Batch,
        *,
        policy_version: int,
        shard: Sequence[int] | None = None,
        capture: bool = False,
    ) -> dict[str, float]:
        """One trainer step on ``batch`` (module docstring); returns float metrics (docs/training.md).

        ``shard``: with more than one rank, the indices of the trajectories this rank trains on; the
        ranks' shards partition the batch (any partition gives the same update; ValueError otherwise).
        None: the whole batch (one process). The metrics are the whole batch's on every rank.

        ``capture``: keep the step's per-token quantities in ``last_capture`` (`StepCapture`, the whole
        batch's on every rank; ``capture`` must then be the same on every rank). Otherwise
        ``last_capture`` is None after the step. Capturing costs a few device-to-host copies, no forward.

        Raises `TrainingDiverged`, changing nothing, when more than ``trainer.max_consecutive_skips`` actor
        steps in a row were skipped."""
        if self.consecutive_skips > self.optim.max_consecutive_skips:
            raise TrainingDiverged(self.consecutive_skips, self.optim.max_consecutive_skips)
        batch = batch.to(self.device)
        step = StepShard.build(batch, shard, self.optim.micro_batch_tokens, self.collective)
        self.last_capture = None
        self._capture = None
        if capture:
            self._capture = StepCapture(
                step=self.step + 1, policy_version=policy_version, actor_updated=False,
                reference_kind=self.loss.reference,
            )  # fmt: skip
        metrics = batch_metrics(batch, policy_version)
        values = None
        critic_skips = self.critic_skipped_steps
        if self.uses_critic:
            values, critic_metrics = self._critic_phase(batch, step)
            metrics.update(critic_metrics)
        actor_trains = not self.critic_warming_up
        updated = False
        if actor_trains:
            actor_metrics, updated = self._actor_phase(batch, step, values, policy_version)
            metrics.update(actor_metrics)
            # a skipped step advances the schedule too: it follows the step budget
            _advance(self.actor_sched, not updated)
            if updated:
                self.actor_steps += 1
                self.trained_tokens += int(batch.action_mask.sum())
                self.consecutive_skips = 0
            else:
                self.skipped_steps += 1
                self.consecutive_skips += 1
        if self.critic_sched is not None:
            _advance(self.critic_sched, self.critic_skipped_steps > critic_skips)
        self.step += 1
        metrics["trainer/actor_updated"] = float(updated)
        metrics["trainer/step"] = float(self.step)
        metrics["trainer/actor_steps"] = float(self.actor_steps)
        metrics["trainer/critic_steps"] = float(self.critic_steps)
        metrics["trainer/skipped_steps"] = float(self.skipped_steps)
        metrics["trainer/consecutive_skips"] = float(self.consecutive_skips)
        if self.uses_critic:
            metrics["critic/skipped_steps"] = float(self.critic_skipped_steps)
        metrics["trainer/trained_tokens"] = float(batch.action_mask.sum()) if updated else 0.0
        metrics["trainer/trained_tokens_total"] = float(self.trained_tokens)
        if self._capture is not None:
            self._capture.actor_updated = updated
            self.last_capture, self._capture = self._capture, None
        return metrics

    def _inputs(self, batch: Batch, values: Tensor | None) -> AdvantageInputs:
        return AdvantageInputs(
            token_rewards=batch.token_rewards,
            action_mask=batch.action_mask,
            cu_seqlens=batch.cu_seqlens,
            values=None if values is None else values.float(),
            outcome_rewards=batch.outcome_rewards,
            prompt_ids=batch.prompt_ids,
            group_ids=batch.group_ids,
            turn_ids=batch.turn_ids,
            truncated=batch.truncated,
        )

    @torch.no_grad()
    def _values(self, parts: list[Batch]) -> Tensor:
        assert self.critic is not None
        return torch.cat([token_values(self.critic, part).float() for part in parts])

    def _critic_phase(self, batch: Batch, step: StepShard) -> tuple[Tensor, dict[str, float]]:
        """Steps 1–3: targets from the current critic, K critic steps, values of the updated critic.
        Returns the whole batch's ``(T,)`` values and the metrics."""
        assert self.critic is not None and self.critic_optim is not None
        ccfg = self.critic_cfg
        k_critic = self.algo.k_critic
        parts = step.parts
        # One micro-batch: the first critic step's forward (with grad) also gives the pre-update values the
        # targets need, so the separate no-grad forward is skipped (same values: same weights, same input).
        first: Tensor | None = None
        if len(parts) == 1 and k_critic >= 1:
            first = token_values(self.critic, parts[0]).float()
            old_values = step.gather(first.detach())
        else:
            old_values = step.gather(self._values(parts))
        targets = critic_targets(self.algo.advantage, self._inputs(batch, old_values), self.params)
        returns = targets.returns.detach()
        mask = (batch.action_mask if targets.value_mask is None else targets.value_mask).bool()
        metrics = {"critic/explained_variance": explained_variance(old_values, returns, mask)}
        denominator = max(float(mask.sum()), 1.0)
        slices = _token_slices(parts)
        local_returns, local_mask, local_old = step.local(returns), step.local(mask), step.local(old_values)
        losses, norms = [], []
        for _ in range(k_critic):
            self.critic_optim.zero_grad(set_to_none=True)
            total = torch.zeros((), device=self.device)
            with self._reduce_on_last(self.critic, len(parts)) as before_backward:
                for i, (part, sl) in enumerate(zip(parts, slices, strict=True)):
                    v = first if first is not None else token_values(self.critic, part).float()
                    first = None
                    loss, _ = value_loss(
                        v, local_returns[sl], local_mask[sl], local_old[sl], ccfg.value_clip,
                        denominator=denominator, with_metrics=False,
                    )  # fmt: skip
                    before_backward(i)
                    loss.backward()
                    total = total + loss.detach()
            norm = _clip_grad_norm(self.critic_params, ccfg.grad_clip)
            total = self.collective.sum(total)  # the whole batch's loss: the same skip decision everywhere
            if finite_update(total, norm):
                self.critic_optim.step()
                self.critic_steps += 1
            else:  # skipped: no stale NaN/Inf gradients left behind
                self.critic_optim.zero_grad(set_to_none=True)
                self.critic_skipped_steps += 1
            norms.append(float(norm))
            losses.append(float(total))
        metrics.update(
            {
                "critic/value_loss": losses[0],
                "critic/value_loss_last": losses[-1],
                "critic/grad_norm": sum(norms) / len(norms),
                "critic/grad_norm_max": max(norms),
                "critic/lr": self.critic_optim.param_groups[0]["lr"],
                "critic/value_mean": float(old_values[mask].mean()) if mask.any() else 0.0,
                "critic/return_mean": float(returns[mask].mean()) if mask.any() else 0.0,
            }
        )
        values = old_values
        if ccfg.recompute_values:
            values = step.gather(self._values(parts))
            metrics["critic/explained_variance_after"] = explained_variance(values, returns, mask)
        if self._capture is not None:
            c = self._capture
            c.values_before, c.values_after = _host(old_values), _host(values)
            c.returns, c.value_mask = _host(returns), mask.cpu()
        return values, metrics

    def _actor_phase(
        self, batch: Batch, step: StepShard, values: Tensor | None, policy_version: int
    ) -> tuple[dict[str, float], bool]:
        """Steps 4–6: policy advantages, one actor optimizer step over the micro-batches, the estimator's
        state update. Returns the metrics and whether the step was applied (False: skipped, non-finite)."""
        algo = self.algo
        parts = step.parts
        action = batch.action_mask.bool()
        old_logprobs = None  # (T,) the whole batch's, from the no-grad forward
        detached = algo.needs_old_logprobs and not self.old_logprob_forward  # π_old: this forward's, detached
        if self.old_logprob_forward:
            with torch.no_grad():
                old_logprobs = step.gather(torch.cat([self._logprobs(part, False)[0] for part in parts]))
            self.old_logprob_forwards += 1
        inputs = self._inputs(batch, values)
        result = estimate_advantages(algo.advantage, inputs, self.params, self.adv_state)
        advantages = step.local(result.advantages.detach())
        whole_reference = old_logprobs if self.loss.reference == "old" else batch.rollout_logprobs
        reference = None if detached else step.local(whole_reference)
        positive = (batch.outcome_rewards > 0)[batch.seq_ids]
        agg = algo.loss_agg
        # whole-batch counts: the ranks' micro-batch losses add up to the batch's loss
        den = self._denominator(batch, action, agg)
        pos_den = self._denominator(batch, action & positive, agg)
        positive = step.local(positive)
        n_total = float(action.sum())
        acc = _Accumulator()
        fresh_logprobs, entropies = [], []
        total = torch.zeros((), device=self.device)
        self.actor_optim.zero_grad(set_to_none=True)
        with self._reduce_on_last(self.actor, len(parts)) as before_backward:
            for i, (part, sl) in enumerate(zip(parts, _token_slices(parts), strict=True)):
                lp, entropy = self._logprobs(part, True)
                mask = part.action_mask
                loss, loss_metrics = self.loss.fn(
                    lp,
                    lp.detach() if reference is None else reference[sl],
                    advantages[sl],
                    mask,
                    algo.eps_low,
                    algo.eps_high,
                    agg,
                    part.cu_seqlens,
                    denominator=den,
                )
                loss_metrics = dict(loss_metrics)
                if algo.nll_coef > 0:
                    nll, nll_metrics = positive_nll_loss(
                        lp, mask, positive[sl], agg, part.cu_seqlens, denominator=pos_den
                    )
                    loss = loss + algo.nll_coef * nll
                    loss_metrics.update(nll_metrics)
                before_backward(i)
                loss.backward()
                total = total + loss.detach()
                fresh_logprobs.append(lp.detach())
                if self._capture is not None:
                    entropies.append(entropy.detach())
                n_action = float(mask.sum())
                # Part losses add up to the batch loss; scaled so the action-token-weighted mean is that sum.
                scale = n_total / max(n_action, 1.0)
                if algo.nll_coef > 0:
                    loss_metrics["nll/loss"] = nll.detach() * scale
                assert entropy is not None
                loss_metrics["actor/entropy"] = (entropy.detach() * mask).sum() / max(n_action, 1.0)
                loss_metrics["actor/loss"] = loss.detach() * scale
                acc.add(loss_metrics, n_action)
        norm = _clip_grad_norm(self.actor_params, self.optim.grad_clip)
        grad_norm = float(norm)
        lr = self.actor_optim.param_groups[0]["lr"]
        applied = finite_update(self.collective.sum(total), norm)
        divergence = None
        fresh = step.gather(torch.cat(fresh_logprobs))  # (T,) the whole batch's, before the update
        if applied:
            self.actor_optim.step()
            if self.estimator.needs_divergence:  # π_old: the old-log-prob forward, else the pre-update one
                before = old_logprobs if old_logprobs is not None else fresh
                divergence = self._divergence(batch, before)
            update_advantage_state(
                algo.advantage, self.adv_state, replace(inputs, divergence=divergence), self.params
            )
        else:  # skipped: weights, moments and the estimator's state untouched; no stale NaN/Inf gradients
            self.actor_optim.zero_grad(set_to_none=True)
        if self._capture is not None:
            reference_all = fresh if detached else whole_reference
            self._capture_actor(step, result.advantages, fresh, entropies, reference_all)
        metrics = acc.means(self.collective)
        # engine vs trainer log-probs on the tokens sampled at the weights this forward used (lag 0)
        metrics.update(lag0_mismatch_metrics(fresh, batch.rollout_logprobs, batch.versions, batch.action_mask,
                                             policy_version))  # fmt: skip
        metrics.update({k: float(v) for k, v in result.metrics.items()})
        metrics.update(
            {
                "actor/grad_norm": grad_norm,
                "actor/lr": lr,
                "actor/old_logprob_forward": float(old_logprobs is not None),
            }
        )
        if divergence is not None:
            metrics[f"{algo.advantage}/divergence_mean"] = float(divergence.mean())  # spo/divergence_mean
        return metrics, applied

    def _capture_actor(
        self,
        step: StepShard,
        advantages: Tensor,
        fresh: Tensor,
        entropies: list[Tensor],
        reference: Tensor,
    ) -> None:
        """The actor phase's per-token quantities into the step's `StepCapture`, in whole-batch order
        (``entropies`` are this rank's micro-batches', ``fresh`` and ``reference`` the whole batch's)."""
        c = self._capture
        assert c is not None
        logprobs = fresh.float()
        ref = reference.float()
        c.advantages, c.logprobs = _host(advantages), _host(logprobs)
        c.reference, c.entropy = _host(ref), _host(step.gather(torch.cat(entropies).float()))
        if self.loss.token_state is not None:
            state = self.loss.token_state(logprobs, ref, advantages, self.algo.eps_low, self.algo.eps_high)
            c.token_state = state.to(torch.int8).cpu()

    def _logprobs(self, part: Batch, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        return token_logprobs(self.actor, part, temperature=self.temperature, with_entropy=with_entropy)

    @staticmethod
    def _denominator(batch: Batch, mask: Tensor, agg: str) -> float:
        """Whole-batch count the aggregation divides by: masked tokens, or trajectories with one."""
        if agg == "token-mean":
            return max(float(mask.sum()), 1.0)
        return max(float((segment_count(mask, batch.seq_ids, batch.num_sequences) > 0).sum()), 1.0)

    @staticmethod
    def _divergence(batch: Batch, logprobs: Tensor) -> Tensor:
        """``(B,)`` mean |log π − log π_rollout| over each trajectory's action tokens (SPO's D)."""
        action = batch.action_mask.bool()
        diff = torch.where(action, (logprobs - batch.rollout_logprobs).abs(), torch.zeros_like(logprobs))
        counts = segment_count(action, batch.seq_ids, batch.num_sequences).clamp(min=1)
        return segment_sum(diff, batch.seq_ids, batch.num_sequences) / counts
