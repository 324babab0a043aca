"""Evaluation: every task of one or more task files ``k`` times through the agent loop, scored by Pass@1
(averaged over the ``k`` samples) and pass@k (the unbiased estimator), per file and overall.

The paper's protocol (docs/evaluation.md) is the default: temperature 1.0, top-p 1.0, 4–16 samples per
problem, each environment's own turn limit (math 50, coding 300). Episodes run concurrently (``concurrency``
at a time) through `sao.rollout.agent_loop.run_episode`, one fresh environment per episode. Sample ``j`` of
a task gets the seed `sample_seed` ``(seed, file name, task id, j)``: the same settings give the same
numbers whatever the concurrency and order of completion.

Which environment plays a task: ``EvalSettings.env`` if given, else the row's ``env`` field, else
``math_tir``. Rows with a ``problem`` field and no ``prompt`` (the AIME-style format) use it as the prompt.
A sample is solved when its outcome reward (``rewards[-1]``) is > 0.5; an episode that raises counts as
unsolved and is reported with its error. Module import stays light (no torch): the engine and the agent
loop are imported when evaluating.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.envs.base import Task
from sao.envs.factory import cap_turns, make_env

__all__ = [
    "DEFAULT_ENV",
    "SUCCESS_THRESHOLD",
    "EvalSettings",
    "TaskFile",
    "aggregate",
    "evaluate",
    "load_task_file",
    "pass_at_k",
    "run_eval",
    "sample_seed",
    "summarize",
    "write_report",
]

DEFAULT_ENV = "math_tir"
SUCCESS_THRESHOLD = 0.5  # the built-in envs reward 0 or 1


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a problem with ``n`` samples of which ``c`` are correct: ``1 − C(n−c, k)/C(n, k)``
    (Chen et al., 2021), computed as a stable product."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class EvalSettings:
    """How to evaluate. ``max_turns=None`` keeps each environment's own limit; ``env`` overrides the
    per-row env of every file; ``limit`` keeps the first tasks of each file."""

    k: int = 4
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int | None = None
    max_tokens_per_turn: int = 1024
    max_total_tokens: int = 16384
    concurrency: int = 32
    env: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # constructor arguments of every task's env
    limit: int | None = None
    transcripts: bool = False  # keep each sample's episode in the report: its text and tokens (`sao inspect`)
    env_timeout_s: float | None = None  # seconds each env call may take (None: forever)

    def __post_init__(self) -> None:
        for name in ("k", "max_tokens_per_turn", "max_total_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")


@dataclass
class TaskFile:
    """The tasks of one file and the environment name that plays each of them."""

    path: str
    tasks: list[Task]
    envs: list[str]


_SWE_FIELDS = {"id_field": "instance_id", "prompt_field": "problem_statement"}


def load_task_file(path: str | Path, env: str | None = None, limit: int | None = None) -> TaskFile:
    """Load a task file with `sao.envs.tasks.load_tasks` and pick each task's environment (see the
    module docstring). A file without a ``prompt`` column is read with ``problem`` as the prompt, or as
    SWE-bench instances (``instance_id``, ``problem_statement``) for the ``swe`` env."""
    from sao.envs.tasks import TaskFileError, load_tasks

    try:
        tasks = load_tasks(path, limit=limit)
    except TaskFileError as err:
        for fields in ({"prompt_field": "problem"}, _SWE_FIELDS):
            try:
                tasks = load_tasks(path, limit=limit, **fields)
                break
            except TaskFileError:
                continue
        else:
            raise err from None
    envs = [env or str(task.metadata.get("env") or DEFAULT_ENV) for task in tasks]
    return TaskFile(str(path), tasks, envs)


def sample_seed(seed: int, file: str, task_id: str, sample: int) -> int:
    """The sampling seed of one episode: a hash of the run seed, file name, task id and sample index."""
    key = f"{seed}/{Path(file).name}/{task_id}/{sample}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF


async def _run_sample(
    engine: Any,
    tokenizer: Any,
    env_name: str,
    task: Task,
    group_id: str,
    seed: int,
    settings: EvalSettings,
    env_factory: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """One episode → its sample record (reward, turns, tokens, finish reason, error)."""
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    record: dict[str, Any] = {"seed": seed, "reward": 0.0, "success": False, "error": None}
    env = None
    started = time.perf_counter()
    try:
        if env_factory is not None:
            env = env_factory()
        else:
            env = cap_turns(make_env(env_name, **settings.env_kwargs), settings.max_turns)
        cfg = AgentLoopConfig(
            max_turns=settings.max_turns or env.max_turns,
            max_total_tokens=settings.max_total_tokens,
            max_tokens_per_turn=settings.max_tokens_per_turn,
            temperature=settings.temperature,
            top_p=settings.top_p,
            env_timeout_s=settings.env_timeout_s,
        )
        traj = await run_episode(engine, tokenizer, env, task, cfg, seed=seed, group_id=group_id)
        reward = float(traj.rewards[-1])
        record.update(
            reward=reward,
            success=reward > SUCCESS_THRESHOLD,
            turns=traj.num_turns,
            tokens=traj.num_tokens,
            action_tokens=traj.num_action_tokens,
            finish_reason=traj.finish_reason,
            token_digest=hashlib.sha256(str(traj.token_ids).encode()).hexdigest()[:16],
            error=traj.metadata.get("error"),
        )
        if (
            settings.transcripts
        ):  # the text, and the tokens `sao inspect` shows (the trajectory less metadata)
            record["transcript"] = tokenizer.decode(traj.token_ids)
            record["trajectory"] = {k: v for k, v in traj.to_dict().items() if k != "metadata"}
        infos = traj.metadata.get("infos") or [{}]
        record["info"] = {key: _short(value) for key, value in infos[-1].items() if _is_scalar(value)}
    except Exception as err:  # one broken episode is reported, it does not end the evaluation
        record["error"] = f"{type(err).__name__}: {err}"
        if env is not None:
            with contextlib.suppress(Exception):
                await env.close()
    record["duration_s"] = round(time.perf_counter() - started, 3)
    return record


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _short(value: Any, limit: int = 500) -> Any:
    return value[:limit] + "..." if isinstance(value, str) and len(value) > limit else value


async def evaluate(
    engine: Any,
    tokenizer: Any,
    files: Sequence[TaskFile],
    settings: EvalSettings,
    *,
    env_factory: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Run every task of ``files`` ``settings.k`` times; returns the report (see `summarize`).

    ``env_factory``: builds every episode's env (a training run's env with its kwargs; the turn limit is
    then ``settings.max_turns`` in the agent loop, not a constructor argument); None: each task's env by
    name, as the module docstring says."""
    if env_factory is None:  # an env that cannot be built (bad name, no sandbox) fails here, not per sample
        for name in sorted({name for tf in files for name in tf.envs}):
            make_env(name, **settings.env_kwargs)
    gate = asyncio.Semaphore(settings.concurrency)

    async def bounded(tf: TaskFile, task: Task, env_name: str, j: int) -> dict[str, Any]:
        async with gate:
            seed = sample_seed(settings.seed, tf.path, task.id, j)
            group = f"{Path(tf.path).name}/{task.id}"
            return await _run_sample(engine, tokenizer, env_name, task, group, seed, settings, env_factory)

    started = time.perf_counter()
    jobs = [
        (tf, task, env_name)
        for tf in files
        for task, env_name in zip(tf.tasks, tf.envs, strict=True)
        for _ in range(settings.k)
    ]
    records = await asyncio.gather(
        *(bounded(tf, task, env_name, i % settings.k) for i, (tf, task, env_name) in enumerate(jobs))
    )
    tasks: list[dict[str, Any]] = []
    for i in range(0, len(jobs), settings.k):
        tf, task, env_name = jobs[i]
        samples = [{"sample": j, **rec} for j, rec in enumerate(records[i : i + settings.k])]
        n, c = len(samples), sum(s["success"] for s in samples)
        tasks.append(
            {
                "file": tf.path,
                "id": task.id,
                "env": env_name,
                "n": n,
                "correct": c,
                "pass@1": pass_at_k(n, c, 1),
                f"pass@{settings.k}": pass_at_k(n, c, settings.k),
                "samples": samples,
            }
        )
    report = summarize(tasks, settings.k)
    report["settings"] = dataclasses.asdict(settings)
    report["wall_s"] = round(time.perf_counter() - started, 3)
    return report


