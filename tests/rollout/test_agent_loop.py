"""The agent loop on the real `LocalEngine` and the tiny model: token-in/token-out layout (actions are the
engine's tokens, observations the template's suffix for the new messages), per-turn rewards, versions,
every finish reason, env and engine failures, templates that rewrite history (the recorded turns stay as
generated), and recorded log-probs equal to the trainer's teacher-forced ones. The BPE tokenizer and
Qwen3-like templates: tests/rollout/test_tito_templates.py."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest
import torch

from sao.engine.local import LocalEngine
from sao.engine.types import EngineCrashedError, Generation, SamplingParams
from sao.envs.base import StepResult, Task
from sao.envs.tools import tool_message
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy
from sao.rollout.agent_loop import AgentLoopConfig, EpisodeError, run_episode
from sao.types import Batch

TASK = Task("count-1", "Count with me.")
EOT_ID = 258  # <|im_end|> in the byte tokenizer (checked in `tok`)
CFG = AgentLoopConfig(max_turns=10, max_total_tokens=4096, max_tokens_per_turn=24)


def ascii_policy(model_dir):
    """The tiny model with a biased LM head: it writes printable ASCII, newlines and ``<|im_end|>`` only
    (often the latter), so decoded turns re-tokenise to the same bytes and turns end on their own."""
    model = load_policy(model_dir, dtype="float32", device="cpu")
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    bias = torch.full((head.out_features,), -1e4)
    bias[32:127] = 0.0
    bias[10] = 0.0
    bias[EOT_ID] = 3.0
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.copy_(bias)
    model.set_output_embeddings(biased)
    return model


@pytest.fixture
def tok(tiny_tokenizer):
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") == EOT_ID
    return tiny_tokenizer


class Recording:
    """The real engine, with every call and its result kept; can fail the n-th call (raise or error)."""

    def __init__(self, engine, fail_call: int | None = None, fail_mode: str = "raise") -> None:
        self.engine, self.fail_call, self.fail_mode = engine, fail_call, fail_mode
        self.calls: list[tuple[list[int], SamplingParams, Generation]] = []

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, prompt_ids, params):
        if len(self.calls) == self.fail_call:
            if self.fail_mode == "raise":
                raise RuntimeError("engine exploded")
            if self.fail_mode == "crash":
                raise EngineCrashedError("child died")
            return Generation([], [], [], "error", error="kv cache on fire")
        gen = await self.engine.generate(prompt_ids, params)
        self.calls.append((list(prompt_ids), params, gen))
        return gen


class CounterEnv:
    """Counts the assistant's turns: each turn gets reward ``k / 10`` and an observation (a tool message, or
    a user message with ``user_obs``); done after ``n_turns``. Optionally fails in step ``fail_at`` or in
    ``close``, or bumps the engine's weight version after each step."""

    name = "counter"

    def __init__(self, n_turns=3, max_turns=50, fail_at=None, fail_close=False, user_obs=False, on_step=None):
        self.n_turns, self.max_turns, self.fail_at = n_turns, max_turns, fail_at
        self.fail_close, self.user_obs, self.on_step = fail_close, user_obs, on_step
        self.received: list[str] = []
        self.messages: list[dict] = []  # everything reset/step returned, in order, assistant turns included
        self.closed = 0

    async def reset(self, task):
        self.messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": task.prompt}]
        return copy.deepcopy(self.messages)

    async def step(self, assistant_text):
        k = len(self.received)
        self.received.append(assistant_text)
        self.messages.append({"role": "assistant", "content": assistant_text})
        if k == self.fail_at:
            raise ValueError("counter broke")
        if self.on_step is not None:
            await self.on_step(k)
        done = k + 1 >= self.n_turns
        obs = (
            [] if done else [{"role": "user", "content": f"n={k}"} if self.user_obs else tool_message(f"{k}")]
        )
        self.messages.extend(obs)
        return StepResult(observation=obs, reward=(k + 1) / 10, done=done, info={"k": k})

    async def close(self):
        self.closed += 1
        if self.fail_close:
            raise OSError("sandbox gone")


