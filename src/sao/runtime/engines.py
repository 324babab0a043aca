"""Starting the rollout engine a run asked for (``engine.backend``) from its `EngineArgs`.

``local``: a `LocalEngine` in this process; ``process``: the same engine in a child process of its own;
``vllm`` / ``sglang``: a server launched on the run's model with the launch settings `server_settings`
resolves from the config (or attached and given the run's weights). A process or server that does not come
up is an `EngineStartError` carrying the cause's message, and so is a server whose context limit is below
the episode budget (`check_context_limit`, at launch and at attach). The run's checkpoint must carry the
rope scaling the config names (`check_rope_scaling`).

Which directory an engine loads (`StartDirs`): a resumed run's first engine start loads the checkpoint it
resumed from; every later start (a restart after a crash, the frozen evaluation engine) loads the configured
model and is then given the trainer's current weights, because by then checkpoint rotation
(``logging.keep_checkpoints``) may have deleted the resumed-from checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sao.config import ConfigError
from sao.config.schema import SERVER_LAUNCH_FLAGS, server_flag_given
from sao.engine.server_settings import ServerSettings
from sao.engine.types import InferenceEngine

if TYPE_CHECKING:
    from .args import EngineArgs

__all__ = [
    "EngineStartError",
    "StartDirs",
    "check_context_limit",
    "check_rope_scaling",
    "server_extra_args",
    "server_settings",
    "start_engine",
]


class EngineStartError(RuntimeError):
    """The rollout engine (a child process or a vLLM / SGLang server) could not be started or attached."""


class StartDirs:
    """Calling it gives the directory the next engine start loads: ``first`` once (the weights the run
    starts from: a resumed run's checkpoint), ``later`` from then on (the configured model, which stays on
    disk; the restarted engine is given the current weights right after)."""

    def __init__(self, first: Path, later: Path) -> None:
        self.first, self.later, self._started = first, later, False

    def __call__(self) -> Path:
        if self._started:
            return self.later
        self._started = True
        return self.first


async def start_engine(
    args: EngineArgs, actor_dir: Path, tokenizer_dir: Path, tokenizer: Any
) -> InferenceEngine:
    """The engine of ``args.backend`` serving the weights in ``actor_dir``; see the module docstring."""
    check_rope_scaling(args.server.rope_scaling, actor_dir)
    if args.backend == "local":
        from sao.engine import LocalEngine

        return LocalEngine(actor_dir, tokenizer, device=args.device, dtype=args.dtype,
                           max_running=args.max_concurrent, seed=args.seed,
                           prefix_cache_tokens=args.prefix_cache_tokens, threads=args.threads)  # fmt: skip
    try:
        if args.backend in ("vllm", "sglang"):
            return await _server_engine(args, actor_dir)
        from sao.engine.process import ProcessEngine

        return await asyncio.to_thread(  # the constructor blocks until the child has loaded the model
            ProcessEngine, actor_dir, tokenizer_dir, device=args.device, dtype=args.dtype,
            max_running=args.max_concurrent, seed=args.seed, threads=args.threads,
            prefix_cache_tokens=args.prefix_cache_tokens,
        )  # fmt: skip
    except EngineStartError:
        raise
    except (OSError, RuntimeError) as err:  # TimeoutError is an OSError
        raise EngineStartError(f"engine.backend={args.backend}: {err}") from err


async def _server_engine(args: EngineArgs, actor_dir: Path) -> InferenceEngine:
    from sao.engine import SGLangEngine, VLLMEngine

    cls = VLLMEngine if args.backend == "vllm" else SGLangEngine
    if args.attach:
        engine = await cls.attach(args.attach)
        try:
            await check_context_limit(engine, args.server.episode_budget, args.backend, attached=True)
            await engine.update_weights(actor_dir, engine.version)  # start from the run's weights
        except BaseException:
            await engine.close()
            raise
        return engine
    extra = server_extra_args(args.backend, args.server_args, args.max_concurrent)
    settings = server_settings(args, actor_dir)
    engine = await cls.launch(
        actor_dir, python=args.python, dtype=args.dtype, settings=settings, extra_args=extra
    )
    await check_context_limit(engine, args.server.episode_budget, args.backend)
    return engine


def server_extra_args(backend: str, server_args: Sequence[str], max_concurrent: int) -> list[str]:
    """``engine.server_args`` plus ``engine.max_concurrent`` as the vLLM / SGLang server's own flag
    (``--max-num-seqs`` / ``--max-running-requests``), unless the server args set it already."""
    flag = "--max-num-seqs" if backend == "vllm" else "--max-running-requests"
    extra = list(server_args)
    if flag not in extra:
        extra += [flag, str(max_concurrent)]
    return extra


def server_settings(args: EngineArgs, actor_dir: Path) -> ServerSettings:
    """The launch settings of ``args``' server on the checkpoint ``actor_dir``. A launch key left null takes
    its derived value unless ``engine.server_args`` sets that flag (then the server args decide; the config
    refuses a key given both ways): eager mode is on when the server has no GPU (a Ray replica with
    ``cluster.engine_gpus=0``; locally, ``model.device`` resolving to cpu), the context limit is the episode
    budget, the tensor-parallel size is the replica's whole GPUs, and ``model.rope_scaling`` becomes the
    checkpoint's rope parameters as a model-config override."""
    s, flags = args.server, SERVER_LAUNCH_FLAGS
    in_args = {key: server_flag_given(args.server_args, flags[key][args.backend]) for key in flags}
    eager = s.enforce_eager
    if eager is None:
        eager = False if in_args["enforce_eager"] else not _server_has_gpu(s.replica_gpus, args.device)
    max_len = s.max_model_len
    if max_len is None and not in_args["max_model_len"]:
        max_len = s.episode_budget
    gpus = s.replica_gpus or 0.0
    overrides = None
    if s.rope_scaling is not None:
        overrides = {"rope_parameters": checkpoint_rope_parameters(actor_dir)}
    return ServerSettings(
        enforce_eager=eager, max_model_len=max_len, tensor_parallel_size=int(gpus) if gpus > 1 else 1,
        memory_fraction=s.gpu_memory_fraction, prefix_caching=s.prefix_caching, model_overrides=overrides,
    )  # fmt: skip


