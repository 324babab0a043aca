"""`sao config --migrate`: a config of the flat algo section rewritten in the typed shape loads to the config
the flat one described; keys the chosen class has no field for are dropped with a note."""

from __future__ import annotations

import yaml

from sao.config import load_config
from sao.config.migrate import migrate_config

FLAT = {
    "model": {"tiny_arch": "qwen3_moe"},
    "algo": {
        "preset": "running_mean_128", "advantage": "running_mean", "policy_loss": "dis", "eps_low": 0.25,
        "eps_high": 4.0, "loss_agg": "seq-mean-token-mean", "running_mean_window": 64,
        "running_mean_scope": "global", "lam_policy": 0.9, "k_critic": 1, "group_size": 1,
    },
}  # fmt: skip


def test_a_flat_algo_section_becomes_the_typed_one(tmp_path):
    migrated, notes = migrate_config(FLAT)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(migrated))
    algo = load_config(path).algo
    assert algo.advantage.type == "running_mean" and (algo.advantage.window, algo.advantage.scope) == (
        64,
        "global",
    )
    assert (algo.loss.type, algo.loss.eps_low, algo.loss.eps_high) == ("dis", 0.25, 4.0)
    assert algo.loss.agg == "seq-mean-token-mean" and algo.k_critic == 1
    assert notes == ["algo.lam_policy=0.9 dropped: running_mean advantage has no lam_policy (it was ignored)"]


def test_a_typed_config_comes_back_unchanged():
    typed = {"algo": {"preset": "sao", "loss": {"type": "dis", "eps_low": 0.2}}}
    assert migrate_config(typed) == (typed, [])


def test_the_cli_prints_the_migrated_file(tmp_path):
    from typer.testing import CliRunner

    from sao.cli import app

    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(FLAT))
    result = CliRunner().invoke(app, ["config", "--migrate", str(path)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["algo"]["loss"] == {
        "type": "dis", "eps_low": 0.25, "eps_high": 4.0, "agg": "seq-mean-token-mean"
    }  # fmt: skip
