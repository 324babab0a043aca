"""Loading a policy or a critic straight into FSDP2 shards: each rank reads only its rows of the checkpoint.

`load_policy` then `shard_model` materialises the whole model on every rank before sharding it (a 30B
model: ~121 GB per rank in float32). Here the model is built on the meta device (no memory), sharded
(`shard_model`), given storage for the rank's shards only (``to_empty``), and each local shard is filled
from the checkpoint with only the rows it holds (`sao.models.shard_reading`: the rows, the blocks, the
checkpoint layouts it accepts).

A new critic value head is drawn exactly as `load_critic` draws it (the same global-RNG draws), so both
paths give the same critic from the same seed.

Owns: building and filling sharded models. Does not own: the FSDP wrapping (`shard_model`), the process
group, the attention / checkpointing preparation (the ``prepare`` callback).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    GenerationConfig,
    PreTrainedModel,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from sao.models.attention import enable_packed_attention
from sao.models.critic import CriticModel
from sao.models.freezing import apply_freeze
from sao.models.loading import checkpoint_dir, resolve_device
from sao.models.shard_reading import CheckpointTensors, ReadPlan, fill_shards, local_rows, recompute_buffers
from sao.models.sharding import shard_model

__all__ = ["Prepare", "load_sharded_critic", "load_sharded_policy"]

# Run on the meta model before sharding (`sao.models.prepare.prepare_for_training`: kernel, checkpointing).
Prepare = Callable[[PreTrainedModel], object]

_POLICY_HEAD = "lm_head."  # a causal LM's output head: in a critic's source when that is a policy


def _materialise(
    root: nn.Module,
    model: PreTrainedModel,
    ckpt: CheckpointTensors,
    plan: ReadPlan,
    *,
    mesh: DeviceMesh | None,
    mp_policy: MixedPrecisionPolicy | None,
    device: torch.device,
) -> None:
    """Shard the meta ``root`` (``model`` itself, or the `CriticModel` around it), allocate the rank's
    shards on ``device``, fill ``model``'s (``plan``'s names) from ``ckpt``."""
    shard_model(root, mesh=mesh, mp_policy=mp_policy)
    root.to_empty(device=device)  # FSDP re-pads each local shard here: the rank's rows only
    fill_shards(model, ckpt, plan)
    recompute_buffers(model, plan.stale_buffers)


def _config(directory: Path, causal: bool):
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if causal and config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(
            f"{str(directory)!r} holds a {config.model_type!r} model, which is not a causal language model"
        )
    return config


def load_sharded_policy(
    path: str | os.PathLike[str],
    *,
    mesh: DeviceMesh | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    device: str | torch.device,
    master_dtype: torch.dtype = torch.float32,
    prepare: Prepare | None = None,
) -> PreTrainedModel:
    """The causal LM of checkpoint directory ``path``, FSDP2-sharded (`shard_model`) with ``mesh`` and
    ``mp_policy``, its parameters in ``master_dtype`` on ``device``, each rank holding and reading only its
    shards (module docstring). Packed attention (`enable_packed_attention`) is on; ``prepare(model)`` runs
    before sharding (checkpointing, attention kernel). In eval mode, like ``from_pretrained``.

    Equal (same weights, same buffers) to ``shard_model(load_policy(path, master_dtype, device))``. A
    collective: every rank calls it with the same arguments. Raises FileNotFoundError (no checkpoint, no
    safetensors weights) or ValueError (not a causal LM; tensors missing, unknown or of the wrong shape,
    named) before allocating anything.
    """
    directory = checkpoint_dir(path)
    target = resolve_device(device)
    config = _config(directory, causal=True)
    ckpt = CheckpointTensors(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=master_dtype)
    plan = ReadPlan(model, ckpt, optional=set(), extras_prefix=None)
    enable_packed_attention(model)
    if prepare is not None:
        prepare(model)
    if (directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    _materialise(model, model, ckpt, plan, mesh=mesh, mp_policy=mp_policy, device=target)
    return model.eval()


def load_sharded_critic(
    path: str | os.PathLike[str],
    *,
    mesh: DeviceMesh | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    device: str | torch.device,
    master_dtype: torch.dtype = torch.float32,
    head_init: Literal["zero", "normal"] = "zero",
    prepare: Prepare | None = None,
) -> CriticModel:
    """The critic of `load_critic` (token classification, one label, dropout 0, packed attention),
    FSDP2-sharded as `load_sharded_policy` loads a policy. ``path``: a policy checkpoint (its backbone;
    its LM head is ignored; a new value head, ``head_init`` as `load_critic`) or a saved critic (its head
    as saved). ``prepare(critic.model)`` runs before sharding. Every parameter trains
    (``freeze_report`` of ``freeze="none"``); a `Trainer` applies its own freezing rule.

    Equal to ``shard_model(load_critic(path, "none", master_dtype, device, head_init))`` under the same
    global RNG state (a ``"normal"`` head makes the same draws). A collective: every rank calls it with
    the same arguments and RNG state.
    """
    if head_init not in ("zero", "normal"):
        raise ValueError(f"head_init must be 'zero' or 'normal', got {head_init!r}")
    directory = checkpoint_dir(path)
    target = resolve_device(device)
    config = _config(directory, causal=False)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # GenericForTokenClassification reads it; no dropout on values
    ckpt = CheckpointTensors(directory)
    with torch.device("meta"):
        model = AutoModelForTokenClassification.from_config(config, dtype=master_dtype)
    critic = CriticModel(model)
    head = critic.head
    prefix = next(name for name, module in model.named_modules() if module is head) + "."
    head_names = {prefix + n for n, _ in head.named_parameters()}
    present = {n for n in head_names if n in ckpt}
    if present and present != head_names:
        raise ValueError(f"{directory}: the checkpoint has only part of the value head: {sorted(present)}")
    plan = ReadPlan(model, ckpt, optional=head_names, extras_prefix=None if present else _POLICY_HEAD)
    new_head = _new_head(model, head, head_init) if not present else None
    enable_packed_attention(model)
    if prepare is not None:
        prepare(model)
    critic.freeze_report = apply_freeze(model, "none")
    _materialise(critic, model, ckpt, plan, mesh=mesh, mp_policy=mp_policy, device=target)
    if new_head is not None:
        with torch.no_grad():
            for name, value in new_head.items():
                local, start, end = local_rows(getattr(head, name))
                local.copy_(value[start:end])
    model.eval()
    return critic


@torch.no_grad()
def _new_head(model: PreTrainedModel, head: nn.Linear, head_init: str) -> dict[str, Tensor]:
    """A new value head's full weights on the CPU (``(1, H)``: small), drawn as `load_critic` draws them:
    transformers initialises the missing head (`_init_weights`), then `load_critic` re-initialises it, both
    from the global RNG."""
    bias, dtype = head.bias is not None, head.weight.dtype
    fresh = nn.Linear(head.in_features, head.out_features, bias=bias, device="meta", dtype=dtype)
    fresh.to_empty(device="cpu")
    model._init_weights(fresh)  # the draw from_pretrained makes for a missing head
    if head_init == "zero":
        fresh.weight.zero_()
    else:
        fresh.weight.normal_(0.0, model.config.initializer_range)
    if fresh.bias is not None:
        fresh.bias.zero_()
    return {name: p.detach() for name, p in fresh.named_parameters()}