def _server_has_gpu(replica_gpus: float | None, device: str) -> bool:
    """A Ray replica has its bundle's GPUs; the local runtime's server the device ``model.device`` names."""
    if replica_gpus is not None:
        return replica_gpus > 0
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


async def check_context_limit(engine: Any, budget: int, backend: str, *, attached: bool = False) -> None:
    """Raise `EngineStartError` (after closing ``engine``) when the server's context limit (its
    ``max_model_len``: vLLM ``/v1/models``, SGLang ``/get_server_info``; unchecked when it reports none) is
    below the episode budget ``budget`` (``data.max_total_tokens``): episodes would be cut short."""
    limit = getattr(engine, "max_model_len", None)
    if limit is None or limit >= budget:
        return
    await engine.close()
    fix = (
        "start it with a longer context"
        if attached
        else "raise engine.max_model_len (or drop the limit from engine.server_args)"
    )
    raise EngineStartError(
        f"engine.backend={backend}: the server's context limit is {limit} tokens, below the episode budget "
        f"data.max_total_tokens={budget}; {fix}, or lower data.max_total_tokens"
    )


def checkpoint_rope_parameters(checkpoint: Path) -> dict[str, Any] | None:
    """The ``rope_parameters`` of ``checkpoint``'s config.json (transformers >= 5 format), if any."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    params = config.get("rope_parameters")
    return dict(params) if isinstance(params, Mapping) else None


def check_rope_scaling(rope_scaling: Mapping[str, Any] | None, checkpoint: Path) -> None:
    """Raise `ConfigError` naming ``model.rope_scaling`` when ``checkpoint`` (the run's actor: the derived
    checkpoint of `sao.models.loading.with_rope_scaling`, or a resumed run's own) does not carry it, e.g. a
    run resumed with another value than it was trained with."""
    if rope_scaling is None:
        return
    params = checkpoint_rope_parameters(checkpoint) or {}
    wanted = {("rope_type" if k == "type" else k): v for k, v in rope_scaling.items()}
    if any(params.get(k) != v for k, v in wanted.items()):
        raise ConfigError(
            f"model.rope_scaling={dict(rope_scaling)}: the run's checkpoint {str(checkpoint)!r} has rope "
            f"parameters {params}; a resumed run keeps the rope scaling it was trained with"
        )
