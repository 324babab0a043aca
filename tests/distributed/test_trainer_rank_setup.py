"""A trainer rank (`TrainerRankActor.setup`, the body of a Ray rank, run here in-process as a 1-rank gloo
world) builds its models from the trainer's compute settings (`TrainerGroupArgs.compute`, the run's
``model.*`` keys), not from the engine's dtype, and hands the engines weights in their own dtype."""

from __future__ import annotations

import torch
from tests.conftest import free_port

from sao.config import load_config
from sao.models.forward import token_logprobs
from sao.models.prepare import checkpointing_enabled
from sao.runtime.build import FACTORIES
from sao.runtime.trainer_group import TrainerGroupArgs, TrainerRankActor
from sao.runtime.weight_sync import push_dtype
from sao.types import Batch, Trajectory


def _batch() -> Batch:
    action = [0, 0, 1, 1, 1, 1]
    traj = Trajectory(prompt_id="p", token_ids=[5, 6, 7, 8, 9, 10], action_mask=action,
                      rollout_logprobs=[0.0] * 6, versions=[0 if a else -1 for a in action],
                      turn_ids=[-1, -1, 0, 0, 0, 0], rewards=[1.0])  # fmt: skip
    return Batch.from_trajectories([traj])


def test_a_rank_holds_master_weights_computes_in_the_model_dtype_and_checkpoints(tiny_moe_dir):
    cfg = load_config(None, [
        "model.tiny_arch=qwen3_moe", "model.device=cpu", "model.dtype=bfloat16", "model.master_dtype=float32",
        "model.gradient_checkpointing=true", "engine.dtype=float16",
    ])  # fmt: skip
    compute = FACTORIES["critic"](cfg).compute
    args = TrainerGroupArgs(actor_dir=str(tiny_moe_dir), critic_dir=None, trainer=FACTORIES["trainer"](cfg),
                            compute=compute, threads=1, head_init="zero",
                            push_dtype=push_dtype("local", "float16", "cpu"))  # fmt: skip
    threads = torch.get_num_threads()
    rank = TrainerRankActor(0, 1, threads=1)
    try:
        rank.setup("127.0.0.1", free_port(), args)
        actor, critic = rank.trainer.actor, rank.trainer.critic
        assert critic is not None
        params = [*actor.parameters(), *critic.parameters()]
        assert {p.dtype for p in params} == {torch.float32}  # master weights, not the engine's float16
        assert all(hasattr(p, "to_local") for p in params)  # FSDP2 shards
        assert checkpointing_enabled(actor) and checkpointing_enabled(critic)
        seen: list[torch.dtype] = []
        layer = actor.model.layers[0]
        hook = layer.register_forward_hook(lambda _m, _a, out: seen.append(out[0].dtype))
        token_logprobs(actor, _batch())
        hook.remove()
        assert seen == [torch.bfloat16]  # FSDP's mixed policy: the layer computes in model.dtype
        pushed = rank.full_state()  # what the engines get: their dtype; the trainer's weights stay float32
        assert {t.dtype for t in pushed.values() if t.is_floating_point()} == {torch.float16}
        assert {p.dtype for p in actor.parameters()} == {torch.float32}
    finally:
        rank.close()
        torch.set_num_threads(threads)
