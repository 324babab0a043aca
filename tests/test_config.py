"""The run config: presets carry the paper's values (docs/algorithms.md), precedence is defaults <- preset <-
YAML <- overrides, and every bad key or value is a ConfigError that names the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.config import AlgoConfig, ConfigError, RunConfig, dump_config, load_config
from sao.presets import PRESET_DESCRIPTIONS, PRESETS

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
TINY = ["model.tiny_arch=qwen3"]

# name: (advantage, policy_loss, eps_low, eps_high, k_critic, critic.freeze, group_size, value_pretrain)
EXPECTED = {
    "sao": ("skip_observation_gae", "dis", 0.3, 5.0, 2, "attention", 1, True),
    "grpo": ("grpo", "ppo_clip", 0.2, 0.28, None, None, 8, False),
    "grpo_dis": ("grpo", "dis", 0.3, 5.0, None, None, 8, False),
    "sao_dis_only": ("skip_observation_gae", "dis", 0.3, 5.0, 1, "none", 1, True),
    "sao_k1": ("skip_observation_gae", "dis", 0.3, 5.0, 1, "attention", 1, True),
    "sao_full_critic": ("skip_observation_gae", "dis", 0.3, 5.0, 2, "none", 1, True),
    "vapo": ("token_gae", "ppo_clip", 0.2, 0.28, 1, "none", 8, True),
    "running_mean_8": ("running_mean", "dis", 0.3, 5.0, None, None, 1, False),
    "running_mean_128": ("running_mean", "dis", 0.3, 5.0, None, None, 1, False),
    "spo": ("spo", "dis", 0.3, 5.0, None, None, 1, False),
    "step_average": ("step_gae", "dis", 0.3, 5.0, 2, "attention", 1, True),
    "step_last_token": ("step_gae", "dis", 0.3, 5.0, 2, "attention", 1, True),
}


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_every_preset_is_covered_and_described() -> None:
    assert set(PRESETS) == set(EXPECTED) == set(PRESET_DESCRIPTIONS)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_preset_loads_with_spec_values(name: str) -> None:
    advantage, loss, eps_low, eps_high, k, freeze, group, pretrain = EXPECTED[name]
    cfg = load_config(None, [*TINY, f"algo={name}"])
    algo = cfg.algo
    assert (algo.preset, algo.advantage.type, algo.loss.type) == (name, advantage, loss)
    assert (algo.loss.eps_low, algo.loss.eps_high, algo.group_size) == (eps_low, eps_high, group)
    assert algo.uses_critic == (k is not None)
    assert (algo.loss.reference == "old") == (loss == "ppo_clip")
    assert cfg.value_pretrain_enabled == pretrain
    if k is not None:
        assert (algo.k_critic, cfg.critic.freeze) == (k, freeze)
        adv = algo.advantage
        assert adv.lam_policy == "adaptive" and adv.adaptive_alpha == 1.5 and adv.lam_critic == 1.0


def test_preset_specific_parameters() -> None:
    def algo(name: str) -> AlgoConfig:
        return load_config(None, [*TINY, f"algo={name}"]).algo

    assert algo("vapo").loss.nll_coef == 0.1 and algo("sao").loss.nll_coef == 0.0
    rm8, rm128 = algo("running_mean_8").advantage, algo("running_mean_128").advantage
    assert (rm8.window, rm8.scope) == (8, "prompt")
    assert (rm128.window, rm128.scope) == (128, "global")
    assert algo("step_average").advantage.step_value == "average"
    assert algo("step_last_token").advantage.step_value == "last_token"
    spo = algo("spo").advantage
    assert (spo.d_half, spo.rho_min, spo.rho_max, spo.sampling_floor) == (0.06, 0.875, 0.96, 0.05)
    assert spo.prioritized_sampling
    assert algo("grpo").advantage.normalize_std


def test_algo_defaults_are_the_sao_preset() -> None:
    assert AlgoConfig() == AlgoConfig(**PRESETS["sao"]["algo"])


def test_default_preset_is_sao_and_spec_readings_are_defaults() -> None:
    cfg = load_config(None, TINY)
    assert cfg.algo.preset == "sao"
    algo = cfg.algo
    assert (algo.advantage.gamma, algo.loss.agg, algo.advantage.adaptive_length) == (
        1.0,
        "token-mean",
        "action",
    )
    assert algo.advantage.truncation == "terminal"
    assert cfg.critic.value_clip is None and cfg.critic.recompute_values


def test_override_beats_preset() -> None:
    cfg = load_config(None, [*TINY, "algo=sao", "algo.k_critic=4", "critic.freeze=none"])
    assert cfg.algo.k_critic == 4 and cfg.critic.freeze == "none"


def test_override_switches_preset_named_in_yaml(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "model: {tiny_arch: qwen3}\nalgo: {preset: sao}\n")
    cfg = load_config(path, ["algo=grpo_dis"])
    assert (cfg.algo.preset, cfg.algo.advantage.type, cfg.algo.group_size) == ("grpo_dis", "grpo", 8)
    assert load_config(path, ["algo.preset=vapo"]).algo.advantage.type == "token_gae"


def test_yaml_field_beats_preset_and_override_beats_yaml(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path, "model: {tiny_arch: qwen3}\nalgo: {preset: grpo_dis, loss: {eps_high: 2.0}}\n"
    )
    assert load_config(path).algo.loss.eps_high == 2.0
    assert load_config(path).algo.loss.eps_low == 0.3  # the preset's other loss fields stay
    assert load_config(path, ["algo.loss.eps_high=3.5"]).algo.loss.eps_high == 3.5
    # An explicit YAML field also survives a preset switch on the command line.
    assert load_config(path, ["algo=sao"]).algo.loss.eps_high == 2.0


def test_yaml_shorthand_names_the_preset(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "model: {tiny_arch: qwen3}\nalgo: spo\n")
    assert load_config(path).algo.advantage.type == "spo"


def test_override_values_are_parsed_as_yaml() -> None:
    cfg = load_config(
        None,
        [
            *TINY,
            "trainer.lr=1e-5",
            "logging.wandb=true",
            "critic.freeze=[q_proj, k_proj]",
            "critic.value_clip=0.2",
        ],
    )
    assert cfg.trainer.lr == 1e-5
    assert cfg.logging.wandb is True
    assert cfg.critic.freeze == ["q_proj", "k_proj"]
    assert cfg.critic.value_clip == 0.2
    assert (
        load_config(None, [*TINY, "critic.value_clip=0.2", "critic.value_clip=null"]).critic.value_clip
        is None
    )


def test_yaml_exponent_without_dot_is_a_float(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "model: {tiny_arch: qwen3}\ntrainer: {lr: 3e-4}\n")
    assert load_config(path).trainer.lr == 3e-4


def test_unknown_key_in_yaml_names_dotted_key_and_suggests(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "model: {tiny_arch: qwen3}\ncritic:\n  pretrain: {corpus_sise: 10}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "critic.pretrain.corpus_sise" in message
    assert "Did you mean 'critic.pretrain.corpus_size'" in message
    assert "ev_patience" in message  # the allowed keys of the section are listed


def test_unknown_key_in_override_names_dotted_key_and_suggests() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [*TINY, "algo.k_critc=3"])
    message = str(info.value)
    assert "algo.k_critc" in message and "Did you mean 'algo.k_critic'" in message


def test_unknown_section_in_override_is_named() -> None:
    with pytest.raises(ConfigError, match=r"'trainr\.lr'.*Did you mean 'trainer'"):
        load_config(None, [*TINY, "trainr.lr=1"])


def test_override_below_a_value_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"algo\.k_critic is a value, not a section"):
        load_config(None, [*TINY, "algo.k_critic.x=1"])


def test_override_without_equals_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        load_config(None, [*TINY, "algo.k_critic"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algo.loss.eps_low=1.5", r"algo\.loss\.eps_low: got 1\.5; .*less than 1"),
        ("algo.k_critic=0", r"algo\.k_critic: got 0; .*greater than or equal to 1"),
        ("algo.advantage.type=foo", r"algo\.advantage\.type: got 'foo'; .*'skip_observation_gae'"),
        ("algo.advantage.lam_policy=1.5", r"algo\.advantage\.lam_policy: got 1\.5; .*\[0, 1\]"),
        ("engine.top_p=0", r"engine\.top_p: got 0"),
        ("trainer.lr=fast", r"trainer\.lr: got 'fast'"),
    ],
)
def test_invalid_value_names_key_and_value(override: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [*TINY, override])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algo.eps_low=1.5", r"algo\.eps_low \(in overrides\) has moved: write algo\.loss\.eps_low=1\.5"),
        ("algo.advantage=foo", r"algo\.advantage \(in overrides\) .*write algo\.advantage\.type=foo"),
        (
            "algo.lam_policy=1.5",
            r"algo\.lam_policy \(in overrides\) has moved: write algo\.advantage\.lam_policy",
        ),
    ],
)
def test_flat_algo_key_is_refused_with_its_new_spelling(override: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [*TINY, override])


def test_grpo_with_single_rollout_names_group_size() -> None:
    with pytest.raises(ConfigError, match=r"algo\.group_size must be >= 2"):
        load_config(None, [*TINY, "algo=grpo", "algo.group_size=1"])


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["engine.backend=vllm", "engine.threads=1"], r"engine\.threads applies to backends 'local'"),
        (["runtime.backend=ray", "engine.threads=1"], r"engine\.threads applies to the local runtime"),
        (["runtime.backend=ray", "trainer.threads=1"], r"trainer\.threads applies to the local runtime"),
        (["engine.attach=http://h:8000"], r"engine\.attach applies to backends 'vllm' and 'sglang'"),
        (["engine.backend=process", "engine.server_args=[--x]"], r"engine\.server_args applies to backends"),
        (["engine.backend=vllm", "engine.attach=http://h", "engine.python=/p"], r"engine\.attach uses a"),
    ],
)
def test_engine_options_must_match_the_backend(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [*TINY, *overrides])
    load_config(None, [*TINY, "engine.backend=process", "engine.threads=2"])
    load_config(None, [*TINY, "engine.threads=1", "trainer.threads=1"])  # the in-process engine too
    load_config(None, [*TINY, "engine.backend=sglang", "engine.python=/p", "engine.server_args=[--x]"])


def test_batch_must_hold_whole_groups() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.batch_size \(12\).*algo\.group_size \(8\)"):
        load_config(None, [*TINY, "algo=grpo", "trainer.batch_size=12"])


def test_unknown_preset_lists_available() -> None:
    with pytest.raises(ConfigError, match=r"unknown preset 'ppo'.*grpo_dis.*step_last_token"):
        load_config(None, [*TINY, "algo=ppo"])


@pytest.mark.parametrize("model", [[], ["model.tiny_arch=qwen3", "model.path=/ckpt"]])
def test_model_needs_exactly_one_source(model: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"model: set exactly one of model\.path and model\.tiny_arch"):
        load_config(None, model)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_sections_reject_bad_assignment() -> None:
    cfg = load_config(None, TINY)
    with pytest.raises(ValueError):
        cfg.algo.loss.eps_low = 2.0


def test_critic_pretrain_enabled_overrides_preset() -> None:
    assert not load_config(None, [*TINY, "critic.pretrain.enabled=false"]).value_pretrain_enabled
    # Without a critic there is nothing to pretrain, whatever the flag says.
    assert not load_config(None, [*TINY, "algo=grpo", "critic.pretrain.enabled=true"]).value_pretrain_enabled


@pytest.mark.parametrize("name", ["sao", "grpo_dis", "vapo"])
def test_dump_then_load_round_trips(tmp_path: Path, name: str) -> None:
    cfg = load_config(None, [*TINY, f"algo={name}", "critic.freeze=[mlp]", "trainer.lr=2e-5", "name=x"])
    path = write_yaml(tmp_path, dump_config(cfg))
    assert load_config(path) == cfg
    assert RunConfig.model_validate(cfg.to_yaml_dict()) == cfg


def test_quickstart_loads() -> None:
    cfg = load_config(QUICKSTART)
    assert (cfg.model.path, cfg.model.tiny_arch) == ("runs/quickstart/sft", None)  # written by make demo
    assert (cfg.algo.preset, cfg.data.env, cfg.logging.run_dir) == ("sao", "calculator", "runs/quickstart/rl")
    assert load_config(QUICKSTART, ["algo=grpo_dis"]).algo.group_size == 8


# ---- the cluster section (runtime.backend=ray) -----------------------------------------------------------

_TINY = ["model.tiny_arch=qwen3_moe"]
_RAY = [*_TINY, "runtime.backend=ray"]


def test_a_ray_config_loads_and_resolves_its_weight_sync_path() -> None:
    cfg = load_config(
        None, [*_RAY, "cluster.num_cpus=4", "cluster.trainer_workers=2", "cluster.engine_replicas=2"]
    )
    assert cfg.cluster.requested() == {"CPU": 4.0, "GPU": 0.0}
    assert cfg.runtime.resolved_weight_sync(cfg.engine.backend) == "broadcast"
    assert cfg.runtime.resolved_weight_sync("vllm") == "disk"  # server replicas reload from a directory
    assert load_config(None, ["model.tiny_arch=qwen3_moe"]).runtime.resolved_weight_sync() == "inproc"
    again = load_config(None, [f"{k}={v}" for k, v in _flat(cfg.to_yaml_dict())])  # a dumped config reloads
    assert again.cluster == cfg.cluster


def _flat(data: dict, prefix: str = "") -> list[tuple[str, str]]:
    import json

    out = []
    for key, value in data.items():
        if isinstance(value, dict) and key != "env_kwargs":
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", json.dumps(value)))
    return out


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*_TINY, "cluster.trainer_workers=2"], r"cluster\.trainer_workers applies to runtime\.backend"),
        ([*_TINY, "runtime.weight_sync=broadcast"], r"runtime\.weight_sync='broadcast' applies"),
        ([*_RAY, "runtime.weight_sync=inproc"], r"weight_sync='inproc' needs runtime\.backend='local'"),
        ([*_RAY, "engine.backend=process"], r"engine\.backend='process' is for the local runtime"),
        ([*_RAY, "engine.backend=vllm", "runtime.weight_sync=broadcast"], r"server replicas reload"),
        ([*_RAY, "engine.backend=sglang", "engine.attach=http://x:1"], r"engine\.attach: with runtime"),
        ([*_RAY, "cluster.address=auto", "cluster.num_cpus=8"], r"cluster\.num_cpus applies to a cluster"),
        ([*_RAY, "cluster.num_cpus=2", "cluster.trainer_workers=2", "cluster.engine_replicas=2"],
         r"cluster\.trainer_cpus / cluster\.engine_cpus: the run asks for 4 CPU .* but the cluster has 2"),
        ([*_RAY, "cluster.num_gpus=1", "cluster.trainer_gpus=1", "cluster.engine_gpus=1"],
         r"cluster\.trainer_gpus / cluster\.engine_gpus: the run asks for 2 GPU"),
    ],
)  # fmt: skip
def test_cluster_settings_that_cannot_work_are_refused_at_load_naming_the_key(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.path=ckpt", "model.tiny_tokenizer=bpe"], r"model\.tiny_tokenizer applies to tiny models"),
        (["model.tiny_arch=qwen3", "model.dtype=float16"], r"model\.dtype=float16: .*loss scaling"),
        (["model.tiny_arch=qwen3", "model.master_dtype=float16"], r"model\.master_dtype"),
        (["model.tiny_arch=qwen3", "model.attn_implementation=flash"], r"model\.attn_implementation"),
    ],
)
def test_model_precision_and_tokenizer_keys_that_cannot_work_are_refused(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_paper_configs_train_with_fp32_master_weights_and_bf16_compute() -> None:
    for path in sorted((REPO / "configs" / "paper").glob("*.yaml")):
        cfg = load_config(path, [])
        assert (cfg.model.dtype, cfg.model.master_dtype, cfg.engine.dtype) == (
            "bfloat16",
            "float32",
            "bfloat16",
        )
        assert cfg.model.gradient_checkpointing is True, path


def test_the_bpe_quickstart_differs_from_the_quickstart_only_in_tokenizer_template_and_paths() -> None:
    plain = load_config(QUICKSTART, []).to_yaml_dict()
    bpe = load_config(REPO / "configs" / "quickstart_bpe.yaml", []).to_yaml_dict()
    assert (bpe["model"]["chat_template"], bpe["model"]["enable_thinking"]) == ("qwen3", True)
    for cfg in (plain, bpe):
        cfg.pop("name")
        cfg["model"].update(path=None, chat_template=None, enable_thinking=None)
        cfg["data"]["eval_file"] = cfg["logging"]["run_dir"] = None
    assert plain == bpe
