"""The repository env (`swe`) played by scripted policies: tools, containment, limits, grading, and one
episode through the real agent loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sao.envs.base import ENV_REGISTRY, StepResult
from sao.envs.swe_env import SWEEnv
from sao.envs.swe_instance import SWEInstance
from sao.envs.swe_tools import disk_usage_bytes, truncate_observation

from .scripted import ScriptedEngine, play_scripted
from .swe_fixture import BUGGY, FIXED, make_instance, task_of

FIX = {"path": "calc/ops.py", "old_str": "return a - b", "new_str": "return a + b"}


@pytest.fixture(scope="module")
def inst(tmp_path_factory: pytest.TempPathFactory) -> SWEInstance:
    return make_instance(tmp_path_factory.mktemp("swe-env"))


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def play(inst: SWEInstance, turns: list[str], **env_kwargs: object) -> tuple[list[dict], list[StepResult]]:
    env = SWEEnv(**{"command_timeout_s": 20.0, "test_timeout_s": 60.0, **env_kwargs})  # type: ignore[arg-type]
    return play_scripted(env, task_of(inst), turns)


def texts(result: StepResult) -> list[str]:
    return [m["content"] for m in result.observation]


def test_registered_under_swe_with_the_five_tools() -> None:
    env = SWEEnv(max_turns=7)
    assert ENV_REGISTRY["swe"] is SWEEnv and env.max_turns == 7
    names = [tool["function"]["name"] for tool in env.tools]
    assert names == ["bash", "view", "str_replace", "create", "submit"]


def test_reset_shows_the_issue_in_a_clean_git_repo_without_the_hidden_tests(inst: SWEInstance) -> None:
    turns = [call("bash", command="git status --porcelain; git log --oneline | wc -l; ls tests")]
    initial, results = play(inst, turns)
    assert [m["role"] for m in initial] == ["system", "user"]
    assert initial[1]["content"].startswith(inst.problem_statement) and "submit" in initial[1]["content"]
    assert texts(results[0]) == ["1\ntest_ops.py\n[exit code 0]"]  # clean, one commit, no test_new.py


def test_reference_patch_through_str_replace_scores_one(inst: SWEInstance) -> None:
    _, results = play(
        inst, [call("str_replace", **FIX), call("bash", command="git diff --stat"), call("submit")]
    )
    assert "edited calc/ops.py" in texts(results[0])[0] and "return a + b" in texts(results[0])[0]
    assert "calc/ops.py | 2 +-" in texts(results[1])[0]
    last = results[-1]
    assert last.done and last.reward == 1.0 and last.observation == []
    assert last.info["resolved"] is True and last.info["submitted"] is True and last.info["limit"] is None
    assert last.info["fail_to_pass_passed"] == 2 and last.info["pass_to_pass_passed"] == 1
    assert "3 passed" in last.info["test_output"]


def test_submit_without_change_scores_zero(inst: SWEInstance) -> None:
    _, results = play(inst, [call("submit")])
    assert results[0].done and results[0].reward == 0.0 and results[0].info["resolved"] is False
    assert results[0].info["fail_to_pass_failed"] == 2 and results[0].info["pass_to_pass_passed"] == 1


def test_calls_after_submit_in_the_same_turn_are_ignored(inst: SWEInstance) -> None:
    turn = call("str_replace", **FIX) + call("submit") + call("create", path="calc/ops.py", file_text="x = (")
    _, results = play(inst, [turn])
    assert results[0].reward == 1.0 and results[0].info["tool_calls"] == 3


def test_view_shows_numbered_lines_ranges_and_directories(inst: SWEInstance) -> None:
    turns = [
        call("view", path="calc/ops.py")
        + call("view", path="calc/ops.py", view_range=[4, -1])
        + call("view", path=".")
        + call("view", path="calc/ops.py", view_range=[9, 12])
        + call("view", path="nope.py")
    ]
    _, results = play(inst, turns)
    whole, tail, listing, bad_range, missing = texts(results[0])
    assert whole == "\n".join(f"{i + 1:6}\t{line}" for i, line in enumerate(BUGGY.splitlines()))
    assert tail == "     4\t\n     5\tdef mul(a, b):\n     6\t    return a * b"
    assert listing.splitlines()[1:] == [
        "calc/",
        "calc/__init__.py",
        "calc/ops.py",
        "tests/",
        "tests/test_ops.py",
    ]
    assert bad_range.startswith("error: view: view_range start 9 is not a line of the file (1..6)")
    assert missing == "error: view: nope.py does not exist"


def test_str_replace_needs_exactly_one_match_and_says_where(inst: SWEInstance) -> None:
    turns = [
        call("str_replace", path="calc/ops.py", old_str="return", new_str="yield")
        + call("str_replace", path="calc/ops.py", old_str="return a / b", new_str="x")
        + call("bash", command="git status --porcelain")
    ]
    _, results = play(inst, turns)
    many, none, status = texts(results[0])
    assert many.startswith("error: str_replace: old_str occurs 2 times in calc/ops.py (at lines 2, 6)")
    assert none.startswith("error: str_replace: old_str does not occur in calc/ops.py")
    assert status == "[exit code 0]"  # nothing changed


def test_create_writes_and_says_when_it_overwrote(inst: SWEInstance) -> None:
    turns = [
        call("create", path="pkg/new/mod.py", file_text="A = 1\nB = 2\n")
        + call("create", path="calc/ops.py", file_text=FIXED)
        + call("bash", command="cat pkg/new/mod.py; git status --porcelain"),
        call("submit"),
    ]
    _, results = play(inst, turns)
    created, overwrote, shown = texts(results[0])
    assert created == "created pkg/new/mod.py (2 lines, 12 characters)"
    assert overwrote.startswith("overwrote the existing file calc/ops.py")
    assert shown == "A = 1\nB = 2\n M calc/ops.py\n?? pkg/\n[exit code 0]"
    assert results[1].reward == 1.0


def test_escaping_the_workspace_is_an_error_and_nothing_leaks_or_lands_outside(
    inst: SWEInstance, tmp_path: Path
) -> None:
    secret, outside = tmp_path / "secret.txt", tmp_path / "outside.txt"
    secret.write_text("secret-outside\n")
    turns = [
        call("view", path="../../../../etc/passwd")
        + call("view", path="/etc/passwd")
        + call("create", path="/etc/sao-swe-escape", file_text="x")
        + call("create", path=f"../../../..{outside}", file_text="x"),
        call(
            "bash",
            command=f"ln -s /etc/passwd leak && ln -s {secret} secret && ln -s {tmp_path} out && echo ok",
        ),
        call("view", path="leak")
        + call("view", path="secret")
        + call("str_replace", path="secret", old_str="secret", new_str="leaked")
        + call("create", path="secret", file_text="overwritten")
        + call("create", path="out/outside.txt", file_text="x")
        + call("view", path="out"),
    ]
    _, results = play(inst, turns)
    answers = texts(results[0]) + texts(results[2])
    assert len(answers) == 10 and all(a.startswith("error: ") for a in answers), answers
    assert all("leads out of the repository" in a or "outside the repository" in a for a in answers)
    assert not any("root:" in a or "secret-outside" in a or "secret.txt" in a for a in answers)
    assert texts(results[1]) == ["ok\n[exit code 0]"]  # the symlinks exist inside
    assert not Path("/etc/sao-swe-escape").exists() and not outside.exists()
    assert secret.read_text() == "secret-outside\n"


def test_unknown_tools_bad_arguments_and_malformed_calls_are_error_observations(inst: SWEInstance) -> None:
    turns = [
        call("rm_rf", path=".")
        + call("bash", cmd="ls")
        + call("view", path="calc/ops.py", view_range="all")
        + "<tool_call>{not json</tool_call>",
        call("bash", command="head -c 3000 /dev/urandom > blob.bin") + call("view", path="blob.bin"),
        "I think the bug is in add.",
    ]
    _, results = play(inst, turns)
    first = texts(results[0])
    assert first[0].startswith("error: tool call is not valid JSON")
    assert first[1].startswith("error: unknown tool 'rm_rf'; the tools are bash, view, str_replace, create")
    assert first[2] == 'error: bash: needs a string "command" argument'
    assert first[3].startswith("error: view: view_range must be two integers")
    assert texts(results[1])[1] == "error: view: blob.bin is a binary file; use bash to inspect it"
    nudge = results[2].observation
    assert nudge[0]["role"] == "user" and "No tool call found" in nudge[0]["content"]
    assert not any(r.done for r in results)


def test_commands_running_forever_or_out_of_memory_are_contained_and_the_episode_goes_on(
    inst: SWEInstance,
) -> None:
    turns = [
        call("bash", command="while true; do :; done"),
        call("bash", command="sleep 1000 & sleep 1000"),
        call("bash", command="python -c 'bytearray(8 << 30)'"),
        call("bash", command="echo still-here"),
    ]
    _, results = play(inst, turns, command_timeout_s=1.0, memory_mb=1024)
    assert "timed out after" in texts(results[0])[0] and "timed out after" in texts(results[1])[0]
    assert "MemoryError" in texts(results[2])[0] and "out of memory" in texts(results[2])[0]
    assert texts(results[3]) == ["still-here\n[exit code 0]"] and not any(r.done for r in results)


def test_a_disk_bomb_ends_the_episode_with_reward_zero(inst: SWEInstance) -> None:
    turns = [
        call("bash", command="head -c 2000000 /dev/zero > small.bin"),
        call("str_replace", **FIX)
        + call("bash", command="for i in 1 2 3 4; do head -c 3000000 /dev/zero > b$i; done"),
        call("submit"),
    ]
    _, results = play(inst, turns, max_disk_mb=8)
    assert len(results) == 2 and not results[0].done
    assert results[1].done and results[1].reward == 0.0 and results[1].observation == []
    assert results[1].info["limit"] == "disk" and results[1].info["disk_mb"] > 8


def test_a_long_observation_keeps_head_and_tail_around_a_note(inst: SWEInstance) -> None:
    _, results = play(inst, [call("bash", command="seq 1 100000")], max_observation_chars=1000)
    text = texts(results[0])[0]
    assert (
        len(text) <= 1000 and text.startswith("1\n2\n3\n") and text.endswith("99999\n100000\n[exit code 0]")
    )
    assert "characters cut; redirect the output to a file and grep" in text


def test_max_turns_ends_the_episode_with_grading(inst: SWEInstance) -> None:
    turns = [call("str_replace", **FIX), call("view", path="calc/ops.py"), call("submit")]
    _, results = play(inst, turns, max_turns=2)
    assert len(results) == 2 and results[1].done and results[1].reward == 1.0
    assert results[1].info["max_turns"] is True and results[1].info["submitted"] is False


def test_the_qwen3_coder_tool_format_is_read(inst: SWEInstance) -> None:
    xml = (
        "<tool_call>\n<function=str_replace>\n<parameter=path>\ncalc/ops.py\n</parameter>\n"
        "<parameter=old_str>\nreturn a - b\n</parameter>\n<parameter=new_str>\nreturn a + b\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    submit = "<tool_call>\n<function=submit>\n</function>\n</tool_call>"
    _, results = play(inst, [xml, submit], tool_format="qwen3_coder")
    assert results[-1].reward == 1.0
    with pytest.raises(ValueError, match="unknown tool-call format 'nope'"):
        SWEEnv(tool_format="nope")


def test_truncate_observation_keeps_short_text_and_bounds_long_text() -> None:
    assert truncate_observation("short", 300) == "short"
    long = "a" * 500 + "b" * 500
    cut = truncate_observation(long, 300)
    head, note, tail = cut.split("\n")
    assert 295 <= len(cut) <= 300 and set(head) == {"a"} and set(tail) == {"b"}
    assert (
        note == f"[... {1000 - len(head) - len(tail)} characters cut; view a line range or grep for it ...]"
    )


def test_disk_usage_counts_allocated_blocks_and_hard_links_once(tmp_path: Path) -> None:
    empty = disk_usage_bytes(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 1_000_000)
    (tmp_path / "d" / "g").hardlink_to(tmp_path / "d" / "f")
    (tmp_path / "link").symlink_to("/usr")
    used = disk_usage_bytes(tmp_path) - empty
    assert 1_000_000 <= used < 1_200_000


def test_episode_through_the_agent_loop(inst: SWEInstance, tiny_tokenizer) -> None:
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    turns = [call("str_replace", **FIX), call("bash", command="git diff"), call("submit")]
    engine = ScriptedEngine(tiny_tokenizer, turns)
    cfg = AgentLoopConfig(max_tokens_per_turn=512, max_total_tokens=8192)
    env = SWEEnv(command_timeout_s=20.0, test_timeout_s=60.0)
    traj = asyncio.run(run_episode(engine, tiny_tokenizer, env, task_of(inst), cfg))
    assert traj.rewards == [0.0, 0.0, 1.0] and traj.finish_reason == "stop"
    assert (
        traj.metadata["infos"][-1]["resolved"] is True and traj.metadata["sandbox_mode"] == env.sandbox_mode
    )
    text = tiny_tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert '"name": "str_replace"' in text.split("<|im_start|>user")[0]  # the schemas are in the system turn
    assert "+    return a + b" in text.split("<tool_response>")[2]  # the git diff observation
    observed = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m == 0]
    assert "edited calc/ops.py" in tiny_tokenizer.decode(observed)  # observations are masked out
    assert env._workspace is None  # closed by the loop
