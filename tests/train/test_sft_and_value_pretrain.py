"""End-to-end on the tiny test model: SFT lowers held-out loss; value pretraining learns returns."""

from __future__ import annotations

import json
import random

import pytest
import torch

from sao.train.sft import SFTOptions, load_chat_jsonl, run_sft
from sao.train.value_pretrain import ValuePretrainOptions, mc_returns, run_value_pretrain
from sao.types import Batch, Trajectory, save_jsonl


def _write_chats(path, n, seed=0):
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            messages = [
                {"role": "user", "content": f"{a}+{b}"},
                {"role": "assistant", "content": f"={a + b}"},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")


def test_sft_lowers_held_out_loss_and_saves_a_loadable_checkpoint(tiny_moe_dir, tmp_path):
    from sao.models.loading import load_policy

    data = tmp_path / "chats.jsonl"
    _write_chats(data, 80)
    out = tmp_path / "sft"
    opts = SFTOptions(steps=40, lr=3e-3, batch_size=16, eval_frac=0.2, eval_every=20, warmup_steps=2)
    result = run_sft(tiny_moe_dir, data, out, opts)
    assert result["eval_loss"] < 0.8 * result["eval_loss_start"]
    lines = (out / "sft_metrics.jsonl").read_text().splitlines()
    assert len(lines) == 40
    assert "sft/eval_loss" in json.loads(lines[-1])
    load_policy(out)  # an ordinary HF checkpoint
    assert not list(tmp_path.glob(".sft.tmp-*"))  # staging directory renamed away


def test_bad_chat_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_chat_jsonl(path)


def _corpus(n, seed=0):
    """Trajectories whose outcome is decided by the first prompt token: a critic can learn it."""
    rng = random.Random(seed)
    trajs = []
    for i in range(n):
        good = rng.random() < 0.5
        prompt = [5 if good else 6] + [rng.randint(10, 60) for _ in range(5)]
        action = [rng.randint(10, 60) for _ in range(6)]
        obs = [rng.randint(10, 60) for _ in range(3)]
        action2 = [rng.randint(10, 60) for _ in range(4)]
        ids = prompt + action + obs + action2
        mask = [0] * len(prompt) + [1] * len(action) + [0] * len(obs) + [1] * len(action2)
        turns = [-1] * len(prompt) + [0] * (len(action) + len(obs)) + [1] * len(action2)
        trajs.append(
            Trajectory(
                prompt_id=f"p{i}",
                token_ids=ids,
                action_mask=mask,
                rollout_logprobs=[-1.0 if m else 0.0 for m in mask],
                versions=[0 if m else -1 for m in mask],
                turn_ids=turns,
                rewards=[1.0 if good else 0.0],
            )
        )
    return trajs


def test_mc_returns_are_reward_to_go_on_action_tokens_only():
    batch = Batch.from_trajectories(_corpus(3))
    returns = mc_returns(batch)
    expected = torch.where(batch.action_mask, batch.outcome_rewards[batch.seq_ids], torch.zeros(()))
    assert torch.equal(returns, expected)


def test_value_pretraining_learns_returns_and_respects_corpus_size(tiny_moe_dir, tmp_path):
    from sao.models.critic import load_critic
    from sao.models.forward import token_values

    corpus_path = tmp_path / "corpus.jsonl"
    save_jsonl(corpus_path, _corpus(96))
    out = tmp_path / "critic"
    opts = ValuePretrainOptions(
        corpus_size=64, max_steps=60, ev_patience=100, lr=3e-3, batch_size=16, eval_frac=0.25, eval_every=10
    )
    result = run_value_pretrain(tiny_moe_dir, corpus_path, out, opts)
    assert result.corpus_size == 64
    assert result.best_ev > 0.5, result.ev_curve
    summary = json.loads((out / "value_pretrain_summary.json").read_text())
    assert summary["corpus_size"] == 64 and summary["steps"] == result.steps
    # The saved critic reloads with its trained head.
    critic = load_critic(out, freeze="none")
    batch = Batch.from_trajectories(_corpus(4, seed=1))
    with torch.no_grad():
        values = token_values(critic, batch)
    assert values[batch.action_mask].abs().sum() > 0


def test_value_pretraining_stops_when_explained_variance_plateaus(tiny_moe_dir, tmp_path):
    corpus_path = tmp_path / "corpus.jsonl"
    save_jsonl(corpus_path, _corpus(32))
    opts = ValuePretrainOptions(
        corpus_size=32, max_steps=50, ev_patience=2, ev_min_delta=10.0, lr=1e-3, batch_size=8, eval_every=2
    )
    result = run_value_pretrain(tiny_moe_dir, corpus_path, tmp_path / "critic", opts)
    assert result.stop_reason.startswith("explained variance plateaued")
    assert result.steps == 6  # evaluations at steps 2 (first, counts as best), 4 and 6


def test_cli_sft_and_pretrain_value_run_end_to_end(tiny_moe_dir, tmp_path):
    from typer.testing import CliRunner

    from sao.cli import app

    runner = CliRunner()
    data = tmp_path / "chats.jsonl"
    _write_chats(data, 20)
    sft_out = tmp_path / "sft"
    args = ["sft", "--model", str(tiny_moe_dir), "--data", str(data), "--out", str(sft_out), "--steps", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (sft_out / "model.safetensors").is_file()
    assert "sft step 3/3 | loss" in result.output  # not a terminal: plain progress lines

    corpus = tmp_path / "corpus.jsonl"
    save_jsonl(corpus, _corpus(16))
    critic_out = tmp_path / "critic"
    args = ["pretrain-value", "--model", str(sft_out), "--corpus", str(corpus), "--out", str(critic_out)]
    result = runner.invoke(app, [*args, "--corpus-size", "8", "--max-steps", "2", "--freeze", "attention"])
    assert result.exit_code == 0, result.output
    summary = json.loads((critic_out / "value_pretrain_summary.json").read_text())
    assert summary["corpus_size"] == 8 and summary["steps"] == 2


def test_cli_pretrain_value_with_a_missing_model_fails_cleanly(tmp_path):
    from typer.testing import CliRunner

    from sao.cli import app

    corpus = tmp_path / "corpus.jsonl"
    save_jsonl(corpus, _corpus(4))
    args = [
        "pretrain-value",
        "--model",
        str(tmp_path / "nope"),
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "c"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "does not exist" in result.output
