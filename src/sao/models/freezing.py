"""Which parameters train: freezing rules by parameter name (the frozen-attention critic; docs/models.md).

``freeze="attention"`` freezes every parameter whose name contains ``.self_attn.`` (the q/k/v/o projections
and q/k norms of HF decoder layers) and keeps the MLP / MoE experts and router, the norms, the embeddings and
the head trainable. ``freeze="none"`` trains everything. A list of regular expressions freezes every
parameter a pattern matches with `re.search`. A rule that matches nothing is an error: a silently
full-parameter "frozen" critic is the failure this guards against.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from torch import nn

__all__ = ["ATTENTION_MARKER", "FreezeReport", "FreezeRule", "apply_freeze", "trainable_parameters"]

ATTENTION_MARKER = ".self_attn."
FreezeRule = str | Sequence[str]


@dataclasses.dataclass(frozen=True)
class FreezeReport:
    """Parameter element counts after `apply_freeze` (``trainable + frozen`` = all), and the frozen names."""

    trainable: int
    frozen: int
    frozen_names: list[str]


def _matcher(freeze: FreezeRule):
    if freeze == "none":
        return lambda name: False
    if freeze == "attention":
        return lambda name: ATTENTION_MARKER in name
    if isinstance(freeze, str):
        raise ValueError(
            f"freeze must be 'attention', 'none' or a list of regular expressions, got {freeze!r}"
        )
    patterns = [re.compile(p) for p in freeze]
    return lambda name: any(p.search(name) for p in patterns)


def apply_freeze(model: nn.Module, freeze: FreezeRule) -> FreezeReport:
    """Set ``requires_grad`` on every parameter of ``model`` in place: False where ``freeze`` matches the
    parameter's name, True elsewhere (so calling it again with another rule replaces the previous one).

    Raises ValueError, naming the model class, when ``freeze`` is ``"attention"`` or a non-empty pattern list
    and matches no parameter (an empty list freezes nothing, like ``"none"``). Returns the counts; the caller
    logs them.
    """
    frozen_by_rule = _matcher(freeze)
    named = list(model.named_parameters())
    frozen_names = [name for name, _ in named if frozen_by_rule(name)]
    must_match = freeze == "attention" or (not isinstance(freeze, str) and len(freeze) > 0)
    if must_match and not frozen_names:
        raise ValueError(
            f"freeze={freeze!r} matches no parameter of {type(model).__name__} "
            f"(e.g. {', '.join(name for name, _ in named[:3])})"
        )
    frozen_set = set(frozen_names)
    trainable = frozen = 0
    for name, param in named:
        param.requires_grad_(name not in frozen_set)
        if name in frozen_set:
            frozen += param.numel()
        else:
            trainable += param.numel()
    return FreezeReport(trainable=trainable, frozen=frozen, frozen_names=frozen_names)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters with ``requires_grad``, in `named_parameters` order: what an optimizer should own."""
    return [p for p in model.parameters() if p.requires_grad]
