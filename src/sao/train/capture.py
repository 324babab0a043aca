"""What the trainer computed per token for one batch, kept when a step is asked to (`Trainer.train_step`
with ``capture=True``): the trajectory inspector's raw material (`sao.inspect`).

Every tensor is the whole batch's, ``(T,)`` in packed order, on the CPU, float32 unless noted; a field is
None when the step did not compute it (no critic; no π_old forward; a loss without a per-token state; the
actor's part of a critic warm-up step).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["StepCapture"]


@dataclass
class StepCapture:
    """One trained batch's per-token quantities (module docstring).

    Attributes:
        step: the trainer step this batch was trained at (1-based, as logged).
        policy_version: the policy version the trainer held when it trained the batch.
        actor_updated: whether the actor's optimizer step was applied (False: skipped or warm-up).
        advantages: Â (0 off action tokens).
        logprobs: log π_θ of the taken tokens in the actor's training forward (before the update).
        reference: the log-probs the policy loss takes its ratio to (``reference_kind``: "rollout", the
            engine's; "old", π_old from the no-grad forward before the update).
        entropy: the policy's entropy at each position (nats), from the same forward.
        token_state: int8, the loss's per-token state (`sao.algos.dis_band_state` / `ppo_clip_state`).
        values_before: the critic's values before its K steps (the targets' bootstrap).
        values_after: the values the advantages were computed from (after the K steps when
            ``critic.recompute_values``, else ``values_before``).
        returns: the critic's targets; value_mask: bool, the tokens the critic trains on.
    """

    step: int
    policy_version: int
    actor_updated: bool
    reference_kind: str
    advantages: Tensor | None = None
    logprobs: Tensor | None = None
    reference: Tensor | None = None
    entropy: Tensor | None = None
    token_state: Tensor | None = None
    values_before: Tensor | None = None
    values_after: Tensor | None = None
    returns: Tensor | None = None
    value_mask: Tensor | None = None
