"""Write SFT conversations that teach a small model to be an answer-checking judge (JSONL, ``{"messages"}``).

Each conversation is a judge request exactly as `sao.envs.judge_client.JudgeClient` sends it with
`judge_settings` (the template `JUDGE_PROMPT`, no system prompt, scale 0..1; rendered by the client's own
`render_messages`), answered ``Score: 1`` when the graded response's final answer equals the task's
reference answer and ``Score: 0`` otherwise (`judge_label`: the response's last integer equals the
reference, and the response is no tool call). Responses are right (about half), wrong (off by a little or a
lot, an operand, a right number followed by a wrong one) or no answer (a tool call, prose, nothing), in
the formats of two task families:

- ``calculator``: the ``calculator`` env's questions (``What is 37 * 12?``), answers as its policy writes
  them (``answer: 444``, ``37*12=444``, with a ``<think>`` block...);
- ``arithmetic``: reasoning-gym-like questions (``Calculate 12 + 7 - 3.``), answers in ``<answer>...``
  tags after some working.

    python examples/make_judge_chats.py --n 4000 --out runs/judge/chats.jsonl
    sao sft ... --data runs/judge/chats.jsonl       # then serve it: sao serve ...

and give the run the printed ``judge:`` settings (its url and model pointing at that server).

``--criterion work`` makes a *style* judge instead (`WORK_PROMPT`, `work_label`): ``Score: 1`` when the
response shows a worked step (``12 + 7 = 19``) before its answer — with ``judge.combine: product`` the
env grades correctness and the judge the style, as the paper's quality × style
(``configs/judge_reasoning_gym.yaml``). A tiny model learns this criterion in a few hundred steps; the
answer check (comparing two numbers across the prompt) it did not learn in 300.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from sao.envs import calculator
from sao.envs.base import Message, Task
from sao.envs.judge_client import JudgeSettings, render_messages
from sao.envs.judged import episode_fields
from sao.envs.sft_data import write_jsonl

JUDGE_PROMPT = (
    "Question: {prompt}\nReference: {answer}\nResponse: {response}\n"
    "Is the response's final answer the reference? Score 1 or 0."
)
# --criterion work: a style judge, as the paper's (quality from the env, style from the judge)
WORK_PROMPT = (
    "Question: {prompt}\nResponse: {response}\n"
    "Does the response show its working (a step such as 12 + 7 = 19) before its answer? Score 1 or 0."
)
PROMPTS = {"answer": JUDGE_PROMPT, "work": WORK_PROMPT}
_STEP = re.compile(r"\d\s*[-+*]\s*\d[^\n]*=\s*-?\d")
FAMILIES = ("calculator", "arithmetic")
_INT = re.compile(r"-?\d+")


def judge_settings(
    base_url: str = "http://127.0.0.1:8000", model: str = "judge", criterion: str = "answer"
) -> JudgeSettings:
    """The settings the data is rendered with; a run's judge must use the same prompt and scale."""
    return JudgeSettings(
        base_url=base_url,
        model=model,
        prompt=PROMPTS[criterion],
        system_prompt=None,
        score_min=0,
        score_max=1,
        max_tokens=24,  # "Score: 1" after the empty <think> block a Qwen3-like template opens with
    )


def judge_label(response: str, answer: int) -> int:
    """1 when ``response`` is no tool call and its last integer is ``answer``, else 0."""
    found = _INT.findall(response)
    return int("<tool_call>" not in response and bool(found) and int(found[-1]) == answer)


def work_label(response: str) -> int:
    """1 when ``response`` is no tool call and shows a worked step (``a op b ... = c``), else 0."""
    return int("<tool_call>" not in response and _STEP.search(response) is not None)


