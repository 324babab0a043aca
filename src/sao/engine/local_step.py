"""The tensor work of one local-engine step: pack the running requests, one forward, one sample per request.

Packing (see `kv_cache` for the attention it feeds): the prefill segments of requests whose KV is behind
(newly admitted, or re-prefilled after a weight update) come first, each ``tokens[cached:-1]`` at positions
``cached ..``; then one decode token per running request, in slot order, its pending ``tokens[-1]`` at
position ``len(tokens) - 1``. The backbone runs once on the ``(1, T)`` row; the LM head runs on the decode
rows only, giving ``(B, V)`` fp32 logits, sampled with each request's parameters and one uniform drawn from
that request's own generator.

Owns: the step's tensors. Does not own: which requests run, their bookkeeping, threads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from sao.engine.kv_cache import PrefillSegment, SlotKVCache, StepPlan
from sao.engine.lean_forward import LeanForward
from sao.engine.local_request import Request
from sao.engine.sampling import sample
from sao.models.forward import lm_parts

__all__ = ["StepResult", "StepRunner"]


class StepResult(NamedTuple):
    tokens: list[int]  # one per running request, in slot order
    logprobs: list[float]
    prefill_tokens: int


class StepRunner:
    """Runs steps of ``model`` (switched to ``sao_engine`` attention) over ``cache``, on ``device``.

    ``lean``: run the backbone with `LeanForward` when it covers the model (same math, less per-call
    overhead); otherwise, or with ``lean=False``, the HF modules."""

    def __init__(self, model: nn.Module, cache: SlotKVCache, device: torch.device, lean: bool = True) -> None:
        self.backbone, self.head = lm_parts(model)
        self.lean = LeanForward.for_model(model) if lean else None
        self.cache = cache
        self.device = device

    def __call__(self, running: list[Request]) -> StepResult:
        """One forward over ``running`` (slot order) and one sampled token per request."""
        segments, ids, positions = [], [], []
        for request in running:
            todo = len(request.tokens) - 1 - request.cached
            if todo > 0:
                segments.append(PrefillSegment(request.slot, request.cached, todo))
                ids += request.tokens[request.cached : -1]
                positions += range(request.cached, len(request.tokens) - 1)
        decode_positions = [len(r.tokens) - 1 for r in running]
        ids += [r.tokens[-1] for r in running]
        positions += decode_positions
        plan = StepPlan.build(self.cache, segments, decode_positions, self.device)
        logits = self.forward(plan, ids, positions, len(running))
        params = [r.params for r in running]
        uniforms = [
            torch.rand((), generator=r.generator, dtype=torch.float64).item() if p.temperature > 0 else 0.0
            for r, p in zip(running, params, strict=True)
        ]
        tokens, logprobs = sample(
            logits,
            torch.tensor([p.temperature for p in params], device=self.device),
            torch.tensor([p.top_k for p in params], device=self.device),
            torch.tensor([p.top_p for p in params], device=self.device),
            torch.tensor(uniforms, dtype=torch.float64),
        )
        return StepResult(tokens.tolist(), logprobs.tolist(), plan.prefill_tokens)

    def forward(self, plan: StepPlan, ids: list[int], positions: list[int], num_decode: int) -> Tensor:
        """``(num_decode, V)`` fp32 logits of the decode rows of the packed step."""
        input_ids = torch.tensor(ids, device=self.device)[None]
        position_ids = torch.tensor(positions, device=self.device)[None]
        with plan.active():
            if self.lean is not None:
                hidden = self.lean(input_ids, position_ids)
            else:
                hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        return self.head(hidden.last_hidden_state[0, -num_decode:]).float()