def play(model_dir, tok, env, cfg=CFG, *, seed=0, fail_call=None, fail_mode="raise", engine_fn=None):
    """Run one episode on a fresh engine; returns (trajectory or exception, recording engine)."""

    async def main():
        engine = LocalEngine(ascii_policy(model_dir), tok, max_running=4)
        rec = Recording(engine, fail_call, fail_mode)
        try:
            if engine_fn is not None:
                env.on_step = lambda k: engine_fn(engine, k)
            return await run_episode(rec, tok, env, TASK, cfg, seed=seed, group_id="g"), rec
        except Exception as err:  # returned so the test can inspect the engine too
            return err, rec
        finally:
            await engine.close()

    return asyncio.run(main())


def spans(traj):
    """``[(turn, start, end)]`` of the action spans."""
    out, t = [], 0
    while t < len(traj.token_ids):
        if traj.action_mask[t]:
            end = t
            while (
                end < len(traj.token_ids) and traj.action_mask[end] and traj.turn_ids[end] == traj.turn_ids[t]
            ):
                end += 1
            out.append((traj.turn_ids[t], t, end))
            t = end
        else:
            t += 1
    return out


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_tokens_are_the_engine_tokens_plus_template_deltas_and_equal_the_full_rendering(tiny_moe_dir, tok):
    env = CounterEnv(n_turns=4)
    traj, rec = play(tiny_moe_dir, tok, env, seed=5)
    traj.validate()
    assert traj.finish_reason == "stop" and env.closed == 1
    assert traj.rewards == [0.1, 0.2, 0.3, 0.4] and traj.num_turns == 4 and len(rec.calls) == 4
    assert traj.prompt_id == TASK.id and traj.group_id == "g"
    # Every prompt is the trajectory so far; every action span is exactly what the engine returned.
    for (turn, start, end), (prompt, params, gen) in zip(spans(traj), rec.calls, strict=True):
        assert traj.token_ids[:start] == prompt
        assert traj.token_ids[start:end] == gen.token_ids
        assert traj.rollout_logprobs[start:end] == gen.logprobs
        assert traj.versions[start:end] == gen.versions == [0] * len(gen.token_ids)
        assert params.stop_token_ids == (EOT_ID,) and params.seed == 5 + turn
        assert params.max_new_tokens == CFG.max_tokens_per_turn
        # The env saw the turn's text without the end-of-turn token.
        ended = gen.token_ids[-1] == EOT_ID
        assert env.received[turn] == tok.decode(gen.token_ids[: -1 if ended else None])
    # The token ids are the tokenisation of the whole conversation, assistant turns as generated (the
    # trajectory ends at the last action token; the template adds a newline after it).
    full = tok.apply_chat_template(env.messages, tokenize=False)
    assert encode(tok, full)[: traj.num_tokens] == traj.token_ids
    assert tok.decode(encode(tok, full)[traj.num_tokens :]) == "\n"
    # Observation tokens: action_mask 0, log-prob 0, version -1; turn ids -1 on the prompt, i after turn i.
    first_action = traj.action_mask.index(1)
    assert set(traj.turn_ids[:first_action]) == {-1}
    for t, is_action in enumerate(traj.action_mask):
        if not is_action:
            assert (traj.rollout_logprobs[t], traj.versions[t]) == (0.0, -1)
    assert "<tool_response>" in tok.decode(
        [i for i, m in zip(traj.token_ids, traj.action_mask, strict=True) if not m]
    )
    meta = traj.metadata
    assert (meta["env"], meta["task_id"], meta["turns"], meta["seed"]) == ("counter", TASK.id, 4, 5)
    assert meta["infos"] == [{"k": k} for k in range(4)] and len(meta["timings"]) == 4
    assert all(t["generate_s"] > 0 and t["env_s"] >= 0 for t in meta["timings"])
    assert "error" not in meta


