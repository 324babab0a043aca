"""Starting the rollout engine a run asked for (``engine.backend``) from its `EngineArgs`.

``local``: a `LocalEngine` in this process; ``process``: the same engine in a child process of its own;
``vllm`` / ``sglang``: a server launched on the run's model (or attached and given the run's weights).
A process or server that does not come up is an `EngineStartError` carrying the cause's message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sao.engine.types import InferenceEngine

if TYPE_CHECKING:
    from .args import EngineArgs

__all__ = ["EngineStartError", "server_extra_args", "start_engine"]


class EngineStartError(RuntimeError):
    """The rollout engine (a child process or a vLLM / SGLang server) could not be started or attached."""


async def start_engine(
    args: EngineArgs, actor_dir: Path, tokenizer_dir: Path, tokenizer: Any
) -> InferenceEngine:
    """The engine of ``args.backend`` serving the weights in ``actor_dir``; see the module docstring."""
    if args.backend == "local":
        from sao.engine import LocalEngine

        return LocalEngine(actor_dir, tokenizer, device=args.device, dtype=args.dtype,
                           max_running=args.max_concurrent, seed=args.seed)  # fmt: skip
    try:
        if args.backend in ("vllm", "sglang"):
            return await _server_engine(args, actor_dir)
        from sao.engine.process import ProcessEngine

        return await asyncio.to_thread(  # the constructor blocks until the child has loaded the model
            ProcessEngine, actor_dir, tokenizer_dir, device=args.device, dtype=args.dtype,
            max_running=args.max_concurrent, seed=args.seed, threads=args.threads,
        )  # fmt: skip
    except (OSError, RuntimeError) as err:  # TimeoutError is an OSError
        raise EngineStartError(f"engine.backend={args.backend}: {err}") from err


async def _server_engine(args: EngineArgs, actor_dir: Path) -> InferenceEngine:
    from sao.engine import SGLangEngine, VLLMEngine

    cls = VLLMEngine if args.backend == "vllm" else SGLangEngine
    if args.attach:
        engine = await cls.attach(args.attach)
        try:
            await engine.update_weights(actor_dir, engine.version)  # start from the run's weights
        except BaseException:
            await engine.close()
            raise
        return engine
    extra = server_extra_args(args.backend, args.server_args, args.max_concurrent)
    return await cls.launch(actor_dir, python=args.python, dtype=args.dtype, extra_args=extra)


def server_extra_args(backend: str, server_args: Sequence[str], max_concurrent: int) -> list[str]:
    """``engine.server_args`` plus ``engine.max_concurrent`` as the vLLM / SGLang server's own flag
    (``--max-num-seqs`` / ``--max-running-requests``), unless the server args set it already."""
    flag = "--max-num-seqs" if backend == "vllm" else "--max-running-requests"
    extra = list(server_args)
    if flag not in extra:
        extra += [flag, str(max_concurrent)]
    return extra
