"""The paper-scale configs (configs/paper/) load, keep the paper's hyperparameters, and their resource plans
(`sao.plan.resources`) give the figures the files and docs/paper_configs.md promise."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sao.config import ConfigError, RunConfig, load_config
from sao.plan.resource_table import format_resource_plan
from sao.plan.resources import Architecture, critic_parameter_sizes, parameter_sizes, resource_plan

ROOT = Path(__file__).resolve().parents[2]
PAPER_CONFIGS = sorted((ROOT / "configs" / "paper").glob("*.yaml"))
GIB = 1024**3

_SAO = {
    "algo.preset": "sao",
    "algo.advantage.type": "skip_observation_gae",
    "algo.loss.type": "dis",
    "algo.group_size": 1,
    "algo.k_critic": 2,
    "critic.freeze": "attention",
    "critic.lr": 5e-6,
    "critic.lr_warmup_steps": 10,
    "trainer.lr": 1e-6,
    "trainer.batch_size": 128,
}
_MATH = {"data.env": "math_tir", "data.max_turns": 50, "data.max_total_tokens": 131072}
_GRPO = {"algo.advantage.type": "grpo", "algo.group_size": 8, "trainer.batch_size": 128, "trainer.lr": 1e-6}
_STYLE = {"data.env": "style_shift", "data.max_turns": 1, "trainer.batch_size": 128, "trainer.lr": 1e-6}
# What each file promises (the paper's values), by file stem: a new file needs an entry here.
EXPECTED: dict[str, dict[str, Any]] = {
    "math_tir_sao": {**_SAO, **_MATH, "algo.loss.eps_low": 0.3, "algo.loss.eps_high": 5.0},
    "coding_agent_sao": {
        **_SAO,
        "data.env": "code_tests",
        "data.max_turns": 300,
        "data.max_total_tokens": 131072,
        "algo.loss.eps_low": 0.8,
        "algo.loss.eps_high": 3.0,
    },
    "math_tir_grpo": {
        **_GRPO,
        **_MATH,
        "algo.preset": "grpo",
        "algo.loss.type": "ppo_clip",
        "algo.loss.eps_low": 0.2,
        "algo.loss.eps_high": 0.28,
    },
    "math_tir_grpo_dis": {
        **_GRPO,
        **_MATH,
        "algo.preset": "grpo_dis",
        "algo.loss.type": "dis",
        "algo.loss.eps_low": 0.3,
        "algo.loss.eps_high": 5.0,
    },
    "style_shift_sao": {**_SAO, **_STYLE},
    "style_shift_running_mean_128": {
        **_STYLE,
        "algo.preset": "running_mean_128",
        "algo.advantage.type": "running_mean",
        "algo.advantage.window": 128,
        "algo.advantage.scope": "global",
        "algo.group_size": 1,
    },
}


def _get(cfg: RunConfig, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_every_paper_config_states_its_promises() -> None:
    assert {p.stem for p in PAPER_CONFIGS} == set(EXPECTED)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_config_keeps_the_papers_hyperparameters(path: Path) -> None:
    cfg = load_config(path)
    wrong = {k: _get(cfg, k) for k, v in EXPECTED[path.stem].items() if _get(cfg, k) != v}
    assert not wrong, f"{path.name}: {wrong}"
    assert (cfg.engine.temperature, cfg.engine.top_p) == (1.0, 1.0)  # the paper samples at 1.0 / 1.0
    assert cfg.trainer.batch_size % cfg.algo.group_size == 0


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_config_runs_qwen3_moe_on_a_joined_ray_cluster_with_server_engines(path: Path) -> None:
    cfg = load_config(path)
    assert (cfg.model.path, cfg.model.dtype, cfg.model.device) == ("Qwen/Qwen3-30B-A3B", "bfloat16", "cuda")
    assert (cfg.runtime.backend, cfg.cluster.address) == ("ray", "auto")
    assert cfg.engine.backend in ("vllm", "sglang")
    assert cfg.runtime.resolved_weight_sync(cfg.engine.backend) == "disk"
    assert cfg.cluster.trainer_gpus >= 1 and cfg.cluster.engine_gpus >= 1
    # The servers' context limit is the trajectory budget and a replica's GPUs its tensor-parallel size,
    # both derived from the config (engine.max_model_len, cluster.engine_gpus), not given as server flags.
    args = cfg.engine.server_args
    assert "--max-model-len" not in args and "--tensor-parallel-size" not in args
    assert cfg.engine.max_model_len in (None, cfg.data.max_total_tokens)
    assert cfg.cluster.engine_gpus == int(cfg.cluster.engine_gpus)


@pytest.mark.parametrize(
    "path", [p for p in PAPER_CONFIGS if "env_kwargs" in p.read_text()], ids=lambda p: p.stem
)
def test_paper_config_env_kwargs_build_the_env(path: Path) -> None:
    from sao.runtime.build import FACTORIES, build_env_factory

    cfg = load_config(path)
    env = build_env_factory(FACTORIES["env"](cfg))()  # a wrong kwarg is a ConfigError naming data.env_kwargs
    assert env.max_turns == cfg.data.max_turns


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_config_header_names_what_cluster_and_command(path: Path) -> None:
    text = path.read_text()
    header = text[: text.index("\nname:")]
    assert all(line.startswith("#") for line in header.splitlines())
    assert header.startswith(("# Reproduces", "# The baseline"))
    assert f"sao train configs/paper/{path.name}" in header
    plan = resource_plan(load_config(path))
    total, trainer, engines = map(
        float, re.search(r"(\d+) GPUs .*= trainer (\d+) \+ engines (\d+)", header).groups()
    )
    assert (total, trainer, engines) == (plan.total_gpus, plan.trainer_gpus, plan.engine_gpus)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_config_resource_plan_adds_up_and_fits(path: Path) -> None:
    cfg = load_config(path)
    plan = resource_plan(cfg)
    assert plan.kv_bytes_per_token == 96 * 1024  # 2 × 48 layers × 4 KV heads × 128 × 2 B
    assert plan.kv_bytes_per_sequence == 96 * 1024 * cfg.data.max_total_tokens
    assert plan.params_total == pytest.approx(30.5e9, rel=0.02)  # model card: 30.5B total, 3.3B activated
    assert plan.params_active == pytest.approx(3.3e9, rel=0.03)
    assert plan.weight_bytes == 2 * plan.params_total
    assert plan.trainer_gpus == cfg.cluster.trainer_workers * cfg.cluster.trainer_gpus
    assert plan.engine_gpus == cfg.cluster.engine_replicas * cfg.cluster.engine_gpus
    assert plan.total_gpus == plan.trainer_gpus + plan.engine_gpus == cfg.cluster.requested()["GPU"]
    assert plan.sequences_per_replica is not None and plan.sequences_per_replica >= 1
    assert (plan.critic_params > 0) == cfg.algo.uses_critic
    # fp32 master weights, bf16 compute, checkpointing; the largest micro-batch is one full trajectory
    precision = (plan.compute_dtype, plan.master_dtype, plan.gradient_checkpointing)
    assert precision == ("bfloat16", "float32", True)
    assert plan.micro_batch_tokens == max(cfg.trainer.micro_batch_tokens, cfg.data.max_total_tokens)
    memory = plan.trainer_memory
    assert memory is not None and memory.engine == 0  # the engines have GPUs of their own
    assert memory.state == plan.trainer_state_bytes_per_gpu
    activations = memory.activations_kept + max(memory.activations_working, memory.lm_head_chunk)
    assert plan.trainer_peak_bytes_per_gpu == memory.state + memory.gathered + activations


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_config_trainer_fits_its_gpus_with_its_reduce_per_micro_batch(path: Path) -> None:
    """One 128k-token trajectory is a micro-batch of its own: the files reduce-scatter per micro-batch, and
    the SAO ones (actor and critic state) use 48 trainer GPUs, where 32 would peak at ~87 GiB of 80."""
    plan = resource_plan(load_config(path))
    assert not plan.unsharded_gradient
    assert plan.trainer_headroom_bytes is not None and plan.trainer_headroom_bytes > 0


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_one_reduce_per_step_holds_a_full_unsharded_fp32_gradient_on_every_rank(path: Path) -> None:
    cfg = load_config(path)
    step = resource_plan(load_config(path, ["trainer.gradient_sync=step"]))
    per_micro_batch = resource_plan(load_config(path, ["trainer.gradient_sync=micro_batch"]))
    assert step.unsharded_gradient  # several long trajectories per rank: several micro-batches
    assert step.trainer_memory is not None and per_micro_batch.trainer_memory is not None
    extra = step.trainer_memory.gathered - per_micro_batch.trainer_memory.gathered
    assert extra == 4 * step.params_total  # the actor's (the larger model) fp32 gradient, unsharded
    assert resource_plan(cfg).unsharded_gradient == (cfg.trainer.gradient_sync == "step")


def _small_dense_checkpoint(directory: Path) -> Path:
    config = {
        "model_type": "qwen3",
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "intermediate_size": 16,
        "vocab_size": 10,
        "tie_word_embeddings": False,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_resource_plan_of_a_small_dense_model_matches_the_hand_computation(tmp_path: Path) -> None:
    overrides = [
        f"model.path={_small_dense_checkpoint(tmp_path)}",
        "model.dtype=float32",
        "engine.dtype=float32",
        "data.max_total_tokens=100",
        "runtime.backend=ray",
        "cluster.num_cpus=8",
        "cluster.num_gpus=5",
        "cluster.trainer_workers=2",
        "cluster.trainer_gpus=1",
        "cluster.engine_replicas=3",
        "cluster.engine_gpus=1",
    ]
    plan = resource_plan(load_config(None, overrides), gpu_memory_gib=1 / 1024, engine_memory_fraction=0.5)
    # Per layer: q 8·8 + k 4·8 + v 4·8 + o 8·8 = 192, q/k norms 4 + 4, MLP 3·16·8 = 384, two norms 16: 600.
    # Embeddings 10·8 = 80, final norm 8, LM head 80.
    assert plan.params_total == plan.params_active == 80 + 2 * 600 + 8 + 80 == 1368
    assert plan.kv_bytes_per_token == 2 * 2 * 1 * 4 * 4 == 64
    assert plan.kv_bytes_per_sequence == 6400
    assert plan.weight_bytes == 1368 * 4
    assert plan.sequences_per_replica == (1024**2 // 2 - 1368 * 4) // 6400 == 81
    assert (plan.trainer_gpus, plan.engine_gpus, plan.total_gpus) == (2, 3, 5)
    # Critic: no LM head, a value head of 8 + 1; frozen attention 2 × (192 + 8) = 400.
    assert (plan.critic_params, plan.critic_trainable_params) == (1368 - 80 + 9, 1297 - 400)
    assert plan.trainer_state_bytes == 16 * 1368 + 16 * 897 + 4 * 400 == 37_840
    assert plan.trainer_state_bytes_per_gpu == 18_920


def test_critic_freeze_patterns_count_as_sao_models_freezing_matches_them(tmp_path: Path) -> None:
    overrides = [f"model.path={_small_dense_checkpoint(tmp_path)}", "model.dtype=float32"]
    plan = resource_plan(load_config(None, [*overrides, r"critic.freeze=['mlp\.(up|down)_proj']"]))
    assert plan.critic_trainable_params == 1297 - 2 * 2 * 16 * 8
    assert (
        resource_plan(load_config(None, [*overrides, "critic.freeze=none"])).critic_trainable_params == 1297
    )
    assert resource_plan(load_config(None, [*overrides, "algo=grpo"])).critic_params == 0


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3"])
@pytest.mark.parametrize("size", ["test", "small"])
def test_parameter_sizes_are_the_transformers_models_parameters(arch: str, size: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from sao.models.tiny import tiny_config

    config = tiny_config(arch, size)
    architecture = Architecture.from_hf_config(config.to_dict())
    config.num_labels = 1
    with torch.device("meta"):
        policy = AutoModelForCausalLM.from_config(config)
        critic = AutoModelForTokenClassification.from_config(config)
    assert parameter_sizes(architecture) == {n: p.numel() for n, p in policy.named_parameters()}
    assert critic_parameter_sizes(architecture) == {n: p.numel() for n, p in critic.named_parameters()}


def test_tiny_arch_plan_uses_saos_tiny_config() -> None:
    overrides = ["model.path=null", "model.tiny_arch=qwen3_moe", "model.tiny_size=small"]
    plan = resource_plan(load_config(ROOT / "configs/quickstart.yaml", overrides))
    assert plan.params_total == 2_003_008  # sao.models.tiny's table
    assert plan.architecture_source == "sao tiny config qwen3_moe/small"
    assert (plan.total_gpus, plan.sequences_per_replica, plan.trainer_state_bytes_per_gpu) == (0, None, None)


def test_local_checkpoint_config_json_is_read_before_the_shipped_table(tmp_path: Path) -> None:
    checkpoint = tmp_path / "Qwen3-30B-A3B"
    checkpoint.mkdir()
    plan = resource_plan(load_config(None, [f"model.path={_small_dense_checkpoint(checkpoint)}"]))
    assert plan.params_total == 1368 and plan.architecture_source == str(checkpoint / "config.json")
    absent = resource_plan(load_config(None, [f"model.path={tmp_path / 'models' / 'Qwen3-30B-A3B'}"]))
    assert absent.params_total == 30_532_122_624  # not there yet: the shipped table, by the model's name


def test_unknown_model_path_is_an_error_naming_model_path() -> None:
    with pytest.raises(ConfigError, match=r"model\.path: 'no/such-model' has no config\.json"):
        resource_plan(load_config(None, ["model.path=no/such-model"]))


def test_unsupported_model_type_is_an_error_naming_model_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match=r"model\.path: .*'llama' is not supported"):
        resource_plan(load_config(None, [f"model.path={tmp_path}"]))


def test_formatted_plan_shows_the_figures() -> None:
    plan = resource_plan(load_config(ROOT / "configs/paper/math_tir_sao.yaml"))
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(format_resource_plan(plan))
    text = console.export_text()
    for figure in (
        "96 KiB",
        "12 GiB",
        "30.53B total, 3.353B active",
        "trainer 48 + engines 16",
        "77.6 GiB of 80",
    ):
        assert figure in text


def test_importing_the_planner_does_not_import_torch() -> None:
    code = "import sys, sao.plan.resources; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


def test_paper_configs_page_shows_the_plans_as_generated_now() -> None:
    from sao.plan.paper_doc import render_blocks, render_page

    page = (ROOT / "docs" / "paper_configs.md").read_text()
    blocks = render_blocks(ROOT / "configs" / "paper")
    assert render_page(page, blocks) == page, "docs/paper_configs.md is stale: python -m sao.plan.paper_doc"
    assert blocks["math_tir_sao"] in page and blocks["summary"] in page
    with pytest.raises(KeyError):
        render_page("<!-- plan:nope -->\nold\n<!-- /plan -->", blocks)
