"""Token-in/token-out with a real BPE tokenizer and templates that rewrite history.

A tiny model with the locally trained byte-level BPE (`sao.models.bpe`) and the Qwen3-like template
(strips earlier ``<think>`` blocks, merges consecutive tool results; thinking on) or the Hermes-like one
plays multi-turn calculator and math_tir episodes: the trainer's tokens are the engine's tokens (invariant
1), the trainer's log-probs reproduce the engine's (invariant 3: the DIS ratio is 1 on-policy), and an
earlier turn's reasoning stays in the trained tokens exactly as generated, though the template would drop
it. Two engines: the real `LocalEngine` sampling from a model steered to BPE word pieces and the think /
tool markers (so its turns are token sequences the BPE would not produce from their text), and a scripted
one that emits fixed turns (thinking, Python code, tool calls) with the model's log-probs of them, for
episodes a random model cannot reach (math_tir's code runs). Whole runs: tests/runtime/test_template_run.py.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from sao.engine.local import LocalEngine
from sao.engine.types import Generation
from sao.envs.base import Task
from sao.envs.calculator import CalculatorEnv, make_tasks
from sao.models.forward import token_logprobs
from sao.models.loading import load_policy, load_tokenizer
from sao.rollout.agent_loop import AgentLoopConfig, run_episode
from sao.types import Batch, Trajectory

CFG = AgentLoopConfig(max_turns=4, max_total_tokens=2048, max_tokens_per_turn=24)


@pytest.fixture(scope="module")
def bpe_dir(tiny_bpe_dir):
    return tiny_bpe_dir


@pytest.fixture(scope="module")
def tok(bpe_dir):
    return load_tokenizer(bpe_dir)


@pytest.fixture(scope="module")
def steered_policy(steer_bpe):
    return steer_bpe


class Recording:
    """An engine with every call kept."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, prompt_ids, params):
        gen = await self.engine.generate(prompt_ids, params)
        self.calls.append((list(prompt_ids), gen))
        return gen


class ScriptedTurns:
    """Emits fixed turns (tokenised, plus ``<|im_end|>``) with the model's log-probs of them given the
    prompt: one teacher-forced forward of prompt + turn, as an engine's sampling forward computes them."""

    version = 0

    def __init__(self, model, tok, texts) -> None:
        self.model, self.tok, self.texts, self.calls = model, tok, list(texts), []
        self.eot = tok.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, params):
        ids = [*self.tok(self.texts.pop(0), add_special_tokens=False)["input_ids"], self.eot]
        reason = "stop" if len(ids) <= params.max_new_tokens else "length"
        ids = ids[: params.max_new_tokens]
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([list(prompt_ids) + ids])).logits[0].float()
        logprobs = logits.log_softmax(-1)[len(prompt_ids) - 1 : -1].gather(-1, torch.tensor(ids)[:, None])
        gen = Generation(ids, logprobs[:, 0].tolist(), [0] * len(ids), reason)
        self.calls.append((list(prompt_ids), gen))
        return gen


def spans(traj: Trajectory) -> list[tuple[int, int]]:
    """(start, end) of each assistant turn."""
    out, start = [], None
    for i, a in enumerate([*traj.action_mask, 0]):
        if a and start is None:
            start = i
        elif not a and start is not None:
            out.append((start, i))
            start = None
    return out


def assert_tito(traj: Trajectory, calls, model) -> None:
    """Invariant 1 (every engine call's prompt is the recorded prefix, its tokens the recorded turn) and
    invariant 3 (the trainer's teacher-forced log-probs equal the recorded ones: DIS ratio 1)."""
    traj.validate()
    assert len(spans(traj)) == len(calls) >= 2
    for (start, end), (prompt, gen) in zip(spans(traj), calls, strict=True):
        assert traj.token_ids[:start] == prompt and traj.token_ids[start:end] == gen.token_ids
        assert traj.rollout_logprobs[start:end] == pytest.approx(gen.logprobs)
    batch = Batch.from_trajectories([traj])
    with torch.no_grad():
        logprobs, _ = token_logprobs(model, batch)
    mask = batch.action_mask
    ratio = torch.exp(logprobs[mask] - batch.rollout_logprobs[mask])
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=2e-4, rtol=0)


