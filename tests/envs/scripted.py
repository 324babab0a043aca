"""Scripted drivers for environment tests: the env is under test, so the "policy" is a fixed script."""

from __future__ import annotations

import asyncio

from sao.engine.types import Generation
from sao.envs.base import Env, StepResult, Task


def play_scripted(env: Env, task: Task, turns: list[str]) -> tuple[list[dict], list[StepResult]]:
    """Reset, then step each scripted turn until the env says done; always close. Returns the initial
    messages and every step result."""

    async def go() -> tuple[list[dict], list[StepResult]]:
        initial = await env.reset(task)
        results: list[StepResult] = []
        try:
            for text in turns:
                results.append(await env.step(text))
                if results[-1].done:
                    break
        finally:
            await env.close()
        return initial, results

    return asyncio.run(go())


class ScriptedEngine:
    """An engine that "generates" fixed texts (tokenised, plus the end-of-turn token)."""

    version = 0

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts = tokenizer, list(texts)
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, params) -> Generation:
        ids = [*self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False), self.eot]
        return Generation(ids, [-1.0] * len(ids), [0] * len(ids), "stop")
