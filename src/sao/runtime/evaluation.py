"""Evaluation during training: Pass@1 over ``eval.k`` samples on held-out task files.

Every ``logging.eval_every`` steps, once at the end, and with ``eval.at_start`` on the initial weights of a
fresh run (step 0), the evaluator starts an evaluation of ``data.eval_file`` on the weights of that step,
as an asyncio task beside the producer: training and generation go on while it runs, and its episodes are
neither trained on nor counted as produced. Where it samples is its `sao.runtime.eval_engine.EvalEngine`
(``eval.engine``): an engine of its own holding exactly that step's weights (``frozen``: every evaluation
on one version), or the run's engine, interleaved with training episodes (``shared``: an intermediate
evaluation spans the versions pushed while it runs). ``eval/policy_version_start`` and ``_end`` are logged
either way.

Results go to the metric sinks at the step they measure (``eval/pass@1``, ``eval/pass@k``,
``eval/mean_reward``, ``eval/errors``, ``eval/wall_s`` (seconds its episodes took), and per task file
``eval/<file stem>/pass@1``), and the full report to ``run_dir/eval/step_<step>.json`` beside the checkpoints.
Envs that follow training (``set_training_progress``) see the progress at the evaluation's start. An
evaluation that fails is reported on the console and as ``eval/failed``; it never stops the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sao.envs.base import notify_training_progress
from sao.eval import TaskFile, evaluate, load_task_file, write_report
from sao.sinks import MultiSink

from .args import EvalArgs
from .clock import TrainingClock
from .eval_engine import EvalEngine

__all__ = ["TrainingEvaluator", "eval_metrics", "load_eval_files"]

log = logging.getLogger(__name__)


def eval_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The ``eval/*`` metrics of an `sao.eval.evaluate` report (overall and per task file)."""
    k = int(report["k"])
    overall = report["overall"]
    metrics = {
        "eval/pass@1": float(overall["pass@1"]),
        f"eval/pass@{k}": float(overall[f"pass@{k}"]),
        "eval/mean_reward": float(overall["mean_reward"]),
        "eval/errors": float(overall["errors"]),
        "eval/samples": float(overall["samples"]),
    }
    for path, per_file in report["files"].items():
        metrics[f"eval/{Path(path).stem}/pass@1"] = float(per_file["pass@1"])
    return metrics


def load_eval_files(args: EvalArgs) -> list[TaskFile]:
    """The held-out task files, read now so that a missing or malformed one fails the run's start."""
    from sao.config import ConfigError
    from sao.envs.tasks import TaskFileError

    try:
        return [load_task_file(p, args.settings.env, args.settings.limit) for p in args.files]
    except (TaskFileError, OSError) as err:
        raise ConfigError(f"data.eval_file: {err}") from None


class TrainingEvaluator:
    """See the module docstring; ``files`` from `load_eval_files`."""

    def __init__(
        self,
        args: EvalArgs,
        files: list[TaskFile],
        engine: EvalEngine,
        tokenizer: Any,
        env_factory: Callable[[], Any],
        sinks: MultiSink,
        run_dir: Path,
        clock: TrainingClock,
    ) -> None:
        self.args, self.engine, self.tokenizer, self.env_factory = args, engine, tokenizer, env_factory
        self.sinks, self.clock = sinks, clock
        self.out_dir = Path(run_dir) / "eval"
        self.files = files
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._held: dict[int, Any] = {}  # what each launched evaluation needs of its step (its weights)

    @property
    def enabled(self) -> bool:
        return bool(self.files)

    def on_start(self) -> None:
        """Evaluate the initial weights of a fresh run (``eval.at_start``), beside the first steps; a run
        resumed from a checkpoint of an evaluation step whose report is missing (the run was interrupted
        while it evaluated) evaluates those weights, which it has again, now."""
        if not self.enabled:
            return
        step, every = self.clock.step, self.args.every
        if step == 0:
            if self.args.at_start:
                self._launch(0)
        elif every is not None and step % every == 0 and not self._report_path(step).exists():
            self._launch(step)

    def _report_path(self, step: int) -> Path:
        return self.out_dir / f"step_{step:08d}.json"

    def on_step(self, step: int) -> None:
        """Start an evaluation of ``step``'s weights when ``logging.eval_every`` says so."""
        every = self.args.every
        if self.enabled and every is not None and step % every == 0:
            self._launch(step)

    async def finish(self, step: int) -> None:
        """The final evaluation (unless one of ``step`` already ran), then wait for every evaluation."""
        if self.enabled and step not in self._tasks:
            self._launch(step)
        await self.wait()

    async def wait(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    async def close(self) -> None:
        """Stop the evaluations' own engine (after `cancel` and `wait`)."""
        self._held.clear()
        await self.engine.close()

    def _launch(self, step: int) -> None:
        self._held[step] = self.engine.hold()  # now, between training steps: exactly this step's weights
        self._tasks[step] = asyncio.create_task(self._evaluate(step))

    async def _evaluate(self, step: int) -> None:
        progress = self.clock.progress()

        def make_env() -> Any:  # an env that follows training sees where it stood when this evaluation began
            env = self.env_factory()
            notify_training_progress(env, progress)
            return env

        async def run(engine: Any) -> dict[str, Any]:
            started = time.monotonic()
            args = self.args.settings
            report = await evaluate(engine, self.tokenizer, self.files, args, env_factory=make_env)
            report["wall_s"] = time.monotonic() - started  # sampling only (not waiting for the engine)
            return report

        try:
            report, start, end = await self.engine.run(self._held.pop(step), run)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # an evaluation that breaks is reported; training goes on
            log.error("evaluation of step %d failed: %s: %s", step, type(err).__name__, err)
            self.sinks.log(step, {"eval/failed": 1.0}, always=True)
            return
        metrics = eval_metrics(report)
        metrics["eval/policy_version_start"] = float(start)
        metrics["eval/policy_version_end"] = float(end)
        metrics["eval/wall_s"] = float(report["wall_s"])
        report["step"] = step
        write_report(report, self._report_path(step))
        self.sinks.log(step, metrics, always=True)
