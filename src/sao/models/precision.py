"""Mixed precision: master weights in one dtype, forward and backward in another (``model.master_dtype``,
``model.dtype``).

The trainer keeps its weights, their gradients, the gradient reduction and AdamW's state in the *master*
dtype (float32 by default) and runs forward and backward in the *compute* dtype (bfloat16 on GPU). At the
paper's lr 1e-6 an AdamW update (≈ lr per element) is far below bfloat16's spacing near a typical weight
(≈ 4e-5 at 0.01): pure bfloat16 weights round most updates away, float32 ones keep them.

- FSDP2 (`fsdp_policy`): float32 sharded parameters with ``MixedPrecisionPolicy(param_dtype=compute,
  reduce_dtype=float32)``: each unit's all-gather casts its parameters to the compute dtype, floating inputs
  of each unit are cast to it (``cast_forward_inputs``), gradients are reduce-scattered in float32 and land
  on the float32 shards.
- One process (`cast_for_compute`): the same arithmetic without FSDP. The model keeps its master-dtype
  ``nn.Parameter``s (state dict names and dtypes unchanged, the optimizer holds them); while a module runs,
  its own parameters are replaced by compute-dtype copies (``p.to(compute)``, differentiable, so gradients
  flow back and land in the master dtype on the originals), and the floating inputs of the modules FSDP
  wraps as units (decoder layers, backbone, value head, root) are cast as FSDP casts them. Buffers (rotary
  ``inv_freq``) keep their dtype, as under FSDP. So one process equals FSDP ranks with the same policy up to
  the order of the gradient sums, with one difference: a module called several times in one forward (the
  LM head's chunks) sums its per-call gradients in the master dtype here and in the compute dtype in an FSDP
  unit (within one micro-batch).

Memory of `cast_for_compute`: the compute copies live while autograd holds them (up to one compute-dtype
copy of the weights until backward; with activation checkpointing only the layer being recomputed).

Owns: the precision pair and how it is applied. Does not own: loading (`sao.models.loading`), sharding
(`sao.models.sharding`), the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from sao.models.loading import resolve_dtype

__all__ = ["ComputeCast", "Precision", "cast_for_compute", "compute_dtype_of", "fsdp_policy"]

_CAST_MARK = "_sao_compute_cast"


@dataclass(frozen=True)
class Precision:
    """``compute``: the dtype of forward and backward; ``master``: the weights', gradients' and optimizer
    state's."""

    compute: torch.dtype
    master: torch.dtype

    @classmethod
    def resolve(
        cls, dtype: str | torch.dtype = "auto", master_dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
    ) -> Precision:  # fmt: skip
        """From ``model.dtype`` (``auto``: bfloat16 on CUDA, float32 elsewhere; `resolve_dtype`) and
        ``model.master_dtype``. Raises ValueError for an unknown name or a float16 compute dtype (it needs
        loss scaling, which sao does not do)."""
        compute = resolve_dtype(dtype, device)
        if compute == torch.float16:
            raise ValueError(
                "model.dtype=float16: half-precision training needs loss scaling, which sao does not do; "
                "use bfloat16"
            )
        return cls(compute, resolve_dtype(master_dtype, device))

    @property
    def mixed(self) -> bool:
        """Whether compute and master dtypes differ."""
        return self.compute != self.master

    @property
    def reduce(self) -> torch.dtype:
        """The dtype gradients are summed in across micro-batches and ranks: the wider of the two."""
        return torch.promote_types(self.compute, self.master)


