"""What the FSDP tests run: the scenarios on 2 gloo ranks (`run_ranks`, spawned once per session by
``conftest.fsdp_runs``) and the same computations in one plain process (the ``reference_*`` functions).

Batches have trajectories of different lengths and a micro-batch budget that gives the two ranks different
numbers of micro-batches; rollout log-probs are the initial actor's plus noise (so DIS keeps most tokens
and SPO sees a divergence). Results are full CPU state dicts, metrics and trainer states.
"""

from __future__ import annotations

import copy
import faulthandler
import socket
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from transformers import AutoModelForCausalLM

from sao.config import load_config
from sao.models.attention import enable_packed_attention
from sao.models.critic import load_critic
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.models.tiny import tiny_config
from sao.runtime.build import FACTORIES
from sao.train.common import set_seed
from sao.train.split import shard_indices
from sao.train.step import Trainer
from sao.train.value_pretrain import ValuePretrainOptions, pretrain_value
from sao.types import Batch, Trajectory

WORLD = 2
# float64 (and eager MoE experts: grouped_mm has no float64 kernel): the rounding differences of another
# summation order stay far below the tests' tolerances; "sao_fp32" runs the production float32 path.
DTYPE = torch.float64
MICRO_BATCH_TOKENS = 40
PRESETS = {
    "sao": ["algo=sao"],
    "sao_fp32": ["algo=sao"],
    "sao_warmup": ["algo=sao", "critic.warmup_steps=1"],  # the actor's optimizer has not stepped at the save
    "grpo": ["algo=grpo", "algo.group_size=2"],
    "spo": ["algo=spo"],
}
PRETRAIN = ValuePretrainOptions(
    max_steps=3, batch_size=4, micro_batch_tokens=MICRO_BATCH_TOKENS, eval_every=2, lr=1e-3
)


def config(preset: str) -> Any:
    return load_config(
        overrides=[
            *PRESETS[preset], "model.tiny_arch=qwen3_moe", "model.dtype=float32", "model.device=cpu",
            "trainer.lr=1e-2", "critic.lr=1e-2", f"trainer.micro_batch_tokens={MICRO_BATCH_TOKENS}",
        ]
    )  # fmt: skip


def trajectories(lengths: list[int], seed: int, grouped: bool) -> list[Trajectory]:
    """Two-turn trajectories: prompt(4) + action + observation(3) + action; groups of two when
    ``grouped`` (prompts repeat either way), rewards in {0, 1}."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        first = (n - 7) // 2
        action = [0] * 4 + [1] * first + [0] * 3 + [1] * (n - 7 - first)
        turns = [-1] * 4 + [0] * (first + 3) + [1] * (n - 7 - first)
        out.append(
            Trajectory(
                prompt_id=f"p{i // 2}",
                token_ids=torch.randint(3, 250, (n,), generator=gen).tolist(),
                action_mask=action,
                rollout_logprobs=[0.0] * n,
                versions=[0 if a else -1 for a in action],
                turn_ids=turns,
                rewards=[float(torch.rand((), generator=gen) < 0.5)],
                group_id=f"g{seed}-{i // 2}" if grouped else None,
                traj_id=f"t{seed}-{i}",
            )
        )
    return out


def on_policy(actor: torch.nn.Module, trajs: list[Trajectory], seed: int) -> Batch:
    """The batch with rollout log-probs = ``actor``'s + N(0, 0.05²) noise on action tokens (capped at 0)."""
    batch = Batch.from_trajectories(trajs)
    with torch.no_grad():
        lp, _ = token_logprobs(actor, batch)
    noise = 0.05 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed))
    batch.rollout_logprobs = torch.where(batch.action_mask, (lp + noise).clamp(max=0.0), torch.zeros_like(lp))
    return batch


def make_batches(model_dir: Path) -> dict[str, list[Batch]]:
    """Per preset, the batches of its steps (the same for the ranks and the reference)."""
    actor = plain_models(model_dir, "grpo")[0]
    grouped = [[24, 12, 30, 9, 17, 20], [14, 26, 10, 33, 19, 8]]
    batches = {
        "grouped": [on_policy(actor, trajectories(lens, s, True), s) for s, lens in enumerate(grouped)],
        "single": [on_policy(actor, trajectories(lens, s, False), s) for s, lens in enumerate(grouped)],
        # one group: the second rank has no trajectory and runs padding micro-batches only
        "one_group": [on_policy(actor, trajectories([21, 16], 7, True), 7)],
    }
    return batches


