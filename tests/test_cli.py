"""The `sao` command line: version, help, `config` printing and errors, `presets` table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from sao import __version__
from sao.cli import app
from sao.presets import PRESETS

QUICKSTART = str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
runner = CliRunner()


def test_version_prints_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"sao {__version__}"


def test_help_lists_subcommands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "config" in result.output and "presets" in result.output


def test_config_prints_resolved_yaml_with_override() -> None:
    result = runner.invoke(app, ["config", QUICKSTART, "algo=grpo_dis", "algo.loss.eps_high=2.5"])
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert printed["algo"]["preset"] == "grpo_dis"
    assert printed["algo"]["loss"]["eps_high"] == 2.5
    assert printed["algo"]["loss"]["type"] == "dis"  # the preset's loss, its band edge overridden
    assert printed["algo"]["group_size"] == 8
    assert printed["model"]["path"] == "runs/quickstart/sft"  # the file's own values stay


def test_config_accepts_overrides_without_a_file() -> None:
    result = runner.invoke(app, ["config", "model.tiny_arch=qwen3", "trainer.lr=1e-5"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["trainer"]["lr"] == 1e-5


def test_config_bad_override_exits_2_naming_the_key() -> None:
    result = runner.invoke(app, ["config", QUICKSTART, "algo.loss.eps_low=1.5"])
    assert result.exit_code == 2
    assert "algo.loss.eps_low" in result.stderr
    assert "Traceback" not in result.output


def test_config_flat_algo_key_exits_2_with_its_new_spelling() -> None:
    result = runner.invoke(app, ["config", QUICKSTART, "algo.eps_low=1.5"])
    assert result.exit_code == 2
    assert "write algo.loss.eps_low=1.5" in result.stderr
    assert "Traceback" not in result.output


def test_config_unknown_key_exits_2_with_suggestion() -> None:
    result = runner.invoke(app, ["config", QUICKSTART, "trainer.batchsize=8"])
    assert result.exit_code == 2
    assert "trainer.batchsize" in result.stderr and "trainer.batch_size" in result.stderr


def test_presets_lists_all_names() -> None:
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    assert len(PRESETS) == 12
    for name in PRESETS:
        assert f" {name} " in result.output


def test_importing_cli_does_not_import_torch() -> None:
    code = "import sys, sao.cli; print('torch' in sys.modules or 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