def arithmetic_tasks(n: int, seed: int) -> list[Task]:
    """Three-operand questions, reasoning-gym style."""
    rng = random.Random(f"judge-arithmetic-{seed}")
    tasks = []
    for i in range(n):
        a, b, c = rng.randint(1, 99), rng.randint(1, 99), rng.randint(1, 20)
        expr = f"{a} {rng.choice('+-')} {b} {rng.choice('+-*')} {c}"
        tasks.append(
            Task(
                f"judge-arith-{seed}-{i}",
                f"Calculate {expr}.",
                calculator.evaluate(expr),
                metadata={"expr": expr},
            )
        )
    return tasks


def _expr(task: Task) -> str:
    meta = task.metadata
    return meta["expr"] if "expr" in meta else f"{meta['a']}{meta['op']}{meta['b']}"


def _wrong(rng: random.Random, task: Task) -> int:
    value = int(task.answer)
    operands = [int(x) for x in _INT.findall(_expr(task)) if int(x) != value]
    choices = [
        value + rng.choice((-2, -1, 1, 2)),
        value + rng.choice((-10, 10, 100)),
        rng.randint(-200, 9999),
    ]
    wrong = rng.choice(choices + operands[:1])
    return wrong if wrong != value else value + 1


def _with_number(rng: random.Random, task: Task, family: str, x: int) -> str:
    expr = _expr(task)
    if family == "calculator":
        forms = [
            f"answer: {x}",
            f"{expr}={x}",
            f"The answer is {x}.",
            f"{x}",
            f"<think>\nanswer now\n</think>\n\nanswer: {x}",
        ]
    else:
        forms = [
            f"<answer>{x}</answer>",
            f"{expr} = {x}\n<answer>{x}</answer>",
            f"Working it out step by step.\n<answer>{x}</answer>",
        ]
    return rng.choice(forms)


def judge_response(rng: random.Random, task: Task, family: str) -> str:
    """One response to grade: right about half the time, else wrong or without an answer."""
    roll = rng.random()
    if roll < 0.5:
        return _with_number(rng, task, family, int(task.answer))
    if roll < 0.8:
        return _with_number(rng, task, family, _wrong(rng, task))
    if roll < 0.9:  # the right number, then a wrong one last
        return f"{task.answer}? No: " + _with_number(rng, task, family, _wrong(rng, task))
    expr = _expr(task).replace(" ", "")
    return rng.choice([calculator.tool_call_text(expr), "", "I am not sure.", "answer: unknown", "xq zzv kk"])


def judge_conversations(
    n: int, seed: int = 0, families: tuple[str, ...] = FAMILIES, criterion: str = "answer"
) -> list[list[Message]]:
    """``n`` judge SFT conversations (see the module docstring), the families taking turns; labelled by
    `judge_label` (``criterion`` answer) or `work_label` (work)."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(f"unknown or no families {unknown}; known: {', '.join(FAMILIES)}")
    rng, settings = random.Random(f"judge-chats-{seed}"), judge_settings(criterion=criterion)
    pools = {"calculator": calculator.make_tasks(n, seed), "arithmetic": arithmetic_tasks(n, seed)}
    out = []
    for i in range(n):
        family = families[i % len(families)]
        task = pools[family][i]
        response = judge_response(rng, task, family)
        episode = [{"role": "user", "content": task.prompt}, {"role": "assistant", "content": response}]
        request = render_messages(settings, episode_fields(episode, answer=task.answer))
        label = judge_label(response, task.answer) if criterion == "answer" else work_label(response)
        out.append([*request, {"role": "assistant", "content": f"Score: {label}"}])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4000, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES)
    )
    parser.add_argument(
        "--criterion", choices=sorted(PROMPTS), default="answer",
        help="answer: the final answer is the reference; work: the response shows a worked step",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    count = write_jsonl(judge_conversations(args.n, args.seed, families, args.criterion), args.out)
    print(f"wrote {count} conversations to {args.out}")
    settings = judge_settings(criterion=args.criterion)
    print("judge settings for the run (url and model: your judge server):")
    print(f"  prompt: {json.dumps(settings.prompt)}")
    print("  system_prompt: null\n  score_min: 0\n  score_max: 1\n  max_tokens: 24")


if __name__ == "__main__":
    main()