def aggregate(tasks: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """The metrics of a set of task records (see `summarize`)."""
    samples = [s for t in tasks for s in t["samples"]]
    return {
        "tasks": len(tasks),
        "samples": len(samples),
        "pass@1": _mean([t["pass@1"] for t in tasks]),
        f"pass@{k}": _mean([t[f"pass@{k}"] for t in tasks]),
        "mean_reward": _mean([s["reward"] for s in samples]),
        "mean_turns": _mean([s["turns"] for s in samples if "turns" in s]),
        "errors": sum(s["error"] is not None for s in samples),
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def summarize(tasks: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """``{"k", "files": {path: metrics}, "overall": metrics, "tasks": tasks}``; metrics are ``tasks``,
    ``samples``, ``pass@1`` and ``pass@k`` (means over problems, each problem weighs the same),
    ``mean_reward``, ``mean_turns`` (of the episodes that returned a trajectory) and ``errors`` (episodes
    that raised or ended with an env/engine error)."""
    by_file: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        by_file.setdefault(t["file"], []).append(t)
    return {
        "k": k,
        "files": {path: aggregate(ts, k) for path, ts in by_file.items()},
        "overall": aggregate(tasks, k),
        "tasks": tasks,
    }


def run_eval(
    model: str | Path,
    task_paths: Sequence[str | Path],
    settings: EvalSettings,
    *,
    device: str = "auto",
    dtype: str = "auto",
) -> dict[str, Any]:
    """Evaluate checkpoint ``model`` on ``task_paths`` with a `LocalEngine`; returns the report with
    ``settings`` completed by the model, task files, device and dtype."""
    from sao.engine.local import LocalEngine
    from sao.models.loading import load_tokenizer

    files = [load_task_file(p, settings.env, settings.limit) for p in task_paths]
    tokenizer = load_tokenizer(model)

    async def main() -> dict[str, Any]:
        engine = LocalEngine(
            model, tokenizer, device=device, dtype=dtype, max_running=settings.concurrency, seed=settings.seed
        )
        async with engine:
            return await evaluate(engine, tokenizer, files, settings)

    report = asyncio.run(main())
    report["settings"].update(
        model=str(model), task_files=[str(p) for p in task_paths], device=device, dtype=dtype
    )
    return report


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report as indented JSON (NaN written as null); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_nan_to_none(report), indent=2) + "\n", encoding="utf-8")
    return out


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value