def test_user_observations_and_turns_cut_by_the_per_turn_limit_equal_a_prefix_stable_rendering(
    tiny_moe_dir, tok
):
    env = CounterEnv(n_turns=6, user_obs=True)
    cfg = dataclasses.replace(CFG, max_tokens_per_turn=2)
    traj, rec = play(tiny_moe_dir, tok, env, cfg, seed=1)
    traj.validate()
    assert traj.finish_reason == "stop" and traj.num_turns == 6
    assert any(gen.finish_reason == "length" for _, _, gen in rec.calls)  # turns that never saw <|im_end|>
    full = tok.apply_chat_template(env.messages, tokenize=False)
    assert encode(tok, full)[: traj.num_tokens] == traj.token_ids


def test_max_turns_is_the_smaller_of_the_config_and_the_env(tiny_moe_dir, tok):
    traj, _ = play(tiny_moe_dir, tok, CounterEnv(n_turns=100, max_turns=2))
    assert (traj.finish_reason, traj.num_turns, len(traj.rewards)) == ("max_turns", 2, 2)
    assert traj.action_mask[-1] == 1  # no observation after the last allowed turn
    env = CounterEnv(n_turns=100)
    traj, _ = play(tiny_moe_dir, tok, env, dataclasses.replace(CFG, max_turns=3))
    assert (traj.finish_reason, traj.num_turns, env.closed) == ("max_turns", 3, 1)


def test_the_token_budget_ends_the_episode_with_length(tiny_moe_dir, tok):
    budget = prompt_tokens(tok) + 40
    cfg = dataclasses.replace(CFG, max_total_tokens=budget, max_tokens_per_turn=16)
    env = CounterEnv(n_turns=100)
    traj, rec = play(tiny_moe_dir, tok, env, cfg, seed=2)
    traj.validate()
    assert traj.finish_reason == "length" and traj.num_tokens <= budget and traj.action_mask[-1] == 1
    assert len(traj.rewards) == traj.num_turns >= 2 and env.closed == 1
    for prompt, params, _ in rec.calls:
        assert params.max_new_tokens == min(16, budget - len(prompt))
    # A turn cut by the budget gets no env step and reward 0.
    if rec.calls[-1][2].finish_reason == "length":
        assert traj.rewards[-1] == 0.0 and len(env.received) == traj.num_turns - 1


def test_a_prompt_over_the_budget_is_an_episode_error(tiny_moe_dir, tok):
    env = CounterEnv()
    err, rec = play(tiny_moe_dir, tok, env, dataclasses.replace(CFG, max_total_tokens=5))
    assert (
        isinstance(err, EpisodeError) and err.reason == "prompt_too_long" and "max_total_tokens" in str(err)
    )
    assert rec.calls == [] and env.closed == 1


def test_an_env_that_raises_in_step_drops_the_episode_as_env_error(tiny_moe_dir, tok):
    env = CounterEnv(n_turns=5, fail_at=1)
    err, rec = play(tiny_moe_dir, tok, env)
    assert isinstance(err, EpisodeError) and err.reason == "env_error"
    assert "turn 1: env.step failed: ValueError: counter broke" in str(err)
    assert isinstance(err.__cause__, ValueError)  # the env's own exception, for the traceback
    assert len(rec.calls) == 2 and env.closed == 1


def test_engine_failures_drop_the_episode_as_engine_errors_or_crashes(tiny_moe_dir, tok):
    for fail_call in (0, 2):
        for mode in ("raise", "error"):
            env = CounterEnv(n_turns=5)
            err, _ = play(tiny_moe_dir, tok, env, fail_call=fail_call, fail_mode=mode)
            assert isinstance(err, EpisodeError) and err.reason == "engine_error" and env.closed == 1
            assert ("engine exploded" if mode == "raise" else "kv cache on fire") in str(err)
            assert isinstance(err.__cause__, RuntimeError) if mode == "raise" else err.__cause__ is None
    env = CounterEnv(n_turns=5)
    err, _ = play(tiny_moe_dir, tok, env, fail_call=1, fail_mode="crash")
    assert isinstance(err, EpisodeError) and err.reason == "engine_crash" and "child died" in str(err)
    assert env.closed == 1