def batches_for(preset: str, batches: dict[str, list[Batch]]) -> list[Batch]:
    if preset == "sao_fp32":
        return batches["grouped"][:1]
    if preset == "grpo":
        return [*batches["grouped"], *batches["one_group"]]
    if preset == "spo":
        return batches["single"]
    return batches["grouped"]


def shards(batch: Batch) -> list[list[int]]:
    return shard_indices(list(batch.group_ids), batch.seq_lengths.tolist(), WORLD)


def dtype_of(preset: str) -> torch.dtype:
    return torch.float32 if preset.endswith("_fp32") else DTYPE


def eager_experts(actor: torch.nn.Module, critic: torch.nn.Module | None) -> None:
    """float64 models: MoE experts by the eager loop (no float64 grouped_mm on CPU)."""
    if next(actor.parameters()).dtype == torch.float64:
        actor.set_experts_implementation("eager")
        if critic is not None:
            critic.model.set_experts_implementation("eager")


def plain_models(model_dir: Path, preset: str) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """Loaded as `RankTrainer` loads them (seed 0, then the actor, then the critic with a random head)."""
    dtype = dtype_of(preset)
    set_seed(0)
    actor = enable_packed_attention(load_policy(model_dir, dtype=dtype, device="cpu"))
    critic = None
    if config(preset).algo.uses_critic:
        critic = load_critic(model_dir, freeze="none", dtype=dtype, device="cpu", head_init="normal")
    eager_experts(actor, critic)
    return actor, critic


def plain_trainer(model_dir: Path, preset: str) -> Trainer:
    cfg = config(preset)
    actor, critic = plain_models(model_dir, preset)
    return Trainer(actor, critic, FACTORIES["trainer"](cfg))


def cpu_state(module: torch.nn.Module | None) -> dict[str, torch.Tensor] | None:
    return None if module is None else {k: v.detach().clone() for k, v in module.state_dict().items()}


def dense_model(tied: bool) -> torch.nn.Module:
    """A tiny dense Qwen3 (seed 1, float64), its LM head tied to the embedding or not."""
    cfg = tiny_config("qwen3", "test")
    cfg.tie_word_embeddings = tied
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPE)
    return enable_packed_attention(model)


def head_loss(model: torch.nn.Module, part: Batch, whole: Batch) -> torch.Tensor:
    """−Σ log π over ``part``'s action tokens / the whole batch's count; the head in chunks of 8 rows (a
    different number of chunks on each rank)."""
    lp, _ = token_logprobs(model, part, chunk_tokens=8)
    return -(lp * part.action_mask).sum() / whole.action_mask.sum()


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
            for n, p in model.named_parameters()}  # fmt: skip


# ---- one process ------------------------------------------------------------------------------------------


def reference_steps(model_dir: Path, preset: str, batches: list[Batch]) -> dict[str, Any]:
    """The plain `Trainer` on ``batches``: weights, metrics and trainer state after each step."""
    trainer = plain_trainer(model_dir, preset)
    steps = []
    for version, batch in enumerate(batches, start=1):
        metrics = trainer.train_step(batch, policy_version=version)
        steps.append(
            {"metrics": metrics, "actor": cpu_state(trainer.actor), "critic": cpu_state(trainer.critic),
             "state": trainer.state_dict(optimizers=False)}
        )  # fmt: skip
    return {"steps": steps, "trainer": trainer}


def reference_pretrain(model_dir: Path, corpus: list[Trajectory]) -> dict[str, torch.Tensor]:
    _, critic = plain_models(model_dir, "sao")
    assert critic is not None
    pretrain_value(critic, corpus, PRETRAIN)
    return cpu_state(critic)  # type: ignore[return-value]


# ---- the ranks --------------------------------------------------------------------------------------------


