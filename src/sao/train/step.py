"""The RL training step: K critic updates on fixed targets, then one actor update (docs/concepts.md).

Owns: the actor and critic AdamW optimizers (trainable parameters only), their lr schedules, the critic
warm-up, gradient clipping, micro-batching with whole-batch normalisation, and the advantage estimator's
persistent state; `Trainer.state_dict` covers all of these (not the model weights, which the checkpoint
module saves). Does not own: rollouts, weight sync to the engine, checkpoints on disk, metric sinks.

One `Trainer.train_step` on a batch:

1. critic values V (no grad; with a single micro-batch, taken from the first critic step's forward) and
   critic targets with λ_critic (the estimator's ``targets``: one GAE pass);
2. ``algo.k_critic`` critic optimizer steps on that batch, targets fixed;
3. V recomputed with the updated critic (``critic.recompute_values``);
(1–3: `sao.train.step_critic.CriticLearner`)
4. policy advantages by the estimator (``algo.advantage``: ``advantages``, pure: one GAE pass with the
   policy λ, length-adaptive, or a baseline read from the estimator's state before this batch);
5. one actor optimizer step on the loss (``algo.loss``: ``dis`` against the rollout log-probs, or
   ``ppo_clip`` against π_old; plus ``nll_coef`` × the positive-example NLL, VAPO);
6. the estimator's state records the batch (its ``update_state``; running-mean history, SPO tracker).

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

Sharded (FSDP) training: with a `Collective` over W ranks every rank gets the whole batch and the indices of
its trajectories (``train_step(..., shard=)``); models run on the rank's micro-batches, everything else on
the whole batch, identically on every rank (`sao.train.step_shard`). Gradients are *summed* over ranks; the
skip decision uses the summed loss and the global gradient norm; ``gradient_sync``:
`step_support.reduce_on_last`.

The trainer is built from its own settings (`sao.train.settings.TrainerArgs`: the typed estimator and loss,
the actor's and the critic's optimizer settings, the sampling temperature); `sao.runtime.build.trainer_args`
fills them from the run config.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import torch
from torch import Tensor, nn

from sao.algos import AdvantageInputs
from sao.algos.mismatch import lag0_mismatch_metrics
from sao.models.forward import stochastic_forward, token_logprobs
from sao.models.freezing import trainable_parameters
from sao.types import Batch

from .capture import StepCapture
from .collective import Collective, LocalCollective
from .settings import TrainerArgs
from .step_actor import actor_backward
from .step_critic import CriticLearner
from .step_metrics import batch_metrics
from .step_schedule import actor_lr_factor
from .step_shard import StepShard
from .step_support import (
    TrainingDiverged,
    advance,
    clip_grad_norm,
    divergence,
    finite_update,
    host,
)

__all__ = ["Trainer", "TrainingDiverged", "finite_update"]


class Trainer:
    """Actor (+ critic) optimization; see the module docstring for the step.

    Args:
        actor, critic: the models (``critic`` may be None only when the estimator uses no critic).
        args: the estimator, the loss, both optimizers' settings, micro-batching, the sampling temperature
            (log-probs are taken at it; 0 means greedy → 1) and ``gradient_sync``: FSDP2 models only,
            ``"step"`` reduce-scatters once per optimizer step, ``"micro_batch"`` after every micro-batch.
        collective: the reductions over the trainer's ranks (default `LocalCollective`: one process). With
            more than one rank the models are FSDP-sharded with summed gradients (`sao.models.sharding`)
            and every ``train_step`` passes the rank's ``shard``.
        old_logprobs: where a loss against π_old gets it: ``"auto"`` the training forward's detached
            log-probs when the actor's forward is deterministic, else a no-grad forward before the update;
            ``"forward"`` always that forward (module docstring).
    """

    def __init__(
        self,
        actor: nn.Module,
        critic: nn.Module | None,
        args: TrainerArgs,
        *,
        collective: Collective | None = None,
        old_logprobs: Literal["auto", "forward"] = "auto",
    ) -> None:
        self.estimator = args.estimator.build()
        self.loss = args.loss.build()
        if self.estimator.uses_critic and critic is None:
            raise ValueError(f"algo.advantage.type={args.estimator.type!r} needs a critic, got None")
        if args.gradient_sync not in ("step", "micro_batch"):
            raise ValueError(f"gradient_sync must be 'step' or 'micro_batch', got {args.gradient_sync!r}")
        if old_logprobs not in ("auto", "forward"):
            raise ValueError(f"old_logprobs must be 'auto' or 'forward', got {old_logprobs!r}")
        self.actor, self.critic, self.args = actor, critic, args
        self.device = next(actor.parameters()).device
        self.collective: Collective = collective if collective is not None else LocalCollective()
        self.temperature = args.temperature if args.temperature > 0 else 1.0
        self.adv_state = self.estimator.make_state()
        # π_old by a no-grad forward, or the training forward's log-probs detached (module docstring)
        self.old_logprob_forward = self.loss.reference == "old" and (
            old_logprobs == "forward" or stochastic_forward(actor)
        )
        opt = args.actor
        self.actor_params = trainable_parameters(actor)
        self.actor_optim = torch.optim.AdamW(self.actor_params, lr=opt.lr, weight_decay=opt.weight_decay)
        self.actor_sched = torch.optim.lr_scheduler.LambdaLR(
            self.actor_optim, actor_lr_factor(opt.lr_schedule, opt.warmup_steps, opt.total_steps)
        )
        self.critic_learner: CriticLearner | None = None
        if self.estimator.uses_critic:
            assert critic is not None
            self.critic_learner = CriticLearner(critic, args.critic, self.collective, args.gradient_sync,
                                                self.device)  # fmt: skip
        self.step = 0  # train_step calls
        self.actor_steps = 0
        self.old_logprob_forwards = 0
        self.trained_tokens = 0
        self.skipped_steps = 0  # actor steps skipped for a non-finite loss / grad norm
        self.consecutive_skips = 0  # skipped actor steps since the last applied one
        self.last_capture: StepCapture | None = None  # the last step's, when it was asked to capture
        self._capture: StepCapture | None = None  # filled during a capturing step

    # ---- the critic's parts (None / 0 without a critic) --------------------------------------------

    @property
    def uses_critic(self) -> bool:
        return self.critic_learner is not None

    @property
    def critic_optim(self) -> torch.optim.Optimizer | None:
        return None if self.critic_learner is None else self.critic_learner.optim

    @property
    def critic_sched(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        return None if self.critic_learner is None else self.critic_learner.sched

    @property
    def critic_params(self) -> list[nn.Parameter]:
        return [] if self.critic_learner is None else self.critic_learner.params

    @property
    def critic_steps(self) -> int:
        return 0 if self.critic_learner is None else self.critic_learner.steps

    @property
    def critic_skipped_steps(self) -> int:
        return 0 if self.critic_learner is None else self.critic_learner.skipped_steps

    @property
    def prioritizes_prompts(self) -> bool:
        """Whether the estimator gives prompt priorities (`sampling_weights`)."""
        return bool(self.estimator.prioritizes_prompts)

    def sampling_weights(self, prompt_ids: list[str]) -> list[float] | None:
        """Prompt priorities from the estimator's state (SPO's √(p̂(1−p̂)) + floor), None without them."""
        weights = self.estimator.sampling_weights(self.adv_state, prompt_ids)
        return None if weights is None else weights.tolist()

    # ---- state -------------------------------------------------------------------------------------

    def state_dict(self, optimizers: bool = True) -> dict[str, Any]:
        """Optimizers, schedulers, counters and the advantage-estimator state (not the model weights).

        ``optimizers=False`` leaves the optimizer states out (``actor_optim`` / ``critic_optim`` absent): a
        sharded trainer's are saved with the weights (`sao.train.dcp`); the rest is the same on every rank."""
        c = self.critic_learner
        state = {
            "step": self.step,
            "actor_steps": self.actor_steps,
            "critic_steps": self.critic_steps,
            "trained_tokens": self.trained_tokens,
            "skipped_steps": self.skipped_steps,
            "critic_skipped_steps": self.critic_skipped_steps,
            "consecutive_skips": self.consecutive_skips,
            "actor_sched": self.actor_sched.state_dict(),
            "critic_sched": c.sched.state_dict() if c else None,
            "adv_state": copy.deepcopy(self.adv_state.state_dict()) if self.adv_state is not None else None,
        }
        if optimizers:
            state["actor_optim"] = self.actor_optim.state_dict()
            state["critic_optim"] = c.optim.state_dict() if c else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s output; without ``actor_optim`` (``optimizers=False``) the optimizers are
        left as they are (load them with the weights)."""
        c = self.critic_learner
        if (state["critic_sched"] is None) != (c is None):
            raise ValueError("trainer state and this trainer disagree on whether there is a critic")
        self.step, self.actor_steps = state["step"], state["actor_steps"]
        self.trained_tokens = state["trained_tokens"]
        # absent from checkpoints written before skipped steps were counted
        self.skipped_steps = state.get("skipped_steps", 0)
        self.consecutive_skips = state.get("consecutive_skips", 0)
        with_optimizers = "actor_optim" in state
        if with_optimizers:
            self.actor_optim.load_state_dict(state["actor_optim"])
        self.actor_sched.load_state_dict(state["actor_sched"])
        if c is not None:
            c.steps, c.skipped_steps = state["critic_steps"], state.get("critic_skipped_steps", 0)
            if with_optimizers:
                c.optim.load_state_dict(state["critic_optim"])
            c.sched.load_state_dict(state["critic_sched"])
        if self.adv_state is not None:
            self.adv_state.load_state_dict(copy.deepcopy(state["adv_state"]))

    @property
    def critic_warming_up(self) -> bool:
        """True while the actor waits for the critic (``critic.warmup_steps`` trainer steps)."""
        return self.uses_critic and self.step < self.args.critic.warmup_steps

    # ---- the step ----------------------------------------------------------------------------------

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
        limit = self.args.max_consecutive_skips
        if self.consecutive_skips > limit:
            raise TrainingDiverged(self.consecutive_skips, limit)
        batch = batch.to(self.device)
        step = StepShard.build(batch, shard, self.args.micro_batch_tokens, self.collective)
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
        if self.critic_learner is not None:
            targets_of = lambda v: self.estimator.targets(self._inputs(batch, v))  # noqa: E731
            values, critic_metrics = self.critic_learner.update(batch, step, targets_of, self._capture)
            metrics.update(critic_metrics)
        updated = False
        if not self.critic_warming_up:
            actor_metrics, updated = self._actor_phase(batch, step, values, policy_version)
            metrics.update(actor_metrics)
            advance(self.actor_sched, not updated)  # a skipped step advances it too: it follows the budget
            self._count_actor_step(batch, updated)
        if self.critic_learner is not None:
            self.critic_learner.end_step(critic_skips)
        self.step += 1
        metrics.update(self._counters(batch, updated))
        if self._capture is not None:
            self._capture.actor_updated = updated
            self.last_capture, self._capture = self._capture, None
        return metrics

    def _count_actor_step(self, batch: Batch, updated: bool) -> None:
        if updated:
            self.actor_steps += 1
            self.trained_tokens += int(batch.action_mask.sum())
            self.consecutive_skips = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skips += 1

    def _counters(self, batch: Batch, updated: bool) -> dict[str, float]:
        metrics = {
            "trainer/actor_updated": float(updated),
            "trainer/step": float(self.step),
            "trainer/actor_steps": float(self.actor_steps),
            "trainer/critic_steps": float(self.critic_steps),
            "trainer/skipped_steps": float(self.skipped_steps),
            "trainer/consecutive_skips": float(self.consecutive_skips),
        }
        if self.uses_critic:
            metrics["critic/skipped_steps"] = float(self.critic_skipped_steps)
        metrics["trainer/trained_tokens"] = float(batch.action_mask.sum()) if updated else 0.0
        metrics["trainer/trained_tokens_total"] = float(self.trained_tokens)
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

    def _actor_phase(
        self, batch: Batch, step: StepShard, values: Tensor | None, policy_version: int
    ) -> tuple[dict[str, float], bool]:
        """Steps 4–6: policy advantages, one actor optimizer step over the micro-batches, the estimator's
        state update. Returns the metrics and whether the step was applied (False: skipped, non-finite)."""
        old_logprobs = None  # (T,) the whole batch's, from the no-grad forward
        detached = self.loss.reference == "old" and not self.old_logprob_forward  # π_old: this forward's
        if self.old_logprob_forward:
            with torch.no_grad():
                old_logprobs = step.gather(torch.cat([self._logprobs(part, False)[0] for part in step.parts]))
            self.old_logprob_forwards += 1
        inputs = self._inputs(batch, values)
        result = self.estimator.advantages(inputs, self.adv_state)
        whole_reference = old_logprobs if self.loss.reference == "old" else batch.rollout_logprobs
        reference = None if detached else step.local(whole_reference)
        self.actor_optim.zero_grad(set_to_none=True)
        acc, total, fresh, entropies = actor_backward(
            self.loss, self._logprobs, batch, step, result.advantages, reference,
            model=self.actor, gradient_sync=self.args.gradient_sync, keep_entropy=self._capture is not None,
        )  # fmt: skip
        norm = clip_grad_norm(self.actor_params, self.args.actor.grad_clip)
        grad_norm = float(norm)
        lr = self.actor_optim.param_groups[0]["lr"]
        applied = finite_update(self.collective.sum(total), norm)
        div = None
        if applied:
            self.actor_optim.step()
            if self.estimator.needs_divergence:  # π_old: the old-log-prob forward, else the pre-update one
                div = divergence(batch, old_logprobs if old_logprobs is not None else fresh)
            self.estimator.update_state(self.adv_state, replace(inputs, divergence=div))
        else:  # skipped: weights, moments and the estimator's state untouched; no stale NaN/Inf gradients
            self.actor_optim.zero_grad(set_to_none=True)
        if self._capture is not None:
            self._capture_actor(
                step, result.advantages, fresh, entropies, fresh if detached else whole_reference
            )
        metrics = acc.means(self.collective)
        # engine vs trainer log-probs on the tokens sampled at the weights this forward used (lag 0)
        metrics.update(lag0_mismatch_metrics(fresh, batch.rollout_logprobs, batch.versions, batch.action_mask,
                                             policy_version))  # fmt: skip
        metrics.update({k: float(v) for k, v in result.metrics.items()})
        metrics.update({"actor/grad_norm": grad_norm, "actor/lr": lr,
                        "actor/old_logprob_forward": float(old_logprobs is not None)})  # fmt: skip
        if div is not None:
            metrics["adv/divergence_mean"] = float(div.mean())
        return metrics, applied

    def _capture_actor(
        self, step: StepShard, advantages: Tensor, fresh: Tensor, entropies: list[Tensor], reference: Tensor
    ) -> None:
        """The actor phase's per-token quantities into the step's `StepCapture`, in whole-batch order
        (``entropies`` are this rank's micro-batches', ``fresh`` and ``reference`` the whole batch's)."""
        c = self._capture
        assert c is not None
        logprobs = fresh.float()
        ref = reference.float()
        c.advantages, c.logprobs = host(advantages), host(logprobs)
        c.reference, c.entropy = host(ref), host(step.gather(torch.cat(entropies).float()))
        state = self.loss.token_state(logprobs, ref, advantages)
        if state is not None:
            c.token_state = state.to(torch.int8).cpu()

    def _logprobs(self, part: Batch, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        return token_logprobs(self.actor, part, temperature=self.temperature, with_entropy=with_entropy)