def test_reset_and_close_failures(tiny_moe_dir, tok):
    class BadReset(CounterEnv):
        async def reset(self, task):
            raise KeyError("no such task")

    env = BadReset()
    err, _ = play(tiny_moe_dir, tok, env)
    assert isinstance(err, EpisodeError) and err.reason == "env_error" and "env.reset failed" in str(err)
    assert env.closed == 1
    env = CounterEnv(n_turns=1, fail_close=True)
    traj, _ = play(tiny_moe_dir, tok, env)
    assert (
        traj.finish_reason == "stop"
        and traj.metadata["close_error"] == "env.close failed: OSError: sandbox gone"
    )


class Hanging(CounterEnv):
    """Hangs (awaiting) in ``where`` ("reset", "step" at turn 1, or "close")."""

    def __init__(self, where, **kw):
        super().__init__(**kw)
        self.where = where

    async def reset(self, task):
        if self.where == "reset":
            await asyncio.sleep(3600)
        return await super().reset(task)

    async def step(self, text):
        if self.where == "step" and len(self.received) == 1:
            await asyncio.sleep(3600)
        return await super().step(text)

    async def close(self):
        await super().close()
        if self.where == "close":
            await asyncio.sleep(3600)


def test_an_env_call_past_the_timeout_drops_the_episode_as_env_timeout(tiny_moe_dir, tok):
    cfg = dataclasses.replace(CFG, env_timeout_s=0.3)
    for where in ("reset", "step"):
        env = Hanging(where, n_turns=3)
        err, _ = play(tiny_moe_dir, tok, env, cfg)
        assert isinstance(err, EpisodeError) and err.reason == "env_timeout", where
        assert f"env.{where} did not return within 0.3 s" in str(err) and env.closed == 1
    env = Hanging("close", n_turns=1)
    traj, _ = play(tiny_moe_dir, tok, env, cfg)
    assert (
        traj.finish_reason == "stop"
        and "env.close did not return within 0.3 s" in traj.metadata["close_error"]
    )
    # A well-behaved env under the same timeout plays to the end.
    env = CounterEnv(n_turns=3)
    traj, _ = play(tiny_moe_dir, tok, env, cfg)
    assert traj.finish_reason == "stop"


class Malformed(CounterEnv):
    """Answers turn 0 with ``answer`` (or returns ``reset_answer`` from reset)."""

    def __init__(self, answer=None, reset_answer=None):
        super().__init__(n_turns=3)
        self.answer, self.reset_answer = answer, reset_answer

    async def reset(self, task):
        return self.reset_answer if self.reset_answer is not None else await super().reset(task)

    async def step(self, text):
        result = await super().step(text)
        return self.answer if self.answer is not None else result


@pytest.mark.parametrize(
    ("answer", "reset_answer", "says"),
    [
        (StepResult([], float("nan"), True), None, "reward nan"),
        (StepResult([], float("inf"), True), None, "reward inf"),
        (StepResult([], "1.0", True), None, "reward '1.0'"),
        (StepResult([], 1.0, "yes"), None, "done='yes'"),
        (StepResult([], 1.0, 2), None, "done=2"),
        (StepResult([], True, True), None, "reward True"),
        (StepResult([], [1.0], True), None, "reward [1.0]"),
        (StepResult("just text", 1.0, False), None, "not a list of messages"),
        (StepResult([{"content": "no role"}], 1.0, False), None, "string 'role'"),
        (StepResult([{"role": "tool", "content": 7}], 1.0, False), None, "content of type int"),
        (StepResult([], 1.0, True, info=None), None, "info of type NoneType"),
        ((1.0, True), None, "has no observation"),
        (None, "hello", "not a list of messages"),
        (None, [], "returned no messages"),
    ],
)
def test_malformed_env_answers_drop_the_episode_as_env_error(tiny_moe_dir, tok, answer, reset_answer, says):
    env = Malformed(answer, reset_answer)
    err, _ = play(tiny_moe_dir, tok, env)
    assert isinstance(err, EpisodeError) and err.reason == "env_error" and says in str(err)
    assert env.closed == 1