def _rank_steps(model_dir: Path, preset: str, batches: list[Batch], ckpt: Path | None) -> dict[str, Any]:
    from sao.models.sharding import full_state_dict
    from sao.train.rank import RankTrainer

    cfg = config(preset)
    rank = dist.get_rank()

    def build() -> RankTrainer:
        t = RankTrainer(model_dir, None, FACTORIES["trainer"](cfg), dtype=dtype_of(preset),
                        device="cpu", head_init="normal")  # fmt: skip
        eager_experts(t.actor, t.critic)
        return t

    def weights(t: RankTrainer) -> dict[str, Any]:
        return {"actor": full_state_dict(t.actor), "critic": full_state_dict(t.critic) if t.critic else None}

    trainer = build()
    steps, saved = [], {}
    for version, batch in enumerate(batches, start=1):
        metrics = trainer.train_step(batch, shards(batch)[rank], policy_version=version)
        steps.append({"metrics": metrics, **weights(trainer), "state": trainer.state_dict()})
        if ckpt is not None and version == 1:
            trainer.save(ckpt)
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            t = trainer.trainer
            saved = (
                copy.deepcopy(  # on the CPU the state dict shares AdamW's step tensors
                    {
                        "actor_optim": get_optimizer_state_dict(t.actor, t.actor_optim, options=options),
                        "critic_optim": get_optimizer_state_dict(t.critic, t.critic_optim, options=options),
                    }
                )
                if t.actor_optim.state
                else {}
            )
    out: dict[str, Any] = {"steps": steps, "saved_optim": saved}
    if ckpt is not None:  # a fresh trainer resumes from the checkpoint and redoes step 2
        resumed = build()
        resumed.load(ckpt)
        resumed.load_state_dict(steps[0]["state"])
        metrics = resumed.train_step(batches[1], shards(batches[1])[rank], policy_version=2)
        out["resumed"] = {"metrics": metrics, **weights(resumed), "state": resumed.state_dict()}
    return out


