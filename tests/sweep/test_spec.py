"""Sweep specs: validation, the expansion into arm × seed runs, override precedence and run identity."""

from __future__ import annotations

import pytest

from sao.config import ConfigError, RunConfig
from sao.sweep.spec import SMOKE_OVERRIDES, SweepSpec, load_spec, plan_runs, run_key

BASE = ["model.tiny_arch=qwen3_moe", "trainer.total_steps=3", "trainer.batch_size=8"]


def _spec(tmp_path, **kw) -> SweepSpec:
    data = {
        "name": "t",
        "overrides": BASE,
        "seeds": [0, 1],
        "runs_root": str(tmp_path / "runs"),
        "arms": [{"name": "sao", "preset": "sao"}, {"name": "grpo", "preset": "grpo"}],
    }
    return SweepSpec.model_validate({**data, **kw})


def test_runs_are_seed_major_and_carry_preset_and_seed(tmp_path):
    runs = plan_runs(_spec(tmp_path))
    assert [(r.arm, r.seed) for r in runs] == [("sao", 0), ("grpo", 0), ("sao", 1), ("grpo", 1)]
    assert [r.config.algo.preset for r in runs] == ["sao", "grpo", "sao", "grpo"]
    assert [(r.config.trainer.seed, r.config.data.seed) for r in runs] == [(0, 0), (0, 0), (1, 1), (1, 1)]
    assert all(r.config.logging.run_dir == str(r.run_dir) for r in runs)
    assert runs[0].command_overrides()[-2:] == [f"logging.run_dir={runs[0].run_dir}", "name=sao"]
    assert len({r.run_dir for r in runs}) == 4


def test_arm_overrides_beat_the_spec_and_the_preset(tmp_path):
    arm = {"name": "a", "preset": "sao", "overrides": ["trainer.lr=0.25", "algo.k_critic=5"]}
    spec = _spec(tmp_path, overrides=[*BASE, "trainer.lr=0.5"], arms=[arm])
    (run, _) = plan_runs(spec)
    assert run.config.trainer.lr == 0.25 and run.config.algo.k_critic == 5
    assert run.config.algo.advantage.type == "skip_observation_gae"  # the rest of the preset stays


def test_an_algo_key_of_the_spec_applies_to_every_arm_whatever_its_preset(tmp_path):
    """The preset only fills what no file or override sets (load_config), wherever the override stands."""
    arms = [{"name": "grpo", "preset": "grpo"}, {"name": "dis", "preset": "grpo_dis"}]
    runs = plan_runs(_spec(tmp_path, overrides=[*BASE, "algo.group_size=4"], arms=arms, seeds=[0]))
    assert [r.config.algo.group_size for r in runs] == [4, 4]
    assert [r.config.algo.loss.type for r in runs] == ["ppo_clip", "dis"]


def test_equal_configs_share_a_run_dir_whatever_the_arm_is_called(tmp_path):
    one = plan_runs(_spec(tmp_path, arms=[{"name": "sao", "preset": "sao"}]))
    other = plan_runs(_spec(tmp_path, name="other", arms=[{"name": "k2", "preset": "sao"}]))
    assert [r.run_dir for r in one] == [r.run_dir for r in other]
    assert run_key(one[0].config) != run_key(one[1].config)  # the seed is part of the run


def test_a_run_is_keyed_by_its_values_away_from_the_defaults(tmp_path):
    """Setting a key to its default (as a key added to the config later reads in an older run) leaves the
    run key, so finished runs stay found; any other value changes it."""
    (base,) = plan_runs(_spec(tmp_path, arms=[{"name": "sao", "preset": "sao"}], seeds=[0]))
    default = RunConfig.model_fields["runtime"].default_factory().max_staleness
    (same,) = plan_runs(_spec(tmp_path, overrides=[*BASE, f"runtime.max_staleness={default}"],
                              arms=[{"name": "sao", "preset": "sao"}], seeds=[0]))  # fmt: skip
    (other,) = plan_runs(_spec(tmp_path, overrides=[*BASE, f"runtime.max_staleness={default + 1}"],
                               arms=[{"name": "sao", "preset": "sao"}], seeds=[0]))  # fmt: skip
    assert run_key(same.config) == run_key(base.config) != run_key(other.config)
    assert base.run_dir.name == f"s0-{run_key(base.config)}"


def test_smoke_is_the_first_seed_with_the_smoke_overrides_last(tmp_path):
    spec = _spec(tmp_path, smoke={"overrides": ["trainer.total_steps=1"]})
    runs = plan_runs(spec, smoke=True)
    assert [(r.arm, r.seed) for r in runs] == [("sao", 0), ("grpo", 0)]
    assert runs[0].config.trainer.total_steps == 1  # the spec's smoke overrides come after SMOKE_OVERRIDES
    assert runs[0].config.trainer.batch_size == 8 and "trainer.batch_size=8" in SMOKE_OVERRIDES
    assert {r.run_dir for r in runs}.isdisjoint(r.run_dir for r in plan_runs(spec))


def test_a_bad_arm_is_an_error_naming_the_arm_and_the_key(tmp_path):
    spec = _spec(tmp_path, arms=[{"name": "bad", "overrides": ["algo.k_critc=2"]}])
    with pytest.raises(ConfigError, match=r"arm 'bad', seed 0: .*k_critc"):
        plan_runs(spec)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: t\narms: [{name: a}, {name: a}]\n", "names must be distinct"),
        ("name: t\narms: []\n", "at least one arm"),
        ("name: t\narms: [{name: a}]\nseeds: 0\n", "a count must be >= 1"),
        ("name: t\narms: [{name: 'a b'}]\n", "letters, digits"),
        ("name: t\narms: [{name: a}]\njobz: 2\n", "jobz"),
        ("name: t\narms: [{name: a}]\nreport: {finals: [{metric: r, how: recovery}]}\n", "needs shifts"),
        ("- not a mapping\n", "must be a mapping"),
        ("name: t\narms: [{name: a}]\nseed_keys: []\n", "every seed would be the same run"),
        ("name: t\narms: [{name: a}]\nreport: {finals: [{metric: r, frac: 0.5}]}\n", "frac applies to"),
        ("name: t\narms: [{name: a}]\nreport: {finals: [{metric: r}, {metric: r}]}\n", "share the column"),
        (
            "name: t\narms: [{name: a}]\nreport: {finals: [{metric: r, how: recovery, shifts: [9, 3]}]}\n",
            "shifts must increase",
        ),
    ],
)
def test_spec_errors_name_the_field(tmp_path, text, message):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_spec(path)


def test_seeds_may_be_a_count_and_the_spec_file_loads(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\nseeds: 3\narms: [{name: a, preset: grpo}]\n")
    spec = load_spec(path)
    assert spec.seeds == [0, 1, 2] and spec.out_dir.as_posix() == "runs/sweeps/t"
    with pytest.raises(ConfigError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
