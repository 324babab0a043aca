"""Each FSDP rank loads only its shards (`sao.models.sharded_loading`), and value pretraining splits its
corpus across the ranks, with the results of today's paths.

The scenarios run on 2 gloo ranks with the other FSDP scenarios (``conftest.fsdp_runs``): sharded loads
beside the full load then `shard_model` of the same checkpoint (tiny dense and MoE models, tied and untied
embeddings, one and several safetensors files, float32 / bfloat16 / float64), critics from a policy and
from a saved critic, broken checkpoints; and `RankTrainer.pretrain_value` beside one process.
"""

from __future__ import annotations

import pytest
import torch

from . import fsdp_scenarios as scenarios

LOADS = [(scenarios.loading_case(*case), torch.float32) for case in scenarios.LOADING_CASES] + [
    ("bf16", torch.float32),
    ("bf16", torch.bfloat16),
    (scenarios.loading_case("qwen3_moe", True, "multi"), torch.float64),
]


def _assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


@pytest.mark.parametrize(("name", "dtype"), LOADS, ids=[f"{n}-{str(d)[6:]}" for n, d in LOADS])
def test_a_sharded_load_equals_the_full_load_then_sharding(name, dtype, fsdp_runs):
    """Bit for bit: every weight (fused MoE experts from per-expert tensors, a tied head, several files,
    bfloat16 on disk), the recomputed rotary buffers, eval mode; a tied head stays tied; packed attention."""
    got = fsdp_runs.ranks["sharded_loading"][(name, dtype)]
    _assert_equal(got["sharded"]["state"], got["full"]["state"])
    _assert_equal(got["sharded"]["buffers"], got["full"]["buffers"])
    assert {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"} <= got["full"][
        "buffers"
    ].keys()
    assert got["sharded"]["training"] is got["full"]["training"] is False
    assert got["tied"] == ("-tied-" in name or name == "bf16")
    assert got["attention"] == "sao_varlen"


def test_a_sharded_load_holds_the_checkpoint_weights(fsdp_runs, tmp_path):
    """The loaded weights are the checkpoint's own (not two equally wrong loads), and rank 0 held only its
    half of the embedding rows."""
    from safetensors.torch import load_file

    from sao.models.moe_names import unfuse_experts

    name = scenarios.loading_case("qwen3_moe", False, "single")
    got = fsdp_runs.ranks["sharded_loading"][(name, torch.float32)]
    on_disk = load_file(fsdp_runs.work / "loading" / name / "model.safetensors")
    _assert_equal(unfuse_experts(got["sharded"]["state"]), on_disk)
    rows = on_disk["model.embed_tokens.weight"].shape[0]
    assert got["local_rows"] == rows // 2


def test_each_rank_reads_only_its_rows_in_bounded_blocks(fsdp_runs):
    """What a rank reads from the files is exactly its shards (no tensor read whole then sliced), the
    ranks' reads add up to the checkpoint once, and no read is larger than a block."""
    from safetensors.torch import load_file

    reads = fsdp_runs.ranks["sharded_loading"]["reads"]
    directory = fsdp_runs.work / "loading" / scenarios.loading_case("qwen3_moe", False, "multi")
    on_disk = sum(t.nbytes for f in directory.glob("*.safetensors") for t in load_file(f).values())
    assert reads["read"] == reads["shards"] < on_disk
    assert sum(reads["every_rank"]) == on_disk
    assert 0 < reads["largest"] <= scenarios.READ_BLOCK_BYTES


@pytest.mark.parametrize(("source", "head_init"), [("qwen3_moe-untied-single", "zero"),
                                                    ("qwen3_moe-untied-single", "normal"),
                                                    ("critic", "zero")])  # fmt: skip
def test_a_sharded_critic_equals_load_critic_then_sharding(source, head_init, fsdp_runs):
    """From a policy checkpoint (its LM head ignored; a new head drawn as `load_critic` draws it) and from
    a saved critic (its head as saved, whatever ``head_init`` says)."""
    got = fsdp_runs.ranks["sharded_loading"][("critic", source, head_init)]
    _assert_equal(got["sharded"]["state"], got["full"]["state"])
    _assert_equal(got["sharded"]["buffers"], got["full"]["buffers"])
    head = got["sharded"]["state"]["model.score.weight"]
    assert bool((head == 0).all()) == (source != "critic" and head_init == "zero")


def test_prepare_sees_each_model_before_it_is_sharded(fsdp_runs):
    seen = fsdp_runs.ranks["sharded_loading"]["prepare"]
    assert len(seen) == len(LOADS) + 3
    assert set(seen) == {(False, "meta")}  # not a DTensor yet, no memory yet


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("missing", r"lacks 1 tensors: \['model.norm.weight'\]"),
        ("unknown", r"1 tensors the model does not know: \['model.layers.9.mlp.gate.weight'\]"),
        (
            "shape",
            r"1 tensors have the wrong shape: \[.model.norm.weight \(65,\) \(the model's: \(64,\)\).\]",
        ),
    ],
    ids=["missing", "unknown", "shape"],
)
def test_a_broken_checkpoint_is_an_error_naming_the_tensor(broken, message, fsdp_runs):
    import re

    assert re.search(message, fsdp_runs.ranks["sharded_loading"]["errors"][broken])


def test_split_value_pretraining_matches_one_process(fsdp_runs):
    """Same critic weights, EV curve, loss and early stop on every rank as one process on the whole corpus;
    each rank forwarded about half of the tokens."""
    got = fsdp_runs.ranks["pretrain_split"]
    want = scenarios.reference_pretrain_split(fsdp_runs.model_dir)
    assert scenarios.PRETRAIN_SPLIT.max_steps > want["result"]["steps"]  # it stopped early
    assert want["result"]["stop_reason"].startswith("explained variance plateaued")
    diff = max(float((got["critic"][k] - want["critic"][k]).abs().max()) for k in want["critic"])
    assert diff < 1e-10
    for rank in got["ranks"]:
        result = rank["result"]
        assert (result["steps"], result["stop_reason"]) == (
            want["result"]["steps"],
            want["result"]["stop_reason"],
        )
        assert [s for s, _ in result["ev_curve"]] == [s for s, _ in want["result"]["ev_curve"]]
        for (_, ev), (_, ev_want) in zip(result["ev_curve"], want["result"]["ev_curve"], strict=True):
            assert ev == pytest.approx(ev_want, rel=1e-9)
        assert result["final_value_loss"] == pytest.approx(want["result"]["final_value_loss"], rel=1e-9)
        assert 0.35 * want["tokens"] < rank["tokens"] < 0.65 * want["tokens"]
