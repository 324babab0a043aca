"""Push verification: after each weight push, every engine replica and the trainer score one fixed probe
sequence, and a replica that does not hold the trainer's weights is named.

The probe (``runtime.push_check.probe``) is built once per run: ``probe_tokens`` token ids drawn from the
tokenizer's vocabulary (special tokens excluded) with the run's seed, or the first training task's rendered
prompt. After the push of version v, each live replica and the trainer give their teacher-forced log-probs
of the probe (temperature 1: `sao.engine.scoring`), concurrently; per replica the mean and the max of
``|log p_engine − log p_trainer|`` over the probe's tokens are metrics
(``weight_sync/probe_mean_abs_diff/replica{i}``, ``…/probe_max_abs_diff/…``). A replica whose mean exceeds
``threshold`` (or whose numbers are not finite) failed: `PushCheckError` names it and the version
(``action=error``; the run stops with a checkpoint) or a warning does (``action=warn``, once until that
replica passes again).

Scope. The mean over the probe is compared, not the max: a bf16 engine against an fp32 trainer differs by
~1e-2–1e-1 nats per token on average, with single rare tokens off by a few tenths; a replica holding the
wrong weights (not loaded, partly loaded, scrambled, another checkpoint) differs by ≥ 1 nat. A replica one
or a few versions behind cannot be told from numerical noise; that slow failure shows in the per-step lag-0
mismatch and its drift alarm (`sao.runtime.weight_checks`).

A replica that is dead (being restarted) is skipped; one whose scoring request fails (e.g. a server without
prompt log-probs) is skipped with a warning (``weight_sync/probe_errors``): the check is about the weights,
not the serving API. A replica that does not answer within ``runtime.weight_sync_timeout_s`` is a
`WeightSyncTimeoutError`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from .sync_deadline import WeightSyncTimeoutError, replica_engines

__all__ = [
    "PushCheck",
    "PushCheckError",
    "probe_diff",
    "probe_token_ids",
    "trainer_score",
]

log = logging.getLogger(__name__)


class PushCheckError(RuntimeError):
    """A replica's probe log-probs differ from the trainer's beyond ``runtime.push_check.threshold``."""

    def __init__(self, replica: str, version: int, mean: float, max_: float, threshold: float) -> None:
        self.replica, self.version, self.mean = replica, version, mean
        super().__init__(
            f"weight push check failed: after the push of version {version}, {replica}'s log-probs on the "
            f"probe differ from the trainer's by {mean:.4g} nats on average (max {max_:.4g}) > "
            f"runtime.push_check.threshold={threshold:g}: {replica} does not hold the trainer's weights"
        )


def probe_token_ids(source: str, length: int, seed: int, tokenizer: Any, tasks: Sequence[Any]) -> list[int]:
    """The run's probe: ``length`` ids drawn uniformly (``torch.Generator`` seeded with ``seed``) from the
    tokenizer's non-special ids (``source="vocab"``), or the first task's prompt rendered with the chat
    template and the generation prompt, cut to ``length`` (``source="prompt"``). Raises ValueError naming
    the key when the prompt has fewer than 2 tokens or there are no tasks."""
    import torch

    if source == "prompt":
        if not tasks:
            raise ValueError("runtime.push_check.probe='prompt': the run has no training task")
        from sao.models.chat_delta import render

        prompt = tasks[0].prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = render(tokenizer, messages, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])[:length]
        if len(ids) < 2:
            raise ValueError(
                f"runtime.push_check.probe='prompt': the first task renders to {len(ids)} token(s)"
            )
        return ids
    if source != "vocab":
        raise ValueError(f"runtime.push_check.probe: unknown source {source!r}")
    special = set(tokenizer.all_special_ids)
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    picks = torch.randint(len(pool), (length,), generator=torch.Generator().manual_seed(seed))
    return pool[picks].tolist()


def trainer_score(model: Any, token_ids: Sequence[int]) -> list[float]:
    """Teacher-forced log-probs of ``token_ids[1:]`` as the trainer computes them (`token_logprobs`, the
    forward DIS uses: backbone and head called as the trainer calls them, so an FSDP2-sharded actor works;
    every rank must call it with the same ids), at temperature 1, fp32."""
    import torch

    from sao.engine.scoring import check_score_ids
    from sao.models.forward import token_logprobs
    from sao.types import Batch, Trajectory

    ids = check_score_ids(token_ids)
    n = len(ids)
    traj = Trajectory(
        prompt_id="probe", token_ids=ids, action_mask=[0] + [1] * (n - 1), rollout_logprobs=[0.0] * n,
        versions=[-1] + [0] * (n - 1), turn_ids=[-1] + [0] * (n - 1), rewards=[0.0], traj_id="probe",
    )  # fmt: skip
    device = next(model.parameters()).device
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, Batch.from_trajectories([traj], device=device))
    return logprobs[1:].float().cpu().tolist()


def probe_diff(trainer: Sequence[float], engine: Sequence[float]) -> tuple[float, float]:
    """``(mean, max)`` of ``|engine − trainer|`` per token; ``(inf, inf)`` when any value is not finite.
    Raises ValueError when the lengths differ."""
    if len(trainer) != len(engine):
        raise ValueError(f"{len(engine)} engine log-probs for {len(trainer)} trainer log-probs")
    diffs = [abs(e - t) for t, e in zip(trainer, engine, strict=True)]
    if not all(math.isfinite(d) for d in diffs):
        return math.inf, math.inf
    return sum(diffs) / len(diffs), max(diffs)


class PushCheck:
    """Scores the probe on ``engine``'s replicas and with ``trainer_score`` (a blocking callable: ids ->
    log-probs, run in a worker thread) after each push; see the module docstring. ``action``: "error" or
    "warn"; ``timeout_s``: how long a replica may take to answer; ``path``: the run's weight-sync path
    (named by a timeout)."""

    def __init__(
        self,
        engine: Any,
        trainer_score: Callable[[list[int]], list[float]],
        probe: Sequence[int],
        *,
        threshold: float,
        action: str,
        timeout_s: float,
        path: str = "",
    ) -> None:
        if action not in ("error", "warn"):
            raise ValueError(f"action must be 'error' or 'warn', got {action!r}")
        self.engine, self.trainer_score, self.probe, self.path = engine, trainer_score, list(probe), path
        self.threshold, self.action, self.timeout_s = threshold, action, timeout_s
        self._warned: set[str] = set()  # replicas warned about since they last passed
        self._errors_warned: set[str] = set()

    async def check(self, version: int) -> tuple[dict[str, float], PushCheckError | None]:
        """The probe metrics of version ``version`` and the failure (the first failing replica's), if any."""
        t0 = time.monotonic()
        every = replica_engines(self.engine)
        replicas = [(n, e) for n, e in every if getattr(e, "alive", True)]
        trainer, *answers = await asyncio.gather(
            asyncio.to_thread(self.trainer_score, self.probe),
            *(self._score(name, eng, version) for name, eng in replicas),
        )
        metrics: dict[str, float] = {}
        failure: PushCheckError | None = None
        errors = failed = 0
        for (name, _), answer in zip(replicas, answers, strict=True):
            try:
                if isinstance(answer, Exception):
                    raise answer
                mean, worst = probe_diff(trainer, answer)
            except Exception as err:  # no answer, or one of the wrong length: not a verdict on the weights
                errors += 1
                self._warn_error(name, err)
                continue
            metrics[f"weight_sync/probe_mean_abs_diff/{name}"] = mean
            metrics[f"weight_sync/probe_max_abs_diff/{name}"] = worst
            if mean <= self.threshold:
                self._warned.discard(name)
                continue
            failed += 1
            error = PushCheckError(name, version, mean, worst, self.threshold)
            failure = failure or error
            if self.action == "warn" and name not in self._warned:
                self._warned.add(name)
                log.warning("%s (runtime.push_check.action=warn: training goes on)", error)
        metrics["weight_sync/probe_failed"] = float(failed)
        metrics["weight_sync/probe_errors"] = float(errors)
        metrics["weight_sync/probe_skipped"] = float(len(every) - len(replicas))
        metrics["weight_sync/probe_s"] = time.monotonic() - t0
        return metrics, failure if self.action == "error" else None

    async def _score(self, name: str, engine: Any, version: int) -> list[float] | Exception:
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                return await engine.score(self.probe)
        except TimeoutError as err:
            if not deadline.expired():
                return err
            what = "probe after the push"
            raise WeightSyncTimeoutError(self.path, version, [name], self.timeout_s, what=what) from None
        except Exception as err:  # scoring unavailable or the replica died meanwhile: not a verdict
            return err

    def _warn_error(self, name: str, err: Exception) -> None:
        if name not in self._errors_warned:
            self._errors_warned.add(name)
            log.warning("weight push check: %s could not score the probe (%s: %s); it is skipped",
                        name, type(err).__name__, err)  # fmt: skip
