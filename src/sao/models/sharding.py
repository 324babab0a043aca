"""FSDP2 sharding of sao's policy and critic (`fully_shard`), and gathering their full weights.

`shard_model` wraps each decoder layer, then the backbone, then the head, then the root. The two models
differ in how sao calls them:

- The critic is called as a whole (`CriticModel.forward`: backbone, then the value head inside the root's
  forward), so the value head is an FSDP unit of its own, like the layers.
- The policy is not: `sao.models.forward.token_logprobs` calls the backbone (`lm_parts`), then the LM head
  in chunks, each recomputed in backward (activation checkpointing), and the number of chunks differs
  between ranks (it follows the rank's tokens). An FSDP unit runs collectives in every forward and
  backward of its module, so a head of its own would all-gather and reduce-scatter once per chunk, a
  different number of times on each rank, and hang; the root is never called, so a root-only wrap never
  gathers the head at all. So the LM head's parameters join the backbone's unit instead (the backbone
  runs once per micro-batch on every rank), which stays gathered from the backbone's forward until the end
  of its backward (``reshard_after_forward=False``): the head's chunks, forward and recomputed, read the
  gathered weight with no collective of their own, and their gradients reach the one reduce-scatter of
  that unit. A head tied to the embedding (``config.tie_word_embeddings``) is the same parameter as
  ``embed_tokens.weight``, which that unit owns already: tied and untied heads take the same path. A
  sharded policy is therefore only called through `lm_parts` (backbone, then head), never as a whole.

Gradients are *summed* over the ranks, not averaged (FSDP's default): the sharded `sao.train.step.Trainer`
normalises each rank's loss by whole-batch counts, so the sum is the single-process gradient.
`set_gradient_reduction` switches to the mean (for every rank training on the same data; value
pretraining splits its batches instead and keeps the sum). Parameters that receive no gradient on some
rank get zeros there (FSDP's ``reduce_scatter_unused_params``) so that every rank reduce-scatters the
same tensors; one that no rank used then gets a zero gradient where one process has none (AdamW still
decays its moments). sao's models use every trainable parameter in every forward (MoE experts are fused
tensors), so this never arises there.

Mixed precision is FSDP's ``MixedPrecisionPolicy`` (`sao.models.precision.fsdp_policy`): the sharded
parameters stay in the master dtype, each unit gathers them in the compute dtype and reduce-scatters float32
gradients. The trainer reduces once per optimizer step, not per micro-batch (``set_requires_gradient_sync``
in `sao.train.step`); FSDP then accumulates the unsharded gradients in the policy's reduce dtype.

Owns: the wrapping and the gather. Does not own: the process group, optimizers, checkpoints on disk.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from sao.models.critic import CriticModel
from sao.models.forward import lm_parts

__all__ = ["full_state_dict", "set_gradient_reduction", "shard_model"]

_HEAD_SLOT = "_sao_lm_head"  # where the LM head sits inside the backbone while the backbone is wrapped


def _decoder_layers(backbone: nn.Module) -> nn.ModuleList:
    layers = getattr(backbone, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(backbone).__name__} has no decoder layers (a ModuleList named 'layers')")
    return layers


def shard_model(
    model: nn.Module,
    *,
    mesh: DeviceMesh | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Apply `fully_shard` in place to a policy (an HF causal LM) or a `CriticModel`; returns ``model``.

    Units: each decoder layer, the backbone (with the policy's LM head, module docstring), the critic's
    value head, the root. ``mesh``: the 1-D data-parallel mesh (default: all ranks of the default group,
    on CUDA if available, else the CPU). ``mp_policy``: FSDP's mixed precision (default: none, the
    parameters' dtype throughout; `sao.models.precision.fsdp_policy` gives sao's: bf16 compute, float32
    reduction on float32 parameters). ``reshard_after_forward`` applies to the layers and the critic's units
    (False keeps them gathered until backward: more memory, fewer all-gathers). Gradients are summed over
    the ranks (`set_gradient_reduction`). torch.distributed must be initialised; every rank calls this
    with the same model.
    """
    common = {"mesh": mesh, "mp_policy": mp_policy if mp_policy is not None else MixedPrecisionPolicy()}
    if isinstance(model, CriticModel):
        backbone, head = model.model.base_model, model.head
        for layer in _decoder_layers(backbone):
            fully_shard(layer, reshard_after_forward=reshard_after_forward, **common)
        fully_shard(backbone, reshard_after_forward=reshard_after_forward, **common)
        fully_shard(head, reshard_after_forward=reshard_after_forward, **common)
        fully_shard(model, **common)
    else:
        backbone, head = lm_parts(model)
        for layer in _decoder_layers(backbone):
            fully_shard(layer, reshard_after_forward=reshard_after_forward, **common)
        backbone.add_module(_HEAD_SLOT, head)  # so the backbone's unit owns the head's parameters
        try:
            fully_shard(backbone, reshard_after_forward=False, **common)
        finally:
            delattr(backbone, _HEAD_SLOT)  # the module tree (and every parameter name) as before
        fully_shard(model, ignored_params=set(head.parameters()), **common)
    set_gradient_reduction(model, "sum")
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_reduce_scatter_unused_params(True, recurse=False)
    return model


def set_gradient_reduction(model: nn.Module, reduce: Literal["sum", "mean"]) -> None:
    """Make the gradient reduction of every FSDP unit in ``model`` a sum or a mean over the ranks (plain
    sums on the wire, then a division for the mean: gloo has no pre-scaled sum)."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    sharded = next((p for p in model.parameters() if isinstance(p, DTensor)), None)
    if sharded is None:
        raise ValueError(f"{type(model).__name__} is not sharded (no DTensor parameters)")
    factor = 1.0 if reduce == "sum" else float(sharded.device_mesh.size())
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(factor)
            module.set_force_sum_reduction_for_comms(True)


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The full (unsharded) state dict of a sharded ``model`` as CPU tensors, under the plain model's
    names: on rank 0; the other ranks get an empty dict. A collective: every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
