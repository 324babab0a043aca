"""Qwen3-MoE expert weights: transformers 5.x fused in-memory layout <-> per-expert checkpoint layout.

In memory (transformers 5.x ``Qwen3MoeExperts``), per MoE layer with E experts, width I, hidden H::

    {prefix}.gate_up_proj   (E, 2I, H)   rows [0, I) = gate_proj, rows [I, 2I) = up_proj
    {prefix}.down_proj      (E, H, I)

On disk, and in what vLLM / SGLang load, one tensor per expert (``nn.Linear`` orientation, out x in)::

    {prefix}.{e}.gate_proj.weight   (I, H)
    {prefix}.{e}.up_proj.weight     (I, H)
    {prefix}.{e}.down_proj.weight   (H, I)

where ``prefix`` ends in ``.mlp.experts``. Expert e computes ``down @ (silu(gate @ x) * (up @ x))``. Every
other tensor (attention, router ``mlp.gate.weight``, norms, embeddings, dense MLPs) has the same name and
shape in both layouts, so a dense model passes through unchanged.

`save_unfused` writes a state dict as an HF directory in the checkpoint layout whatever the model object
is. transformers' ``save_pretrained`` unfuses only the models it recognises: one loaded by
``from_pretrained`` (which records the conversions it applied), or one whose class is its own. An FSDP2
model is neither when built by ``from_config`` (`load_sharded_policy`): ``fully_shard`` swaps its class
for ``FSDPQwen3MoeForCausalLM``, defined outside transformers and so taken for custom code, and
``save_pretrained`` then wrote the fused in-memory tensors, which `load_sharded_policy` cannot read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import torch
from torch import Tensor, nn

__all__ = ["checkpoint_names", "fuse_experts", "save_unfused", "unfuse_experts"]

_FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
_PER_EXPERT = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<kind>gate_proj|up_proj|down_proj)\.weight$"
)


def unfuse_experts(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """In-memory names -> checkpoint names: split each fused expert tensor into one tensor per expert.

    The per-expert tensors are contiguous *views* of the fused ones (no copy); ``.clone()`` them before
    writing with safetensors, which rejects tensors sharing storage. Other entries are passed through as they
    are. Order: each fused tensor's experts take its place, in expert order.
    """
    out: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        match = _FUSED.match(name)
        if match is None:
            out[name] = tensor
            continue
        prefix = match["prefix"]
        if tensor.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D fused expert tensor, got shape {tuple(tensor.shape)}")
        if match["kind"] == "down_proj":
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.down_proj.weight"] = tensor[e]
            continue
        if tensor.shape[1] % 2:
            raise ValueError(
                f"{name}: gate_up_proj needs an even dim 1 (2 x width), got {tuple(tensor.shape)}"
            )
        width = tensor.shape[1] // 2
        for e in range(tensor.shape[0]):
            out[f"{prefix}.{e}.gate_proj.weight"] = tensor[e, :width]
            out[f"{prefix}.{e}.up_proj.weight"] = tensor[e, width:]
    return out


def fuse_experts(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Checkpoint names -> in-memory names: the inverse of `unfuse_experts` (new tensors, inputs untouched).

    Per-expert tensors of one ``prefix`` are stacked into ``gate_up_proj`` and ``down_proj``, placed where
    the prefix's first expert tensor was. Raises ValueError naming the first missing tensor if the experts
    of a prefix are not numbered 0..E-1 with all three projections each.
    """
    groups: dict[str, dict[tuple[str, int], Tensor]] = {}
    order: list[tuple[str, str | None]] = []  # (name, None) = pass-through, (prefix, "experts") = fused group
    for name, tensor in state_dict.items():
        match = _PER_EXPERT.match(name)
        if match is None:
            order.append((name, None))
            continue
        prefix = match["prefix"]
        if prefix not in groups:
            groups[prefix] = {}
            order.append((prefix, "experts"))
        groups[prefix][(match["kind"], int(match["expert"]))] = tensor

    out: dict[str, Tensor] = {}
    for name, kind in order:
        if kind is None:
            out[name] = state_dict[name]
            continue
        experts = groups[name]
        num_experts = 1 + max(e for _, e in experts)
        per_kind: dict[str, list[Tensor]] = {}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            for e in range(num_experts):
                if (proj, e) not in experts:
                    raise ValueError(f"cannot fuse experts: {name}.{e}.{proj}.weight is missing")
            per_kind[proj] = [experts[(proj, e)] for e in range(num_experts)]
        gate, up = torch.stack(per_kind["gate_proj"]), torch.stack(per_kind["up_proj"])
        out[f"{name}.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[f"{name}.down_proj"] = torch.stack(per_kind["down_proj"])
    return out


def checkpoint_names(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor ``model.save_pretrained`` writes: the persistent state with experts
    unfused and tied duplicates dropped (the first name of a shared parameter is kept, as HF does)."""
    kept = dict(model.named_parameters())  # shared (tied) parameters appear once, under their first name
    all_params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    state = {name: t for name, t in model.state_dict().items() if name in kept or name not in all_params}
    return {name: tuple(t.shape) for name, t in unfuse_experts(state).items()}


def save_unfused(model: nn.Module, path: str | os.PathLike[str], state_dict: dict[str, Tensor]) -> None:
    """``model.save_pretrained(path, state_dict=...)`` (config, generation config, safetensors) with the
    experts one tensor per expert (`unfuse_experts`), whatever ``model``'s class (module docstring): the
    layout of ``save_pretrained`` of the plain model, which ``from_pretrained``, `load_policy` and
    `load_sharded_policy` read. ``state_dict``: full tensors under the model's names; it is emptied as
    it is written (each fused tensor is dropped once copied per expert: where the caller holds no other
    reference, the peak is the state plus one fused tensor)."""
    tensors: dict[str, Tensor] = {}
    for name in list(state_dict):
        tensor = state_dict.pop(name)
        for key, part in unfuse_experts({name: tensor}).items():
            tensors[key] = part if part is tensor else part.clone()  # safetensors refuses shared storage
    model.save_pretrained(path, state_dict=tensors, save_original_format=False)  # type: ignore[operator]
