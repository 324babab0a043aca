"""The trainer-memory model (`sao.plan.memory`): hand-computed figures for real shapes, and the activation
terms against what autograd saves and what a CPU backward allocates (the formulas' ground truth)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sao.plan.architecture import KNOWN_ARCHITECTURES, Architecture, known_config, parameter_sizes
from sao.plan.memory import (
    activation_bytes_per_token,
    layer_activation_bytes_per_token,
    local_engine_kv_bytes,
    predicted_trainer_peak_bytes,
    state_bytes_per_parameter,
    trainer_memory,
)

QWEN3_06B = Architecture.from_hf_config(KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"])
# Qwen3-0.6B by hand: embeddings 151936 × 1024 (tied); per layer q 2048·1024 + k, v 1024·1024 each + o
# 1024·2048 = 6,291,456, q/k norms 256, MLP 3 · 3072 · 1024 = 9,437,184, two norms 2048; final norm 1024.
EMBED_06B = 151_936 * 1024
LAYER_06B = 6_291_456 + 256 + 9_437_184 + 2048
PARAMS_06B = EMBED_06B + 28 * LAYER_06B + 1024
# Activations per token in bf16 (c = 2): RMSNorm of width w saves 6w + 4 per row.
NORM_H = 6 * 1024 + 4
ATTENTION_06B = NORM_H + 2048 + 16 * (6 * 128 + 4) + 8 * (6 * 128 + 4) + 4096 + 4096 + 4096 + 64 + 4096
MLP_06B = NORM_H + 2048 + 4 * 2 * 3072
OUTSIDE_06B = NORM_H + 2048 + 2 * 2 * 128 + 24
LOGITS_06B = 1024 * 151_936 * 16  # one chunk of 1024 rows, 16 B per logit


def test_known_architectures_have_the_model_cards_parameter_counts() -> None:
    # model cards: 0.6B (0.44B without embeddings), 8.2B (6.95B)
    assert sum(parameter_sizes(QWEN3_06B).values()) == PARAMS_06B == 596_049_920
    qwen3_8b = Architecture.from_hf_config(KNOWN_ARCHITECTURES["Qwen/Qwen3-8B"])
    layer = 16_777_216 + 2 * 4_194_304 + 16_777_216 + 256 + 3 * 12_288 * 4096 + 8192
    assert sum(parameter_sizes(qwen3_8b).values()) == 2 * 151_936 * 4096 + 36 * layer + 4096 == 8_190_735_360
    assert known_config("qwen3-0.6b") == ("Qwen/Qwen3-0.6B", KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"])
    assert known_config("/models/Qwen3-8B")[0] == "Qwen/Qwen3-8B"  # type: ignore[index]
    assert known_config("Qwen3-9B") is None


def test_state_bytes_follow_the_master_dtype() -> None:
    assert state_bytes_per_parameter("float32") == 16  # weight, gradient, AdamW m and v in fp32
    assert state_bytes_per_parameter("bfloat16") == 8  # pure bf16: all four in bf16
    assert state_bytes_per_parameter("float32", trainable=False) == 4
    assert state_bytes_per_parameter("bfloat16", trainable=False) == 2
    with pytest.raises(ValueError, match="float64"):
        state_bytes_per_parameter("float64")


def test_layer_activations_of_qwen3_0_6b_match_the_hand_computation() -> None:
    assert layer_activation_bytes_per_token(QWEN3_06B, 0, "bfloat16") == ATTENTION_06B + MLP_06B == 75_944
    kept, working = activation_bytes_per_token(QWEN3_06B, "bfloat16", checkpointing=True)
    assert (kept, working) == (28 * 2048 + OUTSIDE_06B, 75_944)  # layer inputs only; one layer recomputed
    kept, working = activation_bytes_per_token(QWEN3_06B, "bfloat16", checkpointing=False)
    assert (kept, working) == (28 * 75_944 + OUTSIDE_06B, 4 * 2 * 1024)


def test_qwen3_0_6b_peak_at_16k_tokens_matches_the_hand_computation() -> None:
    tokens = 16_384
    memory = trainer_memory(QWEN3_06B, tokens, compute="bfloat16", master="float32", checkpointing=True)
    assert memory.state == 16 * PARAMS_06B
    # One process (cast_for_compute): no copy is held through backward; the layer being recomputed has its
    # bf16 copies, their bf16 gradients and those cast to fp32 (2 + 2 + 4 B), the LM head likewise.
    assert memory.gathered == 0
    assert memory.activations_kept == tokens * (28 * 2048 + OUTSIDE_06B)
    assert memory.activations_working == tokens * 75_944 + LAYER_06B * 8
    assert memory.lm_head_chunk == LOGITS_06B + EMBED_06B * 8  # larger than the layer's working set
    expected = 16 * PARAMS_06B + memory.activations_kept + memory.lm_head_chunk
    assert memory.peak == expected == 14_353_367_040
    assert predicted_trainer_peak_bytes("Qwen/Qwen3-0.6B", tokens) == expected


def test_fsdp_ranks_hold_the_gathered_root_unit_and_two_layers() -> None:
    memory = trainer_memory(QWEN3_06B, 16_384, compute="bfloat16", master="float32", world=8)
    assert memory.state == 2 * PARAMS_06B  # 16 B / 8 ranks
    # the bf16 root unit (tied embeddings + final norm) and its unsharded gradient, two gathered layers,
    # one layer's bf16 gradient and its fp32 copy for the reduce-scatter
    assert memory.gathered == (EMBED_06B + 1024) * 2 * 2 + LAYER_06B * 2 * 2 + LAYER_06B * (2 + 4)
    assert memory.lm_head_chunk == LOGITS_06B + EMBED_06B * 2
    assert memory.activations_working == 16_384 * 75_944
    assert trainer_memory(QWEN3_06B, 16_384, world=1, sharded=True).gathered == memory.gathered
    # one reduce per step, several micro-batches a rank: the whole fp32 gradient, unsharded
    held = trainer_memory(QWEN3_06B, 16_384, world=8, unsharded_gradient=True).gathered
    assert held - memory.gathered == 4 * PARAMS_06B
    one_process = trainer_memory(QWEN3_06B, 16_384, unsharded_gradient=True)
    assert one_process.gathered == 0  # one process: the gradients are the master-dtype .grad (state)


def test_pure_bf16_holds_half_the_state_and_gathers_nothing_on_one_gpu() -> None:
    memory = trainer_memory(QWEN3_06B, 4096, compute="bfloat16", master="bfloat16")
    assert memory.state == 8 * PARAMS_06B
    assert memory.gathered == 0  # one process, one dtype: no FSDP unit is gathered or cast
    assert memory.lm_head_chunk == LOGITS_06B + EMBED_06B * 2  # the head's bf16 gradient per chunk
    sharded = trainer_memory(QWEN3_06B, 4096, compute="bfloat16", master="bfloat16", world=4)
    assert sharded.state == 2 * PARAMS_06B and sharded.gathered > 0
    unchecked = trainer_memory(QWEN3_06B, 4096, compute="bfloat16", master="float32", checkpointing=False)
    assert unchecked.gathered == 28 * LAYER_06B * 2  # every layer's bf16 copies saved until backward


def test_sao_on_the_local_runtime_adds_the_critic_and_the_engine() -> None:
    tokens = 16_384
    alone = predicted_trainer_peak_bytes(QWEN3_06B, tokens)
    shared = predicted_trainer_peak_bytes(
        QWEN3_06B, tokens, critic=True, engine_dtype="bfloat16", engine_kv_bytes=1000
    )
    frozen = 28 * (6_291_456 + 256)  # the critic's attention (critic.freeze: attention)
    critic = PARAMS_06B + 1024 + 1  # no LM head (tied), a scalar value head with bias
    assert shared - alone == 16 * (critic - frozen) + 4 * frozen + 2 * PARAMS_06B + 1000


def test_checkpointing_shrinks_activations_and_the_peak_grows_linearly_with_tokens() -> None:
    def act(tokens: int, checkpointing: bool) -> int:
        m = trainer_memory(QWEN3_06B, tokens, checkpointing=checkpointing)
        return m.activations_kept + m.activations_working

    assert act(8192, True) < 0.1 * act(8192, False)
    assert act(32_768, True) - act(16_384, True) == 16_384 * (28 * 2048 + OUTSIDE_06B + 75_944)


def test_local_engine_kv_grows_by_doubling_up_to_the_context_limit() -> None:
    per_token = 2 * 28 * 8 * 128 * 2
    assert local_engine_kv_bytes(QWEN3_06B, "bfloat16", slots=4, longest=3000) == per_token * 4 * 4096
    assert local_engine_kv_bytes(QWEN3_06B, "bfloat16", slots=4, longest=10) == per_token * 4 * 64
    # Qwen3's 40,960 positions cap the capacity below the next power of two
    assert local_engine_kv_bytes(QWEN3_06B, "bfloat16", slots=1, longest=40_000) == per_token * 40_960


def test_peak_accepts_a_checkpoint_directory_and_a_config_mapping(tmp_path: Path) -> None:
    config = KNOWN_ARCHITECTURES["Qwen/Qwen3-8B"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_dir = predicted_trainer_peak_bytes(tmp_path, 2048, world=8)
    assert from_dir == predicted_trainer_peak_bytes(config, 2048, world=8)
    assert from_dir == predicted_trainer_peak_bytes("Qwen/Qwen3-8B", 2048, world=8)
    with pytest.raises(ValueError, match="neither a checkpoint"):
        predicted_trainer_peak_bytes(tmp_path / "missing", 2048)


# --- the formulas against torch on the CPU -------------------------------------------------------------


def _tiny(model_type: str, dtype: str, vocab: int = 512):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    from sao.models.attention import enable_packed_attention

    shape = {"vocab_size": vocab, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384,
             "tie_word_embeddings": False}  # fmt: skip
    if model_type == "qwen3_moe":
        config = Qwen3MoeConfig(**shape, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96)
    else:
        config = Qwen3Config(**shape)
    torch.manual_seed(0)
    model = enable_packed_attention(AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)))
    return model.train(), Architecture.from_hf_config(config.to_dict())


def _batch(tokens: int, vocab: int):
    from tests.models.batches import make_batch

    return make_batch([tokens // 4, tokens // 2, tokens - tokens // 4 - tokens // 2], vocab=vocab)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_saved_activations_are_what_autograd_saves(model_type: str) -> None:
    import torch

    from sao.models.forward import token_logprobs

    model, arch = _tiny(model_type, "bfloat16")
    batch = _batch(1024, 512)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.nbytes():
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        token_logprobs(model, batch, with_entropy=True)
    kept, _ = activation_bytes_per_token(arch, "bfloat16", checkpointing=False)
    assert sum(saved.values()) == pytest.approx(batch.num_tokens * kept, rel=0.01)


def _backward_peak(model, batch) -> int:
    """Peak bytes allocated above the start during a training forward and backward (CPU profiler trace)."""
    from torch.profiler import ProfilerActivity, profile

    from sao.models.forward import token_logprobs

    def step() -> None:
        logprobs, entropy = token_logprobs(model, batch, with_entropy=True)
        (logprobs.sum() + entropy.sum()).backward()

    step()  # the gradients exist before the measured step, as from the second micro-batch on
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    memory_events = [e for e in prof.events() if e.self_cpu_memory_usage]
    # Only the step's own thread: another thread of the test process (an engine loop, a server left by an
    # earlier test) allocating or freeing inside the window would move the count.
    (step_thread, _), *_ = Counter(e.thread for e in memory_events).most_common(1)
    events = sorted(
        (e.time_range.start, e.self_cpu_memory_usage) for e in memory_events if e.thread == step_thread
    )
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


def _prepared(model_type: str, compute: str, master: str, checkpointing: bool, vocab: int = 512):
    """A tiny model in ``master`` computing in ``compute`` (`cast_for_compute`), checkpointed or not, as the
    one-process trainer prepares it."""
    import torch

    from sao.models.precision import cast_for_compute
    from sao.models.prepare import enable_checkpointing

    model, arch = _tiny(model_type, master, vocab)
    model.eval()  # as sao trains: dropout off
    if compute != master:
        cast_for_compute(model, getattr(torch, compute))
    if checkpointing:
        enable_checkpointing(model)
    return model, arch


def _predicted(arch: Architecture, tokens: int, compute: str, master: str, checkpointing: bool) -> int:
    m = trainer_memory(arch, tokens, compute=compute, master=master, checkpointing=checkpointing)
    return m.gathered + m.activations_kept + max(m.activations_working, m.lm_head_chunk)


@pytest.mark.parametrize("master", ["bfloat16", "float32"], ids=["pure-bf16", "fp32-master"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_backward_peak_matches_the_activation_model(
    model_type: str, checkpointing: bool, master: str
) -> None:
    model, arch = _prepared(model_type, "bfloat16", master, checkpointing)
    predicted = _predicted(arch, 4096, "bfloat16", master, checkpointing)
    assert _backward_peak(model, _batch(4096, 512)) == pytest.approx(predicted, rel=0.15)


@pytest.mark.parametrize("master", ["bfloat16", "float32"], ids=["pure-bf16", "fp32-master"])
def test_lm_head_chunk_matches_the_profiler_for_a_large_vocabulary(master: str) -> None:
    model, arch = _prepared("qwen3", "bfloat16", master, checkpointing=True, vocab=16_384)
    memory = trainer_memory(arch, 1024, compute="bfloat16", master=master, checkpointing=True)
    assert (
        memory.lm_head_chunk > 4 * memory.activations_working
    )  # the logits dominate: the test is about them
    predicted = _predicted(arch, 1024, "bfloat16", master, checkpointing=True)
    assert _backward_peak(model, _batch(1024, 16_384)) == pytest.approx(predicted, rel=0.15)
