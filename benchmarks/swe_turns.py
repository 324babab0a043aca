"""Benchmark: turns/s of long episodes on the repository env (`swe`), and where the wall time goes: the
engine, sandboxed runs, the env outside them, the agent loop.

Workload: episodes of ``--turns`` (300) turns played through the real agent loop
(`sao.rollout.agent_loop.run_episode`) on a generated Python package of ``--modules`` (20) modules and a
test suite (or instance ``--index`` of an ``--instances`` JSONL file), observations cut at
``--observation-chars`` (1200, the env's ``max_observation_chars``), tokens of the tiny models' BPE
tokenizer and Qwen3 chat template. A scripted policy cycles through tool calls a coding agent makes
(~30-60 tokens each): ``bash`` (``grep -rn``, ``git diff --stat``, ``python -c``), ``view`` (a file, a
line range, a directory) and ``str_replace`` (an edit, then its undo); the last turn reaches ``max_turns``,
so the episode is graded (the hidden tests run once).

Engines (``--engine``):

- ``local`` (default): the real `LocalEngine` on a tiny ``--arch``/``--size`` model (qwen3_moe/test;
  its config's 4096 positions are lifted to ``--context-limit`` for the engine: RoPE has no learned
  positions), teacher-forced (`swe_engine`): each turn the engine generates ``--gen-tokens`` (24) tokens
  on the true prompt, and the turn recorded is those tokens + the scripted tool calls. Two arms,
  interleaved, ``--reps`` (5) episodes each: prefix cache on (the engine's default
  ``prefix_cache_tokens``: a turn prefills only its new tokens) with ``--turns``-turn episodes, and off
  (``prefix_cache_tokens=0``: every turn prefills the whole context, whose cost grows with its square)
  with ``--off-turns`` (50)-turn episodes; the ratio of the two compares turns/s over those first turns.
- ``scripted``: an engine that "generates" the scripted texts (engine cost ~0: what is measured is
  everything else), ``--reps`` episodes in a row; ``both`` runs it before the engine arms.

Printed, median [range] over episodes: turns/s; the wall-time shares (engine: inside the engine's
``generate``; sandbox: `Sandbox.run`, i.e. ``bash`` calls, the git set-up and the grading run; env
host-side: ``view`` / ``str_replace`` / ``create`` on the host, the disk-use walk after mutating calls,
building the sandbox; agent loop: the rest, rendering and tokenising observations, recording turns); for
the engine arms the prefix hits, the share of prompt tokens served from kept KV and the final context in
tokens, and the cache on / off ratio; for the scripted arm the disk-use walk's cost per call; the load
average before and after.

    python benchmarks/swe_turns.py                     # the issue's figure: ~30-40 min on 2 idle cores
    python benchmarks/swe_turns.py --turns 100         # ~10 min
    python benchmarks/swe_turns.py --engine scripted   # ~2 min
    python benchmarks/swe_turns.py --turns 20 --off-turns 10 --reps 1 --engine both   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import sao.envs.swe_env as swe_env
import sao.envs.swe_workspace as swe_workspace
import swe_engine
from harness import LoadWatch, Spread, interleaved
from sao.engine.types import Generation
from sao.envs.base import Task
from sao.envs.sandbox import Sandbox
from sao.envs.swe_env import SWEEnv
from sao.envs.swe_instance import instance_to_row, load_instances
from sao.envs.swe_tools import disk_usage_bytes
from sao.models.loading import load_tokenizer
from sao.models.tiny import TINY_ARCHS, TINY_SIZES, tiny_checkpoint
from sao.rollout.agent_loop import AgentLoopConfig, run_episode

MODULE = '''"""Module {i}."""

LIMIT = {i} + 10


def scale_{i}(values, factor=2):
    """Every value times factor, capped at LIMIT * 10."""
    return [min(v * factor, LIMIT * 10) for v in values]


def total_{i}(values):
    return sum(scale_{i}(values))
'''
TEST = """from pkg.mod{i} import scale_{i}, total_{i}


