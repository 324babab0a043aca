"""``eval.engine``: the frozen evaluation engine holds exactly the evaluated step's weights; the config
resolves ``auto`` and refuses ``frozen`` where no engine of its own can be started."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rich.console import Console

from sao.config import ConfigError, load_config
from sao.models.loading import load_policy
from sao.runtime.args import EngineArgs, ThreadArgs
from sao.runtime.backend import ModelDirs
from sao.runtime.factory_args import eval_args
from sao.runtime.local_backend import LocalBackend


def _engine_weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


@pytest.mark.parametrize("engine_dtype", ["float32", "bfloat16"])  # bf16: a cast copy of fp32 master weights
def test_a_frozen_evaluation_runs_on_the_weights_held_at_its_launch_whatever_the_trainer_does_next(
    tiny_moe_dir, tiny_tokenizer, engine_dtype
):
    engine = EngineArgs("local", "cpu", engine_dtype, 4, 0)
    backend = LocalBackend(ThreadArgs("local", 1, 1), engine, None, None, None, Console(quiet=True))
    backend.actor = load_policy(tiny_moe_dir, dtype=torch.float32, device="cpu")
    original = {k: v.detach().clone() for k, v in backend.actor.state_dict().items()}
    version = [3]
    frozen = backend.eval_engine(ModelDirs(tiny_moe_dir, tiny_moe_dir, tiny_moe_dir), tiny_tokenizer, 4,
                                 lambda: version[0])  # fmt: skip

    async def scenario():
        held_3 = frozen.hold()  # step 3's evaluation is launched
        with torch.no_grad():  # ... and the trainer moves on to step 4 before it runs
            for p in backend.actor.parameters():
                p.add_(0.5)
        version[0] = 4
        held_4 = frozen.hold()
        seen_3, start_3, end_3 = await frozen.run(held_3, lambda e: asyncio.sleep(0, _engine_weights(e)))
        first_engine = frozen.engine
        seen_4, start_4, end_4 = await frozen.run(held_4, lambda e: asyncio.sleep(0, _engine_weights(e)))
        assert frozen.engine is first_engine  # one engine for every evaluation

        async def broken(engine):
            raise RuntimeError("env exploded")

        with pytest.raises(RuntimeError, match="exploded"):
            await frozen.run(frozen.hold(), broken)
        assert frozen.engine is None  # the next evaluation starts a fresh engine
        _, start_5, _ = await frozen.run(frozen.hold(), lambda e: asyncio.sleep(0, None))
        await frozen.close()
        return (seen_3, start_3, end_3), (seen_4, start_4, end_4), start_5

    (seen_3, start_3, end_3), (seen_4, start_4, end_4), start_5 = asyncio.run(scenario())
    assert (start_3, end_3, start_4, end_4, start_5) == (3, 3, 4, 4, 4)
    moved = dict(backend.actor.state_dict())
    for name, value in seen_3.items():
        assert value.dtype == getattr(torch, engine_dtype), name
        assert torch.equal(value, original[name].to(value.dtype)), name
        assert torch.equal(seen_4[name], moved[name].to(value.dtype)), name


def _cfg(*overrides: str):
    return load_config(None, ["model.tiny_arch=qwen3_moe", "data.eval_file=held.jsonl", *overrides])


def test_auto_is_frozen_for_the_local_runtime_and_shared_for_a_server_engine():
    def resolved(cfg) -> str:
        return eval_args(cfg.data, cfg.eval, cfg.logging, cfg.engine, cfg.runtime).engine

    assert resolved(_cfg()) == "frozen"
    assert resolved(_cfg("engine.backend=process")) == "frozen"
    assert resolved(_cfg("engine.backend=vllm")) == "shared"
    assert resolved(_cfg("eval.engine=shared")) == "shared"


def test_frozen_is_refused_where_no_engine_of_its_own_can_be_started():
    with pytest.raises(
        ConfigError, match=r"eval\.engine='frozen'.*engine\.backend='vllm'.*eval\.engine: shared"
    ):
        _cfg("eval.engine=frozen", "engine.backend=vllm")
