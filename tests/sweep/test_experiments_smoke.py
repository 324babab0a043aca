"""`sao sweep --smoke` of every spec under experiments/: each arm trains a few steps at toy sizes (the first
seed), and its report is written, so the specs keep working as the code changes. Arms that resolve to the
same config (a baseline several claims share) run once, as in the real sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.sweep.aggregate import load_run
from sao.sweep.execute import run_sweep
from sao.sweep.report import write_report
from sao.sweep.spec import load_spec, plan_runs

ROOT = Path(__file__).resolve().parents[2]
# Sweep specs only: experiments/claims.yaml (the claims' parts for the verdicts) is not one.
SPECS = sorted(p for p in (ROOT / "experiments").glob("*.yaml") if p.name != "claims.yaml")


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("experiment-runs")


def test_every_claim_has_a_spec():
    names = {p.stem.split("_")[0] for p in SPECS}
    assert {f"c{i}" for i in range(1, 9)} <= names


@pytest.mark.parametrize("spec_path", SPECS, ids=[p.stem for p in SPECS])
def test_spec_smoke_runs_every_arm_and_reports(spec_path, runs_root, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # specs name their base config and task files relative to the project root
    spec = load_spec(spec_path)
    if not spec.name.endswith("_grid"):  # a claim: >= 3 seeds (a tuning grid runs one seed per setting)
        assert len(spec.seeds) >= 3
    full = plan_runs(spec)  # every real run's config loads
    assert len({r.config.trainer.batch_size for r in full}) == 1  # equal trajectories per step across arms
    spec = spec.model_copy(update={"runs_root": str(runs_root)})
    runs = plan_runs(spec, smoke=True)
    result = run_sweep(spec, runs, in_process=True)
    assert not result["failed"] and not result["stopped"], [r.arm for r in result["failed"]]
    by_arm = {a.name: [load_run(r.run_dir, arm=r.arm, seed=r.seed) for r in runs if r.arm == a.name]
              for a in spec.arms}  # fmt: skip
    assert all(run.steps_done == run.total_steps for rs in by_arm.values() for run in rs)
    paths = write_report(by_arm, spec.report, tmp_path / "report", title=spec.name)
    assert (tmp_path / "report" / "report.md") in paths


def test_every_claim_part_names_a_spec_its_arms_and_one_of_its_final_columns():
    import importlib.util

    loader = importlib.util.spec_from_file_location("verdicts", ROOT / "experiments" / "verdicts.py")
    verdicts = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(verdicts)
    claims = verdicts.load_claims(ROOT / "experiments" / "claims.yaml")
    assert {f"C{i}" for i in range(1, 8)} <= set(claims)
    for name, claim in claims.items():
        for testbed, tb in claim["testbeds"].items():
            spec = load_spec(ROOT / "experiments" / f"{tb['spec']}.yaml")
            arms, labels = {a.name for a in spec.arms}, {f.label for f in spec.report.finals}
            for part in tb["parts"]:
                assert {part.high, part.low} <= arms, (name, testbed, part)
                assert part.metric in labels, (name, testbed, part.metric, sorted(labels))


def test_the_warm_start_gate_passes_inside_its_band_and_writes_its_report_only_then(tmp_path, monkeypatch):
    """experiments/warm_start_gate.py on a random tiny model and two small grid layouts: the evaluation the
    runs' own settings describe, a report written only when Pass@1 is inside [min, max], exit 1 otherwise."""
    import importlib.util
    import json
    import sys

    from sao.envs import make_env_tasks, save_tasks_jsonl
    from sao.models.tiny import tiny_checkpoint

    kwargs = {"size": 4, "holes": 0.1, "min_dist": 2, "slack": 2}
    save_tasks_jsonl(tmp_path / "held.jsonl", make_env_tasks("grid_walk", 2, seed=3, **kwargs))
    model = tiny_checkpoint(tmp_path / "model", "qwen3_moe", "test", seed=0)
    config = tmp_path / "base.yaml"
    config.write_text(json.dumps({
        "model": {"path": "unused", "dtype": "float32", "device": "cpu"},
        "engine": {"max_new_tokens": 8},
        "data": {"env": "grid_walk", "env_kwargs": kwargs, "max_turns": 3, "max_total_tokens": 512,
                 "eval_file": str(tmp_path / "held.jsonl")},
        "eval": {"k": 2, "concurrency": 4},
    }))  # fmt: skip
    loader = importlib.util.spec_from_file_location("gate", ROOT / "experiments" / "warm_start_gate.py")
    gate = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(gate)

    def run(*band: str) -> int:
        out = tmp_path / "gate.json"
        out.unlink(missing_ok=True)
        argv = ["gate", "--config", str(config), "--model", str(model), "--out", str(out), *band]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as stop:
            gate.main()
        return stop.value.code

    assert run("--min-pass", "0", "--max-pass", "1") == 0
    report = json.loads((tmp_path / "gate.json").read_text())
    assert 0.0 <= report["pass@1"] <= 1.0 and report["band"] == [0.0, 1.0]
    settings = report["settings"]
    assert (settings["k"], settings["env"], settings["max_turns"], settings["max_tokens_per_turn"]) == (
        2, "grid_walk", 3, 8)  # fmt: skip
    assert settings["env_kwargs"] == kwargs and settings["max_total_tokens"] == 512
    assert run("--min-pass", "0", "--max-pass", "-0.01") == 1 and not (tmp_path / "gate.json").exists()
