"""The run's checks that the engines decode with the trainer's weights: the push probe after each weight push
(`sao.runtime.push_check`), the lag-0 mismatch drift alarm, and the push deadline
(`sao.runtime.sync_deadline`), built from ``runtime.push_check``, ``runtime.mismatch_drift`` and
``runtime.weight_sync_timeout_s`` (`WeightCheckArgs`).

As step observers (`sao.runtime.observers`): `WeightChecks` runs right after the push and adds the probe
and drift metrics to the step's record; its ``verdict`` runs after the metrics are logged and raises the
step's failure, if any (`PushCheckError`, `MismatchDriftError`), so the failing step's numbers are in
metrics.jsonl before the run stops. The runner stops cleanly (a checkpoint) on `STOPPING_ERRORS`.

Drift. The trainer logs ``mismatch/lag0_logprob_abs_diff`` per step (`sao.algos.mismatch`): mean
|log π_trainer − log π_engine| on the action tokens sampled at the version the trainer held. `MismatchDrift`
keeps that series (steps with lag-0 tokens only; it starts over when a run resumes) and logs
``mismatch/drift_ratio``: the mean of the last ``window`` values over the mean of the first ``window``.
The alarm fires when the ratio exceeds ``factor`` and the recent mean exceeds ``min_abs_diff``: it warns
once (again only after the ratio fell back) or, with ``action=error``, stops the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sao.algos.mismatch import drift_ratio
from sao.config import ConfigError

from .args import WeightCheckArgs
from .push_check import PushCheck, PushCheckError, probe_token_ids
from .sync_deadline import DeadlineSync, WeightSyncTimeoutError

__all__ = [
    "STOPPING_ERRORS",
    "MismatchDrift",
    "MismatchDriftError",
    "WeightChecks",
    "with_deadline",
]

log = logging.getLogger(__name__)

LAG0_METRIC = "mismatch/lag0_logprob_abs_diff"


class MismatchDriftError(RuntimeError):
    """The lag-0 mismatch grew beyond ``runtime.mismatch_drift`` (``action=error``)."""


class MismatchDrift:
    """The drift alarm over a run's lag-0 mismatch series (module docstring)."""

    def __init__(self, *, window: int, factor: float, min_abs_diff: float, action: str) -> None:
        if action not in ("error", "warn"):
            raise ValueError(f"action must be 'error' or 'warn', got {action!r}")
        self.window, self.factor, self.min_abs_diff, self.action = window, factor, min_abs_diff, action
        self.series: list[float] = []
        self.firing = False

    def observe(
        self, metrics: dict[str, float], step: int
    ) -> tuple[dict[str, float], MismatchDriftError | None]:
        """Take the step's lag-0 mismatch from ``metrics`` (if logged); the drift metrics and the error
        to raise (``action=error`` while the alarm fires)."""
        value = metrics.get(LAG0_METRIC)
        if value is not None:
            self.series.append(float(value))
        ratio = drift_ratio(self.series, self.window)
        if ratio is None:
            return {}, None
        recent = sum(self.series[-self.window :]) / self.window
        fires = ratio > self.factor and recent > self.min_abs_diff
        out = {"mismatch/drift_ratio": ratio, "mismatch/drift_alarm": float(fires)}
        error = None
        if fires:
            error = MismatchDriftError(
                f"the lag-0 log-prob mismatch drifted at step {step}: its mean over the last {self.window} "
                f"steps is {recent:.4g} nats, {ratio:.3g} x the run's first {self.window} steps "
                f"(runtime.mismatch_drift.factor={self.factor:g}, min_abs_diff={self.min_abs_diff:g}); the "
                "engines' log-probs drift from the trainer's (stale pushes, numerics)"
            )
            if self.action == "warn" and not self.firing:
                log.warning("%s (runtime.mismatch_drift.action=warn: training goes on)", error)
        self.firing = fires
        return out, error if self.action == "error" else None


class _Verdict:
    """Raises the failure `WeightChecks` found in the same step (after the metrics were logged)."""

    def __init__(self, checks: WeightChecks) -> None:
        self.checks = checks

    async def on_step(self, record: Any) -> None:
        failure, self.checks.failure = self.checks.failure, None
        if failure is not None:
            raise failure


class WeightChecks:
    """The probe after each push and the drift alarm, as a step observer (module docstring); either may be
    None (action 'none')."""

    def __init__(self, push_check: PushCheck | None, drift: MismatchDrift | None) -> None:
        self.push_check, self.drift = push_check, drift
        self.failure: BaseException | None = None
        self.verdict = _Verdict(self)

    @classmethod
    def build(cls, args: WeightCheckArgs, engine: Any, trainer_score: Callable[[list[int]], list[float]],
              tokenizer: Any, tasks: Sequence[Any], path: str) -> WeightChecks:  # fmt: skip
        """The checks of ``args`` for the run's ``engine``, the trainer's scorer, tokenizer and tasks. The
        probe is built here: a bad probe setting (no prompt to take, longer than the engine's context) is
        a `ConfigError` at start."""
        pc, md = args.push_check, args.mismatch_drift
        check = None
        if pc.action != "none":
            try:
                probe = probe_token_ids(pc.probe, pc.probe_tokens, args.seed, tokenizer, tasks)
            except ValueError as err:
                raise ConfigError(str(err)) from None
            limit = getattr(engine, "context_limit", None)
            if limit is not None and len(probe) > limit:
                raise ConfigError(
                    f"runtime.push_check.probe_tokens={len(probe)} exceeds the engine's context limit {limit}"
                )
            check = PushCheck(engine, trainer_score, probe, threshold=pc.threshold, action=pc.action,
                              timeout_s=args.timeout_s, path=path)  # fmt: skip
        drift = None
        if md.action != "none":
            drift = MismatchDrift(window=md.window, factor=md.factor, min_abs_diff=md.min_abs_diff,
                                  action=md.action)  # fmt: skip
        return cls(check, drift)

    async def on_step(self, record: Any) -> None:
        if self.push_check is not None:
            metrics, failure = await self.push_check.check(record.version)
            record.metrics.update(metrics)
            self.failure = self.failure or failure
        if self.drift is not None:
            metrics, failure = self.drift.observe(record.metrics, record.step)
            record.metrics.update(metrics)
            self.failure = self.failure or failure


def with_deadline(sync: Any, args: WeightCheckArgs, engine: Any) -> DeadlineSync:
    """``sync`` under the push deadline of ``args``."""
    return DeadlineSync(sync, args.timeout_s, engine)


STOPPING_ERRORS: tuple[type[BaseException], ...] = (
    WeightSyncTimeoutError,
    PushCheckError,
    MismatchDriftError,
)
