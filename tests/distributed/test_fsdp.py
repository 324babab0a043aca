"""The sharded trainer (2 FSDP2 ranks on gloo) computes the single-process update.

The scenarios run once per session (``conftest.fsdp_runs``): the real `Trainer` inside `RankTrainer` on the
tiny MoE model in float64, where another summation order changes results by ~1e-15, so 1e-10 separates
rounding from any real difference. ``sao_fp32`` is the production float32 path (grouped_mm experts), where
a few near-zero gradient elements, amplified by AdamW's ε regime, differ by up to ~2e-4 after one step.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sao.train.collective import LocalCollective
from sao.train.step_shard import StepShard

from . import fsdp_scenarios as scenarios

TOL = 1e-10


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _assert_metrics_close(got: dict[str, float], want: dict[str, float], rel: float) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=rel, abs=1e-9, nan_ok=True), key


def test_the_scenarios_give_ranks_uneven_work(fsdp_runs):
    """What the equivalence tests rely on: ranks with different token counts and micro-batch counts, and a
    step in which one rank has no trajectory at all."""
    batch = fsdp_runs.batches["grouped"][0]
    shards = scenarios.shards(batch)
    tokens = [int(batch.seq_lengths[s].sum()) for s in shards]
    parts = [len(batch.select(s).split(scenarios.MICRO_BATCH_TOKENS)) for s in shards]
    assert tokens[0] != tokens[1] and parts[0] != parts[1]
    one_group = fsdp_runs.batches["one_group"][0]
    assert [len(s) for s in scenarios.shards(one_group)] == [2, 0]


@pytest.mark.parametrize("preset", ["sao", "sao_warmup", "grpo", "spo"])
def test_sharded_trainer_matches_one_process(preset, fsdp_runs):
    """Weights (actor, critic), metrics and trainer state (counters, schedulers, the estimator's state)
    after every step; two or three consecutive steps, so the optimizer moments matter."""
    batches = scenarios.batches_for(preset, fsdp_runs.batches)
    want = scenarios.reference_steps(fsdp_runs.model_dir, preset, batches)["steps"]
    got = fsdp_runs.ranks[preset]["steps"]
    assert len(got) == len(want) == len(batches) >= 2
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert _max_diff(g["actor"], w["actor"]) < TOL, step
        if w["critic"] is not None:
            assert _max_diff(g["critic"], w["critic"]) < TOL, step
        _assert_metrics_close(g["metrics"], w["metrics"], rel=1e-6)
        assert g["state"] == w["state"], step
    if preset == "spo":  # the tracker saw every prompt of the batch, with the gathered divergence
        trackers = got[-1]["state"]["adv_state"]["trackers"]
        assert len(trackers) == 3 and got[-1]["metrics"]["adv/divergence_mean"] > 0


def test_the_comparison_separates_a_different_batch(fsdp_runs):
    """The same check fails against one process trained on a batch with one reward flipped."""
    batches = scenarios.batches_for("grpo", fsdp_runs.batches)
    first = batches[0]
    flipped = dataclasses.replace(first, outcome_rewards=first.outcome_rewards.clone())
    flipped.outcome_rewards[0] = 1.0 - flipped.outcome_rewards[0]
    want = scenarios.reference_steps(fsdp_runs.model_dir, "grpo", [flipped])["steps"][0]
    assert _max_diff(fsdp_runs.ranks["grpo"]["steps"][0]["actor"], want["actor"]) > 1e-4


def test_float32_differs_from_one_process_only_by_rounding(fsdp_runs):
    """The production dtype and MoE kernels: all but a few elements agree to 1e-6 after one step."""
    batches = scenarios.batches_for("sao_fp32", fsdp_runs.batches)
    want = scenarios.reference_steps(fsdp_runs.model_dir, "sao_fp32", batches)["steps"][0]
    got = fsdp_runs.ranks["sao_fp32"]["steps"][0]
    for name in ("actor", "critic"):
        diffs = torch.cat([(got[name][k] - want[name][k]).abs().flatten() for k in want[name]])
        assert float(diffs.max()) < 1e-3, name  # lr = 1e-2: a real difference moves elements by ~lr
        assert float((diffs > 1e-6).float().mean()) < 1e-3, name
    _assert_metrics_close(got["metrics"], want["metrics"], rel=1e-4)
    assert got["state"] == want["state"]


def test_value_pretraining_on_ranks_matches_one_process(fsdp_runs):
    got = fsdp_runs.ranks["pretrain"]
    want = scenarios.reference_pretrain(fsdp_runs.model_dir, scenarios.corpus())
    assert _max_diff(got, want) < TOL
    _, untrained = scenarios.plain_models(fsdp_runs.model_dir, "sao")
    assert _max_diff(got, scenarios.cpu_state(untrained)) > 1e-4  # it did train


@pytest.mark.parametrize("tied", [False, True])
def test_backbone_then_lm_head_in_chunks_gives_the_full_gradient(tied, fsdp_runs):
    """Sharded dense models called as sao calls them (backbone, then the head in a different number of
    chunks per rank): summed gradients equal the one-process gradient; a tied head stays tied; the full
    state dict has the plain model's names and values."""
    got = fsdp_runs.ranks["lm_head"][tied]
    batch = fsdp_runs.batches["grouped"][0]
    model = scenarios.dense_model(tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    initial = scenarios.cpu_state(model)
    scenarios.head_loss(model, batch, batch).backward()
    want = scenarios.grads(model)
    assert got["tied"] == tied
    assert _max_diff(got["grads"], want) < TOL
    assert all(float(g.abs().max()) > 0 for g in want.values())
    assert got["state"].keys() == initial.keys()
    assert all(torch.equal(got["state"][k], initial[k]) for k in initial)


def test_one_rank_shard_is_the_single_process_step(tiny_moe_dir):
    """Indices covering the batch on a one-rank collective: the same micro-batches and bit-identical
    results as no indices (the single-process path)."""
    batch = scenarios.make_batches(tiny_moe_dir)["grouped"][0]
    results = []
    for shard in (None, list(range(batch.num_sequences))):
        trainer = scenarios.plain_trainer(tiny_moe_dir, "grpo")
        metrics = trainer.train_step(batch, policy_version=1, shard=shard)
        results.append((metrics, scenarios.cpu_state(trainer.actor)))
    (m0, a0), (m1, a1) = results
    assert all(torch.equal(a0[k], a1[k]) for k in a0)
    assert m0.keys() == m1.keys() and all(m0[k] == m1[k] or math.isnan(m0[k]) for k in m0)
    step = StepShard.build(batch, [5, 0, 3, 1, 2, 4], 40, LocalCollective())
    assert step.padding == 0 and torch.equal(
        step.gather(step.local(batch.token_rewards)), batch.token_rewards
    )


def test_shards_must_partition_the_batch(tiny_moe_dir):
    batch = scenarios.make_batches(tiny_moe_dir)["grouped"][0]
    trainer = scenarios.plain_trainer(tiny_moe_dir, "grpo")
    with pytest.raises(ValueError, match="partition the batch: trajectory 5 is on 0 ranks"):
        trainer.train_step(batch, policy_version=1, shard=[0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="out of range"):
        trainer.train_step(batch, policy_version=1, shard=[0, 1, 2, 3, 4, 5, 6])
    assert trainer.step == 0
