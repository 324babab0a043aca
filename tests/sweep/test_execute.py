"""Running sweeps for real on the tiny model: child processes at once, outcomes, skipping finished runs,
resuming interrupted ones, recording failures; then `sao sweep` / `sao report` / `sao compare` end to end."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from sao.cli import app
from sao.sweep.execute import STATUS_FILE, read_outcome, run_state, run_sweep
from sao.sweep.spec import SweepSpec, load_spec, plan_runs

TINY = [
    "model.tiny_arch=qwen3_moe", "model.dtype=float32", "model.device=cpu",
    "critic.pretrain.corpus_size=4", "critic.pretrain.max_steps=1",
    "engine.max_new_tokens=8", "engine.max_concurrent=8", "data.env=long_tail", "data.max_turns=2",
    "trainer.batch_size=4", "trainer.total_steps=2", "runtime.max_in_flight=8",
    "logging.tensorboard=false", "logging.checkpoint_every=1",
]  # fmt: skip


def _spec(tmp_path, arms, seeds=(0,)) -> SweepSpec:
    return SweepSpec(name="t", overrides=TINY, seeds=list(seeds), runs_root=str(tmp_path / "runs"), arms=arms)


def _events(log):
    return lambda kind, run, outcome: log.append((kind, run.arm, run.seed))


def test_child_processes_run_at_once_and_a_second_sweep_skips_them(tmp_path):
    spec = _spec(tmp_path, [{"name": "sao", "preset": "sao"}], seeds=(0, 1))
    runs = plan_runs(spec)
    log: list = []
    result = run_sweep(spec, runs, jobs=2, on_event=_events(log))
    assert [len(result[k]) for k in ("done", "failed", "skipped")] == [2, 0, 0]
    for run in runs:
        outcome = read_outcome(run.run_dir)
        assert (outcome.status, outcome.returncode, outcome.attempts) == ("done", 0, 1)
        assert outcome.wall_s > 0 and outcome.command[1:4] == ["-m", "sao", "train"]
        assert "trained 2 steps" in (run.run_dir / "train.log").read_text()
        steps = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in steps if "reward/mean" in r] == [1, 2]
        assert all(r["runtime/elapsed_s"] > 0 for r in steps if "reward/mean" in r)
    first, second = (read_outcome(r.run_dir) for r in runs)
    assert first.started_at < second.ended_at and second.started_at < first.ended_at  # at once
    again: list = []
    result = run_sweep(spec, runs, jobs=2, on_event=_events(again))
    assert len(result["skipped"]) == 2 and [k for k, *_ in again] == ["skip", "skip"]


def test_an_interrupted_run_resumes_and_a_failed_one_is_recorded_not_rerun(tmp_path):
    spec = _spec(tmp_path, [
        {"name": "ok", "preset": "running_mean_8"},
        {"name": "broken", "overrides": ["engine.backend=vllm", f"engine.python={tmp_path}/no/python"]},
    ])  # fmt: skip
    ok, broken = plan_runs(spec)
    result = run_sweep(spec, [ok, broken], in_process=True)
    assert result["done"] == [ok] and result["failed"] == [broken]
    assert "no/python" in read_outcome(broken.run_dir).error
    # Interrupted after its checkpoint of step 2: resumed (nothing left to train), attempts add up.
    (ok.run_dir / STATUS_FILE).unlink()
    assert run_state(ok.run_dir) == "interrupted"
    log: list = []
    result = run_sweep(spec, [ok, broken], in_process=True, on_event=_events(log))
    assert ("start", "ok", 0) in log and result["skipped"] == [broken]  # a failed run is not rerun
    outcome = read_outcome(ok.run_dir)
    assert outcome.status == "done" and outcome.attempts == 2 and outcome.command[-1] == "--resume"
    # Interrupted before any checkpoint: started again from an empty dir.
    for entry in sorted(ok.run_dir.rglob("*"), reverse=True):
        if entry.name == "checkpoints" or "checkpoints" in entry.parts:
            entry.unlink() if entry.is_file() else entry.rmdir()
    (ok.run_dir / STATUS_FILE).unlink()
    run_sweep(spec, [ok], in_process=True)
    outcome = read_outcome(ok.run_dir)
    assert outcome.attempts == 3 and outcome.command[-1] != "--resume"
    lines = [json.loads(x) for x in (ok.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "reward/mean" in r] == [1, 2]  # one fresh run, not appended
    # --retry-failed reruns it (and it fails again, recorded again).
    result = run_sweep(spec, [broken], in_process=True, retry_failed=True)
    assert result["failed"] == [broken] and read_outcome(broken.run_dir).attempts == 2
    # A failed run that had a checkpoint is resumed from it when retried, its log kept.
    outcome = json.loads((ok.run_dir / STATUS_FILE).read_text())
    (ok.run_dir / STATUS_FILE).write_text(json.dumps({**outcome, "status": "failed", "returncode": 1}))
    assert run_sweep(spec, [ok], in_process=True)["skipped"] == [ok]
    assert run_sweep(spec, [ok], in_process=True, retry_failed=True)["done"] == [ok]
    assert read_outcome(ok.run_dir).command[-1] == "--resume"
    # An attempt killed outright (SIGKILL, the machine down) left its last heartbeat: the next one adds it.
    before = read_outcome(ok.run_dir)
    (ok.run_dir / STATUS_FILE).unlink()
    (ok.run_dir / ".sweep_attempt_open.json").write_text(json.dumps({"wall_s": 1000.0}))
    run_sweep(spec, [ok], in_process=True)
    after = read_outcome(ok.run_dir)
    assert after.attempts == before.attempts + 2
    assert 1000.0 + before.wall_s < after.wall_s < 1100.0 + before.wall_s
    assert not (ok.run_dir / ".sweep_attempt_open.json").exists()


def test_a_run_whose_lock_another_process_holds_is_skipped_as_running(tmp_path):
    import fcntl

    spec = _spec(tmp_path, [{"name": "rm", "preset": "running_mean_8"}])
    (run,) = plan_runs(spec)
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "metrics.jsonl").write_text("")
    with (run.run_dir / ".sweep.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a live run (or another sweep) holds it
        assert run_state(run.run_dir) == "running"
        log: list = []
        result = run_sweep(spec, [run], in_process=True, on_event=_events(log))
        assert result["skipped"] == [run] and log == [("skip", "rm", 0)]
    assert run_state(run.run_dir) == "interrupted"


def test_sweep_report_and_compare_commands(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(json.dumps({
        "name": "cli", "overrides": TINY, "seeds": 2, "runs_root": str(tmp_path / "runs"),
        "out": str(tmp_path / "report"),
        "arms": [{"name": "sao", "preset": "sao"}, {"name": "rm", "preset": "running_mean_8"}],
        "report": {"curves": ["reward/mean"], "finals": [{"metric": "reward/mean", "how": "mean"}]},
    }))  # fmt: skip
    runner = CliRunner()
    dry = runner.invoke(app, ["sweep", str(spec_path), "--dry-run"])
    assert dry.exit_code == 0 and dry.output.count(" new ") == 4
    done = runner.invoke(app, ["sweep", str(spec_path), "--in-process", "trainer.total_steps=1"])
    assert done.exit_code == 0, done.output
    assert "4 done" in done.output and (tmp_path / "report" / "report.md").is_file()
    md = (tmp_path / "report" / "report.md").read_text()
    assert "2 arms × 2 seeds" in md and "| reward/mean (mean) | sao − rm |" in md
    # `sao report` with the same override finds the same runs; without it, none of them.
    again = runner.invoke(
        app, ["report", str(spec_path), "trainer.total_steps=1", "--out", str(tmp_path / "r2")]
    )
    assert again.exit_code == 0 and (tmp_path / "r2" / "finals.csv").is_file()
    missing = runner.invoke(app, ["report", str(spec_path)])
    assert missing.exit_code == 1 and "no run of sweep 'cli' has finished" in missing.output
    dirs = sorted(str(p) for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    compared = runner.invoke(
        app, ["compare", *dirs, "--out", str(tmp_path / "cmp"), "--final", "reward/mean:mean"]
    )
    assert compared.exit_code == 0, compared.output
    assert "| rm |" in (tmp_path / "cmp" / "report.md").read_text()
    bad = runner.invoke(app, ["sweep", str(spec_path), "algo.k_critc=3", "--dry-run"])
    assert bad.exit_code == 2 and "k_critc" in bad.output


USER_ENV = '''
from sao.envs.base import StepResult


class LetterEnv:
    """One turn: reward 1 when the reply contains an 'a'."""

    max_turns = 1

    async def reset(self, task):
        return [{"role": "user", "content": task.prompt}]

    async def step(self, text):
        return StepResult(observation=[], reward=float("a" in text), done=True)

    async def close(self):
        pass
'''


def test_a_sweep_runs_on_the_users_own_env_and_task_file(tmp_path):
    (tmp_path / "letter_env.py").write_text(USER_ENV)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "prompt": f"say {i}"}) + "\n" for i in range(6)))
    spec = _spec(tmp_path, [{"name": "rm", "preset": "running_mean_8"}])
    user = [f"data.env={tmp_path}/letter_env.py:LetterEnv", f"data.train_file={tasks}", "data.max_turns=1"]
    spec = spec.model_copy(update={"overrides": [*spec.overrides, *user]})
    (run,) = plan_runs(spec)
    assert run.config.data.env.endswith("letter_env.py:LetterEnv")
    assert run_sweep(spec, [run], in_process=True)["done"] == [run]
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "reward/mean" in r] == [1, 2]


def test_killing_a_sweep_stops_its_runs_and_the_next_sweep_resumes_them(tmp_path):
    """`kill` of a running `sao sweep` (SIGTERM; Ctrl-C is the same path) terminates its child runs without
    an outcome; the next sweep resumes the run from its checkpoint."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spec_path = tmp_path / "spec.yaml"
    overrides = [o for o in TINY if not o.startswith("trainer.total_steps")] + ["trainer.total_steps=24"]
    spec_path.write_text(json.dumps({"name": "kill", "overrides": overrides, "seeds": [0],
                                     "runs_root": str(tmp_path / "runs"), "out": str(tmp_path / "report"),
                                     "arms": [{"name": "rm", "preset": "running_mean_8"}]}))  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    sweep = subprocess.Popen([sys.executable, "-m", "sao", "sweep", str(spec_path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    spec = load_spec(spec_path)
    (run,) = plan_runs(spec)
    deadline = time.monotonic() + 300  # generous: a loaded 2-core machine starts the child slowly
    while not list((run.run_dir / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sweep.poll() is None, sweep.stdout.read().decode()
    assert list((run.run_dir / "checkpoints").glob("step_*")), "no checkpoint within 300 s"
    heartbeat = json.loads((run.run_dir / ".sweep_attempt_open.json").read_text())  # the running attempt's
    assert heartbeat["wall_s"] >= 0
    sweep.send_signal(signal.SIGTERM)
    out = sweep.communicate(timeout=60)[0].decode()
    assert sweep.returncode == 130 and "`sao sweep` again resumes them" in out
    assert read_outcome(run.run_dir) is None and run_state(run.run_dir) == "interrupted"
    assert not (run.run_dir / ".sweep_attempt_open.json").exists()  # noted as an attempt instead
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in lines) < 24  # stopped mid-run
    result = run_sweep(spec, [run])
    outcome = read_outcome(run.run_dir)
    assert result["done"] == [run] and outcome.attempts == 2 and outcome.command[-1] == "--resume"
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in lines if "reward/mean" in r) == list(range(1, 25))
