"""The critic V_φ: the policy's backbone plus a scalar value head (docs/models.md).

It is transformers' token-classification model with one label (``Qwen3MoeForTokenClassification``,
``Qwen3ForTokenClassification``, …), dropout 0, wrapped so that ``critic(input_ids, position_ids)`` returns
values. Loading a *policy* checkpoint keeps its backbone, drops the LM head and creates the value head
(zero-initialised by default, so V = 0 everywhere at the start); loading a directory written by
`CriticModel.save_pretrained` restores the trained head as saved.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForTokenClassification, PretrainedConfig, PreTrainedModel

from sao.models.attention import PACKED_ATTENTION
from sao.models.freezing import FreezeReport, FreezeRule, apply_freeze
from sao.models.loading import checkpoint_dir, resolve_device, resolve_dtype

__all__ = ["CriticModel", "load_critic"]


class CriticModel(nn.Module):
    """A value model around an HF token-classification model with ``num_labels == 1`` (``.model``).

    ``critic(input_ids, position_ids=None, attention_mask=None, **kwargs) -> values`` ``(B, L)``: the
    value of the state after reading tokens ``0 … t`` at each position t (not shifted; `token_values`
    aligns them to the packed tokens). ``freeze_report`` is the `FreezeReport` of `load_critic`'s
    `apply_freeze` (parameter names as in ``critic.model``).
    """

    def __init__(self, model: PreTrainedModel, freeze_report: FreezeReport | None = None) -> None:
        super().__init__()
        if model.config.num_labels != 1:
            raise ValueError(
                f"a critic needs num_labels == 1, {type(model).__name__} has {model.config.num_labels}"
            )
        self.model = model
        self.freeze_report = freeze_report

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def head(self) -> nn.Linear:
        """The value head: ``Linear(hidden, 1)``."""
        return _value_head(self.model)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        **kwargs,
    ) -> Tensor:
        """``input_ids`` ``(B, L)`` long → values ``(B, L)``; never uses a KV cache."""
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **kwargs,
        )
        return out.logits.squeeze(-1)

    def save_pretrained(self, path: str | os.PathLike[str], **kwargs) -> None:
        """Write an HF checkpoint that `load_critic` (or ``AutoModelForTokenClassification``) reads back."""
        self.model.save_pretrained(path, **kwargs)


def _value_head(model: PreTrainedModel) -> nn.Linear:
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            return head
    raise TypeError(
        f"{type(model).__name__} has no linear token-classification head ('score' or 'classifier')"
    )


def load_critic(
    path: str | os.PathLike[str],
    freeze: FreezeRule = "attention",
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    head_init: Literal["zero", "normal"] = "zero",
    attn_implementation: str = PACKED_ATTENTION,
) -> CriticModel:
    """Load a critic from a policy checkpoint (new value head) or a saved critic (its head as saved).

    ``head_init`` applies only to a new head: ``"zero"`` (weight and bias 0: V ≡ 0 at the start) or
    ``"normal"`` (weight ~ N(0, initializer_range), bias 0). ``dtype`` / ``device`` as in `resolve_dtype` /
    `resolve_device` (``"auto"``: bfloat16 on CUDA, float32 on CPU). ``freeze`` goes to `apply_freeze`; its
    report is ``critic.freeze_report``.
    """
    if head_init not in ("zero", "normal"):
        raise ValueError(f"head_init must be 'zero' or 'normal', got {head_init!r}")
    path = checkpoint_dir(path)  # a clear error for a missing or non-HF directory
    target = resolve_device(device)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    config.num_labels = 1
    config.classifier_dropout = 0.0  # GenericForTokenClassification reads it; no dropout on values
    model, info = AutoModelForTokenClassification.from_pretrained(
        path,
        config=config,
        dtype=resolve_dtype(dtype, target),
        attn_implementation=attn_implementation,
        local_files_only=True,
        output_loading_info=True,
    )
    head = _value_head(model)
    head_names = {n for n, _ in model.named_parameters() if n.startswith(_head_prefix(model, head))}
    missing = set(info["missing_keys"])
    if missing - head_names:
        raise ValueError(f"{path}: checkpoint lacks backbone weights: {sorted(missing - head_names)[:5]}")
    if missing:  # a policy checkpoint: the head is new
        _init_head(head, head_init, model.config.initializer_range)
    model.to(target)
    return CriticModel(model, apply_freeze(model, freeze))


def _head_prefix(model: PreTrainedModel, head: nn.Module) -> str:
    return next(name for name, module in model.named_modules() if module is head) + "."


@torch.no_grad()
def _init_head(head: nn.Linear, head_init: str, std: float) -> None:
    if head_init == "zero":
        head.weight.zero_()
    else:
        head.weight.normal_(0.0, std)
    if head.bias is not None:
        head.bias.zero_()
