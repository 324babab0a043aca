"""How a run is put together: `RunSetup`, the assembly half of `sao.runtime.runner.Run` — every
attribute a run holds (set in ``__init__``; what `start` builds is None until then) and `start`, which
builds the components around the engine in the order each needs the last — plus the plain builders it
calls, each from its own parts: the run directory check, the model directories, the episode sources (the
`Producer`, the `GatewaySource` of external agents and the server in front of them), the value-pretraining
corpus, the prompt sampler, and the timeline sampler of ``logging.timeline_every_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from sao.config import ConfigError, RunConfig, dump_config
from sao.envs.base import Env, Task
from sao.sinks import METRICS_FILE
from sao.types import Trajectory

from .args import GatewayArgs, ModelArgs, RunLogArgs, SamplerArgs
from .backend import Backend, EngineHooks, ModelDirs
from .build import EnvBuilder, assemble, build_env_factory, build_stream, build_tasks, build_tokenizer
from .clock import TrainingClock
from .eval_engine import EvalEngine, SharedEvalEngine
from .evaluation import TrainingEvaluator, load_eval_files
from .gateway_run import RunGateway, make_verifier
from .gateway_source import GatewaySource
from .inspection import TrajectoryInspector
from .observers import Books, Checkpoints, JudgeMetrics, MetricsLog, StepObserver, WeightPush
from .parts import RunParts
from .producer import Producer
from .progress import TrainingProgress
from .rollouts import collect_rollouts
from .run_logs import EpisodeLog, Timeline
from .run_state import FirstFailure, RunState
from .sampler import PromptSampler
from .sources import Sources
from .staleness import StalenessManager
from .task_stream import TaskStream
from .threads import trainer_executor
from .weight_checks import WeightChecks, with_deadline

T = TypeVar("T")

__all__ = [
    "RunSetup",
    "check_run_dir",
    "make_gateway_source",
    "make_producer",
    "make_sampler",
    "model_dirs",
    "pretrain_corpus",
    "serve_gateway",
    "timeline",
]

Queue = asyncio.Queue[list[Trajectory]]


def check_run_dir(run_dir: Path, has_checkpoint: bool, resume: bool) -> None:
    """A new run refuses a directory that already holds one (metrics or checkpoints)."""
    metrics = run_dir / METRICS_FILE
    logged = metrics.is_file() and metrics.stat().st_size > 0
    if not resume and (logged or has_checkpoint):
        raise ConfigError(
            f"logging.run_dir: {str(run_dir)!r} already holds a run (metrics or checkpoints); "
            "resume it with --resume, or pick another run directory"
        )


def model_dirs(actor: ModelArgs, loaded: Any, run_dir: Path) -> ModelDirs:
    """The configured model (a tiny one is built under the run's parent on first use, after seeding), or
    the checkpoint ``loaded``'s actor and critic when resuming."""
    from sao.models.loading import model_from_config
    from sao.train.common import set_seed

    set_seed(actor.seed)
    base = model_from_config(actor.model, run_dir.parent / ".sao-models", seed=actor.seed)
    critic = loaded.critic_dir if loaded and loaded.critic_dir else base
    return ModelDirs(base, loaded.actor_dir if loaded else base, critic)


def make_gateway_source(
    gw: GatewayArgs, pretrain_sessions: int, staleness: StalenessManager, queue: Queue, clock: TrainingClock
) -> GatewaySource:
    """The session source of external agents (``data.source`` gateway/both); the first
    ``pretrain_sessions`` sessions are value pretraining's corpus."""
    g = gw.gateway
    return GatewaySource(
        staleness, queue, clock, group_size=gw.group_size, admission=g.admission,
        admission_timeout_s=g.admission_timeout_s, retry_after_s=g.retry_after_s,
        idle_timeout_s=g.session_idle_timeout_s, pretrain_sessions=pretrain_sessions,
    )  # fmt: skip


async def serve_gateway(
    gw: GatewayArgs, engine: Any, tokenizer: Any, source: GatewaySource, env_factory: Callable[[], Env],
    tasks: Sequence[Task], run_dir: Path, model_name: str, console: Console,
) -> RunGateway:  # fmt: skip
    """The server external agents use, in front of the run's engine, started and announced."""
    verifier = make_verifier(env_factory, tasks, gw.verifier_timeout_s)
    gateway = RunGateway(gw, engine, tokenizer, source, verifier, run_dir, model_name=model_name)
    url = await gateway.start()
    console.print(f"gateway for external agents: {url} (also in {run_dir / 'gateway.json'})",
                  markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    return gateway


def make_sampler(
    args: SamplerArgs, tasks: list[Task], trainer: Any, stream: TaskStream | None = None
) -> PromptSampler:
    """The prompt order: the stream's fresh tasks when there is one, else ``tasks``, prioritized by the
    trainer's estimator when it has priorities and they are on."""
    weights = None
    if args.prioritized and trainer.prioritizes_prompts:
        weights = trainer.sampling_weights
    return PromptSampler(tasks, group_size=args.group_size, seed=args.seed, weights=weights, stream=stream)


def make_producer(
    parts: RunParts, engine: Any, tokenizer: Any, env_factory: Callable[[], Env], sampler: PromptSampler,
    staleness: StalenessManager, queue: Queue, clock: TrainingClock,
    on_fatal: Callable[[BaseException], None],
) -> Producer:  # fmt: skip
    """The built-in episode source (``data.source`` env/both)."""
    st = parts.staleness
    return Producer(
        engine, tokenizer, env_factory, sampler, staleness, queue, parts.agent_loop,
        max_in_flight=st.max_in_flight, clock=clock, progress=clock.progress, seed=parts.loop.seed,
        on_fatal=on_fatal, max_consecutive_drops=st.max_consecutive_drops,
    )  # fmt: skip


async def pretrain_corpus(
    parts: RunParts, gateway: GatewaySource | None, failure: FirstFailure, engine: Any, tokenizer: Any,
    env_factory: Callable[[], Env], tasks: Sequence[Task], console: Console,
) -> list[Trajectory]:  # fmt: skip
    """Value pretraining's corpus: rollouts of the initial policy on the training tasks, or with no built-in
    producer (``data.source=gateway``) the agents' first sessions (unless a component fails first)."""
    pre = parts.value_pretrain
    size = pre.options.corpus_size
    if parts.gateway.source != "gateway":
        return await collect_rollouts(engine, tokenizer, env_factory, tasks, size, parts.agent_loop,
                                      concurrency=pre.concurrency, seed=pre.rollout_seed)  # fmt: skip
    assert gateway is not None
    console.print(f"value pretraining: waiting for {size} sessions of the initial policy through the gateway",
                  markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    return await failure.unless_failed(gateway.pretrain_corpus())


def timeline(
    args: RunLogArgs, clock: TrainingClock, staleness: StalenessManager, sources: Any, queue: Queue,
    engine: Any,
) -> contextlib.AbstractAsyncContextManager[Any]:  # fmt: skip
    """The timeline sampler of ``logging.timeline_every_s`` (a no-op context when it is off)."""
    if args.timeline_every_s is None:
        return contextlib.nullcontext()

    def snapshot() -> dict[str, Any]:
        s = staleness.stats()
        numbers = {k: float(v) for k, v in engine.stats().items() if isinstance(v, (int, float))}
        return {"version": clock.version, "in_flight": sources.in_flight,
                "queued": queue.qsize(), "trained": s.trained, "engine": numbers}  # fmt: skip

    return Timeline(args.run_dir, args.timeline_every_s, snapshot)


class RunSetup:
    """A run's components and their assembly (module docstring); `Run` adds the loop. `start` builds every
    component, the engine first, and closes it on any failure after it."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False, console: Console | None = None) -> None:
        from sao.train.checkpoint import CheckpointManager, LoadedCheckpoint

        self.cfg, self.resume = cfg, resume
        self.parts = p = assemble(cfg)
        self.console = console or Console(stderr=True)
        self.run_dir = p.checkpoints.run_dir
        self.ckpts = CheckpointManager(self.run_dir, keep_last=p.checkpoints.keep_last)
        self.clock = TrainingClock()
        st = p.staleness
        self.staleness = StalenessManager(st.batch_size, st.max_staleness, st.drop_older_than)
        # Bounded by construction: the capacity rule never lets more than `capacity` trajectories (so groups)
        # be started and not yet trained; the explicit bound makes an accounting bug block, not grow memory.
        self.queue: Queue = asyncio.Queue(maxsize=self.staleness.capacity)
        self.state = RunState(self.clock, self.staleness)  # the books a checkpoint holds; elapsed time
        self.failure = FirstFailure()  # a component that cannot go on ends the run with its error
        self.backend = make_backend(p, self.console)
        self._trainer_pool = trainer_executor(self.backend.trainer_threads)
        self._train_lock = asyncio.Lock()  # held while the actor's weights change
        self.last: dict[str, float] = {}  # the last step's metrics
        # Built by `start`, in this order.
        self.loaded: LoadedCheckpoint | None = None
        self.env_factory: EnvBuilder | None = None
        self.eval_files: list[Any] = []
        self.tokenizer: Any = None
        self.tasks: list[Task] = []
        self.engine: Any = None
        self.gateway_source: GatewaySource | None = None
        self.gateway: RunGateway | None = None
        self.pre_metrics: dict[str, float] = {}
        self.trainer: Any = None
        self.sync: Any = None
        self.weight_checks: WeightChecks | None = None
        self.sampler: PromptSampler | None = None
        self.producer: Producer | None = None
        self.sources: Sources | None = None
        self.sinks: Any = None
        self.progress: TrainingProgress | None = None
        self.evaluator: TrainingEvaluator | None = None
        self.dirs: Any = None  # the run's `ModelDirs`, from `start`
        self.books: Books | None = None
        self.inspector: TrajectoryInspector | None = None
        self.observers: list[StepObserver] = []

    async def start(self) -> None:
        p = self.parts
        check_run_dir(self.run_dir, self.ckpts.latest() is not None, self.resume)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(self.cfg))
        self.env_factory = build_env_factory(p.env)
        self.eval_files = load_eval_files(p.evaluator)
        self.loaded = self.ckpts.load() if self.resume and self.ckpts.latest() is not None else None
        dirs = self.dirs = model_dirs(p.actor, self.loaded, self.run_dir)
        self.tokenizer = build_tokenizer(p.tokenizer, dirs.base)
        self.backend.load_models(dirs)
        self.tasks = build_tasks(p.tasks)
        hooks = EngineHooks(self.failure.fail, self._train_lock, lambda: self.clock.version)
        self.engine = await self.backend.start_engine(dirs, self.tokenizer, hooks)
        try:  # from here on the engine (maybe a server, a child process, actors) is closed whatever happens
            await self._sources_and_trainer()
            self._observers()
        except BaseException:
            if self.sinks is not None:
                self.sinks.close()
            await self._close_engine()
            raise

    async def _sources_and_trainer(self) -> None:
        """Gateway, value pretraining, trainer, weight checks, sampler, producer; restored on resume."""
        p, fresh = self.parts, self.loaded is None
        pretrains = fresh and p.critic.enabled and p.value_pretrain.enabled
        if p.gateway.source in ("gateway", "both"):
            # Value pretraining needs rollouts of the initial policy: with no built-in producer, the agents'.
            only_agents = pretrains and p.gateway.source == "gateway"
            sessions = p.value_pretrain.options.corpus_size if only_agents else 0
            self.gateway_source = make_gateway_source(
                p.gateway, sessions, self.staleness, self.queue, self.clock
            )
            if fresh:  # value pretraining may need the agents' sessions: serve now
                await self._serve_gateway()
        self.pre_metrics = await self._pretrain_critic() if pretrains else {}
        self.trainer, sync = self.backend.trainer_and_sync()  # local: built after value pretraining
        self.sync = with_deadline(sync, p.weight_checks, self.engine)
        self.weight_checks = WeightChecks.build(
            p.weight_checks, self.engine, self.backend.scorer(), self.tokenizer, self.tasks, self.sync.path
        )
        self.sampler = make_sampler(p.sampler, self.tasks, self.trainer, build_stream(p.tasks))
        if p.gateway.source in ("env", "both"):
            self.producer = make_producer(
                p, self.engine, self.tokenizer, self.env_factory, self.sampler, self.staleness, self.queue,
                self.clock, self.failure.fail,
            )  # fmt: skip
        self.sources = Sources(self.producer, self.gateway_source)
        self.state.attach(self.sampler, self.producer, self.gateway_source)
        if self.loaded is not None:
            await self._restore(self.loaded)
        if self.producer is not None:
            self.producer.episodes_started = self.staleness.stats().started

    async def _restore(self, loaded: Any) -> None:
        """The trainer, the books and the engine's weights as ``loaded`` left them; then the gateway."""
        from sao.train.checkpoint import restore_rng

        self.ckpts.clean_partial()  # what a save killed mid-way left beside the checkpoints
        self.backend.restore_weights(loaded.path)
        self.trainer.load_state_dict(loaded.trainer_state)
        self.state.restore(loaded, self.trainer.step)
        await self.sync.push(self.clock.version)
        restore_rng(loaded.rng)
        if self.gateway_source is not None:  # served once the books are restored, not before
            await self._serve_gateway()

    def _observers(self) -> None:
        """The sinks, progress, evaluator and the per-step observers, declared in the order they run."""
        from sao.sinks import make_sinks

        p, checks = self.parts, self.weight_checks
        assert checks is not None and self.env_factory is not None
        # A resumed run redoes the steps after its checkpoint (all without one): set their records aside.
        resume_step = self.loaded.step if self.loaded is not None else (-1 if self.resume else None)
        self.sinks = make_sinks(p.sinks.logging, p.sinks.run_dir, run_name=p.sinks.run_name,
                                config=self.cfg.to_yaml_dict(), resume_step=resume_step)  # fmt: skip
        self.progress = TrainingProgress(
            p.loop.total_steps, console=self.console, start_step=self.trainer.step
        )
        self.evaluator = TrainingEvaluator(
            p.evaluator, self.eval_files, self._eval_engine(), self.tokenizer, self.env_factory, self.sinks,
            self.run_dir, self.clock,
        )  # fmt: skip
        self.books = Books(self.staleness, self.sources, self.queue, self.engine)
        self.inspector = TrajectoryInspector(p.inspector, self.trainer, self.tokenizer, resume_step)
        in_order = [
            WeightPush(self.sync),
            # The probe right after the push, before the books free capacity: in sync mode the next batch
            # starts only once the step is checkpointed (an exact resume); the mismatch drift alarm.
            checks,
            self.books,
            JudgeMetrics(self.env_factory.judge) if self.env_factory.judge is not None else None,
            self.inspector if self.inspector.enabled else None,  # its runtime/inspect_s logged with the step
            EpisodeLog(p.run_logs.run_dir, resume_step) if p.run_logs.episodes else None,
            MetricsLog(self.sinks, self.progress),
            checks.verdict,  # a failed check stops the run once its step is logged
            Checkpoints(self._save_checkpoint, p.checkpoints.every, p.loop.total_steps),
        ]
        self.observers = [o for o in in_order if o is not None]

    def _eval_engine(self) -> EvalEngine:
        """Where evaluations sample (``eval.engine``, `sao.runtime.eval_engine`)."""
        args = self.parts.evaluator
        if args.engine == "frozen" and self.eval_files:
            concurrency = args.settings.concurrency
            return self.backend.eval_engine(
                self.dirs, self.tokenizer, concurrency, lambda: self.clock.version
            )
        return SharedEvalEngine(self.engine, self.clock.get_version)

    async def _serve_gateway(self) -> None:
        assert self.gateway_source is not None and self.env_factory is not None
        self.gateway = await serve_gateway(
            self.parts.gateway, self.engine, self.tokenizer, self.gateway_source, self.env_factory,
            self.tasks, self.run_dir, self.parts.gateway.model_name, self.console,
        )  # fmt: skip

    async def _pretrain_critic(self) -> dict[str, float]:
        """Value pretraining on rollouts of the frozen initial policy (docs/models.md)."""
        assert self.env_factory is not None
        corpus = await pretrain_corpus(
            self.parts, self.gateway_source, self.failure, self.engine, self.tokenizer, self.env_factory,
            self.tasks, self.console,
        )  # fmt: skip
        options = self.parts.value_pretrain.options
        opts = dataclasses.replace(options, batch_size=min(options.batch_size, len(corpus)))
        result = await self._in_trainer(self.backend.pretrain_value, corpus, opts, self.console)
        return {"value_pretrain/corpus_size": float(len(corpus)), "value_pretrain/steps": float(result.steps),
                "value_pretrain/best_ev": result.best_ev}  # fmt: skip

    def _save_checkpoint(self, step: int, version: int) -> None:
        self.ckpts.save(step, tokenizer=self.tokenizer, **self.backend.checkpoint_models(),
                        trainer_state=self.trainer.state_dict(), policy_version=version,
                        config=self.cfg.to_yaml_dict(), **self.state.saved())  # fmt: skip

    async def _in_trainer(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the trainer's thread (`sao.runtime.threads.trainer_executor`)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._trainer_pool, functools.partial(fn, *args, **kwargs))

    async def _close_engine(self) -> None:
        if self.gateway is not None:  # first: no request may reach a closing engine
            await self.gateway.close()
        try:
            if self.evaluator is not None:
                await self.evaluator.close()
        finally:
            await self.backend.close()


def make_backend(parts: RunParts, console: Console) -> Backend:
    """The backend of ``runtime.backend``, handed its own parts."""
    if parts.loop.backend == "ray":
        from .ray_backend import RayBackend

        return RayBackend(parts.cluster, parts.engine, parts.trainer, parts.critic, parts.checkpoints.run_dir)
    from .local_backend import LocalBackend

    return LocalBackend(parts.threads, parts.engine, parts.actor, parts.critic, parts.trainer, console)
