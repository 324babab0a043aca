"""`LeanForward`: the engine step's lean backbone equals the HF modules' forward (prefill + decode, both tiny
architectures, after an in-place weight update), and models it does not cover fall back to HF."""

from __future__ import annotations

import pytest
import torch

from sao.engine.kv_cache import ENGINE_ATTENTION, PrefillSegment, SlotKVCache, StepPlan
from sao.engine.lean_forward import LeanForward
from sao.engine.local_step import StepRunner
from sao.models.tiny import build_tiny_model


def _steps(runner: StepRunner, prompts: list[list[int]], extra: list[list[int]]) -> list[torch.Tensor]:
    """Step 1: prefill every prompt (all but its last token) and decode its last token; then one decode
    step per column of ``extra`` (the next token of each sequence). The decode logits of every step."""
    cache, device = runner.cache, runner.device
    segments, ids, positions = [], [], []
    for slot, p in enumerate(prompts):
        segments.append(PrefillSegment(slot, 0, len(p) - 1))
        ids += p[:-1]
        positions += range(len(p) - 1)
    decode = [len(p) - 1 for p in prompts]
    ids += [p[-1] for p in prompts]
    positions += decode
    out = [runner.forward(StepPlan.build(cache, segments, decode, device), ids, positions, len(prompts))]
    for column in zip(*extra, strict=True):
        decode = [d + 1 for d in decode]
        plan = StepPlan.build(cache, [], decode, device)
        out.append(runner.forward(plan, list(column), decode, len(prompts)))
    return out


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3"])
def test_the_lean_step_equals_the_hf_modules_step_and_follows_in_place_updates(arch):
    torch.manual_seed(0)
    model = build_tiny_model(arch, "test", seed=0).eval()
    model.set_attn_implementation(ENGINE_ATTENTION)
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (5, 11, 2)]
    extra = [torch.randint(0, 256, (3,)).tolist() for _ in prompts]
    lean = StepRunner(model, SlotKVCache(4, 64), torch.device("cpu"), lean=True)
    hf = StepRunner(model, SlotKVCache(4, 64), torch.device("cpu"), lean=False)
    assert isinstance(lean.lean, LeanForward) and hf.lean is None
    with torch.no_grad():
        for got, want in zip(_steps(lean, prompts, extra), _steps(hf, prompts, extra), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        # An in-place update (what `apply_state_dict` does) reaches the lean path at its next step.
        new = build_tiny_model(arch, "test", seed=1).state_dict()
        for name, p in model.named_parameters():
            p.copy_(new[name])
        lean.cache.clear()
        hf.cache.clear()
        for got, want in zip(_steps(lean, prompts, extra), _steps(hf, prompts, extra), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_models_it_does_not_cover_use_the_hf_modules():
    model = build_tiny_model("qwen3", "test", seed=0)
    model.config.attention_bias = True  # a config the lean path does not implement
    assert LeanForward.for_model(model) is None
    model.config.attention_bias = False
    model.config.model_type = "llama"
    assert LeanForward.for_model(model) is None
    assert LeanForward.for_model(torch.nn.Linear(2, 2)) is None
