"""The mini-swe-agent environment (`sao.integrations.mini_swe_agent.SandboxEnvironment`): commands run in
the instance's sandboxed workspace, limits and escapes are contained, the submit command ends the episode,
the hidden tests grade it; mini-swe-agent builds it from its own config and runs its own agent on it. The
slow test plays episodes through a training run's gateway (examples/swe_agent/demo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip("minisweagent")

from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output
from pydantic import ValidationError
from tests.envs.swe_fixture import BUGGY, F2P, make_instance

from sao.envs.sandbox import sandbox_mode
from sao.envs.swe_instance import SWEInstanceError, instance_to_row
from sao.envs.swe_workspace import open_workspace
from sao.integrations.mini_swe_agent import SUBMIT_MARKER, SandboxEnvironment, find_instance

ROOT = Path(__file__).resolve().parents[2]
CLASS_PATH = "sao.integrations.mini_swe_agent.SandboxEnvironment"


@pytest.fixture(scope="module")
def instance_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-instance file of the shared hand-made instance (`tests.envs.swe_fixture`): ``calc/ops.py`` whose
    ``add`` subtracts; hidden tests for ``add``; ``test_mul`` passes before and after."""
    sandbox_mode()  # the suite needs bwrap (or an opted-into mode); fails loudly otherwise
    root = tmp_path_factory.mktemp("swe")
    inst = make_instance(root)
    path = root / "instances.jsonl"
    path.write_text(json.dumps(instance_to_row(inst, base_dir=root)) + "\n")
    return path


@pytest.fixture
def env(instance_file: Path):
    environment = SandboxEnvironment(
        instances=str(instance_file), instance_id="calc__add-1", timeout=20, env={"PAGER": "cat"}
    )
    yield environment
    environment.cleanup()


def test_commands_run_in_the_instance_workspace_at_base_commit(env: SandboxEnvironment) -> None:
    out = env.execute({"command": "cat calc/ops.py; git log --oneline | wc -l; git status --porcelain"})
    assert out["returncode"] == 0 and out["exception_info"] == ""
    assert BUGGY in out["output"]
    assert out["output"].rstrip().endswith("1")  # one commit, nothing changed, no hidden tests yet
    assert not (env.sandbox.root / "tests" / "test_new.py").exists()


def test_stderr_joins_the_output_and_the_exit_code_is_kept(env: SandboxEnvironment) -> None:
    out = env.execute({"command": "echo to-out; echo to-err >&2; exit 3"})
    assert out["output"] == "to-out\nto-err\n"
    assert out["returncode"] == 3 and out["exception_info"] == ""


def test_files_persist_across_commands_and_cwd_and_env_apply(env: SandboxEnvironment) -> None:
    env.execute({"command": "echo kept > calc/note.txt"})
    assert env.execute({"command": "cat note.txt; pwd; echo $PAGER"}, cwd="calc")["output"].split("\n")[
        :3
    ] == [
        "kept",
        str(env.sandbox.root / "calc"),
        "cat",
    ]
    assert env.execute({"command": "git status --porcelain"})["output"] == "?? calc/note.txt\n"


def test_a_command_that_runs_forever_is_killed_and_the_episode_goes_on(env: SandboxEnvironment) -> None:
    t0 = time.monotonic()
    out = env.execute({"command": "echo begun; sleep 600"}, timeout=1)
    assert time.monotonic() - t0 < 15
    assert out["returncode"] == -1 and "timed out after 1 s" in out["exception_info"]
    assert out["output"].startswith("begun")
    assert out["extra"]["exception_type"] == "TimeoutExpired"
    assert env.execute({"command": "echo still-here"})["output"] == "still-here\n"


def test_background_processes_do_not_outlive_their_command(env: SandboxEnvironment) -> None:
    marker = "sleep 987.654"
    out = env.execute({"command": f"nohup {marker} >/dev/null 2>&1 & disown; echo started"})
    assert out["output"] == "started\n"
    time.sleep(0.2)
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert found.stdout == "", "a process of the command survived it"


