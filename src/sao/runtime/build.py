"""How a run is assembled: the builders that make components from their arguments, and `assemble`, every
factory's arguments for one config (`sao.runtime.factories` holds the table: which keys each component
reads, and the arguments it receives). A component is handed its own arguments, never the whole config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sao.config import ConfigError, RunConfig
from sao.envs.base import Env, EnvError, Task
from sao.envs.factory import cap_turns, make_env

from .args import EnvArgs, TaskArgs, TokenizerArgs, TrainerArgs
from .factories import FACTORIES
from .parts import RunParts
from .task_stream import TaskStream, chunk_seed

__all__ = [
    "FACTORIES",
    "EnvBuilder",
    "assemble",
    "build_env_factory",
    "build_stream",
    "build_tasks",
    "build_tokenizer",
    "build_trainer",
]


def build_trainer(args: TrainerArgs, actor: Any, critic: Any) -> Any:
    """The `Trainer` built from its own settings (``FACTORIES["trainer"](cfg)``)."""
    from sao.train.step import Trainer

    return Trainer(actor, critic, args)


def build_tokenizer(args: TokenizerArgs, checkpoint: Path) -> Any:
    """The run's tokenizer: ``checkpoint``'s, with ``model.chat_template`` replacing its template and
    ``model.enable_thinking`` bound in it (so every rendering — episodes, gateway sessions, evaluation, a
    checkpoint's saved tokenizer — sees the same value). Raises `ConfigError` naming the key."""
    from sao.models.loading import load_tokenizer
    from sao.models.templates import bind_template_variables, load_chat_template

    tokenizer = load_tokenizer(checkpoint)
    if args.chat_template is not None:
        try:
            tokenizer.chat_template = load_chat_template(args.chat_template)
        except (OSError, ValueError) as err:
            raise ConfigError(f"model.chat_template: {err}") from None
    if not tokenizer.chat_template:
        raise ConfigError(
            f"model.chat_template: the tokenizer of {str(checkpoint)!r} has no chat template; name one "
            "(a .jinja file, or 'qwen3', 'qwen3_coder', 'hermes', 'sao')"
        )
    if args.enable_thinking is not None:
        tokenizer.chat_template = bind_template_variables(
            tokenizer.chat_template, enable_thinking=args.enable_thinking
        )
    return tokenizer


class EnvBuilder:
    """Builds a fresh env per episode (``data.env`` with ``data.env_kwargs``), wrapped by the LLM judge
    when one is configured; ``judge`` is the one judge client every episode of this process shares (its
    concurrency bound, cache and counters), None without a judge."""

    def __init__(self, args: EnvArgs) -> None:
        self.args = args
        self.judge: Any = None
        if args.judge is not None:
            from sao.envs.judge_client import JudgeClient

            self.judge = JudgeClient(args.judge.settings)

    def __call__(self) -> Env:
        env = cap_turns(make_env(self.args.name, **self.args.kwargs), self.args.max_turns)
        if self.judge is None:
            return env
        from sao.envs.judged import JudgedEnv

        assert self.args.judge is not None
        return JudgedEnv(env, self.judge, self.args.judge.combine, self.args.judge.max_turns)


def build_env_factory(args: EnvArgs) -> EnvBuilder:
    """A builder of fresh envs (one per episode); builds one now so a bad name or kwargs fail at startup."""
    try:
        build = EnvBuilder(args)
        build()
    except EnvError as err:
        raise ConfigError(f"data.env / data.env_kwargs: {err}") from None
    except ValueError as err:  # the judge's settings
        raise ConfigError(f"judge: {err}") from None
    return build


def _generated(args: TaskArgs, n: int, seed: int) -> list[Task]:
    from sao.envs.factory import make_env_tasks

    try:
        return make_env_tasks(args.env, n, seed, **args.env_kwargs)
    except EnvError as err:
        raise ConfigError(f"data.train_file: not set, and {err}") from None


def build_tasks(args: TaskArgs) -> list[Task]:
    """The training tasks: ``data.train_file`` read with its column names, else ``data.num_tasks`` from the
    env's task source. With ``data.stream`` these are the pool of value pretraining and weight probes only,
    generated with a seed the stream never uses (`build_stream` makes the training tasks)."""
    if args.train_file:
        from sao.envs.tasks import TaskFileError, load_tasks

        id_field, prompt_field, answer_field, tests_field = args.fields
        try:
            return load_tasks(args.train_file, id_field=id_field, prompt_field=prompt_field,
                              answer_field=answer_field, tests_field=tests_field)  # fmt: skip
        except TaskFileError as err:
            raise ConfigError(f"data.train_file: {err}") from None
    if args.stream:
        return _generated(args, args.count, chunk_seed(args.seed, 0, namespace="pool"))
    return _generated(args, args.count, args.seed)


def build_stream(args: TaskArgs) -> TaskStream | None:
    """The stream of fresh training tasks (``data.stream``), or None; its first chunk is made now, so an
    env whose generator cannot serve a stream fails at startup."""
    if not args.stream:
        return None
    stream = TaskStream(lambda n, seed: _generated(args, n, seed), args.seed)
    try:
        stream.task(0)
    except ValueError as err:
        raise ConfigError(f"data.stream: {err}") from None
    return stream


def assemble(cfg: RunConfig) -> RunParts:
    """Every factory's arguments for one run config, as the typed `RunParts` (what `Run` builds from).
    Raises `TypeError` naming the factories when `RunParts` and `FACTORIES` disagree."""
    from dataclasses import fields

    declared = {f.name for f in fields(RunParts)}
    if declared != FACTORIES.keys():
        raise TypeError(f"RunParts and FACTORIES differ in: {sorted(declared ^ FACTORIES.keys())}")
    return RunParts(**{name: factory(cfg) for name, factory in FACTORIES.items()})
