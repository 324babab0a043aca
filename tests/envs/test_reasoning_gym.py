"""The ``reasoning_gym`` env over the real reasoning-gym library: configuration checks, seeded task mixes,
the library's scorer as the reward (through ``step``, ``score`` and a task file), and the SFT recipe."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("reasoning_gym")

from sao.envs import make_env, make_env_tasks
from sao.envs.base import EnvError, Task, score_conversation
from sao.envs.reasoning_gym_env import (
    INSTALL_HINT,
    ReasoningGymEnv,
    ReasoningGymScoreError,
    _family_check,
    _scorer,
)
from sao.envs.reasoning_gym_sft import SOLVERS, answer_reply, main, sft_conversations
from sao.envs.tasks import load_tasks, save_tasks_jsonl

from .scripted import ScriptedEngine, play_scripted

SMALL = {  # the small configs the docs recommend for a tiny model
    "chain_sum": {"config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}},
    "products": {"weight": 2, "config": {"max_digits": 1}},
    "leg_counting": {"weight": 5, "config": {"min_animals": 1, "max_animals": 2, "max_instances": 3}},
}


def tagged(answer: str) -> str:
    return f"Let me think.\n<answer>{answer}</answer>"


def play(env: ReasoningGymEnv, task: Task, text: str):
    initial, [result] = play_scripted(env, task, [text])
    return initial, result


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return ReasoningGymEnv.make_tasks(60, 3, datasets=SMALL)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"datasets": ["chain_summ"]}, "unknown reasoning-gym dataset 'chain_summ'; did you mean chain_sum"),
        (
            {"datasets": {"chain_sum": {"config": {"max_digit": 2}}}},
            "'chain_sum': unknown config key 'max_digit'",
        ),
        (
            {"datasets": {"leg_counting": {"config": {"max_animals": 2}}}},
            "max_animals must be >= min_animals",
        ),
        ({"datasets": {"chain_sum": {"config": {"seed": 1}}}}, "config key 'seed' is set by sao"),
        ({"datasets": {"chain_sum": {"weight": 0}}}, "'chain_sum': weight must be a finite number > 0"),
        ({"datasets": {"chain_sum": {"wieght": 2}}}, "'chain_sum': unknown keys ['wieght']"),
        ({"datasets": ["chain_sum", "chain_sum"]}, "'chain_sum' is listed more than once"),
        ({"datasets": []}, "datasets must be a non-empty list"),
        ({"datasets": ["composite"]}, "'composite' is refused"),
        ({"datasets": ["arc_agi"]}, "'arc_agi': its entries do not survive JSON"),
        ({"answer_tag": "a>b"}, "answer_tag must be a tag name"),
        ({"answer_tag": "final"}, "asks for <answer> tags but answer_tag is 'final'"),
    ],
)
def test_bad_configuration_is_refused_at_construction_naming_the_problem(kwargs, message):
    with pytest.raises(EnvError) as err:
        make_env("reasoning_gym", **kwargs)
    assert message in str(err.value)


def test_without_the_library_the_module_imports_and_construction_names_the_install_command(monkeypatch):
    code = "import sys; sys.modules['reasoning_gym'] = None; import sao.envs.reasoning_gym_sft"
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(EnvError, match="pip install 'sao\\[reasoning-gym\\]'"):
        ReasoningGymEnv(datasets=["chain_sum"])
    assert "sao[reasoning-gym]" in INSTALL_HINT


def test_system_prompt_is_a_library_prompt_by_name_verbatim_text_or_none(tasks):
    from reasoning_gym.utils import SYSTEM_PROMPTS

    task = tasks[0]
    assert asyncio.run(ReasoningGymEnv().reset(task))[0]["content"] == SYSTEM_PROMPTS["default"]
    assert (
        asyncio.run(ReasoningGymEnv(system_prompt="direct").reset(task))[0]["content"]
        == SYSTEM_PROMPTS["direct"]
    )
    assert (
        ReasoningGymEnv(system_prompt="Reply <answer>n</answer>.").system_prompt
        == "Reply <answer>n</answer>."
    )
    assert ReasoningGymEnv(system_prompt=None).system_prompt is None
    assert ReasoningGymEnv(system_prompt="", answer_tag="final").system_prompt is None


def test_tasks_are_deterministic_in_n_seed_and_datasets_and_extend_with_n(tasks):
    again = ReasoningGymEnv.make_tasks(60, 3, datasets=SMALL)
    assert again == tasks
    assert ReasoningGymEnv.make_tasks(20, 3, datasets=SMALL) == tasks[:20]
    other = ReasoningGymEnv.make_tasks(60, 4, datasets=SMALL)
    assert [t.prompt for t in other] != [t.prompt for t in tasks]
    assert len({t.id for t in tasks}) == 60 and tasks[0].id.startswith("rg3-0-")
    reweighted = {**SMALL, "products": {"weight": 9, "config": {"max_digits": 1}}}
    assert ReasoningGymEnv.make_tasks(60, 3, datasets=reweighted) != tasks


def test_tasks_mix_families_by_weight():
    mix = Counter(t.metadata["dataset"] for t in ReasoningGymEnv.make_tasks(4000, 0, datasets=SMALL))
    assert set(mix) == set(SMALL)
    for name, share in (("chain_sum", 1 / 8), ("products", 2 / 8), ("leg_counting", 5 / 8)):
        assert abs(mix[name] / 4000 - share) < 0.03, mix


def test_tasks_carry_the_library_entry_and_the_family_config(tasks):
    import reasoning_gym

    task = next(t for t in tasks if t.metadata["dataset"] == "chain_sum")
    config = json.loads(task.metadata["dataset_config"])
    meta = json.loads(task.metadata["entry_metadata"])
    assert config == SMALL["chain_sum"]["config"]
    assert meta["source_dataset"] == "chain_sum" and task.prompt.endswith(f"{meta['expression']} =")
    dataset = reasoning_gym.create_dataset("chain_sum", **config, seed=0, size=1)
    entry = {"question": task.prompt, "answer": task.answer, "metadata": meta}
    assert dataset.score_answer(task.answer, entry) == 1.0


def test_make_env_tasks_passes_only_the_datasets_to_the_generator(tasks):
    made = make_env_tasks("reasoning_gym", 60, 3, datasets=SMALL, system_prompt="direct", answer_tag="answer")
    assert made == tasks
    with pytest.raises(EnvError, match=r"data\.env_kwargs\.datasets"):
        make_env_tasks("reasoning_gym", 4, 0)


def test_the_library_answer_in_the_tag_scores_one_and_a_wrong_or_missing_one_zero(tasks):
    env = ReasoningGymEnv(datasets=SMALL)
    for task in tasks[:12]:
        initial, right = play(env, task, tagged(task.answer))
        assert initial[-1] == {"role": "user", "content": task.prompt}
        assert (right.reward, right.done, right.observation) == (1.0, True, [])
        assert right.info == {"dataset": task.metadata["dataset"], "answer": task.answer, "no_answer": False}
        assert play(env, task, tagged(str(int(task.answer) + 1)))[1].reward == 0.0
        missing = play(env, task, f"The answer is {task.answer}.")[1]
        assert (missing.reward, missing.info["no_answer"], missing.info["answer"]) == (0.0, True, None)


def test_the_last_answer_tag_is_the_answer(tasks):
    task, env = tasks[0], ReasoningGymEnv()
    assert play(env, task, f"<answer>x</answer> then <answer>{task.answer}</answer>")[1].reward == 1.0
    assert play(env, task, f"<answer>{task.answer}</answer> then <answer>x</answer>")[1].reward == 0.0


def test_a_library_scorer_that_fails_raises_instead_of_a_made_up_reward(tasks, monkeypatch):
    task = next(t for t in tasks if t.metadata["dataset"] == "products")
    scorer = _scorer("products", task.metadata["dataset_config"])
    for bad in (float("nan"), "1", 1.5):
        monkeypatch.setattr(scorer, "score_answer", lambda answer, entry, bad=bad: bad)
        with pytest.raises(ReasoningGymScoreError, match="not in \\[0, 1\\]"):
            play(ReasoningGymEnv(), task, tagged(task.answer))

    def crash(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(scorer, "score_answer", crash)
    with pytest.raises(ReasoningGymScoreError, match="score_answer raised KeyError"):
        play(ReasoningGymEnv(), task, tagged(task.answer))


def test_a_task_that_is_not_a_reasoning_gym_task_fails_at_reset():
    with pytest.raises(EnvError, match="is not a reasoning_gym task"):
        play(ReasoningGymEnv(), Task("x", "What is 2 + 2?", "4"), tagged("4"))


def test_score_agrees_with_step_and_gives_zero_for_a_malformed_conversation(tasks):
    env = ReasoningGymEnv()
    for task in tasks[:8]:
        for text in (tagged(task.answer), tagged("0"), "no tag", f"<answer> {task.answer} </answer>"):
            initial, result = play(env, task, text)
            conversation = [*initial, {"role": "assistant", "content": text}]
            assert asyncio.run(score_conversation(env, task, conversation)) == result.reward
    assert env.score(tasks[0], [{"role": "user", "content": tagged(tasks[0].answer)}]) == 0.0
    assert env.score(tasks[0], []) == 0.0
    tool_call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}
    assert env.score(tasks[0], [tool_call]) == 0.0


def test_tasks_read_back_from_a_task_file_score_in_a_fresh_process_state(tasks, tmp_path):
    path = tmp_path / "rg.jsonl"
    save_tasks_jsonl(path, tasks)
    loaded = load_tasks(path)
    assert loaded == tasks
    _scorer.cache_clear()  # as in another process: the datasets are rebuilt from the tasks' metadata
    _family_check.cache_clear()
    env = ReasoningGymEnv()  # no datasets needed to play tasks from a file
    assert all(play(env, t, tagged(t.answer))[1].reward == 1.0 for t in loaded)
    assert _scorer.cache_info().currsize == len(SMALL)


def test_sft_rows_are_the_reset_messages_and_a_solution_ending_in_the_tagged_answer(tmp_path):
    from sao.envs.reasoning_gym_env import generate_tasks, parse_datasets
    from sao.train.sft import load_chat_jsonl

    out = tmp_path / "chats.jsonl"
    rest = {k: v for k, v in SMALL.items() if k != "chain_sum"}
    main(["--datasets", "chain_sum", "--config", json.dumps(rest), "--n", "40", "--out", str(out)])
    rows = [messages for messages, _tools in load_chat_jsonl(out)]
    datasets = {"chain_sum": {}, **rest}
    sft_tasks = generate_tasks(40, 0, parse_datasets(datasets), namespace="sft")
    assert len(rows) == 40 and len({t.metadata["dataset"] for t in sft_tasks}) == 3
    for row, task in zip(rows, sft_tasks, strict=True):
        assert row[:2] == asyncio.run(ReasoningGymEnv(datasets=datasets).reset(task))
        assert row[2] == {"role": "assistant", "content": answer_reply(task)}
        assert row[2]["content"].endswith(f"<answer>{task.answer}</answer>")
    training = ReasoningGymEnv.make_tasks(40, 0, datasets=datasets)
    assert [t.prompt for t in training] != [t.prompt for t in sft_tasks]  # the SFT seeds are not training's
    direct, failed = sft_conversations(5, 1, ["products"], system_prompt="direct", solution=False)
    assert failed == 0 and all(c[0]["content"].startswith("Answer the question directly") for c in direct)
    assert all(c[2]["content"].startswith("<answer>") for c in direct)


def test_sft_solutions_are_worked_steps_that_end_at_the_answer(tasks):
    for task in tasks:
        reply = answer_reply(task)
        lines = reply.split("\n")
        assert task.metadata["dataset"] in SOLVERS and len(lines) >= 2
        assert lines[-2].endswith(f"= {task.answer}") and lines[-1] == f"<answer>{task.answer}</answer>"
    chain = Task(
        "c", "q", "-4", metadata={"dataset": "chain_sum", "entry_metadata": '{"expression": "4 - 1 - 7"}'}
    )
    assert answer_reply(chain) == "4 - 1 = 3\n3 - 7 = -4\n<answer>-4</answer>"
    assert answer_reply(chain, solution=False) == "<answer>-4</answer>"
    mixed = Task(
        "m",
        "q",
        "-11",
        metadata={"dataset": "basic_arithmetic", "entry_metadata": '{"expression": "3 - 2 * 7"}'},
    )
    assert answer_reply(mixed) == "<answer>-11</answer>"  # left to right would be wrong: no solution
    legs = Task(
        "l",
        "q",
        "18",
        metadata={"dataset": "leg_counting", "entry_metadata": '{"animals": {"spider": 2, "human": 1}}'},
    )
    assert answer_reply(legs) == "spider: 2 * 8 = 16\nhuman: 1 * 2 = 2\n16 + 2 = 18\n<answer>18</answer>"


def test_an_episode_through_the_agent_loop_earns_the_library_reward(tasks, tiny_tokenizer):
    from sao.rollout.agent_loop import AgentLoopConfig, run_episode

    task = tasks[1]
    engine = ScriptedEngine(tiny_tokenizer, [answer_reply(task)])
    traj = asyncio.run(run_episode(engine, tiny_tokenizer, ReasoningGymEnv(), task, AgentLoopConfig()))
    assert traj.rewards == [1.0] and traj.finish_reason == "stop" and traj.num_turns == 1
    assert traj.metadata["infos"][0]["answer"] == task.answer


def test_a_deliberately_imperfect_warm_start_mixes_direct_and_wrong_answers():
    from sao.envs.reasoning_gym_env import ReasoningGymEnv, generate_tasks
    from sao.envs.reasoning_gym_sft import SFT_NAMESPACE

    datasets = {"chain_sum": {"config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}}
    chats, failed = sft_conversations(400, 0, datasets, "simple", direct_frac=0.5, direct_wrong_frac=0.5)
    tasks = generate_tasks(400, 0, ReasoningGymEnv(datasets=datasets).families, namespace=SFT_NAMESPACE)
    assert failed == 0 and len(chats) == 400 == len(tasks)
    kinds = {"worked": 0, "direct": 0, "wrong": 0}
    for chat, task in zip(chats, tasks, strict=True):
        reply = chat[-1]["content"]
        assert chat[-2]["content"] == task.prompt
        if reply == answer_reply(task, solution=True) and "=" in reply:
            kinds["worked"] += 1
        elif reply == answer_reply(task, solution=False):
            kinds["direct"] += 1
        else:  # the tag alone, off by 1 or 2
            value = int(reply.removeprefix("<answer>").removesuffix("</answer>"))
            assert abs(value - int(task.answer)) in (1, 2)
            kinds["wrong"] += 1
    assert 150 < kinds["worked"] < 250 and 60 < kinds["direct"] < 140 and 60 < kinds["wrong"] < 140, kinds
    with pytest.raises(EnvError, match="direct_wrong_frac"):
        sft_conversations(1, 0, datasets, direct_wrong_frac=2.0)