def test_scale_{i}():
    assert scale_{i}([1, 2]) == [2, 4]


def test_total_{i}():
    assert total_{i}([1]) == 2
"""


def make_repo(root: Path, modules: int) -> Task:
    """A package of ``modules`` modules with one test file each, committed; the task of an instance whose
    hidden test adds one test (it passes at base: the benchmark measures the env, not the fix)."""
    repo = root / "bench-repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    for i in range(modules):
        (repo / "pkg" / f"mod{i}.py").write_text(MODULE.format(i=i))
        (repo / "tests" / f"test_mod{i}.py").write_text(TEST.format(i=i))
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b"}
    env.update(GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@b")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True
        ).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    base = git("rev-parse", "HEAD").decode().strip()
    test_file = repo / "tests" / "test_mod0.py"
    test_file.write_text(TEST.format(i=0) + "\n\ndef test_extra():\n    assert total_0([2]) == 4\n")
    test_patch = git("diff").decode()
    git("checkout", "-q", "--", ".")
    row = {
        "instance_id": "bench-0", "repo": "bench/repo", "base_commit": base,
        "problem_statement": "Benchmark instance.", "patch": "", "test_patch": test_patch,
        "FAIL_TO_PASS": ["tests/test_mod0.py::test_extra"],
        "PASS_TO_PASS": [f"tests/test_mod{i}.py::test_scale_{i}" for i in range(modules)],
        "repo_path": str(repo),
    }  # fmt: skip
    return Task(id=row.pop("instance_id"), prompt=row.pop("problem_statement"), metadata=row)


def call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def policy_turns(path: str) -> itertools.cycle[str]:
    """The scripted agent's turns, cycled: exploration, an edit of ``path``, checks, the edit undone."""
    return itertools.cycle(
        [
            "Let me look around.\n" + call("bash", command="grep -rn 'def ' --include=*.py . | head -40"),
            call("view", path="."),
            call("view", path=path),
            call("str_replace", path=path, old_str="min(v * factor", new_str="min(factor * v"),
            call("bash", command="git diff --stat && python -c 'import pkg'"),
            call("view", path=path, view_range=[5, 8]),
            call("str_replace", path=path, old_str="min(factor * v", new_str="min(v * factor"),
            call("bash", command="git status --porcelain | head; ls tests | wc -l"),
        ]
    )


class ScriptedEngine:
    """An engine that "generates" the policy's next text (tokenised, plus the end-of-turn token)."""

    version = 0

    def __init__(self, tokenizer, turns: itertools.cycle[str]) -> None:
        self.tokenizer, self.turns = tokenizer, turns
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, params) -> Generation:
        ids = [*self.tokenizer.encode(next(self.turns), add_special_tokens=False), self.eot]
        return Generation(ids, [-1.0] * len(ids), [0] * len(ids), "stop")


SPENT = dict.fromkeys(("sandbox_s", "sandbox_runs", "walk_s", "walks", "reset_close_s", "grade_s"), 0.0)


