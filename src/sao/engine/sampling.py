"""Next-token sampling for the local engine: pure tensor functions on ``(B, V)`` logits, one row per request.

The distribution a non-greedy row samples from is, in this order (vLLM's and HF's order):

1. temperature: ``logits / T``;
2. top-k: keep the tokens whose tempered logit is >= the k-th largest (ties at the k-th value are kept);
3. top-p (nucleus): of the top-k distribution renormalised, keep the smallest set of most likely tokens whose
   probability reaches ``p`` (a token is kept when the mass of the tokens ranked above it is < p, so the
   most likely token always survives);
4. renormalise: ``log_softmax`` over the kept tokens, ``-inf`` elsewhere.

**Recorded log-prob** = the log-probability of the sampled token under that final distribution. At
temperature 1 with top-k and top-p off it is ``log_softmax(logits)[token]``, the trainer's teacher-forced
log-prob (`sao.models.forward.token_logprobs`), which makes the DIS ratio exactly 1 on-policy (invariant
3 of docs/concepts.md). A greedy row (temperature 0) takes the argmax (the first one on ties) and records
its log-prob under the untempered, unfiltered distribution (the contract of `SamplingParams`).

Randomness comes in as one uniform per row, drawn by the caller from that request's own generator, and a
row is sampled by inverting its CDF: a request's tokens depend on its own logits and seed only, never on the
other rows of the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sample", "sampling_logprobs"]


def _filtering_rows(top_k: Tensor, top_p: Tensor, vocab: int) -> Tensor:
    """``(B,)`` bool: the rows whose top-k or top-p removes anything."""
    return ((top_k > 0) & (top_k < vocab)) | (top_p < 1)


def _sorted_filtered(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> tuple[Tensor, Tensor]:
    """``scaled (B, V)`` tempered logits → ``(logprobs, order)``: the renormalised top-k/top-p log-probs in
    descending-logit order (``-inf`` for dropped tokens) and the token id at each sorted position, both
    ``(B, V)``."""
    vocab = scaled.shape[-1]
    ordered, order = scaled.sort(dim=-1, descending=True, stable=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kth = ordered.gather(-1, (k - 1)[:, None])  # (B, 1): the k-th largest value
    keep = ordered >= kth
    probs = torch.softmax(ordered.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = probs.cumsum(-1) - probs
    keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1)
    keep[:, 0] = True  # guards against fp round-off in the cumulative sum
    return torch.log_softmax(ordered.masked_fill(~keep, float("-inf")), dim=-1), order


def sampling_logprobs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Log-probs ``(B, V)`` fp32 of the distribution each row samples from (``-inf`` for filtered tokens).

    ``logits (B, V)``; ``temperature (B,)`` float (0 = greedy: the untempered ``log_softmax``, no filters);
    ``top_k (B,)`` long (``-1`` or ``>= V`` = off); ``top_p (B,)`` float in (0, 1] (1 = off). Each row is
    computed from its own values only (a row without filters is a plain ``log_softmax`` whatever the other
    rows ask for). Inputs are not modified.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None].float()
    out = torch.log_softmax(scaled, dim=-1)
    filtering = _filtering_rows(top_k, top_p, logits.shape[-1]) & ~greedy
    if bool(filtering.any()):
        sorted_logprobs, order = _sorted_filtered(scaled[filtering], top_k[filtering], top_p[filtering])
        out[filtering] = torch.empty_like(sorted_logprobs).scatter_(-1, order, sorted_logprobs)
    if bool(greedy.any()):
        out[greedy] = torch.log_softmax(logits[greedy], dim=-1)
    return out


def sample(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniforms: Tensor
) -> tuple[Tensor, Tensor]:
    """Sample one token per row. Returns ``(tokens (B,) long, logprobs (B,) fp32)``.

    Arguments as in `sampling_logprobs`, plus ``uniforms (B,)`` in [0, 1), one per row from that request's
    generator (ignored for greedy rows). A row picks the first token, in vocabulary order, whose cumulative
    probability exceeds ``u`` (vocabulary order for every row, filtered or not, so that a row's token never
    depends on the other rows); tokens of probability 0 are never picked. ``logprobs`` are the recorded
    log-probs described in the module docstring.
    """
    logits = logits.float()
    row_logprobs = sampling_logprobs(logits, temperature, top_k, top_p)
    cdf = row_logprobs.double().exp().cumsum(-1)  # (B, V); a dropped token adds exactly 0
    target = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    # right=True: a zero-probability token shares its cdf value with the token before it and is never hit;
    # the clamp to the last token of positive probability guards against round-off at u -> 1.
    last_positive = (cdf < cdf[:, -1:]).sum(-1, keepdim=True)
    index = torch.minimum(torch.searchsorted(cdf, target, right=True), last_positive)  # (B, 1)
    tokens = index.squeeze(-1)
    greedy = temperature <= 0
    if bool(greedy.any()):
        tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
    return tokens, row_logprobs.gather(-1, tokens[:, None]).squeeze(-1)
