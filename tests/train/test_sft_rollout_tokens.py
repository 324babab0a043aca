"""SFT data tokenises the way generation does, with the BPE tokenizer and templates that rewrite history.

`render_chat` of a conversation must be token for token (and mask for mask) the trajectory the agent loop
records when an engine generates each assistant message as `assistant_text` renders it and an env replays
the conversation's other messages: the prompt, each observation suffix and each turn tokenised on its own,
so warm-start data carries the same tokens as RL, whatever the template does to earlier turns."""

from __future__ import annotations

import asyncio
import copy
import itertools

import pytest

from sao.engine.types import Generation
from sao.envs.base import StepResult, Task
from sao.models.chat import render_chat
from sao.models.chat_delta import assistant_text
from sao.models.loading import load_tokenizer
from sao.models.templates import bind_template_variables
from sao.rollout.agent_loop import AgentLoopConfig, run_episode

CONVERSATION = [
    {"role": "system", "content": "Use the tool."},
    {"role": "user", "content": "What is 12 * 7?"},
    {
        "role": "assistant",
        "content": '<think>\nMultiply.\n</think>\n\n<tool_call>{"name": "calc"}</tool_call>',
    },
    {"role": "tool", "content": "84"},
    {"role": "tool", "content": "84.0"},
    {"role": "assistant", "content": "<think>\nBoth agree.\n</think>\n\nIt is 84."},
    {"role": "user", "content": "Sure?"},
    {"role": "assistant", "content": "<think>\nYes.\n</think>\n\nanswer: 84"},
]


def _without_reasoning(messages):
    out = copy.deepcopy(messages)
    for m in out:
        if m["role"] == "assistant":
            m["content"] = m["content"].split("</think>\n\n")[-1]
    return out


class Replay:
    """Replays the conversation's non-assistant messages between its assistant turns."""

    def __init__(self, messages) -> None:
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        self.first = messages[: turns[0]]
        self.between = [messages[a + 1 : b] for a, b in itertools.pairwise(turns)]

    async def reset(self, task):
        return copy.deepcopy(self.first)

    async def step(self, text):
        obs = self.between.pop(0) if self.between else []
        return StepResult(copy.deepcopy(obs), reward=0.0, done=not obs, info={})

    async def close(self):
        pass


class Writes:
    """Generates each assistant message as the template renders it after its generation prompt."""

    version = 0

    def __init__(self, tok, messages) -> None:
        eot = "<|im_end|>"
        self.turns = [
            tok(assistant_text(tok, m, None, eot), add_special_tokens=False)["input_ids"]
            for m in messages
            if m["role"] == "assistant"
        ]

    async def generate(self, prompt_ids, params):
        ids = self.turns.pop(0)
        return Generation(ids, [-1.0] * len(ids), [0] * len(ids), "stop")


@pytest.mark.parametrize(("template", "thinking"), [("qwen3", True), ("qwen3", False), ("hermes", True)])
def test_sft_tokens_and_masks_equal_an_agent_loop_rollout(tiny_bpe_dir, template, thinking):
    tok = load_tokenizer(tiny_bpe_dir, chat_template=template)
    tok.chat_template = bind_template_variables(tok.chat_template, enable_thinking=thinking)
    messages = CONVERSATION if thinking else _without_reasoning(CONVERSATION)
    sft = render_chat(tok, messages)
    cfg = AgentLoopConfig(max_turns=10, max_total_tokens=4096, max_tokens_per_turn=256)
    traj = asyncio.run(run_episode(Writes(tok, messages), tok, Replay(messages), Task("t", "x"), cfg))
    assert traj.num_turns == 3
    assert sft.token_ids == traj.token_ids and sft.action_mask == traj.action_mask
    assert sft.turn_ids == traj.turn_ids
    text = tok.decode(sft.token_ids)
    if thinking:  # every turn's reasoning is trained on, though the template drops the earlier ones
        assert text.count("</think>") == 3
        full = tok.apply_chat_template(messages, tokenize=False)
        assert ("Multiply." in full) is (template == "hermes")
