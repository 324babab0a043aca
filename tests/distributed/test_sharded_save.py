"""The HF directories a sharded trainer writes (`RankTrainer.save`, `sao.train.dcp.save_sharded`) on 2 gloo
ranks: a resume on ranks reads them back (`load_sharded_policy`, `load_sharded_critic`), ``from_pretrained``
and the one-process loaders read them, and they hold the tensors a one-process `CheckpointManager` writes
(MoE experts one tensor per expert), whichever way the trainer built its models."""

from __future__ import annotations

import faulthandler
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from sao.models.critic import load_critic
from sao.models.loading import load_policy
from sao.runtime.build import FACTORIES
from sao.train.checkpoint import CheckpointManager

from . import fsdp_scenarios as scenarios


@torch.no_grad()
def _perturb(model: torch.nn.Module) -> None:
    """Move every parameter away from the source checkpoint's, the same on every rank."""
    for i, param in enumerate(model.parameters()):
        param.add_(1e-3 * (i + 1))


def _worker(rank: int, port: int, model_dir: Path, ckpt: Path) -> None:
    from sao.models.sharded_loading import load_sharded_critic, load_sharded_policy
    from sao.models.sharding import full_state_dict
    from sao.train.rank import RankTrainer

    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(60, exit=True)  # a hung collective fails the test
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        trainer = RankTrainer(model_dir, None, FACTORIES["trainer"](scenarios.config("sao")),
                              dtype=torch.float32, device="cpu")  # fmt: skip
        assert trainer.critic is not None
        _perturb(trainer.actor)
        _perturb(trainer.critic)
        saved = {"actor": full_state_dict(trainer.actor), "critic": full_state_dict(trainer.critic)}
        trainer.save(ckpt)
        dist.barrier()  # rank 0 writes the HF directories after the others have returned
        actor = load_sharded_policy(ckpt / "actor", device="cpu")
        critic = load_sharded_critic(ckpt / "critic", device="cpu")
        loaded = {"actor": full_state_dict(actor), "critic": full_state_dict(critic)}
        if rank == 0:
            torch.save({"saved": saved, "loaded": loaded}, ckpt / "ranks.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _tensors(directory: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(directory / "model.safetensors", framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_sharded_trainers_hf_directories_load_sharded_plain_and_in_one_process_layout(
    tiny_moe_dir, tmp_path
):
    ckpt = tmp_path / "ckpt"
    mp.start_processes(_worker, args=(scenarios.free_port(), tiny_moe_dir, ckpt), nprocs=2,
                       start_method="spawn")  # fmt: skip
    ranks = torch.load(ckpt / "ranks.pt", weights_only=False)
    saved = ranks["saved"]
    assert not torch.equal(
        saved["actor"]["model.norm.weight"], load_policy(tiny_moe_dir, "float32", "cpu").model.norm.weight
    )  # the trainer's weights are not the source's
    _assert_equal(ranks["loaded"]["actor"], saved["actor"])  # a resume on ranks
    _assert_equal(ranks["loaded"]["critic"], saved["critic"])
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "actor", dtype=torch.float32)
    _assert_equal(hf.state_dict(), saved["actor"])
    _assert_equal(load_policy(ckpt / "actor", "float32", "cpu").state_dict(), saved["actor"])
    critic = load_critic(ckpt / "critic", freeze="none", dtype="float32", device="cpu")
    _assert_equal(critic.state_dict(), saved["critic"])

    run = CheckpointManager(tmp_path / "run")  # the one-process writer, on the source's plain models
    plain = run.save(0, actor=load_policy(tiny_moe_dir, "float32", "cpu"),
                     critic=load_critic(tiny_moe_dir, freeze="none", dtype="float32", device="cpu"),
                     trainer_state={})  # fmt: skip
    for name in ("actor", "critic"):
        written = _tensors(ckpt / name)
        assert written == _tensors(plain / name), name
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in _tensors(ckpt / "actor")