def test_the_host_filesystem_is_out_of_reach(env: SandboxEnvironment, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    outside = env.sandbox.root.parent / f"escape-{tmp_path.name}"  # the scratch dir above the workspace
    out = env.execute(
        {"command": f"cat {secret}; ls {ROOT}; echo x > {tmp_path}/escape.txt; cd .. && echo x > {outside}"}
    )
    assert "hunter2" not in out["output"] and "pyproject.toml" not in out["output"]
    assert out["returncode"] != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt"]
    assert not outside.exists()


def test_the_host_environment_is_not_passed_on(
    env: SandboxEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAO_TEST_TOKEN", "tok-123")
    assert "tok-123" not in env.execute({"command": "env"})["output"]
    assert "SAO_TEST_TOKEN" not in env.get_template_vars()
    assert env.get_template_vars()["instance_id"] == "calc__add-1"


def test_the_submit_command_raises_submitted_with_the_rest_of_its_output(env: SandboxEnvironment) -> None:
    with pytest.raises(Submitted) as caught:
        env.execute({"command": f"echo {SUBMIT_MARKER} && echo the-patch"})
    exit_message = caught.value.messages[0]
    assert exit_message["role"] == "exit"
    assert exit_message["extra"] == {"exit_status": "Submitted", "submission": "the-patch\n"}
    assert env.execute({"command": f"echo {SUBMIT_MARKER}; exit 1"})["returncode"] == 1  # failed: no submit


def test_grade_resolves_the_reference_patch_and_not_the_unchanged_repo(env: SandboxEnvironment) -> None:
    inst = env.instance
    before = env.grade(timeout_s=120)
    assert before["resolved"] is False
    assert set(before["fail_to_pass"]) == set(F2P) and "PASSED" not in before["fail_to_pass"].values()
    assert before["pass_to_pass"] == {"tests/test_ops.py::test_mul": "PASSED"}
    env.sandbox.write_file("fix.patch", inst.patch)
    assert env.execute({"command": "git apply fix.patch && rm fix.patch"})["returncode"] == 0
    after = env.grade(timeout_s=120)
    assert after["resolved"] is True and after["error"] is None


def test_mini_swe_agent_loads_it_by_import_path_from_its_config(instance_file: Path) -> None:
    env = get_environment(
        {"environment_class": CLASS_PATH, "instances": str(instance_file), "instance_id": "calc__add-1"}
    )
    try:
        assert isinstance(env, SandboxEnvironment)
        assert env.serialize()["info"]["config"]["environment_type"] == CLASS_PATH
    finally:
        env.cleanup()


def test_mini_swe_agent_own_agent_fixes_and_submits_in_the_sandbox(instance_file: Path) -> None:
    """mini-swe-agent's DefaultAgent with its scripted test model: a fix by sed, then the submit command."""
    env = get_environment(
        {"environment_class": CLASS_PATH, "instances": str(instance_file), "instance_id": "calc__add-1"}
    )
    model = DeterministicModel(
        outputs=[
            make_output("look", [{"command": "grep -n 'a - b' calc/ops.py"}]),
            make_output("fix", [{"command": "sed -i 's/a - b/a + b/' calc/ops.py"}]),
            make_output("done", [{"command": f"echo {SUBMIT_MARKER} && git diff"}]),
        ]
    )
    agent = DefaultAgent(
        model, env, system_template="sys", instance_template="{{task}}", step_limit=5, cost_limit=0
    )
    try:
        info = agent.run(env.instance.problem_statement)
        assert info["exit_status"] == "Submitted"
        assert "+    return a + b" in info["submission"]
        assert "2:    return a - b" in agent.messages[3]["content"]  # the grep's observation
        assert env.grade(timeout_s=120)["resolved"] is True
    finally:
        env.cleanup()


def test_an_unknown_config_key_is_refused_by_name(instance_file: Path) -> None:
    with pytest.raises(ValidationError, match="interpreter"):
        SandboxEnvironment(
            instances=str(instance_file), instance_id="calc__add-1", interpreter=["bash", "-c"]
        )


def test_an_unknown_instance_is_an_error_naming_it(instance_file: Path) -> None:
    with pytest.raises(SWEInstanceError, match="no instance 'nope'"):
        SandboxEnvironment(instances=str(instance_file), instance_id="nope")


def test_cleanup_removes_the_workspace(instance_file: Path) -> None:
    env = SandboxEnvironment(instances=str(instance_file), instance_id="calc__add-1")
    root = env.sandbox.root
    assert (root / "calc" / "ops.py").is_file()
    env.cleanup()
    env.cleanup()  # idempotent
    assert not root.exists()


def test_open_workspace_commits_the_tree_and_grades_it(instance_file: Path) -> None:
    found = find_instance(str(instance_file), "calc__add-1")
    with open_workspace(found, timeout_s=20) as ws:
        head = ws.sandbox.run("git rev-parse HEAD").stdout.strip()
        assert head == ws.base_commit
        assert ws.grade(120).resolved is False
    assert ws.sandbox.closed


@pytest.mark.slow
def test_demo_trains_on_mini_swe_agent_sessions_with_books_balanced(tmp_path: Path) -> None:
    """A few episodes through a training run's gateway with a tiny model (examples/swe_agent/demo.py, no
    warm start: nearly every reply is a format error, so each model call is a one-turn branch): sessions
    recorded, rewarded and trained, every admitted session accounted for."""
    report = tmp_path / "report.json"
    cmd = [
        sys.executable, str(ROOT / "examples/swe_agent/demo.py"), "--work-dir", str(tmp_path / "run"),
        "--instances", "3", "--warm-start-steps", "0", "--concurrency", "2", "--report", str(report),
        "trainer.total_steps=2", "trainer.batch_size=4",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=900)
    out = json.loads(report.read_text())
    books = out["books"]
    assert books["sessions_balanced"] and books["trained_are_closed"], books
    assert out["steps"] == 2
    assert books["trained"] == out["trajectories"]["trained"] >= 8  # a session's branches are queued together
    assert out["sessions"]["rewarded"] >= 1
    assert out["harness"]["outcomes"].get("rewarded", 0) >= 1
    assert out["trajectories"]["per_session"] > 1  # the agent dropped its malformed replies: new branches
    assert 0.5 < out["tokens"]["observation_share"] < 1.0  # the prompt is masked, the replies are not