class TimedSandbox(Sandbox):
    """`Sandbox` adding up the wall time of its runs into ``SPENT``."""

    def run(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return super().run(*args, **kwargs)
        finally:
            SPENT["sandbox_s"] += time.perf_counter() - started
            SPENT["sandbox_runs"] += 1


def timed_disk_usage(root: Path) -> int:
    started = time.perf_counter()
    try:
        return disk_usage_bytes(root)
    finally:
        SPENT["walk_s"] += time.perf_counter() - started
        SPENT["walks"] += 1


class TimedSWEEnv(SWEEnv):
    """`SWEEnv` adding up into ``SPENT`` the wall time of ``reset`` and ``close`` (outside the loop's per-turn
    ``env_s``) and of grading (inside the last turn's)."""

    async def reset(self, task: Task):
        started = time.perf_counter()
        try:
            return await super().reset(task)
        finally:
            SPENT["reset_close_s"] += time.perf_counter() - started

    async def close(self) -> None:
        started = time.perf_counter()
        try:
            await super().close()
        finally:
            SPENT["reset_close_s"] += time.perf_counter() - started

    def _grade(self):
        started = time.perf_counter()
        try:
            return super()._grade()
        finally:
            SPENT["grade_s"] += time.perf_counter() - started


def instrument() -> None:
    """Make the env's workspace build `TimedSandbox` and time the env's disk-use walks (both are looked up
    by module name)."""
    swe_workspace.Sandbox = TimedSandbox
    swe_env.disk_usage_bytes = timed_disk_usage


def fresh_env(turns: int, observation_chars: int) -> TimedSWEEnv:
    """A new timed env of ``turns`` turns, with ``SPENT`` zeroed for its episode."""
    SPENT.update(dict.fromkeys(SPENT, 0.0))
    return TimedSWEEnv(
        max_turns=turns, command_timeout_s=60.0, test_timeout_s=300.0, max_observation_chars=observation_chars
    )


def one_episode(tokenizer, task: Task, path: str, turns: int, observation_chars: int) -> dict[str, float]:
    """One episode played by `ScriptedEngine`; its turns/s and wall shares."""
    env = fresh_env(turns, observation_chars)
    cfg = AgentLoopConfig(max_turns=turns, max_total_tokens=10**8, max_tokens_per_turn=4096)
    engine = ScriptedEngine(tokenizer, policy_turns(path))
    started = time.perf_counter()
    traj = asyncio.run(run_episode(engine, tokenizer, env, task, cfg))
    wall = time.perf_counter() - started
    env_s = sum(t["env_s"] for t in traj.metadata["timings"]) + SPENT["reset_close_s"]
    played, last = len(traj.rewards), traj.metadata["infos"][-1]
    assert played == turns and last.get("grade_error") is None and last["resolved"], last
    return {
        "turns_per_s": played / wall,
        "wall_s": wall,
        "sandbox_share": SPENT["sandbox_s"] / wall,
        "env_share": max(env_s - SPENT["sandbox_s"], 0.0) / wall,
        "walk_ms": 1000 * SPENT["walk_s"] / max(SPENT["walks"], 1),
        "loop_share": (wall - env_s) / wall,
        "sandbox_runs": float(SPENT["sandbox_runs"]),
        "tokens": len(traj.token_ids),
    }


def scripted_report(args: argparse.Namespace, tokenizer, task: Task, path: str) -> str:
    """The scripted arm: ``--reps`` episodes in a row, its figures median [range]."""
    runs = [one_episode(tokenizer, task, path, args.turns, args.observation_chars) for _ in range(args.reps)]
    s = {key: Spread(tuple(r[key] for r in runs)) for key in runs[0]}
    return "\n".join([
        f"scripted engine (engine cost ~0): {args.turns}-turn episodes, {args.reps} episodes",
        f"  turns/s                  {s['turns_per_s'].fmt('.1f')}",
        f"  episode wall             {s['wall_s'].fmt('.1f', ' s')}",
        f"  share in sandbox runs    {s['sandbox_share'].fmt('.0%')}  ({runs[0]['sandbox_runs']:.0f} runs)",
        f"  share in env, host-side  {s['env_share'].fmt('.0%')}",
        f"  share in agent loop      {s['loop_share'].fmt('.0%')}",
        f"  tokens per episode       {s['tokens'].fmt(',.0f')}",
        f"  disk-use walk per call   {s['walk_ms'].fmt('.2f', ' ms')}",
    ])  # fmt: skip


def engine_report(args: argparse.Namespace, model_dir: Path, tokenizer, task: Task, path: str) -> str:
    """The two engine arms (prefix cache on / off), interleaved, ``--reps`` episodes each."""
    window = min(args.off_turns, args.turns)
    common = {"gen_tokens": args.gen_tokens, "window": window, "context_limit": args.context_limit}
    arms = {
        "cache on": swe_engine.EngineArm(True, args.turns, **common, device=args.device),
        "cache off": swe_engine.EngineArm(False, window, **common, device=args.device),
    }
    print(
        f"engine arms: LocalEngine, tiny {args.arch}/{args.size} on {args.device}, torch threads "
        f"{torch.get_num_threads()}, context limit {args.context_limit}; teacher-forced, {args.gen_tokens} "
        f"generated tokens per turn; cache on: {args.turns}-turn episodes, cache off: {window}-turn "
        f"episodes; {args.reps} episodes each, interleaved",
        flush=True,
    )

    def runner(arm: swe_engine.EngineArm):
        def run(rep: int) -> dict[str, float]:
            env = fresh_env(arm.turns, args.observation_chars)
            return swe_engine.engine_episode(model_dir, tokenizer, task, env, policy_turns(path), arm, SPENT)

        return run

    def progress(name: str, rep: int, result: dict[str, float]) -> None:
        print(f"  rep {rep + 1}/{args.reps} {name:9s} {result['wall_s']:6.1f} s", flush=True)

    results = interleaved({name: runner(arm) for name, arm in arms.items()}, args.reps, progress)
    return swe_engine.report(results, arms)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("local", "scripted", "both"), default="local")
    parser.add_argument("--turns", type=int, default=300, help="turns per episode (the cache-on arm's)")
    parser.add_argument("--off-turns", type=int, default=50, help="turns of the cache-off arm's episodes")
    parser.add_argument("--reps", type=int, default=5, help="episodes per arm")
    parser.add_argument("--gen-tokens", type=int, default=24, help="tokens the engine generates per turn")
    parser.add_argument("--arch", choices=TINY_ARCHS, default="qwen3_moe")
    parser.add_argument("--size", choices=TINY_SIZES, default="test")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--context-limit", type=int, default=131072, help="the engine's max_model_len")
    parser.add_argument("--observation-chars", type=int, default=1200, help="the env's max_observation_chars")
    parser.add_argument("--modules", type=int, default=20)
    parser.add_argument("--instances", type=Path, default=None, help="a SWE-style JSONL file instead")
    parser.add_argument("--index", type=int, default=0, help="which instance of --instances")
    parser.add_argument("--edit-path", default=None, help="the file the policy edits (an --instances file)")
    args = parser.parse_args()
    if args.instances is not None and args.edit_path is None:
        parser.error("--instances needs --edit-path (a file holding 'min(v * factor' is not assumed)")
    for name in ("turns", "off_turns", "reps", "gen_tokens", "observation_chars"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def load_task(args: argparse.Namespace, tmp: Path) -> tuple[Task, str]:
    """The episode's task and the file the policy edits."""
    if args.instances is None:
        return make_repo(tmp, args.modules), "pkg/mod1.py"
    row = instance_to_row(load_instances(args.instances)[args.index])
    return Task(id=row.pop("instance_id"), prompt=row.pop("problem_statement"), metadata=row), args.edit_path


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    watch = LoadWatch()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_checkpoint(Path(tmp) / "model", args.arch, args.size, seed=0, tokenizer="bpe")
        tokenizer = load_tokenizer(model_dir)
        task, path = load_task(args, Path(tmp))
        instrument()
        print(
            f"swe env, task {task.id!r}, observations <= {args.observation_chars} chars, BPE tokenizer; "
            f"median [range] over episodes",
            flush=True,
        )
        if args.engine in ("scripted", "both"):
            print(scripted_report(args, tokenizer, task, path), flush=True)
        if args.engine in ("local", "both"):
            print(engine_report(args, model_dir, tokenizer, task, path))
    print(watch.report())


if __name__ == "__main__":
    main()
