"""A lean backbone forward for the engine step of Qwen3 / Qwen3-MoE models: the same math as the HF modules,
without their per-call machinery.

On small models the engine's step time is mostly fixed cost per operation, and HF's decoder adds its own on
top of the tensor ops: module dispatch (~47 module calls per step on the tiny MoE), output-capturing
wrappers, mask preprocessing, config attribute lookups. `LeanForward` runs the decoder as a plain loop of
tensor functions over the model's **own parameters** (read at every call, never copied: an in-place weight
update takes effect in the next step as it does for the HF path), with

- RMSNorm as one fused ``F.rms_norm`` (fp32 inside, as HF computes it);
- the HF rotary-embedding module for cos/sin (so every RoPE type the config names is honoured);
- attention through the engine's own ``sao_engine`` attention function (`kv_cache`), exactly as the HF
  path calls it;
- the MoE block as HF's router math (softmax in fp32, top-k, renormalised when ``norm_topk_prob``) and the
  model's experts module (whatever experts implementation it is set to).

Results equal the HF forward's up to float summation order (tested at 1e-5 on the logits).
`LeanForward.for_model` returns None for any model or config it does not cover (other architectures,
attention biases, sliding windows, layer types other than full attention); the engine then uses the HF
forward.

Owns: the decoder math of the covered architectures. Does not own: the KV cache, packing, sampling.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from sao.engine.kv_cache import ENGINE_ATTENTION

__all__ = ["LeanForward"]

_COVERED = {"qwen3", "qwen3_moe"}


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanForward:
    """``(input_ids (1, T), position_ids (1, T)) -> last hidden state (1, T, H)`` of a covered model's
    backbone, inside an active `StepPlan` (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        backbone = model.model
        cfg = model.config
        self.embed = backbone.embed_tokens
        self.norm = backbone.norm
        self.rotary = backbone.rotary_emb
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.layers = [self._layer(i, layer) for i, layer in enumerate(backbone.layers)]
        self.attention = ALL_ATTENTION_FUNCTIONS[ENGINE_ATTENTION]  # registered by kv_cache

    @classmethod
    def for_model(cls, model: nn.Module) -> LeanForward | None:
        """A `LeanForward` when ``model`` is covered, else None."""
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in _COVERED or not hasattr(model, "model"):
            return None
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "use_sliding_window", False):
            return None
        if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
            return None
        try:
            return cls(model)
        except (AttributeError, TypeError):
            return None

    def _layer(self, index: int, layer: nn.Module) -> SimpleNamespace:
        attn, mlp = layer.self_attn, layer.mlp
        if getattr(attn, "layer_idx", None) != index:
            raise TypeError("attention layer_idx does not match its position")
        moe = hasattr(mlp, "experts") and hasattr(mlp, "gate")
        if not moe and not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            raise TypeError(f"unknown MLP {type(mlp).__name__}")
        return SimpleNamespace(
            attn=attn,
            in_norm=layer.input_layernorm,
            post_norm=layer.post_attention_layernorm,
            mlp=mlp,
            moe=moe,
            act=getattr(mlp, "act_fn", None),
        )

    def _rms(self, x: Tensor, norm: nn.Module) -> Tensor:
        eps = getattr(norm, "variance_epsilon", self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype) * norm.weight

    def _attention(self, layer: SimpleNamespace, h: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        attn = layer.attn
        T = h.shape[0]
        q = self._rms(F.linear(h, attn.q_proj.weight).view(T, -1, self.head_dim), attn.q_norm)
        k = self._rms(F.linear(h, attn.k_proj.weight).view(T, -1, self.head_dim), attn.k_norm)
        v = F.linear(h, attn.v_proj.weight).view(T, -1, self.head_dim)
        q = q * cos + _rotate_half(q) * sin  # (T, H, D), cos/sin (T, 1, D)
        k = k * cos + _rotate_half(k) * sin
        out, _ = self.attention(
            attn,
            q.transpose(0, 1)[None],  # (1, H, T, D)
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            None,
            scaling=attn.scaling,
        )
        return F.linear(out.reshape(T, -1), attn.o_proj.weight)

    def _mlp(self, layer: SimpleNamespace, h: Tensor) -> Tensor:
        mlp = layer.mlp
        if not layer.moe:
            return F.linear(layer.act(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                            mlp.down_proj.weight)  # fmt: skip
        gate = mlp.gate
        probs = torch.softmax(F.linear(h, gate.weight), dim=-1, dtype=torch.float)
        top, index = torch.topk(probs, gate.top_k, dim=-1)
        if gate.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return mlp.experts(h, index, top.to(h.dtype))

    def __call__(self, input_ids: Tensor, position_ids: Tensor) -> Any:
        h = self.embed(input_ids)[0]  # (T, H)
        cos, sin = self.rotary(h[None], position_ids)  # (1, T, D)
        cos, sin = cos[0, :, None].to(h.dtype), sin[0, :, None].to(h.dtype)
        for layer in self.layers:
            h = h + self._attention(layer, self._rms(h, layer.in_norm), cos, sin)
            h = h + self._mlp(layer, self._rms(h, layer.post_norm))
        return SimpleNamespace(last_hidden_state=self._rms(h, self.norm)[None])
