"""bf16 compute with float32 master weights: 2 FSDP2 ranks (gloo) with `MixedPrecisionPolicy(bf16, fp32)`
equal one process with `cast_for_compute`, and the ranks reduce-scatter float32 gradients once per step.

The scenarios (`precision_scenarios`) run once per module: the real `RankTrainer` (sharded loading,
`prepare_for_training` with activation checkpointing, the policy from ``model.dtype``/``model.master_dtype``)
and the plain `Trainer`, two SAO steps (K=2 critic steps, then the actor) on the tiny dense Qwen3, several
micro-batches per rank. The one-process and sharded runs split the batch into different micro-batches, so
their bf16 gradients are rounded over different token sets: the actor's gradients differ at bf16 precision
(≈ 1e-3 relative), and AdamW's first steps (≈ lr × sign(g)) flip a few near-zero elements. The critic's
differ less (its metrics ≈ 1e-4 relative, its weights by < 0.1 × lr) but how much less depends on the CPU's
bf16 kernels: on an AVX-512 CPU without AMX they agreed to float32 precision, on one with AMX (Sapphire
Rapids and later) they do not, so the critic is held to the actor's kind of bound, 10× tighter on its loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from . import precision_scenarios as scenarios

LR = 1e-3  # trainer.lr and critic.lr of the scenarios


@pytest.fixture(scope="module")
def runs(tiny_dense_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("mixed_precision")
    batches = scenarios.make_batches(tiny_dense_dir)
    return {
        "ranks": scenarios.run_ranks(tiny_dense_dir, work, batches),
        "reference": scenarios.reference_steps(tiny_dense_dir, batches),
    }


def _relative(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """‖got − want‖ / ‖want‖ over every tensor."""
    assert got.keys() == want.keys()
    diff = sum(float((got[k].double() - want[k].double()).square().sum()) for k in want)
    norm = sum(float(want[k].double().square().sum()) for k in want)
    return (diff / norm) ** 0.5


def test_the_ranks_hold_fp32_shards_and_checkpoint_their_layers(runs):
    ranks = runs["ranks"]["step"]
    assert ranks["sharded_dtypes"] == ["torch.float32"]
    assert ranks["checkpointed"]


def test_two_mixed_precision_ranks_equal_one_process_with_cast_for_compute(runs):
    got, want = runs["ranks"]["step"]["steps"], runs["reference"]
    assert len(got) == len(want) == 2
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        for key in ("critic/value_loss", "critic/value_loss_last", "critic/grad_norm"):
            assert g["metrics"][key] == pytest.approx(w["metrics"][key], rel=5e-4), (step, key)
        for key in ("actor/loss", "actor/grad_norm"):
            assert g["metrics"][key] == pytest.approx(w["metrics"][key], rel=5e-3), (step, key)
        for part in ("critic", "actor"):
            assert g[part].keys() == w[part].keys()
            # An element off by more than a tenth of one AdamW step: rare (bf16 rounding near g = 0), while a
            # missed or doubled step or unreduced gradients would move most elements by ~lr.
            moved = sum(int(((g[part][k] - w[part][k]).abs() > 0.1 * LR).sum()) for k in w[part])
            assert moved / sum(v.numel() for v in w[part].values()) < 0.01, (step, part)
        critic = max(float((g["critic"][k] - w["critic"][k]).abs().max()) for k in w["critic"])
        assert critic < LR, step  # no element a whole step apart (measured: < 1e-4 with AMX, 1e-8 without)
    assert _relative(got[0]["actor_grads"], want[0]["actor_grads"]) < 1e-2  # same weights: bf16 rounding


def test_gradients_are_reduce_scattered_once_per_step_in_fp32(runs):
    """``gradient_sync="step"``: one reduce-scatter per FSDP unit and optimizer step, whatever the number of
    micro-batches; ``"micro_batch"``: one per micro-batch. Both in float32, with the same gradients: the
    deferred sum over micro-batches is accumulated in float32 (in bf16 it would differ by ≈ 1e-3)."""
    step = runs["ranks"]["step"]["steps"][0]
    per_micro_batch = runs["ranks"]["micro_batch"]["steps"][0]
    micro_batches = step["micro_batches"]
    assert micro_batches > 1
    assert per_micro_batch["reduce_scatters"]["count"] == micro_batches * step["reduce_scatters"]["count"]
    assert (
        step["reduce_scatters"]["dtypes"] == per_micro_batch["reduce_scatters"]["dtypes"] == ["torch.float32"]
    )
    assert _relative(step["actor_grads"], per_micro_batch["actor_grads"]) < 1e-6
    assert _relative(step["critic"], per_micro_batch["critic"]) < 1e-7
    assert step["metrics"]["actor/loss"] == pytest.approx(per_micro_batch["metrics"]["actor/loss"], rel=1e-6)
