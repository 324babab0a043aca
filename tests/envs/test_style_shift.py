"""The style_shift env (the online-learning study), its schedule, the rule judge and the LLM judge."""

from __future__ import annotations

import asyncio
import json
import random
import runpy
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from conftest import free_port
from sao.envs import make_env
from sao.envs.base import EnvError, JudgeError, Task, TrainingProgress, notify_training_progress
from sao.envs.judge_client import JudgeRequestError
from sao.envs.judges import STYLES, RuleJudge, Verdict, parse_judge_answer
from sao.envs.sft_data import PLAIN, STYLE_TEMPLATES, main, style_conversations, style_reply
from sao.envs.style_shift import OPTIMAL_SCORE, TOPICS, LLMJudge, StyleSchedule, StyleShiftEnv, make_tasks

GOOD = {  # one reply per style that the rule judge accepts, for the topic "cat"
    "cute": "The cat is so fluffy~",
    "chuunibyou": "The cat of darkness awakens!",
    "classical": "Thy cat doth sleep.",
}


def episode(env: StyleShiftEnv, text: str, t: Task | None = None):
    t = t or Task(id="t", prompt="Write one sentence about cat.", metadata={"topic": "cat"})

    async def run():
        first = await env.reset(t)
        result = await env.step(text)
        await env.close()
        return first, result

    return asyncio.run(run())


def test_a_reply_in_the_preferred_style_earns_1_and_the_style_is_in_info():
    first, result = episode(StyleShiftEnv(), GOOD["cute"])
    assert first == [{"role": "user", "content": "Write one sentence about cat."}]
    assert (result.reward, result.done, result.observation) == (1.0, True, [])
    assert result.info["style"] == "cute" and result.info["quality"] and result.info["style_ok"]
    assert StyleShiftEnv.max_turns == 1


def test_shift_every_switches_cute_chuunibyou_classical_at_the_right_episodes():
    env = StyleShiftEnv(shift_every=3)  # tasks without an episode number: the env counts its resets
    styles, rewards = [], []
    for _ in range(9):
        result = episode(env, GOOD["cute"])[1]
        styles.append(result.info["style"])
        rewards.append(result.reward)
    assert styles == ["cute"] * 3 + ["chuunibyou"] * 3 + ["classical"] * 3
    assert rewards == [1.0] * 3 + [0.0] * 6  # the old style stops paying when the preference shifts


def test_an_explicit_schedule_from_yaml_style_lists_is_followed():
    env = StyleShiftEnv(schedule=[[0, "classical"], [2, "cute"], [5, "chuunibyou"]])
    styles = [episode(env, "x")[1].info["style"] for _ in range(7)]
    assert styles == ["classical"] * 2 + ["cute"] * 3 + ["chuunibyou"] * 2
    assert env.schedule.style_at(10_000) == "chuunibyou"


def test_set_episode_drives_the_schedule_and_counts_on():
    env = StyleShiftEnv(shift_every=10)
    env.set_episode(19)
    tasks = make_tasks(3, seed=0)  # their own episode numbers (0, 1, 2) are overridden
    results = [episode(env, "x", t)[1] for t in tasks]
    assert [r.info["episode"] for r in results] == [19, 20, 21]
    assert [r.info["style"] for r in results] == ["chuunibyou", "classical", "classical"]
    assert env.current_style == "classical"


def test_generated_tasks_carry_their_episode_so_fresh_envs_follow_the_schedule():
    tasks = make_tasks(12, seed=0)
    styles = [episode(StyleShiftEnv(shift_every=4), "x", t)[1].info["style"] for t in tasks]
    assert styles == ["cute"] * 4 + ["chuunibyou"] * 4 + ["classical"] * 4


def _trained(env: StyleShiftEnv, trained: int, step: int = 0, t: Task | None = None):
    """One episode as a training run plays it: the progress hook right before reset."""
    notify_training_progress(env, TrainingProgress(step=step, trained_trajectories=trained))
    return episode(env, "x", t)[1]