def fsdp_policy(precision: Precision) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for ``precision``: parameters gathered in the compute dtype, floating inputs cast to it,
    gradients reduced in `Precision.reduce`; None when compute and master dtypes are equal (FSDP then works in
    the parameters' dtype throughout)."""
    if not precision.mixed:
        return None
    return MixedPrecisionPolicy(
        param_dtype=precision.compute, reduce_dtype=precision.reduce, cast_forward_inputs=True
    )


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating tensor in it (through tuples, lists, dicts) cast to ``dtype``."""
    if isinstance(value, Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        items = [_cast_floating(v, dtype) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _cast_floating(v, dtype) for k, v in value.items()}
    return value


def _units(model: nn.Module) -> list[nn.Module]:
    """The modules `sao.models.sharding.shard_model` makes FSDP units (their inputs are cast): each decoder
    layer, the backbone, a critic's value head, the root."""
    from sao.models.critic import CriticModel

    inner = model.model if isinstance(model, CriticModel) else model
    backbone = getattr(inner, "base_model", None)
    units: list[nn.Module] = []
    if isinstance(backbone, nn.Module):
        layers = getattr(backbone, "layers", None)
        if isinstance(layers, nn.ModuleList):
            units.extend(layers)
        units.append(backbone)
    if isinstance(model, CriticModel):
        units.append(model.head)
    units.append(model)
    return units


class ComputeCast:
    """The hooks of `cast_for_compute` on one model; `remove` takes them off (the model is as before). One
    forward at a time per model (the swap is visible to every thread); apply it to a deep copy anew rather
    than copying a model that has it."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.model, self.dtype = model, dtype
        self._handles: list[RemovableHandle] = []
        self._stash: dict[int, list[dict[str, nn.Parameter]]] = {}  # per module: the originals it runs on

    def _swap_in(self, module: nn.Module, args: Any) -> None:
        originals = {}
        for name, param in module._parameters.items():
            if param is not None and param.is_floating_point() and param.dtype != self.dtype:
                originals[name] = param
                module._parameters[name] = param.to(self.dtype)  # type: ignore[assignment]
        self._stash.setdefault(id(module), []).append(originals)

    def _swap_out(self, module: nn.Module, args: Any, output: Any) -> None:
        stack = self._stash.get(id(module))
        if not stack:
            return
        module._parameters.update(stack.pop())
        if not stack:
            del self._stash[id(module)]

    def _cast_inputs(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _cast_floating(args, self.dtype), _cast_floating(kwargs, self.dtype)

    def attach(self) -> None:
        dtype = self.dtype
        for module in self.model.modules():
            owns = [p for p in module._parameters.values() if p is not None and p.is_floating_point()]
            if any(p.dtype != dtype for p in owns):
                self._handles.append(module.register_forward_pre_hook(self._swap_in))
                # always_call: an exception in forward must not leave compute copies in place of the weights
                self._handles.append(module.register_forward_hook(self._swap_out, always_call=True))
        for unit in _units(self.model):
            self._handles.append(unit.register_forward_pre_hook(self._cast_inputs, with_kwargs=True))
        setattr(self.model, _CAST_MARK, self)

    def remove(self) -> None:
        """Take the hooks off (call outside a forward)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if getattr(self.model, _CAST_MARK, None) is self:
            delattr(self.model, _CAST_MARK)


def cast_for_compute(model: nn.Module, compute_dtype: torch.dtype) -> ComputeCast:
    """Run ``model`` (an HF causal LM or a `CriticModel`, one process, not sharded) in ``compute_dtype``
    while it keeps its parameters in their own dtype, as FSDP2's ``MixedPrecisionPolicy(param_dtype=
    compute_dtype)`` does (module docstring). In place; returns the handle that removes it. A model whose
    parameters are all in ``compute_dtype`` gets input casts only (a no-op). Raises ValueError if
    ``model`` has it already or is FSDP-sharded."""
    if getattr(model, _CAST_MARK, None) is not None:
        raise ValueError(f"{type(model).__name__} already computes in {getattr(model, _CAST_MARK).dtype}")
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError(f"{type(model).__name__} is sharded: FSDP casts by its policy (fsdp_policy)")
    cast = ComputeCast(model, compute_dtype)
    cast.attach()
    return cast


def compute_dtype_of(model: nn.Module) -> torch.dtype | None:
    """The compute dtype `cast_for_compute` set on ``model``, None without it."""
    cast: ComputeCast | None = getattr(model, _CAST_MARK, None)
    return None if cast is None else cast.dtype
