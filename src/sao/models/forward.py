"""Teacher-forced forwards on a packed `Batch`: per-token log-probs and entropies (policy), values (critic).

Alignment (the RL trainer depends on it): every output is ``(T,)`` and aligned with the token it describes,
exactly like ``batch.action_mask`` and ``batch.rollout_logprobs``:

- ``logprobs[t] = log π(token_t | tokens before t in the same trajectory)``, at the sampling temperature.
- ``entropy[t]`` is the entropy of that same next-token distribution (the one token t was drawn from).
- ``values[t] = V(s_t)``, the value of the state in which token t is generated, i.e. the critic's output at
  position t - 1 of the same trajectory (its hidden state has read tokens 0 … t - 1).

The first token of a trajectory has no prefix: its log-prob, entropy and value are defined as 0. It is always
a prompt token (an action token there raises ValueError), so the convention never reaches a loss. The
critic's output at the last token of a trajectory (the state after the episode) is not used.

The backbone runs once per micro-batch on ``input_ids (1, T)`` with ``position_ids`` restarting at 0 per
trajectory, under `packed_context` (attention never crosses trajectories). The LM head is applied in chunks
of ``chunk_tokens`` rows under `torch.utils.checkpoint`, so neither forward nor backward holds ``(T, V)``
logits. Gradients flow when called with grad enabled.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sao.models.attention import packed_attention_kwargs, packed_context
from sao.types import Batch

__all__ = ["lm_parts", "stochastic_forward", "token_logprobs", "token_values"]


_NOISE_KEYS = ("dropout", "jitter")  # config entries that make a training-mode forward random (> 0: on)


def stochastic_forward(model: nn.Module) -> bool:
    """Whether two forwards of ``model`` on the same input may differ: it is in training mode and has an
    active dropout module or a config entry naming dropout or router jitter that is above 0 (HF models
    apply ``attention_dropout`` functionally, only while training)."""
    if not model.training:
        return False
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 and m.training for m in model.modules()):
        return True
    configs = [getattr(m, "config", None) for m in model.modules()]
    for config in {id(c): c for c in configs if c is not None}.values():
        for key, value in vars(config).items():
            if any(n in key for n in _NOISE_KEYS) and isinstance(value, int | float) and value > 0:
                return True
    return False


def _check_prefixes(batch: Batch) -> None:
    first = batch.position_ids == 0
    if bool((batch.action_mask & first).any()):
        seq = int(batch.seq_ids[(batch.action_mask & first).nonzero()[0, 0]])
        raise ValueError(
            f"batch index {seq} (traj_id={batch.traj_ids[seq]}): action_mask: the first token is an action "
            "token, which has no prefix to condition on"
        )


def _micro_batches(batch: Batch, micro_batch_tokens: int | None) -> list[Batch]:
    return [batch] if micro_batch_tokens is None else batch.split(micro_batch_tokens)


def _backbone_hidden(backbone: nn.Module, batch: Batch) -> Tensor:
    """``(T, H)`` final hidden states of the packed batch."""
    with packed_context(batch.cu_seqlens):
        out = backbone(
            input_ids=batch.token_ids[None],
            position_ids=batch.position_ids[None],
            use_cache=False,  # with a cache, transformers would silently stop treating the row as packed
            **packed_attention_kwargs(batch.cu_seqlens, batch.max_seqlen),
        )
    return out.last_hidden_state[0]


def _shift_sources(batch: Batch) -> tuple[Tensor, Tensor]:
    """``(targets, sources)``, both ``(T - B,)`` long: the tokens with a prefix and the row before each."""
    targets = (batch.position_ids > 0).nonzero().squeeze(-1)
    return targets, targets - 1


def _scatter(values: Tensor, targets: Tensor, total: int) -> Tensor:
    """``(T,)``: ``values`` at ``targets``, 0 elsewhere (differentiable)."""
    return values.new_zeros(total).index_copy(0, targets, values)


def _head_chunk(
    head: nn.Module, hidden: Tensor, next_ids: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    """``hidden (n, H)``, ``next_ids (n,)`` → fp32 ``(log p(next_ids), entropy)``, each ``(n,)``."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, next_ids[:, None]).squeeze(-1) - log_norm
    if not with_entropy:
        return logprobs, logprobs.new_zeros(())
    entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropy


def _chunked_head(
    head: nn.Module,
    hidden: Tensor,
    next_ids: Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor | None]:
    """The LM head and log-softmax over ``chunk_tokens`` rows at a time; each chunk is recomputed in backward
    instead of keeping its ``(chunk, V)`` logits."""
    logprobs, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        args = (head, hidden[start : start + chunk_tokens], next_ids[start : start + chunk_tokens])
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_head_chunk, *args, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args, temperature, with_entropy)
        logprobs.append(lp)
        entropies.append(ent)
    if not logprobs:  # every trajectory is a single token
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)


def lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(backbone, LM head), refusing models whose logits are transformed after the head (softcapping,
    logit scales): the trainer's log-probs and the engine's sampling both apply the head alone."""
    backbone = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or backbone is model or head is None:
        raise TypeError(f"{type(model).__name__} is not a causal LM with a backbone and an output head")
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(model.config, name, None) not in (None, 1, 1.0):
            raise NotImplementedError(f"{type(model).__name__} transforms its logits ({name}); not supported")
    return backbone, head


def token_logprobs(
    model: nn.Module,
    batch: Batch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
    micro_batch_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced log-probs of every packed token under ``model`` (an HF causal LM).

    Returns ``(logprobs, entropy)``, fp32 ``(T,)`` each (``entropy`` None unless ``with_entropy``), aligned to
    token t as described in the module docstring; 0 at each trajectory's first token. Logits are divided by
    ``temperature`` before the softmax, to match the engine's sampling distribution. ``micro_batch_tokens``
    runs the backbone on `Batch.split` micro-batches (whole trajectories, at most that many tokens each);
    the results are concatenated back in batch order.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    _check_prefixes(batch)
    backbone, head = lm_parts(model)
    logprobs, entropies = [], []
    for part in _micro_batches(batch, micro_batch_tokens):
        hidden = _backbone_hidden(backbone, part)
        targets, sources = _shift_sources(part)
        lp, ent = _chunked_head(
            head, hidden[sources], part.token_ids[targets], temperature, with_entropy, chunk_tokens
        )
        logprobs.append(_scatter(lp, targets, part.num_tokens))
        if ent is not None:
            entropies.append(_scatter(ent, targets, part.num_tokens))
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)


def token_values(critic: nn.Module, batch: Batch, micro_batch_tokens: int | None = None) -> Tensor:
    """Critic values V(s_t) for every packed token, ``(T,)`` in the critic's dtype, aligned to token t (the
    critic's output at position t - 1; 0 at each trajectory's first token). ``critic`` is a `CriticModel` or
    anything called as ``critic(input_ids (1, T), position_ids (1, T), **packed kwargs) -> (1, T)``."""
    _check_prefixes(batch)
    values = []
    for part in _micro_batches(batch, micro_batch_tokens):
        with packed_context(part.cu_seqlens):
            out = critic(
                part.token_ids[None],
                part.position_ids[None],
                **packed_attention_kwargs(part.cu_seqlens, part.max_seqlen),
            )[0]
        targets, sources = _shift_sources(part)
        values.append(_scatter(out[sources], targets, part.num_tokens))
    return torch.cat(values)
