"""Local-engine weights: read a checkpoint directory, check a state dict against the model, copy it in.

Accepted names are the trainer's (transformers' in-memory ``state_dict`` names, MoE experts fused) or the
checkpoint's (one tensor per expert, as ``save_pretrained`` writes and vLLM loads): per-expert tensors are
fused first (`sao.models.fuse_experts`). A state dict may cover part of the model (the rest keeps its
weights); an unknown name or a shape mismatch is a ValueError raised before anything is copied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from sao.engine.types import WeightsLike
from sao.models.moe_names import fuse_experts

__all__ = ["apply_state_dict", "load_checkpoint_state", "prepare_state_dict"]


def load_checkpoint_state(path: str | Path) -> dict[str, Tensor]:
    """Every tensor of the HF checkpoint directory ``path`` (safetensors, sharded or not, or
    ``pytorch_model.bin``), on the CPU, in checkpoint names."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"weights directory {str(directory)!r} does not exist")
    if (directory / "model.safetensors").is_file():
        return load_file(directory / "model.safetensors", device="cpu")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(directory / shard, device="cpu"))
        return state
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(
        f"{str(directory)!r} holds no model.safetensors(.index.json) or pytorch_model.bin"
    )


def _targets(model: nn.Module) -> dict[str, Tensor]:
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(dict(model.named_buffers(remove_duplicate=False)))
    return named


def prepare_state_dict(model: nn.Module, weights: WeightsLike) -> dict[str, Tensor]:
    """``weights`` (a state dict or a checkpoint directory) as a state dict in ``model``'s in-memory names,
    checked against ``model``: raises ValueError naming the first unknown name or mismatched shape."""
    state = load_checkpoint_state(weights) if isinstance(weights, (str, Path)) else weights
    if not isinstance(state, Mapping):
        raise TypeError(
            f"weights must be a state dict or a checkpoint directory, got {type(weights).__name__}"
        )
    state = fuse_experts(state)
    if not state:
        raise ValueError("the weights hold no tensors")
    targets = _targets(model)
    for name, tensor in state.items():
        if name not in targets:
            raise ValueError(f"weights: {name!r} is not a parameter or buffer of {type(model).__name__}")
        if tuple(tensor.shape) != tuple(targets[name].shape):
            want = tuple(targets[name].shape)
            raise ValueError(f"weights: {name!r} has shape {tuple(tensor.shape)}, the model's is {want}")
    return state


@torch.no_grad()
def apply_state_dict(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Copy ``state`` (checked by `prepare_state_dict`) into ``model`` in place, casting to its dtype and
    device."""
    targets = _targets(model)
    for name, tensor in state.items():
        targets[name].copy_(tensor)
