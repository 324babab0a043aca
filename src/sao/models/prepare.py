"""What the trainer does to a loaded model before training it: the attention kernel and activation
checkpointing (``model.attn_implementation``, ``model.gradient_checkpointing``).

`prepare_for_training` is the ``prepare`` callback of the sharded loaders (`sao.models.sharded_loading`, run
on the meta-device model before sharding) and what the one-process runtime applies after loading; it
touches no weight, so it runs before or after the weights exist and before or after `fully_shard`.

Activation checkpointing is per decoder layer: in a forward with gradients enabled, each layer keeps only
its inputs and recomputes its inside during backward (`torch.utils.checkpoint`, non-reentrant), so a
micro-batch holds one layer's activations plus every layer's input instead of every layer's activations.
transformers' own switch (``gradient_checkpointing_enable``) is not used: it checkpoints only when the
module is in training mode, and sao keeps its models in eval mode (dropout off, so the trainer's log-probs
are the engine's), so it would silently do nothing. Here the layer's ``forward`` is wrapped on the instance:
transformers' ``use_cache``/training checks never see it, hooks registered on the layer (FSDP2's unshard
and reshard) stay outside the checkpointed region as with torch's ``checkpoint_wrapper``, and parameter names
and the state dict are unchanged. No-grad forwards (old log-probs, values, generation) run as before. The
pack reaches a recomputed layer through the ``cu_seq_lens_*`` keywords it was called with
(`sao.models.attention.packed_attention_kwargs`).

Owns: the kernel switch and the checkpointing wrapper. Does not own: dtypes (`sao.models.precision`),
loading, sharding.
"""

from __future__ import annotations

import types
from typing import Any, Protocol, TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from sao.models.attention import enable_packed_attention
from sao.models.loading import resolve_device
from sao.models.precision import Precision

__all__ = [
    "ComputeSettings",
    "checkpointing_enabled",
    "disable_checkpointing",
    "enable_checkpointing",
    "prepare_for_training",
    "wants_checkpointing",
]

M = TypeVar("M", bound=nn.Module)


class ComputeSettings(Protocol):
    """What `prepare_for_training` reads (`sao.runtime.args.ComputeArgs` has it)."""

    @property
    def dtype(self) -> str: ...
    @property
    def master_dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def attn_implementation(self) -> str: ...
    @property
    def gradient_checkpointing(self) -> bool | None: ...


def _hf_model(model: nn.Module) -> nn.Module:
    """The HF model of a `CriticModel` (its ``.model``), else ``model``."""
    from sao.models.critic import CriticModel

    return model.model if isinstance(model, CriticModel) else model


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = _hf_model(model)
    layers = getattr(getattr(inner, "base_model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(inner).__name__} has no decoder layers (base_model.layers, a ModuleList)")
    return layers


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A decoder layer's forward, recomputed in backward when gradients are on."""
    forward = type(self).forward
    if torch.is_grad_enabled():
        return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)
    return forward(self, *args, **kwargs)


def _is_checkpointed(layer: nn.Module) -> bool:
    bound = layer.__dict__.get("forward")
    return isinstance(bound, types.MethodType) and bound.__func__ is _checkpointed_forward


def enable_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing on every decoder layer of ``model`` (an HF causal LM or token-classification
    model, or a `CriticModel`), in place, in train and eval mode alike (module docstring). Idempotent.
    Raises TypeError for a model without ``base_model.layers``."""
    for layer in _decoder_layers(model):
        if not _is_checkpointed(layer):
            # bound to the layer itself: a deep copy of the model rebinds it to the copy
            layer.forward = types.MethodType(_checkpointed_forward, layer)


def disable_checkpointing(model: nn.Module) -> None:
    """Undo `enable_checkpointing` (a no-op where it is off)."""
    for layer in _decoder_layers(model):
        if _is_checkpointed(layer):
            del layer.forward


def checkpointing_enabled(model: nn.Module) -> bool:
    """Whether every decoder layer of ``model`` is checkpointed."""
    return all(_is_checkpointed(layer) for layer in _decoder_layers(model))


def wants_checkpointing(compute: ComputeSettings) -> bool:
    """``compute.gradient_checkpointing``, or for None whether the trainer's device resolves to CUDA."""
    if compute.gradient_checkpointing is not None:
        return compute.gradient_checkpointing
    return resolve_device(compute.device).type == "cuda"


def _check_flash(compute: ComputeSettings) -> None:
    device = resolve_device(compute.device)
    precision = Precision.resolve(compute.dtype, compute.master_dtype, device)
    if device.type != "cuda" or precision.compute not in (torch.bfloat16, torch.float16):
        raise ValueError(
            "model.attn_implementation='flash_attention_2' runs on CUDA in bfloat16 or float16; this trainer "
            f"computes in {str(precision.compute).removeprefix('torch.')} on {device.type} "
            "(set model.dtype=bfloat16 on a GPU, or model.attn_implementation='sdpa')"
        )


def prepare_for_training(model: M, compute: ComputeSettings) -> M:
    """Apply ``compute``'s attention kernel (`enable_packed_attention`) and activation checkpointing
    (`wants_checkpointing`) to ``model`` (an HF model, or a `CriticModel`: its ``.model``) in place; returns
    ``model``. Raises ValueError for flash_attention_2 off CUDA or outside bf16/fp16, ImportError without
    flash_attn."""
    inner = _hf_model(model)
    if compute.attn_implementation == "flash_attention_2":
        _check_flash(compute)
    enable_packed_attention(inner, compute.attn_implementation)  # type: ignore[arg-type]
    if wants_checkpointing(compute):
        enable_checkpointing(inner)
    return model
