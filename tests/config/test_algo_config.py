"""The typed ``algo`` section at load: flat keys of earlier versions are refused with their new spelling
(which then loads), a section chosen by ``type`` merges key by key while the type stays and starts afresh from
the new class's defaults when a layer names another type."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.algos import DIS, GRPO, SPO, RunningMean
from sao.config import ConfigError, load_config
from sao.config.algo import MOVED_KEYS, AlgoConfig
from sao.config.unions import union_variants

TINY = ["model.tiny_arch=qwen3_moe"]


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text("model: {tiny_arch: qwen3_moe}\n" + text)
    return path


def _refused(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, [*TINY, *overrides])
    return str(err.value)


def _new_home(old: str) -> tuple[str, str, str, object]:
    """``(section, field, a type that has it, a valid value)`` for the flat key ``old``."""
    section, field = MOVED_KEYS[old].split(".")
    variants = {t: c for t, c in (union_variants(AlgoConfig, section) or {}).items() if t != "custom"}
    if field == "type":
        tag = sorted(variants)[-1]
        return section, field, tag, tag
    tag, cls = next((t, c) for t, c in variants.items() if field in c.model_fields)
    return section, field, tag, cls.model_fields[field].default


# ---- flat keys of earlier versions ---------------------------------------------------------------------


def test_a_flat_algo_override_is_refused_with_its_new_spelling():
    message = _refused(["algo.eps_low=0.2"])
    assert "algo.eps_low" in message and "write algo.loss.eps_low=0.2" in message


def test_a_section_given_as_a_name_is_refused_with_its_type_spelling():
    message = _refused(["algo.advantage=grpo"])
    assert "write algo.advantage.type=grpo" in message and "advantage: {type: grpo}" in message
    assert "write algo.loss.type=ppo_clip" in _refused(["algo.loss=ppo_clip"])


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_every_moved_key_is_refused_with_a_spelling_that_loads(old):
    section, field, tag, value = _new_home(old)
    spelled = f"algo.{section}.{field}={value}"
    assert f"write {spelled}" in _refused([f"algo.{old}={value}"])
    group = ["algo.group_size=8"] if tag == "grpo" else []
    cfg = load_config(None, [*TINY, *group, f"algo.{section}.type={tag}", spelled])
    assert getattr(getattr(cfg.algo, section), field) == value


def test_a_moved_key_owned_by_some_types_says_which():
    message = _refused(["algo.spo_d_half=0.1"])
    assert "write algo.advantage.d_half=0.1 (a field of algo.advantage.type spo)" in message
    message = _refused(["algo.lam_policy=0.5"])
    assert "(a field of algo.advantage.type skip_observation_gae / token_gae / step_gae)" in message
    assert "(a field of" not in _refused(["algo.eps_high=2.0"])  # every loss type has it


def test_flat_algo_keys_in_yaml_are_refused_naming_the_file_and_the_new_spelling(tmp_path):
    path = _yaml(tmp_path, "algo:\n  preset: sao\n  eps_low: 0.2\n")
    message = _refused([], path)
    assert f"algo.eps_low (in {path})" in message and "write algo.loss.eps_low=0.2" in message
    path = _yaml(tmp_path, "algo:\n  advantage: grpo\n")
    assert "write algo.advantage.type=grpo" in _refused([], path)
    path = _yaml(tmp_path, "algo:\n  running_mean_window: 4\n")
    assert "write algo.advantage.window=4" in _refused([], path)


# ---- a section chosen by type: merge while the type stays, start afresh when it changes ---------------


def test_an_override_that_retypes_a_preset_section_starts_from_the_new_class_defaults():
    cfg = load_config(None, [*TINY, "algo=grpo", "algo.advantage.type=running_mean"])
    assert cfg.algo.advantage == RunningMean()  # grpo's normalize_std did not leak in
    cfg = load_config(None, [*TINY, "algo=grpo", "algo.loss.type=dis"])
    assert cfg.algo.loss == DIS()  # DIS's own band, not ppo_clip's 0.2 / 0.28


def test_fields_merge_key_by_key_while_the_type_stays():
    cfg = load_config(None, [*TINY, "algo=running_mean_128", "algo.advantage.window=4"])
    assert cfg.algo.advantage == RunningMean(window=4, scope="global")
    cfg = load_config(None, [*TINY, "algo=running_mean_128", "algo.advantage.type=running_mean"])
    assert cfg.algo.advantage == RunningMean(window=128, scope="global")  # same type: nothing reset


def test_an_override_retypes_a_yaml_section_and_sets_fields_in_one_go(tmp_path):
    path = _yaml(tmp_path, "algo:\n  advantage: {type: spo, d_half: 0.1}\n")
    assert load_config(path, ["algo.advantage.type=running_mean"]).algo.advantage == RunningMean()
    cfg = load_config(None, [*TINY, "algo.advantage={type: spo, d_half: 0.1}"])
    assert cfg.algo.advantage == SPO(d_half=0.1)


def test_a_yaml_section_of_another_type_replaces_the_presets(tmp_path):
    path = _yaml(tmp_path, "algo:\n  preset: sao\n  group_size: 8\n  advantage: {type: grpo}\n")
    assert load_config(path).algo.advantage == GRPO()  # the preset's GAE keys are gone


def test_a_field_of_the_previous_type_is_refused_naming_the_key_and_the_type():
    message = _refused(["algo=running_mean_8", "algo.advantage.type=grpo", "algo.advantage.window=4"])
    assert "algo.advantage.window" in message and "grpo" in message


def test_a_type_given_after_its_fields_in_one_layer_keeps_them():
    """Within one layer (the overrides), the order of a field and its section's type does not matter."""
    for overrides in (
        ["algo.loss.eps_low=0.1", "algo.loss.type=ppo_clip"],
        ["algo.loss.type=ppo_clip", "algo.loss.eps_low=0.1"],
    ):
        loss = load_config(None, ["model.tiny_arch=qwen3_moe", *overrides]).algo.loss
        assert (loss.type, loss.eps_low, loss.eps_high) == ("ppo_clip", 0.1, 0.28), overrides
