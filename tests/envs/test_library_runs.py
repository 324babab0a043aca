"""Short asynchronous SAO runs on the environment libraries (reasoning-gym, TextArena, verifiers): the run
trains, every started trajectory is accounted for, and the tokens trained are exactly those generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao.config import load_config
from sao.runtime.runner import train_sync_entry

_RUN = [
    "model.tiny_arch=qwen3_moe", "model.tiny_size=test", "model.dtype=float32", "model.device=cpu",
    "critic.lr=1e-3", "critic.pretrain.corpus_size=8", "critic.pretrain.max_steps=2",
    "engine.max_new_tokens=16", "engine.max_concurrent=8",
    "trainer.lr=1e-3", "trainer.batch_size=4", "trainer.total_steps=3",
    "runtime.max_in_flight=8", "runtime.max_staleness=1", "runtime.mode=async",
    "logging.tensorboard=false", "logging.checkpoint_every=3", "logging.episodes=true",
]  # fmt: skip


# The multi-turn runs below use the most realistic tokenizer and template here: a locally trained byte-level
# BPE and the Qwen3-like template with thinking on (it rewrites earlier turns: their <think> blocks go).
_BPE_QWEN3 = ["model.tiny_tokenizer=bpe", "model.chat_template=qwen3", "model.enable_thinking=true"]


def _run(run_dir: Path, *overrides: str) -> tuple[list[dict], list[dict], dict]:
    """A 3-step async SAO run; checks the books and the token count; returns steps, episodes, counters."""
    result = train_sync_entry(load_config(None, [*_RUN, f"logging.run_dir={run_dir}", *overrides]))
    assert (result.steps, result.policy_version) == (3, 3)
    c = result.counters
    assert c["trained"] == 12 and c["started"] == c["trained"] + c["dropped"] + c["pending"], c
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "reward/mean" in r]
    episodes = [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 12
    generated = sum(turn["gen_tokens"] for e in episodes for turn in e["turns"])
    assert sum(r["batch/action_tokens"] for r in steps) == generated > 0
    return steps, episodes, c


def test_a_reasoning_gym_mixture_streams_fresh_prompts_through_an_async_sao_run(tmp_path):
    pytest.importorskip("reasoning_gym")
    run = tmp_path / "run"
    steps, episodes, counters = _run(
        run, "data.env=reasoning_gym", "data.stream=true", "data.max_turns=1", "data.max_total_tokens=1024",
        "data.env_kwargs={datasets: {chain_sum: {config: {max_terms: 3, max_digits: 2}}, "
        "basic_arithmetic: {config: {max_terms: 2, max_digits: 2}}, leg_counting: {weight: 2}}}",
    )  # fmt: skip
    assert counters.get("dropped/prompt_too_long", 0) == 0
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in steps)
    ids = [e["prompt_id"] for e in episodes]
    assert len(set(ids)) == len(ids)  # a stream: no prompt trained twice
    assert {i.split("-")[-1] for i in ids} <= {"chain_sum", "basic_arithmetic", "leg_counting"}


@pytest.mark.parametrize(
    ("game", "extra", "tokenizer"),
    [
        ("GuessTheNumber-v0", [], []),  # single-player: the game's own reward at the end
        ("TicTacToe-v0", ["opponent: random", "player_id: random"], _BPE_QWEN3),  # two-player, scripted foe
    ],
)
def test_textarena_games_train_in_an_async_sao_run(tmp_path, game, extra, tokenizer):
    pytest.importorskip("textarena")
    kwargs = ", ".join([f"game: {game}", "max_turns: 4", *extra])
    steps, episodes, _ = _run(
        tmp_path / "run", "data.env=textarena", f"data.env_kwargs={{{kwargs}}}", "data.max_turns=4",
        "data.max_total_tokens=1500", *tokenizer,
    )  # fmt: skip
    assert all(e["turns"] for e in episodes)
    assert all(-1.0 <= r["reward/mean"] <= 1.0 for r in steps)
    assert max(len(e["turns"]) for e in episodes) > 1  # multi-turn: the game answered moves


def test_a_verifiers_multi_turn_environment_trains_in_an_async_sao_run(tmp_path, monkeypatch):
    pytest.importorskip("verifiers")
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "vf_envs"))  # as an installed hub package
    steps, episodes, _ = _run(
        tmp_path / "run", "data.env=verifiers",
        "data.env_kwargs={env_id: sao_vf_guess, env_args: {num_tasks: 16}}", "data.max_turns=6",
        "data.max_total_tokens=1500", *_BPE_QWEN3,
    )  # fmt: skip
    assert max(len(e["turns"]) for e in episodes) > 1  # the env answered guesses
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in steps)


def test_swe_repository_tasks_train_in_an_async_sao_run_with_the_built_in_agent_loop(tmp_path):
    """The repository env played by the built-in loop (no harness): synthetic instances from the env's
    own generator, a sandbox per episode, graded at the loop's last turn (data.max_turns caps the env's)."""
    steps, episodes, _ = _run(
        tmp_path / "run", "data.env=swe", "data.num_tasks=4", "data.max_turns=2",
        "data.max_total_tokens=4000",
        f"data.env_kwargs={{repos_dir: {tmp_path / 'repos'}, files: 2, depth: 0, command_timeout_s: 10}}",
        *_BPE_QWEN3,
    )  # fmt: skip
    assert {e["prompt_id"] for e in episodes} <= {f"synth__{f}-{i:04d}" for f in
                                                  ("textkit", "intervals", "ledger", "inventory", "daycount",
                                                   "gridmath") for i in range(4)}  # fmt: skip
    # graded on the loop's last turn ("stop": the env ended it), not cut ungraded at "max_turns"
    assert any(e["finish_reason"] == "stop" for e in episodes)
    assert all(e["finish_reason"] in ("stop", "length") for e in episodes)
    assert all(r["reward/mean"] == 0.0 for r in steps)  # a tiny random model resolves nothing