def _rank_lm_head(batch: Batch) -> dict[str, Any]:
    """Backbone, then the LM head in chunks, forward and backward, on sharded dense models (tied, untied)."""
    from sao.models.sharding import full_state_dict, shard_model

    out = {}
    for tied in (False, True):
        model = shard_model(dense_model(tied))
        local = batch.select(shards(batch)[dist.get_rank()])
        head_loss(model, local, batch).backward()
        out[tied] = {
            "grads": grads(model),
            "state": full_state_dict(model),
            "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        }
    return out


def _rank_pretrain(model_dir: Path, corpus: list[Trajectory]) -> dict[str, torch.Tensor]:
    from sao.models.sharding import full_state_dict
    from sao.train.rank import RankTrainer

    cfg = config("sao")
    trainer = RankTrainer(model_dir, None, FACTORIES["trainer"](cfg), dtype=DTYPE, device="cpu",
                          head_init="normal")  # fmt: skip
    eager_experts(trainer.actor, trainer.critic)
    trainer.pretrain_value(corpus, PRETRAIN)
    assert trainer.critic is not None
    frozen = [n for n, p in trainer.critic.named_parameters() if not p.requires_grad]
    assert frozen and all(".self_attn." in n for n in frozen)  # the RL freezing is back
    return full_state_dict(trainer.critic)


def _worker(rank: int, port: int, model_dir: Path, work: Path) -> None:
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(120, exit=True)  # a hung collective fails the test, not the session
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        batches = torch.load(work / "batches.pt", weights_only=False)
        results = {
            preset: _rank_steps(model_dir, preset, batches_for(preset, batches), checkpoint_dir(work, preset))
            for preset in PRESETS
        }
        results["pretrain"] = _rank_pretrain(model_dir, corpus())
        results["lm_head"] = _rank_lm_head(batches["grouped"][0])
        results.update(
            sharded_loading=_rank_sharded_loading(work / "loading"),
            pretrain_split=_rank_pretrain_split(model_dir),
        )
        if rank == 0:
            torch.save(results, work / "ranks.pt")
        dist.barrier()  # the ranks leave together: neither tears down its gloo threads while the other works
    finally:
        dist.destroy_process_group()


def checkpoint_dir(work: Path, preset: str) -> Path | None:
    """Where a scenario saves after its first step (None: it does not)."""
    return work / f"ckpt_{preset}" if preset in ("sao", "sao_warmup") else None


def corpus() -> list[Trajectory]:
    """The value-pretraining corpus."""
    return trajectories([24, 12, 30, 9, 17, 20, 14, 26], 11, False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(model_dir: Path, work: Path, batches: dict[str, list[Batch]]) -> dict[str, Any]:
    """Every scenario on 2 spawned gloo ranks; rank 0's results."""
    torch.save(batches, work / "batches.pt")
    mp.start_processes(_worker, args=(free_port(), model_dir, work), nprocs=WORLD, start_method="spawn")
    return torch.load(work / "ranks.pt", weights_only=False)


# ---- sharded loading and split value pretraining (test_sharded_loading.py) -------------------------------

LOADING_CASES = [
    (arch, tied, files)
    for arch in ("qwen3", "qwen3_moe")
    for tied in (False, True)
    for files in ("single", "multi")
]


def loading_case(arch: str, tied: bool, files: str) -> str:
    return f"{arch}-{'tied' if tied else 'untied'}-{files}"


def write_loading_checkpoints(root: Path) -> None:
    """The checkpoints the loading scenario reads: every `LOADING_CASES` case (float32; "multi": several
    safetensors files and an index), one saved in bfloat16, a saved critic with a trained-looking head, and
    three broken ones (a tensor missing, an unknown tensor, a tensor of the wrong shape)."""
    from safetensors.torch import load_file, save_file

    for arch, tied, files in LOADING_CASES:
        cfg = tiny_config(arch, "test")  # type: ignore[arg-type]
        cfg.tie_word_embeddings = tied
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(len(loading_case(arch, tied, files)))
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        shard = {"max_shard_size": "150KB"} if files == "multi" else {}
        model.save_pretrained(root / loading_case(arch, tied, files), **shard)
        if (arch, tied, files) == ("qwen3", True, "multi"):
            model.to(torch.bfloat16).save_pretrained(root / "bf16", **shard)
    source = root / loading_case("qwen3_moe", False, "single")
    set_seed(3)
    load_critic(source, freeze="none", dtype=torch.float32, device="cpu", head_init="normal").save_pretrained(
        root / "critic"
    )
    state = load_file(source / "model.safetensors")
    for name, change in {
        "missing": lambda s: s.pop("model.norm.weight"),
        "unknown": lambda s: s.update({"model.layers.9.mlp.gate.weight": torch.zeros(4, 64)}),
        "shape": lambda s: s.update({"model.norm.weight": torch.zeros(65)}),
    }.items():
        broken = dict(state)
        change(broken)
        (root / name).mkdir()
        (root / name / "config.json").write_bytes((source / "config.json").read_bytes())
        save_file(broken, root / name / "model.safetensors")


def _rank_sharded_loading(root: Path) -> dict[str, Any]:
    """Sharded loads next to today's path (full load, then `shard_model`): full state dicts and buffers of
    both, for every case; critics (new heads, a saved one); bfloat16; the errors of broken checkpoints."""
    from sao.models.critic import CriticModel
    from sao.models.sharded_loading import load_sharded_critic, load_sharded_policy
    from sao.models.sharding import full_state_dict, shard_model

    if dist.get_rank() == 0:
        write_loading_checkpoints(root)
    dist.barrier()

    def both(model: torch.nn.Module) -> dict[str, Any]:
        inner = model.model if isinstance(model, CriticModel) else model
        return {"state": full_state_dict(model), "buffers": {k: v.clone() for k, v in inner.named_buffers()},
                "training": model.training}  # fmt: skip

    out: dict[str, Any] = {}
    seen: list[tuple[bool, str]] = []

    def prepare(model: torch.nn.Module) -> None:  # what it sees: not yet sharded, not yet allocated
        param = next(model.parameters())
        seen.append((hasattr(param, "full_tensor"), param.device.type))

    cases = [(loading_case(*c), torch.float32) for c in LOADING_CASES]
    cases += [("bf16", torch.float32), ("bf16", torch.bfloat16), (loading_case("qwen3_moe", True, "multi"),
              torch.float64)]  # fmt: skip
    for name, dtype in cases:
        sharded = load_sharded_policy(root / name, device="cpu", master_dtype=dtype, prepare=prepare)
        full = shard_model(enable_packed_attention(load_policy(root / name, dtype=dtype, device="cpu")))
        out[(name, dtype)] = {
            "sharded": both(sharded),
            "full": both(full),
            "tied": sharded.lm_head.weight is sharded.model.embed_tokens.weight,
            "attention": sharded.config._attn_implementation,
            "local_rows": sharded.model.embed_tokens.weight.to_local().shape[0],
        }
    critic_source = root / loading_case("qwen3_moe", False, "single")
    heads: list[tuple[Path, Literal["zero", "normal"]]] = [
        (critic_source, "zero"), (critic_source, "normal"), (root / "critic", "zero")
    ]  # fmt: skip
    for source, head_init in heads:
        set_seed(5)
        sharded = load_sharded_critic(source, device="cpu", head_init=head_init, prepare=prepare)
        set_seed(5)
        full = load_critic(source, freeze="none", dtype=torch.float32, device="cpu", head_init=head_init)
        shard_model(full)
        out[("critic", source.name, head_init)] = {"sharded": both(sharded), "full": both(full)}
    out["prepare"] = seen
    errors = {}
    for name in ("missing", "unknown", "shape"):
        try:
            load_sharded_policy(root / name, device="cpu")
        except ValueError as err:
            errors[name] = str(err)
    out["errors"] = errors
    out["reads"] = _read_accounting(root / loading_case("qwen3_moe", False, "multi"))
    return out


READ_BLOCK_BYTES = 1024  # the block size of the read-accounting load (larger than any row of the tiny models)


def _read_accounting(path: Path) -> dict[str, Any]:
    """A sharded load of ``path`` in blocks of `READ_BLOCK_BYTES`, every tensor read from its safetensors
    file recorded (the real ``safe_open``, observed): this rank's reads and its shards' bytes, and every
    rank's read total."""
    import contextlib

    from safetensors import safe_open

    from sao.models import shard_reading
    from sao.models.sharded_loading import load_sharded_policy

    reads: list[int] = []

    class Slice:  # a tensor's lazy view: records the bytes of every slice read through it
        def __init__(self, view: Any) -> None:
            self.view = view

        def __getitem__(self, index: Any) -> torch.Tensor:
            tensor = self.view[index]
            reads.append(tensor.nbytes)
            return tensor

        def __getattr__(self, name: str) -> Any:
            return getattr(self.view, name)

    class Handle:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def get_slice(self, name: str) -> Slice:
            return Slice(self.handle.get_slice(name))

        def get_tensor(self, name: str) -> torch.Tensor:
            tensor = self.handle.get_tensor(name)
            reads.append(tensor.nbytes)
            return tensor

        def keys(self) -> list[str]:
            return self.handle.keys()

    @contextlib.contextmanager
    def observed_open(file: Any, framework: str) -> Any:
        with safe_open(file, framework=framework) as handle:
            yield Handle(handle)

    block = shard_reading._BLOCK_BYTES
    shard_reading.safe_open, shard_reading._BLOCK_BYTES = observed_open, READ_BLOCK_BYTES
    try:
        model = load_sharded_policy(path, device="cpu", master_dtype=torch.float32)
    finally:
        shard_reading.safe_open, shard_reading._BLOCK_BYTES = safe_open, block
    shards = sum(p.to_local().nbytes for p in model.parameters())  # float32 in memory and on disk
    totals: list[Any] = [None] * WORLD
    dist.all_gather_object(totals, sum(reads))
    return {"largest": max(reads), "read": sum(reads), "shards": shards, "every_rank": totals}


PRETRAIN_SPLIT = ValuePretrainOptions(
    max_steps=12, batch_size=5, micro_batch_tokens=MICRO_BATCH_TOKENS, eval_frac=0.3, eval_every=2,
    ev_patience=2, ev_min_delta=0.2, lr=1e-3,
)  # fmt: skip  # patience 2 with a large min delta: stops early, after a few evaluations


def pretrain_split_corpus() -> list[Trajectory]:
    """Uneven lengths (ranks get different micro-batch counts), held-out batches of 5 and 1."""
    return trajectories(
        [24, 12, 30, 9, 17, 20, 14, 26, 33, 8, 19, 10, 27, 15, 22, 11, 29, 13, 18, 25], 17, False
    )


def count_tokens(critic: torch.nn.Module) -> tuple[list[int], Any]:
    """``([n], handle)``: n counts the tokens of every forward of ``critic`` until ``handle.remove()``."""
    tokens = [0]

    def count(_: torch.nn.Module, args: tuple[Any, ...]) -> None:
        tokens[0] += args[0].numel()

    return tokens, critic.register_forward_pre_hook(count)


def reference_pretrain_split(model_dir: Path) -> dict[str, Any]:
    import dataclasses

    _, critic = plain_models(model_dir, "sao")
    assert critic is not None
    tokens, hook = count_tokens(critic)
    result = pretrain_value(critic, pretrain_split_corpus(), PRETRAIN_SPLIT)
    hook.remove()
    return {"critic": cpu_state(critic), "result": dataclasses.asdict(result), "tokens": tokens[0]}


def _rank_pretrain_split(model_dir: Path) -> dict[str, Any]:
    """`RankTrainer.pretrain_value` with early stopping; the tokens each rank's critic forwarded."""
    import dataclasses

    from sao.models.sharding import full_state_dict
    from sao.train.rank import RankTrainer

    cfg = config("sao")
    trainer = RankTrainer(model_dir, None, FACTORIES["trainer"](cfg), dtype=DTYPE, device="cpu",
                          head_init="normal")  # fmt: skip
    eager_experts(trainer.actor, trainer.critic)
    assert trainer.critic is not None
    tokens, hook = count_tokens(trainer.critic)
    result = trainer.pretrain_value(pretrain_split_corpus(), PRETRAIN_SPLIT)
    hook.remove()
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, {"result": dataclasses.asdict(result), "tokens": tokens[0]})
    return {"critic": full_state_dict(trainer.critic), "ranks": gathered}