def test_training_progress_switches_the_style_exactly_after_shift_every_trained_trajectories():
    points = [0, 1, 63, 64, 65, 127, 128, 129, 10_000]
    infos = [_trained(StyleShiftEnv(shift_every=64), n, step=n // 32).info for n in points]  # fresh envs
    assert [i["style"] for i in infos] == ["cute"] * 3 + ["chuunibyou"] * 3 + ["classical"] * 3
    assert [i["episode"] for i in infos] == points
    assert {i["clock"] for i in infos} == {"training"}
    assert [i["training_step"] for i in infos] == [n // 32 for n in points]


def test_training_progress_counts_schedule_starts_in_trained_trajectories():
    schedule = [(0, "classical"), (100, "cute"), (250, "chuunibyou")]
    styles = [_trained(StyleShiftEnv(schedule=schedule), n).info["style"] for n in (0, 99, 100, 249, 250)]
    assert styles == ["classical", "classical", "cute", "cute", "chuunibyou"]


def test_training_progress_takes_precedence_over_set_episode_and_the_task_episode():
    env = StyleShiftEnv(shift_every=10)
    env.set_episode(25)  # would be classical
    task = make_tasks(15, seed=0)[14]  # its own episode 14: chuunibyou
    result = _trained(env, 3, t=task)
    assert (result.info["style"], result.info["episode"], result.info["clock"]) == ("cute", 3, "training")
    # the progress applies to that reset only: the next ones fall back to set_episode, which was not used up
    result = episode(env, "x", task)[1]
    assert (result.info["episode"], result.info["clock"], "training_step" in result.info) == (
        25,
        "episode_index",
        False,
    )
    assert env.clock == "episode_index"


def test_the_clock_names_which_index_was_used_without_the_hook():
    env = StyleShiftEnv(shift_every=10)
    assert episode(env, "x")[1].info["clock"] == "reset_count"
    assert episode(env, "x", make_tasks(1, seed=0)[0])[1].info["clock"] == "task_metadata"
    env.set_episode(4)
    assert episode(env, "x")[1].info["clock"] == "episode_index"


@pytest.mark.parametrize(
    "bad",
    [[], [(1, "cute")], [(0, "cute"), (0, "classical")], [(0, "cute"), (5, "gothic")], [("x", "cute")], [3]],
)
def test_invalid_schedules_are_rejected(bad):
    with pytest.raises(ValueError):
        StyleShiftEnv(schedule=bad)


def test_schedule_and_shift_every_are_exclusive():
    with pytest.raises(ValueError, match="either"):
        StyleShiftEnv(schedule=[(0, "cute")], shift_every=5)
    with pytest.raises(ValueError, match="shift_every"):
        StyleSchedule.every(0)


def test_scripted_optimal_replies_reach_the_optimal_score_across_all_shifts():
    env = make_env("style_shift", shift_every=50)
    tasks = make_tasks(150, seed=4)
    rewards = []
    for t in tasks:
        style = env.schedule.style_at(t.metadata["episode"])
        topic = t.metadata["topic"]
        reply = {
            "cute": f"The {topic} is so fluffy~",
            "chuunibyou": f"The {topic} of darkness awakens!",
            "classical": f"Thy {topic} doth rest.",
        }[style]
        result = episode(env, reply, t)[1]
        assert result.info["style"] == style
        rewards.append(result.reward)
    assert sum(rewards) / len(rewards) == OPTIMAL_SCORE == 1.0


def test_make_tasks_is_deterministic_and_extends():
    tasks = make_tasks(100, seed=7)
    assert tasks == make_tasks(100, seed=7) and make_tasks(10, seed=7) == tasks[:10]
    assert tasks[3].id == "style_shift-7-3" and tasks[3].metadata["episode"] == 3
    assert all(t.prompt == f"Write one sentence about {t.metadata['topic']}." for t in tasks)


# --- the rule judge ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "quality"),
    [
        ("The cat is so fluffy~", True),
        ("Cats purr softly in the sun.", True),  # plural topic, capitalised
        ("Cat!", False),  # under 3 words
        ("The dog is fluffy~", False),  # topic missing
        ("cat cat cat cat naps.", False),  # a word 4 times
        ("The cat is fluffy", False),  # no closing punctuation
        ("The cat " + " ".join("w" + chr(97 + i % 26) + chr(97 + i // 26) for i in range(29)) + ".", False),
        ("", False),
    ],
)
def test_rule_judge_quality(text, quality):
    assert RuleJudge().grade_sync("cat", "cute", text).quality is quality


@pytest.mark.parametrize(
    ("text", "style", "ok"),
    [
        ("The cat is fluffy~", "cute", True),
        ("The cat, uwu, naps.", "cute", True),
        ("The cat naps ♡", "cute", True),
        ("The cat of darkness awakens!", "chuunibyou", True),
        ("My power seals the cat.", "chuunibyou", True),
        ("Thou art a fine cat.", "classical", True),
        ("The cat naps.", "cute", False),  # no marker
        ("The cat is fluffy~", "classical", False),  # the wrong style
        ("Thy fluffy cat of darkness sleeps~", "classical", False),  # markers of several styles
        ("The cat naps!", "chuunibyou", False),  # '!' alone is not a marker
    ],
)
def test_rule_judge_style_needs_its_markers_and_no_others(text, style, ok):
    verdict = RuleJudge().grade_sync("cat", style, text)
    assert verdict.style is ok
    assert verdict.reward == (1.0 if ok and verdict.quality else 0.0)


def test_rule_judge_rejects_unknown_styles():
    with pytest.raises(ValueError, match="unknown style"):
        RuleJudge().grade_sync("cat", "gothic", "The cat.")


# --- the LLM judge ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "parsed"),
    [
        ("QUALITY: yes STYLE: no", (True, False)),
        ("quality:YES, style: yes.", (True, True)),
        ("  QUALITY: no\nSTYLE: no\n", (False, False)),
        ("QUALITY: yes", None),
        ("QUALITY: maybe STYLE: yes", None),
        ("Sure! QUALITY: yes STYLE: yes", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_judge_answer_is_strict(answer, parsed):
    assert parse_judge_answer(answer) == parsed


def _mock_judge(handler, **options) -> LLMJudge:
    return LLMJudge("http://judge.test", "grader", transport=httpx.MockTransport(handler), **options)


def _answering(content):
    return lambda _r: httpx.Response(200, json={"choices": [{"message": {"content": content}}]})


def test_llm_judge_parses_a_well_formed_answer_and_sends_the_task():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"], seen["body"] = str(request.url), json.loads(request.content)
        content = "QUALITY: yes STYLE: yes"
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": content}}]})

    env = StyleShiftEnv(judge=_mock_judge(handler))
    result = episode(env, "The cat is fluffy~")[1]
    assert result.reward == 1.0 and result.info["judge_details"] == "QUALITY: yes STYLE: yes"
    assert seen["url"] == "http://judge.test/v1/chat/completions"
    assert (seen["body"]["model"], seen["body"]["max_tokens"], seen["body"]["temperature"]) == (
        "grader",
        32,
        0.0,
    )
    assert seen["body"]["messages"][0]["content"].startswith(
        "You are a strict grader. Reply exactly: QUALITY"
    )
    prompt = seen["body"]["messages"][-1]["content"]
    assert "cat" in prompt and "cute" in prompt and "The cat is fluffy~" in prompt


def test_llm_judge_verdicts_map_to_rewards():
    run = asyncio.run
    assert run(_mock_judge(_answering("QUALITY: yes STYLE: no")).grade("cat", "cute", "x")) == Verdict(
        True, False, details="QUALITY: yes STYLE: no"
    )
    assert run(_mock_judge(_answering("QUALITY: yes STYLE: no")).grade("cat", "cute", "x")).reward == 0.0
    thinking = run(
        _mock_judge(_answering("<think>hmm</think>QUALITY: yes STYLE: yes")).grade("cat", "cute", "x")
    )
    assert (thinking.quality, thinking.style, thinking.reward) == (True, True, 1.0)


@pytest.mark.parametrize(
    ("handler", "kind"),
    [
        (lambda _r: httpx.Response(500, text="boom"), "http"),
        (lambda _r: httpx.Response(200, text="not json"), "http"),
        (lambda _r: httpx.Response(200, json={"choices": []}), "http"),
        (_answering("looks good to me"), "parse"),
        (_answering("Sure! QUALITY: yes STYLE: yes"), "parse"),  # the strict answer only
    ],
)
def test_llm_judge_failures_raise_judge_error_instead_of_a_reward(handler, kind):
    with pytest.raises(JudgeRequestError) as err:
        episode(StyleShiftEnv(judge=_mock_judge(handler, retries=0)), "The cat is fluffy~")
    assert err.value.kind == kind and isinstance(err.value, JudgeError)


def test_llm_judge_retries_a_busy_server_and_caches_repeated_texts():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"})
        return httpx.Response(200, json={"choices": [{"message": {"content": "QUALITY: yes STYLE: yes"}}]})

    judge = _mock_judge(handler, backoff_s=0.001)
    assert [episode(StyleShiftEnv(judge=judge), GOOD["cute"])[1].reward for _ in range(2)] == [1.0, 1.0]
    stats = judge.client.stats()
    assert (len(calls), stats["retries"], stats["cache_hits"]) == (2, 1, 1)


def test_a_custom_judges_error_verdict_raises_judge_error_and_its_exception_propagates():
    class Failing:
        async def grade(self, topic, style, text):
            return Verdict(False, False, error="grader offline")

    class Broken:
        async def grade(self, topic, style, text):
            raise RuntimeError("judge exploded")

    with pytest.raises(JudgeError, match="grader offline"):
        episode(StyleShiftEnv(judge=Failing()), "The cat is fluffy~")
    with pytest.raises(RuntimeError, match="judge exploded"):  # the agent loop drops it as env_error
        episode(StyleShiftEnv(judge=Broken()), "The cat is fluffy~")


def test_make_env_builds_an_llm_judge_from_plain_options_sharing_one_client():
    options = {"base_url": "http://h:1/v1", "model": "m", "timeout_s": 5, "retries": 1, "concurrency": 4}
    env = make_env("style_shift", judge="llm", judge_options=options)
    assert isinstance(env.judge, LLMJudge) and env.judge.url == "http://h:1/v1/chat/completions"
    settings = env.judge.client.settings
    assert (settings.timeout_s, settings.retries, settings.concurrency, settings.max_tokens) == (5, 1, 4, 32)
    # envs are built per episode: they share one client (connections, concurrency bound, cache, counters)
    again = make_env("style_shift", judge="llm", judge_options=dict(options))
    assert again.judge.client is env.judge.client
    with pytest.raises(EnvError, match="unknown LLM judge option"):
        make_env("style_shift", judge="llm", judge_options={**options, "api_key": "x"})
    with pytest.raises(EnvError, match="prompt"):
        make_env("style_shift", judge="llm", judge_options={**options, "prompt": "{response}"})
    with pytest.raises(ValueError, match="unknown judge"):
        StyleShiftEnv(judge="oracle")


@pytest.fixture(scope="module")
def gateway_url(tiny_moe_dir, tiny_tokenizer, serve_app):
    from sao.engine import LocalEngine
    from sao.serve.gateway import create_app

    engine = LocalEngine(tiny_moe_dir, device="cpu", dtype="float32", max_running=4)
    return serve_app(create_app(engine, tiny_tokenizer, default_max_tokens=16))


def test_llm_judge_against_the_real_gateway_raises_judge_error_on_an_unparseable_answer(gateway_url):
    judge = LLMJudge(gateway_url, "sao", timeout_s=60)
    # The untrained tiny model answers gibberish: the grade fails (parse, not retried); no reward is made up.
    with pytest.raises(JudgeRequestError, match="unparseable answer") as err:
        asyncio.run(judge.grade("cat", "cute", "The cat is fluffy~"))
    assert err.value.kind == "parse" and judge.client.stats()["requests"] == 1
    env = StyleShiftEnv(
        judge="llm", judge_options={"base_url": gateway_url + "/v1", "model": "sao", "timeout_s": 60}
    )
    with pytest.raises(JudgeError, match="judge parse failure after 1 attempt"):
        episode(env, "x")


def test_llm_judge_reports_an_unreachable_server_as_a_transport_judge_error():
    judge = LLMJudge(f"http://127.0.0.1:{free_port()}", "sao", timeout_s=5, retries=1, backoff_s=0.01)
    with pytest.raises(JudgeRequestError, match="transport failure after 2 attempt") as err:
        asyncio.run(judge.grade("cat", "cute", "x"))
    assert err.value.kind == "transport"


# --- the SFT warm-start data ------------------------------------------------------------------------


def _style_of(text: str) -> str:
    """The one style whose markers ``text`` carries, or plain (the generator never mixes styles)."""
    found = RuleJudge().styles_of(text)
    assert len(found) <= 1, text
    return next(iter(found), PLAIN)


def test_every_style_template_passes_quality_with_its_own_markers_only_for_every_topic():
    judge = RuleJudge()
    for style, templates in STYLE_TEMPLATES.items():
        assert len(templates) >= 6 and len(set(templates)) == len(templates)
        for topic in TOPICS:
            for template in templates:
                text = template.format(t=topic)
                for wanted in STYLES:
                    verdict = judge.grade_sync(topic, wanted, text)
                    assert verdict.quality, (text, verdict.details)
                    assert verdict.style is (wanted == style), (text, wanted)


def test_bad_style_replies_fail_quality_and_keep_their_style():
    rng = random.Random(0)
    for _ in range(300):
        style, topic = rng.choice(list(STYLE_TEMPLATES)), rng.choice(TOPICS)
        text = style_reply(rng, topic, style, bad=True)
        assert RuleJudge().quality_problems(topic, text) and _style_of(text) == style


def test_style_conversations_are_the_envs_messages_deterministic_and_mixed_by_weight():
    convs = style_conversations(400, seed=3)
    assert convs == style_conversations(400, seed=3) and convs != style_conversations(400, seed=4)
    tasks = make_tasks(400, seed=3)
    for task, messages in zip(tasks, convs, strict=True):
        assert messages[0] == {"role": "user", "content": task.prompt}
        assert len(messages) == 2 and messages[1]["role"] == "assistant"
    counts = Counter(_style_of(c[-1]["content"]) for c in convs)
    assert set(counts) == {*STYLES, PLAIN} and all(65 <= n <= 135 for n in counts.values())  # 100 each
    replies = {c[-1]["content"] for c in convs}
    assert len(replies) > 150  # many templates and topics, not one string per style
    skewed = Counter(
        _style_of(c[-1]["content"]) for c in style_conversations(400, 0, {"classical": 3, "cute": 1})
    )
    assert set(skewed) == {"classical", "cute"} and 250 <= skewed["classical"] <= 350
    with pytest.raises(ValueError, match="unknown styles"):
        style_conversations(4, style_weights={"gothic": 1.0})


def test_style_conversations_earn_reward_only_in_the_preferred_style_and_bad_frac_fails_quality():
    convs = style_conversations(400, seed=0)
    tasks = make_tasks(400, seed=0)
    judge = RuleJudge()
    bad = 0
    for wanted in STYLES:
        env = StyleShiftEnv(schedule=[(0, "cute"), (1000, "chuunibyou"), (2000, "classical")])
        env.set_episode(1000 * STYLES.index(wanted))
        for task, messages in zip(tasks, convs, strict=True):
            text = messages[-1]["content"]
            good = not judge.quality_problems(task.metadata["topic"], text)
            result = episode(env, text, task)[1]
            assert result.info["style"] == wanted and result.info["quality"] is good
            assert result.reward == (1.0 if good and _style_of(text) == wanted else 0.0)
            bad += wanted == "cute" and not good
    assert 20 <= bad <= 65  # bad_frac = 0.1 of 400
    assert all(
        judge.quality_problems(t.metadata["topic"], c[-1]["content"])
        for t, c in zip(make_tasks(50, seed=1), style_conversations(50, seed=1, bad_frac=1.0), strict=True)
    )
    assert not any(
        judge.quality_problems(t.metadata["topic"], c[-1]["content"])
        for t, c in zip(make_tasks(50, seed=1), style_conversations(50, seed=1, bad_frac=0.0), strict=True)
    )


def test_style_chats_cli_and_example_write_the_generators_jsonl(tmp_path, monkeypatch, capsys):
    from sao.train.sft import load_chat_jsonl

    main(["style_shift", "--n", "12", "--seed", "2", "--out", str(tmp_path / "cli.jsonl")])
    assert [m for m, _ in load_chat_jsonl(tmp_path / "cli.jsonl")] == style_conversations(12, seed=2)
    out = tmp_path / "chats.jsonl"
    script = Path(__file__).resolve().parents[2] / "examples" / "make_style_chats.py"
    argv = [str(script), "--n", "20", "--seed", "5", "--bad-frac", "0.5", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    assert f"wrote 20 conversations to {out}" in capsys.readouterr().out
    assert [m for m, _ in load_chat_jsonl(out)] == style_conversations(20, seed=5, bad_frac=0.5)
    assert json.loads(out.read_text(encoding="utf-8").splitlines()[0]).keys() == {"messages"}