def test_sampled_calculator_episodes_train_on_the_engines_bpe_tokens_with_ratio_one(
    bpe_dir, tok, steered_policy
):
    """The real engine and the Qwen3-like template with thinking on: observations are tool errors (a
    malformed call) and user nudges (no number); earlier ``<think>`` blocks stay as generated."""
    model = steered_policy(bpe_dir, tok)
    tasks = make_tasks(6, seed=3)

    async def main():
        engine = LocalEngine(model, tok, max_running=4)
        try:
            out = []
            for i, task in enumerate(tasks):
                rec = Recording(engine)
                traj = await run_episode(rec, tok, CalculatorEnv(max_turns=4), task, CFG, seed=i)
                out.append((traj, rec.calls))
            return out
        finally:
            await engine.close()

    episodes = asyncio.run(main())
    kept_reasoning = retokenised_differently = 0
    roles = set()
    for traj, calls in episodes:
        assert_tito(traj, calls, model)
        turns = [tok.decode(traj.token_ids[s:e]) for s, e in spans(traj)]
        text = tok.decode(traj.token_ids)
        roles |= {r for r in ("<tool_response>", "error: reply answer") if r in text}
        for ids in (traj.token_ids[s:e] for s, e in spans(traj)):
            retokenised_differently += tok(tok.decode(ids), add_special_tokens=False)["input_ids"] != ids
        for turn in turns[:-1]:
            if "<think>" in turn and "</think>" in turn:
                kept_reasoning += 1
                assert turn in text  # the trained tokens hold the turn as generated, reasoning included
    assert roles == {"<tool_response>", "error: reply answer"}  # tool results and user nudges both seen
    assert kept_reasoning >= 1
    # Sampled BPE tokens are often not what the tokenizer makes of their text: re-tokenising would train on
    # other tokens than the engine sampled (the trainer never does).
    assert retokenised_differently >= 1


MATH_TURNS = [
    "<think>\nCompute it with Python.\n</think>\n\n```python\nprint(2 + 3)\n```",
    "<think>\nThe output says 5.\n</think>\n\nThe code printed the sum.",
    "<think>\nGive the boxed answer.\n</think>\n\nThe answer is \\boxed{5}.",
]


@pytest.mark.parametrize("template", ["qwen3", "hermes"])
def test_a_math_tir_episode_with_code_a_nudge_and_reasoning_keeps_every_turn_as_generated(
    bpe_dir, tok, template
):
    from sao.envs.math_tir import MathTIREnv

    other = load_tokenizer(bpe_dir, chat_template=template)
    model = load_policy(bpe_dir, dtype="float32", device="cpu")
    engine = ScriptedTurns(model, other, MATH_TURNS)
    task = Task("m1", "What is 2 + 3?", answer="5")
    traj = asyncio.run(run_episode(engine, other, MathTIREnv(max_turns=5), task, CFG, seed=0))
    assert traj.finish_reason == "stop" and traj.rewards[-1] == 1.0
    assert_tito(traj, engine.calls, model)
    text = other.decode(traj.token_ids)
    for turn in MATH_TURNS:
        assert turn + "<|im_end|>" in text  # every turn's reasoning, as generated
    assert "<tool_response>\n5\n</tool_response>" in text and "neither a ```python block" in text
    # The template itself would drop the first two turns' reasoning (qwen3) once the nudge, a user
    # message, follows them: a re-rendering would train on text the model never saw.
    messages = [{"role": "user", "content": task.prompt}]
    messages += [{"role": "assistant", "content": MATH_TURNS[0]}, {"role": "tool", "content": "5"}]
    messages += [{"role": "assistant", "content": MATH_TURNS[1]}, {"role": "user", "content": "nudge"}]
    rendered = other.apply_chat_template(messages, tokenize=False)
    assert ("Compute it with Python" in rendered) is (template == "hermes")