def test_env_answers_of_other_numeric_types_are_accepted_as_floats_and_bools(tiny_moe_dir, tok):
    import numpy as np

    for reward, done in ((np.float32(0.5), np.bool_(True)), (torch.tensor(0.5), 1), (1, torch.tensor(True))):
        traj, _ = play(tiny_moe_dir, tok, Malformed(StepResult([], reward, done)))
        assert traj.finish_reason == "stop" and traj.rewards[-1] == float(reward)
        assert all(type(r) is float for r in traj.rewards)


def test_the_sandbox_mode_of_a_code_running_env_is_recorded(tiny_moe_dir, tok):
    env = CounterEnv(n_turns=1)
    traj, _ = play(tiny_moe_dir, tok, env)
    assert "sandbox_mode" not in traj.metadata
    env.sandbox_mode = "bwrap"
    traj, _ = play(tiny_moe_dir, tok, env)
    assert traj.metadata["sandbox_mode"] == "bwrap"


def test_versions_come_from_the_engine_across_a_weight_update_between_turns(tiny_moe_dir, tok):
    async def bump(engine, k):
        if k == 0:
            await engine.update_weights(engine.model.state_dict(), version=7)

    traj, _ = play(tiny_moe_dir, tok, CounterEnv(n_turns=3), engine_fn=bump)
    traj.validate()
    per_turn = [set(traj.versions[s:e]) for _, s, e in spans(traj)]
    assert per_turn == [{0}, {7}, {7}]


def test_recorded_logprobs_equal_the_trainers_teacher_forced_logprobs(tiny_moe_dir, tok):
    traj, _ = play(tiny_moe_dir, tok, CounterEnv(n_turns=3), seed=11)
    batch = Batch.from_trajectories([traj])
    with torch.no_grad():
        teacher, _ = token_logprobs(ascii_policy(tiny_moe_dir), batch)
    mask = batch.action_mask
    assert int(mask.sum()) > 6
    torch.testing.assert_close(teacher[mask], batch.rollout_logprobs[mask], atol=1e-4, rtol=0)


# A template in the style of Qwen3-Thinking: the generation prompt opens <think>, and earlier assistant
# turns are rendered with their reasoning dropped, so the recorded `<think>\n` is rewritten.
THINK_PROMPT_TEMPLATE = """\
{%- for message in messages -%}
  {%- if message.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}
"""

# Qwen3's rule: the reasoning of assistant turns before the last *user* message is dropped (tool results
# do not count as user queries), so a user turn after a reasoning turn rewrites it.
QWEN3_STYLE_TEMPLATE = """\
{%- set ns = namespace(last_query=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- if message.role == 'assistant' -%}
    {%- set content = message.content -%}
    {%- if loop.index0 < ns.last_query and '</think>' in content -%}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def with_template(tok, template):
    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def test_a_template_that_rewrites_the_generation_prompt_keeps_history_and_appends_the_new_messages(
    tiny_moe_dir, tok
):
    thinking = with_template(tok, THINK_PROMPT_TEMPLATE)
    env = CounterEnv(n_turns=3)
    traj, rec = play(tiny_moe_dir, thinking, env)
    traj.validate()
    assert traj.finish_reason == "stop" and traj.num_turns == 3
    for (_, start, end), (prompt, _, gen) in zip(spans(traj), rec.calls, strict=True):
        assert traj.token_ids[:start] == prompt and traj.token_ids[start:end] == gen.token_ids
    # The recorded prompt keeps its "<think>\n" (a re-rendering would drop it) ...
    assert tok.decode(traj.token_ids[: spans(traj)[0][1]]).endswith("<|im_start|>assistant\n<think>\n")
    # ... and each observation is the template's text for the tool message alone, then the generation prompt.
    (_, _, first_end), (_, second_start, _) = spans(traj)[:2]
    ended = rec.calls[0][2].token_ids[-1] == EOT_ID
    expected = ("" if ended else "<|im_end|>") + "\n<|im_start|>user\n<tool_response>\n0\n</tool_response>"
    expected += "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tok.decode(traj.token_ids[first_end:second_start]) == expected
    assert "prefix_mismatch_turns" not in traj.metadata


class ScriptedEngine:
    """Returns fixed texts (tokenised, plus <|im_end|>; cut to ``max_new_tokens`` with finish ``length``)
    with log-prob -1 and version 0."""

    version = 0

    def __init__(self, tok, texts):
        self.tok, self.texts = tok, list(texts)

    async def generate(self, prompt_ids, params):
        ids = [*encode(self.tok, self.texts.pop(0)), EOT_ID]
        reason = "stop" if len(ids) <= params.max_new_tokens else "length"
        ids = ids[: params.max_new_tokens]
        return Generation(ids, [-1.0] * len(ids), [0] * len(ids), reason)


def prompt_tokens(tok, template_tok=None):
    env_messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": TASK.prompt}]
    text = (template_tok or tok).apply_chat_template(env_messages, tokenize=False, add_generation_prompt=True)
    return len(encode(tok, text))


def test_budget_exhausted_by_an_observation_or_inside_a_turn(tok):
    n = prompt_tokens(tok)
    # "abc" + <|im_end|> fits, the observation after it does not: stepped, rewarded, observation dropped.
    env = CounterEnv(n_turns=5)
    cfg = dataclasses.replace(CFG, max_total_tokens=n + 4 + 5)
    traj = asyncio.run(run_episode(ScriptedEngine(tok, ["abc"]), tok, env, TASK, cfg))
    traj.validate()
    assert (traj.finish_reason, traj.rewards, env.received, env.closed) == ("length", [0.1], ["abc"], 1)
    assert traj.num_tokens == n + 4 and traj.action_mask[-4:] == [1] * 4
    # The turn itself is cut by the budget: no env step, reward 0.
    env = CounterEnv(n_turns=5)
    cfg = dataclasses.replace(CFG, max_total_tokens=n + 3)
    traj = asyncio.run(run_episode(ScriptedEngine(tok, ["abcdef"]), tok, env, TASK, cfg))
    traj.validate()
    assert (traj.finish_reason, traj.rewards, env.received, env.closed) == ("length", [0.0], [], 1)
    assert traj.num_tokens == n + 3 and "error" not in traj.metadata


@pytest.mark.parametrize("user_obs", [False, True])
def test_a_template_that_drops_earlier_reasoning_leaves_every_turns_reasoning_as_generated(tok, user_obs):
    qwen = with_template(tok, QWEN3_STYLE_TEMPLATE)
    texts = [f"<think>\nstep {i}\n</think>\n\nanswer {i}" for i in range(3)]
    env = CounterEnv(n_turns=3, user_obs=user_obs)
    traj = asyncio.run(run_episode(ScriptedEngine(tok, texts), qwen, env, TASK, CFG))
    traj.validate()
    assert traj.finish_reason == "stop" and traj.num_turns == 3
    actions = [tok.decode(traj.token_ids[s:e]) for _, s, e in spans(traj)]
    assert actions == [t + "<|im_end|>" for t in texts]  # reasoning kept, though a user turn follows
    observations = tok.decode([i for i, m in zip(traj.token_ids, traj.action_mask, strict=True) if m == 0])
    assert observations.count("n=") == (2 if user_obs else 0) and "</think>" not in observations
    if user_obs:  # the template itself would have rewritten turn 0
        full = qwen.apply_chat_template(env.messages, tokenize=False)
        assert "step 0" not in full and "step 0" in tok.decode(traj.token_ids)


def test_the_end_of_turn_token_is_looked_up_and_a_missing_one_is_a_clear_error(tiny_tokenizer):
    from sao.models.chat_delta import end_of_turn_token as _end_of_turn_id

    assert _end_of_turn_id(tiny_tokenizer, None) == (
        "<|im_end|>",
        tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    assert _end_of_turn_id(tiny_tokenizer, "<|endoftext|>")[0] == "<|endoftext|>"
    with pytest.raises(ValueError, match=r"no end-of-turn token \(tried \['<\|nope\|>'\]\)"):
        _end_of_turn_id(tiny_tokenizer, "<|nope|>")
